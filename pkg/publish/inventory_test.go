package publish

import (
	"errors"
	"maps"
	"slices"
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

// TestInventorySync publishes at first sync and then only when discovery
// finds something different; a discovery error keeps the last publication.
func TestInventorySync(t *testing.T) {
	gpus := publishtest.GPUs()
	var discoverErr error
	pub := &publishtest.Publisher{}
	var seen [][]gpu.GPU
	inv := &Inventory{
		NodeName:     testNode,
		DiscoverNode: func() (gpu.Discovery, error) { return gpu.Discovery{GPUs: gpus}, discoverErr },
		Publisher:    pub,
		OnChange:     func(g []gpu.GPU) { seen = append(seen, g) },
	}
	ctx := ctxFor(t)
	for step, want := range []bool{true, false, false} {
		changed, err := inv.Sync(ctx)
		if err != nil || changed != want {
			t.Fatalf("sync %d: changed %v err %v, want changed %v", step, changed, err, want)
		}
	}
	gpus = gpus[:3] // a GPU fell off the bus
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("after losing a GPU: changed %v err %v", changed, err)
	}
	discoverErr = errors.New("nvml gone")
	if _, err := inv.Sync(ctx); err == nil {
		t.Fatal("discovery error not returned")
	}
	if len(pub.Published) != 2 || len(seen) != 2 || len(seen[1]) != 3 {
		t.Errorf("published %d times, OnChange %d times", len(pub.Published), len(seen))
	}
}

