package plugin

// The differential test in this file holds the admission webhook and the
// kubelet plugin to one verdict on every claim: what the webhook admits,
// prepare accepts, and what prepare accepts, the webhook admits. The claim
// goes the way it goes in a cluster: the webhook reviews it (and the
// DeviceClass config it names), kube-scheduler's own allocator allocates it
// on the published model of a mock node, and the plugin prepares the
// allocation on that node.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/webhook"
	"github.com/tessera-dev/tessera/pkg/webhook/webhooktest"
)

// diffCase is one claim of the differential test, as the fuzzer writes it.
type diffCase struct {
	// claimConfig and classConfig are the fields of a GpuConfig after its
	// apiVersion and kind (",\"sharing\":{…}"); "" is an entry without
	// fields, "-" no entry at all.
	claimConfig, classConfig string
	// kindA and kindB pick the classes of requests a and b from
	// diffClasses: kindA, and kindB-1 (kindB 0: no request b).
	kindA, kindB uint8
	// count % 5 is request a's count (1–4); 0 is allocationMode All.
	count uint8
	// memory and cores are the capacity requests of request a ("": none).
	memory, cores string
	// flags, see the diff* bits.
	flags uint8
}

// Bits of diffCase.flags.
const (
	diffAdminAccess      = 1 << iota // request a has adminAccess
	diffUUID                         // a matchAttribute uuid constraint on a and b
	diffNVLink                       // a matchAttribute nvlinkDomain constraint on a and b
	diffConfigA                      // the claim's config names request a only
	diffFirstAvailable               // request a is firstAvailable: its own shape, then one whole GPU
	diffTolerateNotLent              // request a tolerates the not-lent taint
	diffTolerateMIGInUse             // request a tolerates the mig-in-use taint
	diffTolerateAll                  // request a tolerates every taint (no key, operator Exists)
)

// diffClasses are the DeviceClasses requests are drawn from, modulo their
// number.
var diffClasses = []string{model.WholeClassName, model.SharedClassName, model.MIGClassName}

// diffSeeds cover every field of GpuConfig, each request shape and the
// tolerations; testdata/fuzz/FuzzAdmissionAgreesWithPrepare holds the
// disagreements the fuzzer found.
var diffSeeds = []diffCase{
	{claimConfig: "-", classConfig: "-", kindA: 0, count: 1},
	{claimConfig: "", classConfig: "", kindA: 1, count: 1, memory: "20Gi", cores: "25"},
	{claimConfig: `,"sharing":{"isolation":"MPS","computeLimit":50,"memoryLimit":"10Gi"}`, classConfig: "-", kindA: 1, count: 1, memory: "20Gi", cores: "25"},
	{claimConfig: `,"sharing":{"isolation":"HAMiCore","computeLimit":20}`, classConfig: "-", kindA: 1, count: 1, memory: "20Gi", cores: "25"},
	{claimConfig: `,"sharing":{"isolation":"DriverMemory","memoryLimit":"30Gi"}`, classConfig: "-", kindA: 1, count: 1, memory: "20Gi"},
	{claimConfig: `,"sharing":{"isolation":"Advisory"}`, classConfig: `,"sharing":{"allowedIsolations":["MPS","HAMiCore"]}`, kindA: 1, count: 1, memory: "1Gi"},
	{claimConfig: "-", classConfig: `,"sharing":{"isolation":"MPS","allowedIsolations":["MPS"]}`, kindA: 1, count: 1, memory: "1Gi", cores: "10"},
	{claimConfig: `,"sharing":{"allowedIsolations":["MPS"]}`, classConfig: "-", kindA: 1, count: 1, memory: "1Gi"},
	{claimConfig: `,"topology":{"nvlink":"Required"}`, classConfig: "-", kindA: 0, count: 2},
	{claimConfig: `,"topology":{"nvlink":"Preferred"}`, classConfig: "-", kindA: 0, kindB: 1, count: 1, flags: diffNVLink},
	{claimConfig: `,"topology":{"nvlink":"Ignore"}`, classConfig: `,"topology":{"nvlink":"Required"}`, kindA: 0, count: 0},
	{claimConfig: `,"lending":{"lendWhenIdle":true}`, classConfig: "-", kindA: 0, count: 1},
	{claimConfig: `,"lending":{"lendWhenIdle":false}`, classConfig: `,"lending":{"lendWhenIdle":true}`, kindA: 2, count: 1},
	{claimConfig: `,"locality":{"affinity":"a","antiAffinity":"b","exclusion":"c"}`, classConfig: `,"locality":{"scope":"Cluster"}`, kindA: 1, count: 1, memory: "2Gi"},
	{claimConfig: `,"locality":{"scope":"Namespace"}`, classConfig: "-", kindA: 1, count: 1, memory: "2Gi"},
	{claimConfig: `,"sharing":{"isolation":"MPS"}`, classConfig: "-", kindA: 2, count: 1},
	{claimConfig: `,"sharing":{"isolation":"HAMiCore"}`, classConfig: "-", kindA: 2, count: 1},
	{claimConfig: "-", classConfig: `,"sharing":{"isolation":"DriverMemory"}`, kindA: 2, count: 1},
	{claimConfig: `,"sharing":{"isolation":"MPS"}`, classConfig: "-", kindA: 1, kindB: 2, count: 1, memory: "1Gi", flags: diffUUID | diffConfigA},
	{claimConfig: `,"sharing":{"isolation":"HAMiCore","computeLimit":30}`, classConfig: "-", kindA: 1, kindB: 0, count: 1, memory: "1Gi", cores: "30", flags: diffFirstAvailable},
	{claimConfig: `,"sharing":{"memoryLimit":"512Mi"}`, classConfig: "-", kindA: 1, count: 1, memory: "1Gi", flags: diffAdminAccess},
	{claimConfig: "-", classConfig: "-", kindA: 0, count: 1, flags: diffTolerateNotLent},
	{claimConfig: "-", classConfig: "-", kindA: 2, count: 1, flags: diffTolerateMIGInUse},
	{claimConfig: "-", classConfig: "-", kindA: 1, count: 1, memory: "1Gi", flags: diffTolerateAll},
}

