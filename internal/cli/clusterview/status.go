// Package clusterview builds the cluster-wide view behind `tessera status`: per
// node and GPU, what the GPU is, how much of its memory and compute claims
// hold, who holds it (pod and claim), what enforces each share's limits (the
// plugin's attestation in the claim's status) and whether it is healthy. A
// GPU in MIG mode is listed with its MIG devices (every static instance,
// the held placements of a dynamic GPU), each with its holders and health. It reads only
// the API (ResourceSlices and ResourceClaims), so it needs no access to the
// nodes, and shows exactly what the scheduler sees.
package clusterview

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/accounting"
	"github.com/tessera-dev/tessera/pkg/model"
)

// Report is the status of every GPU Tessera publishes, by node.
type Report struct {
	Nodes []Node `json:"nodes"`
	// Budgets are the cluster's GPUBudgets (GetBudgets), when read.
	Budgets []Budget `json:"budgets,omitempty"`
}

// Node is one node's GPUs, by ascending minor.
type Node struct {
	Name string `json:"name"`
	GPUs []GPU  `json:"gpus"`
}

// Mode is how a GPU is allocated.
type Mode string

const (
	ModeFree   Mode = "free"
	ModeWhole  Mode = "whole"
	ModeShared Mode = "shared"
	// ModeMIG is a GPU in MIG mode: it publishes MIG devices only
	// (docs/mig.md), whether or not a claim holds one.
	ModeMIG Mode = "mig"
)

// GPU is one GPU and what holds it.
type GPU struct {
	// Device is the whole device's name (gpu-<minor>).
	Device      string `json:"device"`
	Minor       int    `json:"minor"`
	UUID        string `json:"uuid,omitempty"`
	ProductName string `json:"productName,omitempty"`
	MemoryBytes int64  `json:"memoryBytes"`
	Cores       int64  `json:"cores"`
	// AllocatedMemoryBytes and AllocatedCores are held by claims, as
	// package accounting counts: all of it for a whole GPU, the sum of the
	// shares' consumedCapacity otherwise; admin access holds nothing.
	AllocatedMemoryBytes int64 `json:"allocatedMemoryBytes"`
	AllocatedCores       int64 `json:"allocatedCores"`
	Mode                 Mode  `json:"mode"`
	// Healthy is false while a device of the GPU carries the
	// gpu.tessera.dev/unhealthy taint; Taints are all taints of its devices.
	Healthy bool                      `json:"healthy"`
	Taints  []resourceapi.DeviceTaint `json:"taints,omitempty"`
	Holders []Holder                  `json:"holders"`
	// Lending is the GPU's lending device (gpu-N-lent), when the node
	// publishes one.
	Lending *Lending `json:"lending,omitempty"`
	// MIG is set for a GPU in MIG mode. Its MemoryBytes and Cores are then
	// those of its static instances together, or of the full-GPU profile
	// (dynamic), and AllocatedMemoryBytes and AllocatedCores those of the
	// MIG devices claims hold.
	MIG *MIG `json:"mig,omitempty"`
}

// MIG is what a GPU in MIG mode publishes and who holds it.
type MIG struct {
	// Dynamic is true when the GPU publishes placements (instances are made
	// for the claims that get them), false for its existing instances.
	Dynamic bool `json:"dynamic"`
	// Devices are the static instances, every one, or the dynamic
	// placements claims hold, in the order they are published.
	Devices []MIGDevice `json:"devices"`
}

// MIGDevice is one MIG device.
type MIGDevice struct {
	// Device is gpu-N-mig-<GI>-<CI> (static) or gpu-N-mig-<profile>-<start>.
	Device  string `json:"device"`
	Profile string `json:"profile,omitempty"`
	// PlacementStart and PlacementSize are the memory slices it covers.
	PlacementStart int `json:"placementStart"`
	PlacementSize  int `json:"placementSize"`
	// UUID is the MIG-… UUID of a static instance.
	UUID        string `json:"uuid,omitempty"`
	MemoryBytes int64  `json:"memoryBytes"`
	Cores       int64  `json:"cores"`
	// Unhealthy is the value of the device's gpu.tessera.dev/unhealthy
	// taint ("XID-43"), "" while it is healthy.
	Unhealthy string `json:"unhealthy,omitempty"`
	// Holders are the claims allocated the device.
	Holders []Holder `json:"holders"`
}

