package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// testClass is a DeviceClass whose spec.config holds the given opaque
// parameters of driver gpu.tessera.dev (JSON), after one of another driver.
func testClass(name string, params ...string) *resourceapi.DeviceClass {
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	class.Spec.Config = append(class.Spec.Config, resourceapi.DeviceClassConfiguration{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "other.example.com", Parameters: runtime.RawExtension{Raw: []byte(`{"not":"ours"}`)}},
	}})
	for _, p := range params {
		class.Spec.Config = append(class.Spec.Config, resourceapi.DeviceClassConfiguration{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: modelnames.DriverName, Parameters: runtime.RawExtension{Raw: []byte(p)}},
		}})
	}
	return class
}

func gpuConfigJSON(fields string) string {
	return `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig",` + fields + `}`
}

// floorClasses are the classes of TestValidateDeviceClaimFloor.
func floorClasses() map[string]*resourceapi.DeviceClass {
	return map[string]*resourceapi.DeviceClass{
		// Enforced shares only, MPS unless the claim picks HAMiCore.
		"pinned": testClass("pinned", gpuConfigJSON(`"sharing":{"isolation":"MPS","allowedIsolations":["MPS","HAMiCore"]}`)),
		// A floor without an isolation: the node's default decides.
		"floor-only": testClass("floor-only", gpuConfigJSON(`"sharing":{"allowedIsolations":["MPS"]}`)),
		// Its isolation is outside its own floor.
		"broken-floor": testClass("broken-floor", gpuConfigJSON(`"sharing":{"isolation":"Advisory","allowedIsolations":["MPS"]}`)),
		"typo":         testClass("typo", gpuConfigJSON(`"sharing":{"allowedIsolation":["MPS"]}`)),
		"disjoint": testClass("disjoint",
			gpuConfigJSON(`"sharing":{"allowedIsolations":["MPS"]}`),
			gpuConfigJSON(`"sharing":{"allowedIsolations":["HAMiCore"]}`)),
		"no-floor":                 testClass("no-floor", gpuConfigJSON(`"sharing":{"isolation":"HAMiCore"}`)),
		modelnames.SharedClassName: testClass(modelnames.SharedClassName, gpuConfigJSON(`"sharing":{"isolation":"MPS","allowedIsolations":["MPS"]}`)),
	}
}