// FuzzAdmissionAgreesWithPrepare: for any claim of Tessera's classes (whole
// GPUs, shares with memory and cores requests, MIG devices; one or two
// requests, firstAvailable, constraints, adminAccess, tolerations) with any
// claim and DeviceClass GpuConfig, the webhook and prepare agree:
//
//   - the webhook admits the claim (and the class config) and the scheduler's
//     allocator allocates it on the mock node: prepare accepts it;
//   - prepare accepts an allocation of it: the webhook admits it, unless
//     each of its refusals is about an allocation other than this one (a
//     refusal that says the claim "may get" several GPUs or GPUs of
//     different NVLink domains, which this allocation happened not to, or
//     a firstAvailable alternative the allocator did not pick).
//
// The webhook's verdict is webhook.Review's, for every claim: the chart's
// matchConditions send it only claims with a gpu.tessera.dev config, so in
// a cluster a claim without one (the cases with claimConfig "-") is checked
// at prepare alone.
//
// The one refusal at prepare that is allowed after admission is a placement
// the webhook cannot rule out and warns about (placementWarned); a grant
// conflict would be capacity, but a fresh node has none.
//
// A claim the allocator cannot allocate is left out: its pod stays Pending
// with the scheduler's reason, never stuck in ContainerCreating. Prepare runs
// on a fresh node where every backend is available (MPS, HAMi-core,
// DriverMemory), so that no refusal is about the node: none is expected.
func FuzzAdmissionAgreesWithPrepare(f *testing.F) {
	for _, s := range diffSeeds {
		f.Add(s.claimConfig, s.classConfig, s.kindA, s.kindB, s.count, s.memory, s.cores, s.flags)
	}
	f.Fuzz(func(t *testing.T, claimConfig, classConfig string, kindA, kindB, count uint8, memory, cores string, flags uint8) {
		checkAgreement(t, diffCase{claimConfig, classConfig, kindA, kindB, count, memory, cores, flags})
	})
}

