package publish

import (
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

// A discovery failure (a GPU lost from the bus) must not hold back its taint.
func TestInventoryPublishesTaintsWhenDiscoveryFails(t *testing.T) {
	gpus := publishtest.GPUs()
	var discoverErr error
	taints := map[string][]resourceapi.DeviceTaint{}
	pub := &publishtest.LockedPublisher{}
	inv := &Inventory{NodeName: testNode, Publisher: pub,
		DiscoverNode: func() (gpu.Discovery, error) { return gpu.Discovery{GPUs: gpus}, discoverErr },
		Taints:       func() map[string][]resourceapi.DeviceTaint { return taints }}
	ctx := ctxFor(t)
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	discoverErr = fmt.Errorf("GPU index 1: nvmlDeviceGetMemoryInfo: GPU is lost")
	taints = map[string][]resourceapi.DeviceTaint{publishtest.UUID(1): {{Key: health.TaintKey, Value: "GPULost", Effect: resourceapi.DeviceTaintEffectNoExecute}}}
	changed, err := inv.Sync(ctx)
	if err == nil || !changed {
		t.Fatalf("changed %v, err %v; want a publication and the discovery error", changed, err)
	}
	if got := pub.Taints(); len(got) != 2 || got["gpu-1"] == nil || got["gpu-1-shared"] == nil {
		t.Errorf("published taints %v", got)
	}
	if changed, _ := inv.Sync(ctx); changed {
		t.Error("republished without a change")
	}
}

// The two instances of a surge rolling update publish the same taints: the
// new one starts with the old one's faults (the state file in the data
// directory), and picks up later faults at its next inventory sync.
func TestHealthTaintsSharedBetweenInstances(t *testing.T) {
	ctx := ctxFor(t)
	store := health.Store{Path: filepath.Join(t.TempDir(), health.StateFile)}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	old := health.NewTracker(health.DefaultPolicy(), clk)
	old.Persist(ctx, store)
	old.Observe(health.Event{UUID: publishtest.UUID(1), Kind: health.KindXID, XID: 79})

	clk.SetTime(clk.Now().Add(time.Minute))
	young := health.NewTracker(health.DefaultPolicy(), clk)
	young.Persist(ctx, store)
	pub := &publishtest.LockedPublisher{}
	inv := &Inventory{NodeName: testNode, Publisher: pub, Taints: HealthTaints(young),
		DiscoverNode: func() (gpu.Discovery, error) { return gpu.Discovery{GPUs: publishtest.GPUs()}, nil }}
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	fatal := resourceapi.DeviceTaint{Key: health.TaintKey, Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoExecute}
	if got := pub.Taints(); len(got) != 2 || len(got["gpu-1"]) != 1 || got["gpu-1"][0] != fatal {
		t.Fatalf("the new instance publishes %v, want gpu-1's devices tainted %v", got, fatal)
	}

	// A fault only the old instance saw (it registered for events first).
	old.Observe(health.Event{UUID: publishtest.UUID(2), Kind: health.KindXID, XID: 94})
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("sync: changed %v, err %v", changed, err)
	}
	if got := pub.Taints(); len(got) != 4 || len(got["gpu-2-shared"]) != 1 || got["gpu-2-shared"][0].Value != "XID-94" {
		t.Errorf("after the old instance's fault the new one publishes %v", got)
	}
	if o, y := old.Taints(), young.Taints(); !reflect.DeepEqual(o, y) {
		t.Errorf("taints differ:\nold   %v\nyoung %v", o, y)
	}
}