// TestValidateDeviceClaimFloor: with the classes it names, admission refuses a
// claim whose own config asks for an isolation its DeviceClass does not allow
// (sharing.allowedIsolations), naming the config's field and the class's
// list; refuses a class that prepare would refuse for every claim; warns when
// the node's --default-isolation will decide; and allows, with a warning, a
// claim whose class cannot be read.
func TestValidateDeviceClaimFloor(t *testing.T) {
	const cfg = `{apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, `
	request := func(class string) string {
		return `
requests:
- name: gpus
  exactly: {deviceClassName: ` + class + `, capacity: {requests: {memory: 8Gi, cores: "20"}}}`
	}
	config := func(fields string) string {
		return `
config:
- requests: [gpus]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + fields + `}}`
	}
	isolation0 := "spec.devices.config[0].opaque.parameters.sharing.isolation"
	class0 := "spec.devices.requests[0].exactly.deviceClassName"
	unreadable := errors.New("deviceclasses.resource.k8s.io \"unreadable\" is forbidden: User \"system:serviceaccount:tessera:tessera-webhook\" cannot get resource")

	tests := []struct {
		name         string
		devices      string
		wantErrors   []string
		wantWarnings []string
	}{
		{
			name:    "the class allows the claim's isolation",
			devices: request("pinned") + config(`sharing: {isolation: HAMiCore}`),
		},
		{
			name:    "the claim leaves isolation to the class",
			devices: request("pinned") + config(`sharing: {computeLimit: 50}`),
		},
		{
			name:    "the claim asks for Advisory",
			devices: request("pinned") + config(`sharing: {isolation: Advisory}`),
			wantErrors: []string{isolation0 + `: Invalid value: "Advisory": request "gpus" is of DeviceClass pinned, whose config allows only MPS, HAMiCore ` +
				`(sharing.allowedIsolations); a claim may choose only an isolation its class allows, so prepare would refuse the claim`},
		},
		{
			name:    "the built-in shared class with a floor",
			devices: request(modelnames.SharedClassName) + config(`sharing: {isolation: HAMiCore}`),
			wantErrors: []string{isolation0 + `: Invalid value: "HAMiCore": request "gpus" is of DeviceClass shared.gpu.tessera.dev, whose config allows only MPS ` +
				`(sharing.allowedIsolations); a claim may choose only an isolation its class allows, so prepare would refuse the claim`},
		},
		{
			name: "the last claim config that sets isolation is the one prepare uses",
			devices: request("pinned") + config(`sharing: {isolation: MPS}`) + `
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {isolation: Advisory}}}`,
			wantErrors: []string{`spec.devices.config[1].opaque.parameters.sharing.isolation: Invalid value: "Advisory": request "gpus" is of DeviceClass pinned, ` +
				`whose config allows only MPS, HAMiCore (sharing.allowedIsolations); a claim may choose only an isolation its class allows, so prepare would refuse the claim`},
		},
		{
			name:    "a claim may not set allowedIsolations, whatever its class",
			devices: request("no-floor") + config(`sharing: {isolation: Advisory, allowedIsolations: [Advisory]}`),
			wantErrors: []string{`spec.devices.config[0].opaque.parameters.sharing.allowedIsolations: Forbidden: ` +
				`only a DeviceClass config may set it; a claim chooses sharing.isolation among the isolations its class allows`},
		},
		{
			name:    "a class without a floor",
			devices: request("no-floor") + config(`sharing: {isolation: Advisory}`),
		},
		{
			name:    "the node's default decides",
			devices: request("floor-only") + config(`sharing: {computeLimit: 50}`),
			wantWarnings: []string{class0 + `: DeviceClass floor-only allows only MPS, and neither it nor the claim sets sharing.isolation: ` +
				`prepare refuses request "gpus" unless the node's --default-isolation is one of them`},
		},
		{
			name:    "a class whose isolation is outside its own floor",
			devices: request("broken-floor") + config(`sharing: {computeLimit: 50}`),
			wantErrors: []string{class0 + `: Invalid value: "broken-floor": the config of DeviceClass broken-floor sets sharing.isolation Advisory, ` +
				`which its own sharing.allowedIsolations (MPS) does not allow, so prepare would refuse the claim; ` +
				`set sharing.isolation in the claim's config to one of MPS, or have the admin fix the class`},
		},
		{
			name:    "... unless the claim picks an allowed one",
			devices: request("broken-floor") + config(`sharing: {isolation: MPS}`),
		},
		{
			name:    "a class config prepare refuses",
			devices: request("typo") + config(`sharing: {isolation: MPS}`),
			wantErrors: []string{class0 + `: Invalid value: "typo": the config of DeviceClass typo is invalid: ` +
				`spec.config[1].opaque.parameters: invalid GpuConfig: sharing.allowedIsolation: unknown field; prepare would refuse every claim of the class`},
		},
		{
			name:    "class configs whose floors have nothing in common",
			devices: request("disjoint") + config(`sharing: {isolation: MPS}`),
			wantErrors: []string{class0 + `: Invalid value: "disjoint": the config of DeviceClass disjoint is invalid: ` +
				`spec.config[2].opaque.parameters.sharing.allowedIsolations (HAMiCore) has no isolation in common with the class's earlier configs; ` +
				`prepare would refuse every claim of the class`},
		},
		{
			name:         "a class that does not exist",
			devices:      request("missing") + config(`sharing: {isolation: Advisory}`),
			wantWarnings: []string{class0 + `: DeviceClass missing not found; its sharing.allowedIsolations is checked when the claim is prepared`},
		},
		{
			name:    "a class that cannot be read: allowed, with a warning",
			devices: request("unreadable") + config(`sharing: {isolation: Advisory}`),
			wantWarnings: []string{class0 + `: DeviceClass unreadable could not be read (deviceclasses.resource.k8s.io "unreadable" is forbidden: ` +
				`User "system:serviceaccount:tesser…); its sharing.allowedIsolations is checked when the claim is prepared`},
		},
		{
			name: "a subrequest's class and the config of its parent request",
			devices: `
requests:
- name: gpus
  firstAvailable:
  - {name: enforced, deviceClassName: pinned}
  - {name: any, deviceClassName: no-floor}` + config(`sharing: {isolation: Advisory}`),
			wantErrors: []string{isolation0 + `: Invalid value: "Advisory": request "gpus/enforced" is of DeviceClass pinned, whose config allows only MPS, HAMiCore ` +
				`(sharing.allowedIsolations); a claim may choose only an isolation its class allows, so prepare would refuse the claim`},
		},
		{
			name: "adminAccess devices get no isolation backend",
			devices: `
requests:
- name: gpus
  exactly: {deviceClassName: pinned, adminAccess: true}` + config(`sharing: {isolation: Advisory}`),
		},
		{
			name: "the config of another request",
			devices: request("pinned") + `
- name: other
  exactly: {deviceClassName: no-floor}
config:
- requests: [other]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {isolation: Advisory}}}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			classes := DeviceClassMap(floorClasses())
			lookup := func(name string) (*resourceapi.DeviceClass, error) {
				if name == "unreadable" {
					return nil, unreadable
				}
				return classes(name)
			}
			errs, warnings := ValidateDeviceClaimWithClasses(decodeDevices(t, tc.devices), field.NewPath("spec", "devices"), lookup)
			checkErrors(t, errs, tc.wantErrors)
			checkWarnings(t, warnings, tc.wantWarnings)
		})
	}
}

// TestValidateDeviceClaimFloorReadsEachClassOnce: a class is read once per
// claim (the whole-GPU class too, for its topology.nvlink), and without a
// lookup (the CLI) the floor is left to prepare.
func TestValidateDeviceClaimFloorReadsEachClassOnce(t *testing.T) {
	var devices resourceapi.DeviceClaim
	if err := yaml.UnmarshalStrict([]byte(`
requests:
- name: a
  exactly: {deviceClassName: pinned}
- name: b
  exactly: {deviceClassName: pinned}
- name: whole
  exactly: {deviceClassName: gpu.tessera.dev}
config:
- requests: [a, b]
  opaque: {driver: gpu.tessera.dev, parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, sharing: {isolation: Advisory}}}`), &devices); err != nil {
		t.Fatal(err)
	}
	classes := DeviceClassMap(floorClasses())
	reads := map[string]int{}
	lookup := func(name string) (*resourceapi.DeviceClass, error) {
		reads[name]++
		return classes(name)
	}
	errs, _ := ValidateDeviceClaimWithClasses(&devices, field.NewPath("spec", "devices"), lookup)
	if len(errs) != 2 {
		t.Errorf("want one error per request of class pinned, got %v", errs)
	}
	if len(reads) != 2 || reads["pinned"] != 1 || reads[modelnames.WholeClassName] != 1 {
		t.Errorf("classes read %v, want pinned and %s once each", reads, modelnames.WholeClassName)
	}
	if errs, warnings := ValidateDeviceClaim(&devices, field.NewPath("spec", "devices")); len(errs) != 0 || len(warnings) != 0 {
		t.Errorf("without classes: errors %v, warnings %v; want none", errs, warnings)
	}
}

// fakeClasses is a DeviceClassReader that records the contexts it is given.
type fakeClasses struct {
	classes map[string]*resourceapi.DeviceClass
	calls   atomic.Int32
}

func (f *fakeClasses) Get(ctx context.Context, name string) (*resourceapi.DeviceClass, error) {
	f.calls.Add(1)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return DeviceClassMap(f.classes)(name)
}

// TestHandlerReadsDeviceClasses: the HTTP handler wires Review to its
// DeviceClassReader: the claim of the pinned shared class that asks for
// Advisory is denied with the field path and the reason.
func TestHandlerReadsDeviceClasses(t *testing.T) {
	valid, err := os.ReadFile(filepath.Join("testdata", "claim-v1-valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Replace(valid, []byte(`"isolation": "MPS"`), []byte(`"isolation": "Advisory"`), 1)
	classes := &fakeClasses{classes: floorClasses()}
	req := httptest.NewRequest("POST", ValidatePath, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	Handler{Classes: classes}.ServeHTTP(rec, req)
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &review); err != nil {
		t.Fatalf("%v: %s", err, rec.Body.String())
	}
	want := `spec.devices.config[0].opaque.parameters.sharing.isolation: Invalid value: "Advisory": request "gpus" is of DeviceClass shared.gpu.tessera.dev, ` +
		`whose config allows only MPS (sharing.allowedIsolations); a claim may choose only an isolation its class allows, so prepare would refuse the claim`
	if review.Response == nil || review.Response.Allowed || review.Response.Result.Message != want {
		t.Fatalf("response %+v\nwant denied with %s", review.Response, want)
	}
	if n := classes.calls.Load(); n != 1 {
		t.Errorf("%d class reads, want 1", n)
	}
}

// TestDeviceClasses: the reader the webhook runs with answers from the API
// server before its cache has synced, and from the cache after; a class the
// cache does not hold yet is read from the API server.
func TestDeviceClasses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(testClass("pinned", gpuConfigJSON(`"sharing":{"allowedIsolations":["MPS"]}`)))
	classes := NewDeviceClasses(client)

	// Before Start: a GET.
	class, err := classes.Get(ctx, "pinned")
	if err != nil || class.Name != "pinned" {
		t.Fatalf("Get before the cache: %v, %v", class, err)
	}
	if _, err := classes.Get(ctx, "missing"); !apierrors.IsNotFound(err) {
		t.Fatalf("Get of a missing class: %v, want NotFound", err)
	}

	classes.Start(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for !classes.synced() {
		if time.Now().After(deadline) {
			t.Fatal("the cache did not sync")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gets := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "deviceclasses" {
				n++
			}
		}
		return n
	}
	before := gets()
	if class, err := classes.Get(ctx, "pinned"); err != nil || class.Name != "pinned" {
		t.Fatalf("Get from the cache: %v, %v", class, err)
	}
	if gets() != before {
		t.Error("a class in the cache was read with a GET")
	}

	// A class the cache does not hold: a GET, which may find it.
	if _, err := client.ResourceV1().DeviceClasses().Create(ctx, testClass("new"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if class, err := classes.Get(ctx, "new"); err != nil || class.Name != "new" {
		t.Fatalf("Get of a new class: %v, %v", class, err)
	}
	if _, err := classes.Get(ctx, "missing"); !apierrors.IsNotFound(err) {
		t.Fatalf("Get of a missing class: %v, want NotFound", err)
	}
}