// diffNode is the mock node of the differential test: hgx-h100-mig (GPU 0
// in MIG mode with two static instances, GPU 1 with dynamic MIG, GPUs 2–7
// whole or shared), published as the plugin publishes it.
type diffNode struct {
	mock    *gpu.MockNode
	gpus    []gpu.GPU
	node    *v1.Node
	slices  []*resourceapi.ResourceSlice
	classes []resourceapi.DeviceClass
}

func newDiffNode(t testing.TB) *diffNode {
	t.Helper()
	mock := migNode(t)
	d, err := gpu.DiscoverNode(mock)
	if err != nil {
		t.Fatal(err)
	}
	res, err := model.Resources(testNode, d.GPUs, model.WithDynamicMIG(gpuUUID(mock, 1)), model.WithDriverMemoryLimits(true))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := model.ResourceSlices(testNode, res)
	if err != nil {
		t.Fatal(err)
	}
	n := &diffNode{mock: mock, gpus: d.GPUs, node: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-a-uid"}}, classes: model.DeviceClasses()}
	for i := range objs {
		s := &objs[i]
		s.Name = fmt.Sprintf("%sslice%d", s.GenerateName, i)
		s.UID = types.UID(fmt.Sprintf("slice-%d", i))
		n.slices = append(n.slices, s)
	}
	return n
}

// diffConfig is the opaque parameters of a GpuConfig with fields after its
// apiVersion and kind; ok is false for "-" (no entry).
func diffConfig(fields string) (raw []byte, ok bool) {
	if fields == "-" {
		return nil, false
	}
	return []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig"` + fields + `}`), true
}

func opaque(raw []byte) resourceapi.DeviceConfiguration {
	return resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
		Driver: model.DriverName, Parameters: runtime.RawExtension{Raw: raw},
	}}
}

// build turns a case into a claim and the DeviceClasses; ok is false for a
// case the API server would not store (parameters that are no JSON object,
// capacity requests that are no quantity).
func (c diffCase) build(n *diffNode) (claim *resourceapi.ResourceClaim, classes []resourceapi.DeviceClass, ok bool) {
	classA := diffClasses[int(c.kindA)%len(diffClasses)]
	exact := resourceapi.ExactDeviceRequest{DeviceClassName: classA, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(c.count % 5)}
	if exact.Count == 0 {
		exact.AllocationMode = resourceapi.DeviceAllocationModeAll
	}
	if classA == model.SharedClassName && (c.memory != "" || c.cores != "") {
		exact.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for name, value := range map[resourceapi.QualifiedName]string{capacityMemory: c.memory, capacityCores: c.cores} {
			if value == "" {
				continue
			}
			q, err := resource.ParseQuantity(value)
			if err != nil || q.Sign() < 0 {
				return nil, nil, false
			}
			exact.Capacity.Requests[name] = q
		}
	}
	if c.flags&diffAdminAccess != 0 {
		admin := true
		exact.AdminAccess = &admin
	}
	for _, t := range []struct {
		bit uint8
		key string
	}{{diffTolerateNotLent, model.NotLentTaintKey}, {diffTolerateMIGInUse, model.MIGInUseTaintKey}} {
		if c.flags&t.bit != 0 {
			exact.Tolerations = append(exact.Tolerations, resourceapi.DeviceToleration{Key: t.key, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule})
		}
	}
	if c.flags&diffTolerateAll != 0 {
		exact.Tolerations = append(exact.Tolerations, resourceapi.DeviceToleration{Operator: resourceapi.DeviceTolerationOpExists})
	}
	a := resourceapi.DeviceRequest{Name: "a", Exactly: &exact}
	if c.flags&diffFirstAvailable != 0 {
		a = resourceapi.DeviceRequest{Name: "a", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "x", DeviceClassName: exact.DeviceClassName, AllocationMode: exact.AllocationMode, Count: exact.Count, Capacity: exact.Capacity, Tolerations: exact.Tolerations},
			{Name: "y", DeviceClassName: model.WholeClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}
		if exact.AdminAccess != nil {
			// adminAccess is not a field of subrequests.
			return nil, nil, false
		}
	}
	devices := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{a}}
	if c.kindB != 0 {
		classB := diffClasses[int(c.kindB-1)%len(diffClasses)]
		b := resourceapi.ExactDeviceRequest{DeviceClassName: classB, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
		if classB == model.SharedClassName {
			b.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{capacityMemory: resource.MustParse("1Gi")}}
		}
		devices.Requests = append(devices.Requests, resourceapi.DeviceRequest{Name: "b", Exactly: &b})
		for _, con := range []struct {
			bit       uint8
			attribute resourceapi.FullyQualifiedName
		}{{diffUUID, model.DriverName + "/uuid"}, {diffNVLink, model.DriverName + "/nvlinkDomain"}} {
			if c.flags&con.bit != 0 {
				attribute := con.attribute
				devices.Constraints = append(devices.Constraints, resourceapi.DeviceConstraint{Requests: []string{"a", "b"}, MatchAttribute: &attribute})
			}
		}
	} else if c.flags&diffNVLink != 0 {
		attribute := resourceapi.FullyQualifiedName(model.DriverName + "/nvlinkDomain")
		devices.Constraints = append(devices.Constraints, resourceapi.DeviceConstraint{MatchAttribute: &attribute})
	}
	if raw, set := diffConfig(c.claimConfig); set {
		if !json.Valid(raw) {
			return nil, nil, false
		}
		entry := resourceapi.DeviceClaimConfiguration{DeviceConfiguration: opaque(raw)}
		if c.flags&diffConfigA != 0 {
			entry.Requests = []string{"a"}
		}
		devices.Config = append(devices.Config, entry)
	}
	classes = slices.Clone(n.classes)
	if raw, set := diffConfig(c.classConfig); set {
		if !json.Valid(raw) {
			return nil, nil, false
		}
		for i := range classes {
			if classes[i].Name == classA {
				classes[i] = *classes[i].DeepCopy()
				classes[i].Spec.Config = append(classes[i].Spec.Config, resourceapi.DeviceClassConfiguration{DeviceConfiguration: opaque(raw)})
			}
		}
	}
	claim = &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "claim-diff", UID: "uid-diff"},
		Spec:       resourceapi.ResourceClaimSpec{Devices: devices},
	}
	return claim, classes, true
}

