package clusterview

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/internal/cli/clitest"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/model"
)

// tableHas checks that r's table, its white space folded, has every line
// of want.
func tableHas(t *testing.T, r Report, want ...string) {
	t.Helper()
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	squeeze := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	text := squeeze(table.String())
	for _, w := range want {
		if !strings.Contains(text, squeeze(w)) {
			t.Errorf("table lacks %q", w)
		}
	}
}

// published returns the ResourceSlices node publishes for a mock profile,
// with gpu-3 tainted unhealthy.
func published(t *testing.T, node, profile string) []runtime.Object {
	t.Helper()
	gpus := gputest.GPUs(t, profile)
	slices := clitest.Slices(t, node, gpus, model.WithTaints(map[string][]resourceapi.DeviceTaint{
		gpus[3].UUID: {{Key: unhealthyTaint, Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoExecute}},
	}))
	var out []runtime.Object
	for i := range slices {
		slices[i].Name = slices[i].GenerateName + "x"
		out = append(out, &slices[i])
	}
	return out
}

func shareResult(node, device, shareID, memory, cores string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{
		Request: "gpu", Driver: model.DriverName, Pool: node, Device: device, ShareID: ptr.To(types.UID(shareID)),
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory), "cores": resource.MustParse(cores)},
	}
}

func allocated(ns, name string, pods []string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name)}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID(p)})
	}
	return c
}

func TestStatus(t *testing.T) {
	objs := published(t, "node-a", "hgx-h100")
	objs = append(objs, published(t, "node-b", "l4x4")...)
	objs = append(objs,
		allocated("demo", "quarter-0-gpu", []string{"quarter-0"}, shareResult("node-a", "gpu-0-shared", "s0", "19Gi", "25")),
		allocated("demo", "quarter-1-gpu", []string{"quarter-1"}, shareResult("node-a", "gpu-0-shared", "s1", "19Gi", "25")),
		allocated("demo", "shared", []string{"reader", "writer"}, shareResult("node-a", "gpu-0-shared", "s2", "10Gi", "0")),
		allocated("ml", "whole", []string{"train"}, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: model.DriverName, Pool: "node-a", Device: "gpu-7"}),
		allocated("ml", "other-driver", []string{"x"}, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: "example.com", Pool: "node-a", Device: "gpu-1"}),
		&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "pending"}},
	)
	client := fake.NewClientset(objs...)

	r, err := Get(context.Background(), client, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Nodes) != 2 || r.Nodes[0].Name != "node-a" || len(r.Nodes[0].GPUs) != 8 || len(r.Nodes[1].GPUs) != 4 {
		t.Fatalf("nodes: %+v", r.Nodes)
	}
	g0 := r.Nodes[0].GPUs[0]
	if g0.Device != "gpu-0" || g0.Mode != ModeShared || g0.AllocatedMemoryBytes != 48<<30 || g0.AllocatedCores != 50 || len(g0.Holders) != 3 {
		t.Errorf("gpu-0: %+v", g0)
	}
	if g0.ProductName != "NVIDIA H100 80GB HBM3" || g0.MemoryBytes != (81559-470)<<20 || g0.Cores != 100 || !g0.Healthy {
		t.Errorf("gpu-0 facts: %+v", g0)
	}
	if h := g0.Holders[0]; h.Namespace != "demo" || h.Pods[0] != "quarter-0" || h.Claim != "quarter-0-gpu" || h.MemoryBytes != 19<<30 {
		t.Errorf("first holder: %+v", h)
	}
	g7 := r.Nodes[0].GPUs[7]
	if g7.Mode != ModeWhole || g7.AllocatedMemoryBytes != g7.MemoryBytes || g7.AllocatedCores != 100 || g7.Holders[0].Pods[0] != "train" {
		t.Errorf("gpu-7: %+v", g7)
	}
	if g1 := r.Nodes[0].GPUs[1]; g1.Mode != ModeFree || len(g1.Holders) != 0 {
		t.Errorf("gpu-1 (claimed by another driver only): %+v", g1)
	}
	if g3 := r.Nodes[0].GPUs[3]; g3.Healthy || len(g3.Taints) != 1 {
		t.Errorf("gpu-3: %+v", g3)
	}

	tableHas(t, r,
		"node-a gpu-0 NVIDIA H100 80GB HBM3 48Gi/79.2Gi 50/100 Healthy demo/quarter-0",
		"demo/quarter-0 (claim quarter-0-gpu: 19Gi, 25 cores; not attested)",
		"demo/reader,writer (claim shared: 10Gi, 0 cores; not attested)",
		"node-a gpu-3 NVIDIA H100 80GB HBM3 0/79.2Gi 0/100 Unhealthy(XID-79:NoExecute) -",
		"node-a gpu-7 NVIDIA H100 80GB HBM3 79.2Gi/79.2Gi 100/100 Healthy ml/train",
		"ml/train (claim whole: whole GPU)",
		"node-b gpu-3 NVIDIA L4")

	only, err := Get(context.Background(), client, "node-b")
	if err != nil || len(only.Nodes) != 1 || only.Nodes[0].Name != "node-b" {
		t.Errorf("--node node-b: %+v %v", only, err)
	}
	b, err := json.Marshal(only)
	if err != nil || !strings.Contains(string(b), `"mode":"free"`) {
		t.Errorf("json: %s %v", b, err)
	}
}