// Lending is what a GPU lends to borrowers (docs/lending.md).
type Lending struct {
	// Phase is "Lent" while borrowers may be placed, else the value of the
	// lending device's gpu.tessera.dev/not-lent taint ("NotLent"; the
	// plugin's metric tessera_gpu_lending_phase says why).
	Phase string `json:"phase"`
	// LendableBytes is the lending device's memory capacity; it means
	// something only while Lent.
	LendableBytes int64 `json:"lendableBytes"`
	// Borrowers are the claims allocated the lending device; each holds
	// its consumedCapacity of what is lent, none of the GPU's counters.
	Borrowers []Holder `json:"borrowers"`
}

// Holder is one allocation on the GPU: a claim and the pods it is reserved for.
type Holder struct {
	Namespace string   `json:"namespace"`
	Claim     string   `json:"claim"`
	Pods      []string `json:"pods"`
	// Device is gpu-N (whole), gpu-N-shared (a share) or a MIG device.
	Device string `json:"device"`
	// MIGProfile is the profile of a MIG device ("3g.40gb").
	MIGProfile string `json:"migProfile,omitempty"`
	ShareID    string `json:"shareID,omitempty"`
	// MemoryBytes and Cores are what the allocation holds of the GPU (see
	// package accounting): 0 for admin access.
	MemoryBytes int64 `json:"memoryBytes"`
	Cores       int64 `json:"cores"`
	AdminAccess bool  `json:"adminAccess,omitempty"`
	// Attestation is what the node's plugin applied to the device when it
	// prepared it: the isolation backend and the limits in force, from the
	// claim's status.devices[].data. Nil until the device is prepared, after
	// a failed prepare, or when the plugin could not write the claim's
	// status.
	Attestation *configapi.GpuAttestation `json:"attestation,omitempty"`
	// PrepareError is why the node's plugin could not prepare the device
	// (its Ready=False condition), for example an isolation backend the node
	// cannot apply.
	PrepareError string `json:"prepareError,omitempty"`
}

// unhealthyTaint is pkg/health's TaintKey (not imported: status runs on
// laptops and must not pull in NVML).
const unhealthyTaint = "gpu.tessera.dev/unhealthy"

// Get reads the ResourceSlices of driver gpu.tessera.dev and every
// ResourceClaim and builds the report. node, when not empty, restricts it to
// that node.
func Get(ctx context.Context, client kubernetes.Interface, node string) (Report, error) {
	sliceList, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + model.DriverName})
	if err != nil {
		return Report{}, fmt.Errorf("list ResourceSlices: %w", err)
	}
	claimList, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return Report{}, fmt.Errorf("list ResourceClaims: %w", err)
	}
	r := Build(sliceList.Items, claimList.Items)
	if node != "" {
		r.Nodes = slices.DeleteFunc(r.Nodes, func(n Node) bool { return n.Name != node })
	}
	return r, nil
}