// admission is the webhook's verdict on a claim and its classes.
type admission struct {
	// classRefused is the webhook's refusal of a class config ("" when it
	// admits every class).
	classRefused string
	// refused are the causes of the claim's denial (none: admitted).
	refused []metav1.StatusCause
	message string
	// warnings are the admission's warnings.
	warnings []string
}

func admit(t testing.TB, claim *resourceapi.ResourceClaim, classes []resourceapi.DeviceClass) admission {
	t.Helper()
	var verdict admission
	byName := map[string]*resourceapi.DeviceClass{}
	for i := range classes {
		class := &classes[i]
		byName[class.Name] = class
		raw, err := json.Marshal(class)
		if err != nil {
			t.Fatal(err)
		}
		resp := webhook.Review(context.Background(), &admissionv1.AdmissionRequest{
			UID: "c", Kind: metav1.GroupVersionKind{Group: resourceapi.GroupName, Version: "v1", Kind: "DeviceClass"},
			Operation: admissionv1.Create, Name: class.Name, Object: runtime.RawExtension{Raw: raw},
		}, nil)
		if !resp.Allowed {
			verdict.classRefused = resp.Result.Message
		}
	}
	resp := webhook.Review(context.Background(), webhooktest.ClaimCreate(t, *claim), webhook.DeviceClassMap(byName))
	verdict.warnings = resp.Warnings
	if !resp.Allowed {
		if resp.Result == nil || resp.Result.Code != 422 {
			t.Fatalf("webhook answered %+v, want an Invalid denial", resp.Result)
		}
		verdict.message = resp.Result.Message
		if resp.Result.Details != nil {
			verdict.refused = resp.Result.Details.Causes
		}
		if len(verdict.refused) == 0 {
			verdict.refused = []metav1.StatusCause{{Message: resp.Result.Message}}
		}
	}
	return verdict
}

