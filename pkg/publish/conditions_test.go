package publish

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/metrics"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

// What discovery finds wrong with a GPU it described is never silent: a MIG
// GPU is published as MIG devices only (none while it has no instance), with
// an event, a status line and a metric; a GPU waiting
// for the NVLink fabric or in the wrong compute mode is published tainted;
// a GPU whose NVLink queries fail is published in a domain of its own. Each
// taint goes once the GPU is fixed, with an event.
func TestInventoryConditions(t *testing.T) {
	ctx := ctxFor(t)
	node := gputest.MockNode(t, "hgx-h100")
	mustDo := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	mustDo(node.SetMIG(1, true))
	mustDo(node.SetFabric(2, gpu.FabricNotStarted))
	mustDo(node.SetComputeMode(3, gpu.ComputeModeExclusiveProcess))
	mustDo(node.FailDiscovery(4, "nvmlDeviceGetNvLinkState", nvml.ERROR_UNKNOWN))
	uuid := func(i int) string { u, _ := node.Devices[i].GetUUID(); return u }

	pub, events := &publishtest.Publisher{}, &publishtest.Events{}
	inv := &Inventory{NodeName: testNode, DiscoverNode: NVMLDiscovery(node, nil), Publisher: pub, Events: events}
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("first sync: changed %v, err %v", changed, err)
	}
	devs, _ := pub.Devices(t)
	if _, ok := devs["gpu-1"]; ok || len(devs) != 14 {
		t.Errorf("published %d devices (gpu-1 among them: %v), want the 7 GPUs not in MIG mode (GPU 1 has no MIG instance)", len(devs), ok)
	}
	taint := func(value string) resourceapi.DeviceTaint {
		return resourceapi.DeviceTaint{Key: health.TaintKey, Value: value, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	}
	for name, want := range map[string]string{
		"gpu-2": "FabricNotReady", "gpu-2-shared": "FabricNotReady",
		"gpu-3": "ComputeModeExclusiveProcess", "gpu-3-shared": "ComputeModeExclusiveProcess",
	} {
		if got := devs[name]; len(got) != 1 || got[0] != taint(want) {
			t.Errorf("%s taints %v, want %v", name, got, taint(want))
		}
	}
	for _, name := range []string{"gpu-0", "gpu-4", "gpu-4-shared"} {
		if devs[name] != nil {
			t.Errorf("%s tainted: %v", name, devs[name])
		}
	}
	list := events.List()
	for _, e := range []struct{ reason, gpu, says string }{
		{"Warning GPUMIGEnabled", "GPU index 1 (" + uuid(1) + ")", "published as MIG devices only"},
		{"Warning GPUFabricNotReady", "GPU index 2 (" + uuid(2) + ")", "NotStarted"},
		{"Warning GPUComputeMode", "GPU index 3 (" + uuid(3) + ")", "compute mode is ExclusiveProcess, Tessera expects Default"},
		{"Warning GPUNVLinkUnknown", "GPU index 4 (" + uuid(4) + ")", "nvmlDeviceGetNvLinkState"},
	} {
		if !publishtest.HasEvent(list, e.reason, e.gpu, e.says) {
			t.Errorf("events %q, want %s for %s saying %q", list, e.reason, e.gpu, e.says)
		}
	}
	status := inv.Status()
	for _, s := range []string{"ok: 8 GPUs published (1 as MIG devices)", "GPU index 1 (" + uuid(1) + "): MIGEnabled;",
		"GPU index 2 (" + uuid(2) + "): FabricNotReady, published with taint gpu.tessera.dev/unhealthy=FabricNotReady:NoSchedule"} {
		if !strings.Contains(status, s) {
			t.Errorf("status %q does not say %q", status, s)
		}
	}
	snap := inv.DiscoverySnapshot()
	if len(snap.Conditions) != 4 || snap.Conditions[0] != (metrics.GPUCondition{Index: 1, UUID: uuid(1), Reason: "MIGEnabled", Published: true}) {
		t.Errorf("metrics conditions %+v", snap.Conditions)
	}
	// Unchanged: no new event, nothing republished.
	n := len(events.List())
	if changed, err := inv.Sync(ctx); err != nil || changed || len(events.List()) != n {
		t.Errorf("unchanged: changed %v, err %v, new events %q", changed, err, events.List()[n:])
	}

	// The Fabric Manager registers GPU 2; the admin puts GPU 3 back.
	mustDo(node.SetFabric(2, gpu.FabricCompleted))
	mustDo(node.SetComputeMode(3, gpu.ComputeModeDefault))
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("after the fix: changed %v, err %v", changed, err)
	}
	devs, _ = pub.Devices(t)
	for _, name := range []string{"gpu-2", "gpu-2-shared", "gpu-3", "gpu-3-shared"} {
		if devs[name] != nil {
			t.Errorf("after the fix: %s taints %v", name, devs[name])
		}
	}
	for _, reason := range []string{"FabricNotReady", "ComputeMode"} {
		if !publishtest.HasEvent(events.List(), "Normal GPUConditionCleared", reason+" no longer holds") {
			t.Errorf("events %q, want GPUConditionCleared for %s", events.List(), reason)
		}
	}
	if publishtest.HasEvent(events.List(), "Normal GPUConditionCleared", "MIGEnabled") {
		t.Errorf("MIG cleared although GPU 1 is still in MIG mode: %q", events.List())
	}
}

// A GPU the node expects in another mode (an MPS-dedicated GPU) is not
// tainted for being in it.
func TestInventoryExpectedComputeMode(t *testing.T) {
	ctx := ctxFor(t)
	node := gputest.MockNode(t, "l4x4")
	if err := node.SetComputeMode(0, gpu.ComputeModeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	pub := &publishtest.Publisher{}
	inv := &Inventory{NodeName: testNode, DiscoverNode: NVMLDiscovery(node, nil), Publisher: pub,
		ComputeModes: gpu.ComputeModePolicy{PerGPU: func(g gpu.GPU) (gpu.ComputeMode, bool) { return gpu.ComputeModeExclusiveProcess, g.Index == 0 }}}
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if devs, _ := pub.Devices(t); devs["gpu-0"] != nil || devs["gpu-1"] != nil {
		t.Errorf("taints gpu-0 %v gpu-1 %v, want none", devs["gpu-0"], devs["gpu-1"])
	}
}

// Every GPU in MIG mode and without instances: no device is published, the
// GPUs are counted as published as MIG devices, and the node does not claim
// that NVML sees no GPU.
func TestInventoryAllMIG(t *testing.T) {
	ctx := ctxFor(t)
	node := gputest.MockNode(t, "a100-pairs")
	for i := range node.Devices {
		if err := node.SetMIG(i, true); err != nil {
			t.Fatal(err)
		}
	}
	events := &publishtest.Events{}
	inv := &Inventory{NodeName: testNode, DiscoverNode: NVMLDiscovery(node, nil), Publisher: &publishtest.Publisher{}, Events: events}
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if publishtest.HasEvent(events.List(), "Warning NoGPUs", "NVML reports no GPU") {
		t.Errorf("events %q: NoGPUs although NVML reports 4", events.List())
	}
	if s := inv.Status(); !strings.HasPrefix(s, "ok: 4 GPUs published (4 as MIG devices); GPU index 0") {
		t.Errorf("status %q", s)
	}
}