// Build is Get without the API: the report for these slices and claims.
// Slices of other drivers are ignored, and of each pool only those of its
// newest generation count (older ones are being replaced).
func Build(resourceSlices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim) Report {
	newest := map[string]int64{}
	for _, s := range resourceSlices {
		if s.Spec.Driver == model.DriverName {
			newest[s.Spec.Pool.Name] = max(newest[s.Spec.Pool.Name], s.Spec.Pool.Generation)
		}
	}
	type key = accounting.GPU
	gpus := map[key]*GPU{}
	migDevices := newMIGIndex()
	nodeOf := map[string]string{} // pool → node
	get := func(pool string, minor int) *GPU {
		k := key{Pool: pool, Minor: minor}
		if gpus[k] == nil {
			gpus[k] = &GPU{Device: model.WholeDeviceName(minor), Minor: minor, Healthy: true, Mode: ModeFree, Holders: []Holder{}}
		}
		return gpus[k]
	}
	for _, s := range resourceSlices {
		if s.Spec.Driver != model.DriverName || s.Spec.Pool.Generation != newest[s.Spec.Pool.Name] {
			continue
		}
		node := s.Spec.Pool.Name
		if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
			node = *s.Spec.NodeName
		}
		nodeOf[s.Spec.Pool.Name] = node
		for _, d := range s.Spec.Devices {
			minor, kind, err := model.ParseDevice(d.Name)
			if err != nil {
				if m, migErr := model.ParseMIGDevice(d.Name); migErr == nil {
					addMIGDevice(get(s.Spec.Pool.Name, m.Minor), migDevices, s.Spec.Pool.Name, m, d)
				}
				continue
			}
			g := get(s.Spec.Pool.Name, minor)
			if kind == model.KindLent {
				g.Lending = lendingOf(d)
				continue
			}
			shared := kind == model.KindShared
			if !shared {
				g.UUID = stringAttr(d, model.AttrUUID)
				g.ProductName = stringAttr(d, model.AttrProductName)
				if c, ok := d.Capacity[model.Memory]; ok {
					g.MemoryBytes = c.Value.Value()
				}
				if c, ok := d.Capacity[model.Cores]; ok {
					g.Cores = c.Value.Value()
				}
			}
			for _, t := range d.Taints {
				if t.Key == unhealthyTaint {
					g.Healthy = false
				}
				if !slices.ContainsFunc(g.Taints, func(x resourceapi.DeviceTaint) bool {
					return x.Key == t.Key && x.Value == t.Value && x.Effect == t.Effect
				}) {
					t.TimeAdded = nil
					g.Taints = append(g.Taints, t)
				}
			}
		}
	}

	capacity := func(k key) (accounting.Capacity, bool) {
		g, ok := gpus[k]
		if !ok {
			return accounting.Capacity{}, false
		}
		return accounting.Capacity{MemoryBytes: g.MemoryBytes, Cores: g.Cores}, true
	}
	var devices []accounting.Device
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		var pods []string
		for _, ref := range c.Status.ReservedFor {
			if ref.Resource == "pods" && ref.APIGroup == "" {
				pods = append(pods, ref.Name)
			}
		}
		slices.Sort(pods)
		if pods == nil {
			pods = []string{}
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if m, ok := migDevices.byKey[migKey{res.Pool, res.Device}]; ok && res.Driver == model.DriverName {
				h := Holder{Namespace: c.Namespace, Claim: c.Name, Pods: pods, Device: res.Device, MIGProfile: m.dev.Profile,
					AdminAccess: res.AdminAccess != nil && *res.AdminAccess}
				if !h.AdminAccess {
					h.MemoryBytes, h.Cores = m.dev.MemoryBytes, m.dev.Cores
					m.gpu.AllocatedMemoryBytes += h.MemoryBytes
					m.gpu.AllocatedCores += h.Cores
				}
				h.Attestation, h.PrepareError = deviceStatus(c.Status.Devices, res)
				m.dev.Holders = append(m.dev.Holders, h)
				m.gpu.Holders = append(m.gpu.Holders, h)
				continue
			}
			if b, k, ok := borrower(c, pods, res); ok {
				if g := gpus[k]; g != nil && g.Lending != nil {
					g.Lending.Borrowers = append(g.Lending.Borrowers, b)
				}
				continue
			}
			d, ok := accounting.FromResult(res)
			if !ok {
				continue // another driver's
			}
			gpuCapacity, ok := capacity(d.GPU)
			if !ok {
				continue // a device no longer published
			}
			held := d.Holds(gpuCapacity)
			h := Holder{Namespace: c.Namespace, Claim: c.Name, Pods: pods, Device: res.Device,
				MemoryBytes: held.MemoryBytes, Cores: held.Cores, AdminAccess: d.AdminAccess}
			if res.ShareID != nil {
				h.ShareID = string(*res.ShareID)
			}
			h.Attestation, h.PrepareError = deviceStatus(c.Status.Devices, res)
			g := gpus[d.GPU]
			g.Holders = append(g.Holders, h)
			devices = append(devices, d)
		}
	}
	for k, a := range accounting.Allocated(devices, capacity) {
		g := gpus[k]
		g.AllocatedMemoryBytes, g.AllocatedCores = a.MemoryBytes, a.Cores
		switch {
		case a.Whole:
			g.Mode = ModeWhole
		case a.Shares > 0:
			g.Mode = ModeShared
		}
	}

	byNode := map[string]*Node{}
	for k, g := range gpus {
		name := nodeOf[k.Pool]
		if byNode[name] == nil {
			byNode[name] = &Node{Name: name}
		}
		slices.SortFunc(g.Holders, compareHolders)
		if g.Lending != nil {
			slices.SortFunc(g.Lending.Borrowers, compareHolders)
		}
		finishMIG(g, migDevices)
		byNode[name].GPUs = append(byNode[name].GPUs, *g)
	}
	var r Report
	for _, n := range byNode {
		slices.SortFunc(n.GPUs, func(a, b GPU) int { return cmp.Compare(a.Minor, b.Minor) })
		r.Nodes = append(r.Nodes, *n)
	}
	slices.SortFunc(r.Nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
	if r.Nodes == nil {
		r.Nodes = []Node{}
	}
	return r
}