// allocate runs kube-scheduler's allocator for claim on the node; nil when
// the claim does not fit (or the allocator refuses it as invalid).
func (n *diffNode) allocate(t testing.TB, claim *resourceapi.ResourceClaim, classes []resourceapi.DeviceClass) *resourceapi.AllocationResult {
	t.Helper()
	// kube-scheduler gives up on a node after its filter timeout; so does
	// this, with a shorter one.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	alloc, err := structured.NewAllocator(ctx, model.SchedulerFeatures, model.NewAllocatedState(),
		model.NewClassLister(classes), n.slices, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		t.Fatal(err)
	}
	results, err := alloc.Allocate(ctx, n.node, []*resourceapi.ResourceClaim{claim})
	if err != nil || len(results) == 0 {
		return nil
	}
	return &results[0]
}

// mayRefusal reports whether a webhook refusal is about allocations other
// than alloc: the claim may get several GPUs, GPUs of different NVLink
// domains, or a second device (and this allocation did not prepare to a
// refusal), or it is about a firstAvailable alternative alloc did not pick.
func mayRefusal(cause metav1.StatusCause, alloc *resourceapi.AllocationResult) bool {
	for _, phrase := range []string{" may get ", "may pick GPUs of different NVLink domains", " adds a second "} {
		if strings.Contains(cause.Message, phrase) {
			return true
		}
	}
	picked := map[string]bool{}
	for _, r := range alloc.Devices.Results {
		picked[r.Request] = true
	}
	for _, sub := range []string{"a/x", "a/y"} {
		if !picked[sub] && strings.Contains(cause.Message, fmt.Sprintf("request %q", sub)) {
			return true
		}
	}
	return false
}

// placementWarned reports whether prepare refused a placement the
// scheduler chose that admission cannot rule out and warned about: admin
// access to a dynamic MIG placement.
func placementWarned(err error, warnings []string) bool {
	if !strings.Contains(err.Error(), "admin access to a dynamic MIG placement") {
		return false
	}
	return slices.ContainsFunc(warnings, func(w string) bool {
		return strings.Contains(w, "admin access to MIG devices: if the scheduler picks a dynamic MIG placement")
	})
}

func checkAgreement(t *testing.T, c diffCase) {
	// A case that hangs crashes the test, so that the fuzzer keeps it.
	watchdog := time.AfterFunc(time.Minute, func() { panic(fmt.Sprintf("no verdict after a minute on %#v", c)) })
	defer watchdog.Stop()
	n := newDiffNode(t)
	claim, classes, ok := c.build(n)
	if !ok {
		t.Skip("not a claim the API server stores")
	}
	verdict := admit(t, claim, classes)
	if verdict.classRefused != "" {
		// The class cannot be installed: no claim of it exists.
		t.Skip("class refused: " + verdict.classRefused)
	}
	alloc := n.allocate(t, claim, classes)
	if alloc == nil {
		t.Skip("does not fit the node: the pod stays Pending with the scheduler's reason")
	}
	allocated := claim.DeepCopy()
	allocated.Status.Allocation = alloc

	e := newEnv(t)
	i := e.startMIG(n.mock, func(o *Options) {
		o.DriverMemory = isolation.DriverMemory{Capable: true, HookPath: "/usr/bin/nvidia-cdi-hook", DriverRoot: "/"}
	})
	prepared := prepare(t, i.Plugin, allocated)
	spec, _ := json.Marshal(claim.Spec.Devices)
	allocation, _ := json.Marshal(alloc.Devices.Results)
	switch {
	case len(verdict.refused) == 0 && prepared.Err != nil:
		var conflict *grantConflict
		if errors.As(prepared.Err, &conflict) {
			t.Skipf("capacity: %v", prepared.Err)
		}
		if placementWarned(prepared.Err, verdict.warnings) {
			t.Skipf("placement the webhook warned about: %v", prepared.Err)
		}
		t.Fatalf("the webhook admits the claim, prepare refuses it:\n  claim devices: %s\n  class config: %s\n  allocation: %s\n  prepare: %v",
			spec, c.classConfig, allocation, prepared.Err)
	case len(verdict.refused) > 0 && prepared.Err == nil:
		for _, cause := range verdict.refused {
			if !mayRefusal(cause, alloc) {
				t.Fatalf("prepare accepts the claim, the webhook refuses it:\n  claim devices: %s\n  class config: %s\n  allocation: %s\n  webhook: %s",
					spec, c.classConfig, allocation, verdict.message)
			}
		}
	}
}