func TestBytes(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 512 << 20: "512Mi", 19 << 30: "19Gi", 81559 << 20: "79.6Gi", 1000: "1000"} {
		if got := Bytes(in); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", in, got, want)
		}
	}
}

// Admin access holds nothing of a GPU (not even the consumedCapacity the
// allocator writes into an admin-access share), and two shares of one claim
// add up: the rule of package accounting.
func TestStatusAccounting(t *testing.T) {
	objs := published(t, "node-a", "hgx-h100")
	admin := func(r resourceapi.DeviceRequestAllocationResult) resourceapi.DeviceRequestAllocationResult {
		r.Request, r.AdminAccess = "debug", ptr.To(true)
		return r
	}
	second := shareResult("node-a", "gpu-0-shared", "s2", "4Gi", "5")
	second.Request = "other"
	objs = append(objs,
		allocated("ml", "pair", []string{"train"}, shareResult("node-a", "gpu-0-shared", "s1", "8Gi", "10"), second),
		allocated("ops", "watch", nil,
			admin(shareResult("node-a", "gpu-0-shared", "s3", "1Gi", "1")),
			admin(resourceapi.DeviceRequestAllocationResult{Driver: model.DriverName, Pool: "node-a", Device: "gpu-5"})),
	)
	r, err := Get(context.Background(), fake.NewClientset(objs...), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	gpus := r.Nodes[0].GPUs
	if g := gpus[0]; g.Mode != ModeShared || g.AllocatedMemoryBytes != 12<<30 || g.AllocatedCores != 15 || len(g.Holders) != 3 {
		t.Errorf("gpu-0: %+v", g)
	}
	for _, h := range gpus[0].Holders {
		if h.AdminAccess && (h.MemoryBytes != 0 || h.Cores != 0) {
			t.Errorf("admin-access holder holds something: %+v", h)
		}
	}
	if g := gpus[5]; g.Mode != ModeFree || g.AllocatedMemoryBytes != 0 || g.AllocatedCores != 0 || len(g.Holders) != 1 || !g.Holders[0].AdminAccess {
		t.Errorf("gpu-5 (admin access only): %+v", g)
	}
}

// withDeviceStatus adds the plugin's status.devices entry for the claim's
// result i: Ready with its condition status and message, and data.
func withDeviceStatus(c *resourceapi.ResourceClaim, i int, ready metav1.ConditionStatus, message, data string) *resourceapi.ResourceClaim {
	r := c.Status.Allocation.Devices.Results[i]
	d := resourceapi.AllocatedDeviceStatus{Driver: r.Driver, Pool: r.Pool, Device: r.Device,
		Conditions: []metav1.Condition{{Type: "Ready", Status: ready, Reason: "X", Message: message}}}
	if r.ShareID != nil {
		d.ShareID = ptr.To(string(*r.ShareID))
	}
	if data != "" {
		d.Data = &runtime.RawExtension{Raw: []byte(data)}
	}
	c.Status.Devices = append(c.Status.Devices, d)
	return c
}

// TestStatusAttestation: each holder carries what the plugin attested in
// its claim's status (backend, limits, whether enforced) or why prepare
// failed, matched by device and share; the table says it per share.
func TestStatusAttestation(t *testing.T) {
	objs := published(t, "node-a", "hgx-h100")
	const head = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuAttestation","node":"node-a","uuid":"GPU-x",`
	mps := allocated("demo", "mps", []string{"mps-pod"}, shareResult("node-a", "gpu-0-shared", "s1", "16Gi", "30"))
	mps = withDeviceStatus(mps, 0, metav1.ConditionTrue, "prepared", head+
		`"isolation":"MPS","memory":17179869184,"cores":30,"memoryLimit":17179869184,"coresLimit":50,"enforced":{"memory":true,"cores":true},"newerField":1}`)
	advisory := allocated("demo", "advisory", []string{"adv-pod"}, shareResult("node-a", "gpu-0-shared", "s2", "8Gi", "10"))
	advisory = withDeviceStatus(advisory, 0, metav1.ConditionTrue, "prepared", head+
		`"isolation":"Advisory","memory":8589934592,"cores":10,"memoryLimit":8589934592,"coresLimit":10,"enforced":{"memory":false,"cores":false}}`)
	// An earlier plugin's data: no kind, read all the same.
	old := allocated("demo", "old", []string{"old-pod"}, shareResult("node-a", "gpu-0-shared", "s3", "4Gi", "5"))
	old = withDeviceStatus(old, 0, metav1.ConditionTrue, "prepared", `{"uuid":"GPU-x","memoryLimit":4294967296,"coresLimit":5,"isolation":"Advisory"}`)
	failed := allocated("demo", "failed", []string{"failed-pod"}, shareResult("node-a", "gpu-1-shared", "s4", "8Gi", "10"))
	failed = withDeviceStatus(failed, 0, metav1.ConditionFalse,
		"claim demo/failed: device gpu-1-shared: isolation HAMiCore: library /var/lib/tessera/hami/libvgpu.so (--hami-core-library): not found; "+
			"refusing to run the share without limits", "")
	// An entry of another share of the same device does not apply.
	pending := allocated("demo", "pending", []string{"pending-pod"}, shareResult("node-a", "gpu-1-shared", "s5", "8Gi", "10"))
	pending.Status.Devices = append(pending.Status.Devices, failed.Status.Devices...)
	whole := allocated("ml", "whole", []string{"train"}, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: model.DriverName, Pool: "node-a", Device: "gpu-7"})
	whole = withDeviceStatus(whole, 0, metav1.ConditionTrue, "prepared", head[:len(head)-1]+`}`)
	objs = append(objs, mps, advisory, old, failed, pending, whole)

	r, err := Get(context.Background(), fake.NewClientset(objs...), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	holders := map[string]Holder{}
	for _, g := range r.Nodes[0].GPUs {
		for _, h := range g.Holders {
			holders[h.Claim] = h
		}
	}
	if a := holders["mps"].Attestation; a == nil || a.Isolation != "MPS" || a.MemoryLimit != 16<<30 || a.CoresLimit != 50 || !a.Enforced.Cores {
		t.Errorf("mps holder attestation %+v", a)
	}
	if a := holders["old"].Attestation; a == nil || a.Isolation != "Advisory" || a.CoresLimit != 5 {
		t.Errorf("old holder attestation %+v", a)
	}
	if h := holders["failed"]; h.Attestation != nil || !strings.Contains(h.PrepareError, "--hami-core-library") {
		t.Errorf("failed holder %+v", h)
	}
	if h := holders["pending"]; h.Attestation != nil || h.PrepareError != "" {
		t.Errorf("pending holder took another share's status: %+v", h)
	}
	if a := holders["whole"].Attestation; a == nil || a.Isolation != "" {
		t.Errorf("whole holder attestation %+v", a)
	}

	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	for _, want := range []string{
		"demo/mps-pod (claim mps: 16Gi, 30 cores; MPS enforces memory 16Gi and compute 50%)",
		"demo/adv-pod (claim advisory: 8Gi, 10 cores; Advisory, not enforced: memory 8Gi and compute 10%)",
		"demo/old-pod (claim old: 4Gi, 5 cores; Advisory, not enforced: memory 4Gi and compute 5%)",
		"demo/failed-pod (claim failed: 8Gi, 10 cores; not prepared: claim demo/failed: device gpu-1-shared: isolation HAMiCore: library " +
			"/var/lib/tessera/hami/libvgpu.so (--hami-core-lib…)",
		"demo/pending-pod (claim pending: 8Gi, 10 cores; not attested)",
		"ml/train (claim whole: whole GPU)",
	} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	b, err := json.Marshal(r)
	if err != nil || !strings.Contains(string(b), `"attestation":{"kind":"GpuAttestation","apiVersion":"gpu.tessera.dev/v1alpha1"`) ||
		!strings.Contains(string(b), `"prepareError":"claim demo/failed`) {
		t.Errorf("json lacks the attestation or the prepare error: %s %v", b, err)
	}
}

func TestBudgetsTable(t *testing.T) {
	hard := resource.MustParse("40Gi")
	items := []configapi.GPUBudget{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "gpu"},
			Spec: configapi.GPUBudgetSpec{Hard: configapi.BudgetLimits{GPUs: ptr.To[int64](2)}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "gpu"},
			Spec: configapi.GPUBudgetSpec{Hard: configapi.BudgetLimits{Memory: &hard}, DeviceClassName: "shared.gpu.tessera.dev"},
			Status: configapi.GPUBudgetStatus{Used: configapi.BudgetAmount{Memory: resource.MustParse("30Gi"), Cores: 60},
				Pending: []configapi.PendingCharge{{Claim: "c", UID: "u"}}}},
	}
	var out strings.Builder
	if err := (Report{Budgets: Budgets(items)}).WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"NAMESPACE  BUDGET  CLASS                   MEMORY     CORES  GPUS  PENDING",
		"team-a     gpu     shared.gpu.tessera.dev  30Gi/40Gi  60/-   0/-   1",
		"team-b     gpu     -                       0/-        0/-    0/2   0",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