// One GPU that fails discovery does not stop the node: the others are
// published, the broken one is reported (event, status, metrics) and, once
// its facts are known, published tainted; it comes back untainted.
func TestInventoryBrokenGPU(t *testing.T) {
	ctx := ctxFor(t)
	node := gputest.MockNode(t, "hgx-h100")
	// Broken from the start: its memory size cannot be read, so it cannot
	// be published.
	if err := node.FailDiscovery(3, "nvmlDeviceGetMemoryInfo", nvml.ERROR_UNKNOWN); err != nil {
		t.Fatal(err)
	}
	pub, events := &publishtest.Publisher{}, &publishtest.Events{}
	var seen [][]gpu.GPU
	inv := &Inventory{NodeName: testNode, DiscoverNode: NVMLDiscovery(node, nil), Publisher: pub, Events: events,
		OnChange: func(g []gpu.GPU) { seen = append(seen, g) }}
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("first sync: changed %v, err %v; want a publication without error", changed, err)
	}
	devs, _ := pub.Devices(t)
	if len(devs) != 14 || devs["gpu-3"] != nil || devs["gpu-2"] != nil || len(devs["gpu-2-shared"]) != 0 {
		t.Errorf("published %d devices %v, want the 7 healthy GPUs' 14, untainted", len(devs), slices.Sorted(maps.Keys(devs)))
	}
	if _, ok := devs["gpu-3"]; ok {
		t.Error("gpu-3 published although it could not be described")
	}
	if len(seen) != 1 || len(seen[0]) != 7 {
		t.Errorf("OnChange got %d inventories", len(seen))
	}
	uuid3, _ := node.Devices[3].GetUUID()
	if !publishtest.HasEvent(events.List(), "Warning GPUDiscoveryFailed", "GPU index 3 ("+uuid3+")", "nvmlDeviceGetMemoryInfo", "not published") {
		t.Errorf("events %q, want a Warning GPUDiscoveryFailed for GPU index 3", events.List())
	}
	if s := inv.Status(); !strings.HasPrefix(s, "ok: 7 GPUs published; GPU index 3") {
		t.Errorf("status %q", s)
	}
	snap := inv.DiscoverySnapshot()
	if !snap.Up || snap.GPUs != 7 || snap.Errors != 1 || len(snap.Failed) != 1 || snap.Failed[0] != (metrics.FailedGPU{Index: 3, UUID: uuid3}) {
		t.Errorf("metrics snapshot %+v", snap)
	}
	// The same failure again: no new event, nothing republished.
	n := len(events.List())
	if changed, err := inv.Sync(ctx); err != nil || changed || len(events.List()) != n {
		t.Errorf("unchanged failure: changed %v, err %v, events %q", changed, err, events.List()[n:])
	}

	// It recovers: published, reported.
	if err := node.FailDiscovery(3, "nvmlDeviceGetMemoryInfo", nvml.SUCCESS); err != nil {
		t.Fatal(err)
	}
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("after recovery: changed %v, err %v", changed, err)
	}
	if devs, _ := pub.Devices(t); len(devs) != 16 || devs["gpu-3"] != nil {
		t.Errorf("after recovery: %d devices, gpu-3 taints %v", len(devs), devs["gpu-3"])
	}
	if !publishtest.HasEvent(events.List(), "Normal GPUDiscoveryRecovered", "GPU index 3") {
		t.Errorf("events %q, want GPUDiscoveryRecovered", events.List())
	}
	if s := inv.Status(); s != "ok: 8 GPUs published" {
		t.Errorf("status %q", s)
	}

	// It breaks again, now with its facts known: published, tainted.
	if err := node.FailDiscovery(3, "nvmlDeviceGetMemoryInfo", nvml.ERROR_GPU_IS_LOST); err != nil {
		t.Fatal(err)
	}
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("broken again: changed %v, err %v", changed, err)
	}
	devs, _ = pub.Devices(t)
	if len(devs) != 16 {
		t.Errorf("broken again: %d devices, want 16", len(devs))
	}
	for _, name := range []string{"gpu-3", "gpu-3-shared"} {
		if got := devs[name]; len(got) != 1 || got[0] != DiscoveryFailedTaint {
			t.Errorf("%s taints %v, want %v", name, got, DiscoveryFailedTaint)
		}
	}
	if devs["gpu-4"] != nil {
		t.Errorf("gpu-4 tainted: %v", devs["gpu-4"])
	}
	if !publishtest.HasEvent(events.List(), "Warning GPUDiscoveryFailed", "GPU index 3", "published as gpu-3 with taint gpu.tessera.dev/unhealthy=DiscoveryFailed:NoSchedule") {
		t.Errorf("events %q", events.List())
	}
	if g := seen[len(seen)-1]; len(g) != 8 || g[3].UUID != uuid3 || g[3].NVLinkDomain != "" {
		t.Errorf("OnChange: %d GPUs, gpu-3 %+v; want all 8, gpu-3 in no NVLink domain", len(g), g[3])
	}
	if snap := inv.DiscoverySnapshot(); len(snap.Failed) != 1 || !snap.Failed[0].Published {
		t.Errorf("metrics snapshot %+v", snap)
	}
}

// A GPU that fails late in discovery, never described before, is published
// tainted with the facts that were read; its health taints stay.
func TestInventoryPartlyDescribedGPU(t *testing.T) {
	ctx := ctxFor(t)
	node := gputest.MockNode(t, "l4x4")
	if err := node.FailDiscovery(1, "nvmlDeviceGetPciInfo", nvml.ERROR_UNKNOWN); err != nil {
		t.Fatal(err)
	}
	uuid1, _ := node.Devices[1].GetUUID()
	xid := resourceapi.DeviceTaint{Key: health.TaintKey, Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoExecute}
	pub := &publishtest.Publisher{}
	inv := &Inventory{NodeName: testNode, DiscoverNode: NVMLDiscovery(node, nil), Publisher: pub,
		Taints: func() map[string][]resourceapi.DeviceTaint { return map[string][]resourceapi.DeviceTaint{uuid1: {xid}} }}
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	devs, _ := pub.Devices(t)
	if got := devs["gpu-1"]; len(devs) != 8 || !slices.Equal(got, []resourceapi.DeviceTaint{xid, DiscoveryFailedTaint}) {
		t.Errorf("%d devices, gpu-1 taints %v; want 8 and the XID and discovery taints", len(devs), got)
	}
}