func compareHolders(a, b Holder) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(strings.Join(a.Pods, ","), strings.Join(b.Pods, ",")),
		cmp.Compare(a.Claim, b.Claim), cmp.Compare(a.ShareID, b.ShareID))
}

// lendingOf reads a lending device: Lent when it has no lending taint.
func lendingOf(d resourceapi.Device) *Lending {
	l := &Lending{Phase: "Lent", Borrowers: []Holder{}}
	for _, t := range d.Taints {
		if t.Key == model.NotLentTaintKey {
			l.Phase = t.Value
		}
	}
	if c, ok := d.Capacity[model.Memory]; ok {
		l.LendableBytes = c.Value.Value()
	}
	return l
}

// borrower is the holder of a result on a lending device (gpu-N-lent) and
// the GPU it borrows from; ok is false for every other result.
func borrower(c resourceapi.ResourceClaim, pods []string, res resourceapi.DeviceRequestAllocationResult) (Holder, accounting.GPU, bool) {
	if res.Driver != model.DriverName {
		return Holder{}, accounting.GPU{}, false
	}
	minor, kind, err := model.ParseDevice(res.Device)
	if err != nil || kind != model.KindLent {
		return Holder{}, accounting.GPU{}, false
	}
	h := Holder{Namespace: c.Namespace, Claim: c.Name, Pods: pods, Device: res.Device, AdminAccess: res.AdminAccess != nil && *res.AdminAccess}
	if res.ShareID != nil {
		h.ShareID = string(*res.ShareID)
	}
	if q, ok := res.ConsumedCapacity[model.Memory]; ok {
		h.MemoryBytes = q.Value()
	}
	if q, ok := res.ConsumedCapacity[model.Cores]; ok {
		h.Cores = q.Value()
	}
	h.Attestation, h.PrepareError = deviceStatus(c.Status.Devices, res)
	return h, accounting.GPU{Pool: res.Pool, Minor: minor}, true
}

// deviceStatus reads the plugin's status.devices entry of the allocation
// result res: its attestation when the device's Ready condition is True, the
// condition's message when it is False. Data that does not decode as a
// GpuAttestation (another writer's) counts as none.
func deviceStatus(devices []resourceapi.AllocatedDeviceStatus, res resourceapi.DeviceRequestAllocationResult) (*configapi.GpuAttestation, string) {
	for _, d := range devices {
		if d.Driver != res.Driver || d.Pool != res.Pool || d.Device != res.Device ||
			(d.ShareID == nil) != (res.ShareID == nil) || (d.ShareID != nil && *d.ShareID != string(*res.ShareID)) {
			continue
		}
		ready := meta.FindStatusCondition(d.Conditions, readyCondition)
		switch {
		case ready == nil:
			return nil, ""
		case ready.Status == metav1.ConditionFalse:
			return nil, ready.Message
		case ready.Status != metav1.ConditionTrue || d.Data == nil || len(d.Data.Raw) == 0:
			return nil, ""
		}
		a, err := configapi.DecodeAttestationLenient(d.Data.Raw)
		if err != nil {
			return nil, ""
		}
		return a, ""
	}
	return nil, ""
}

// readyCondition is pkg/plugin's ConditionReady (not imported: status runs
// on laptops and must not pull in the plugin).
const readyCondition = "Ready"

func stringAttr(d resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}
