package plugin

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/health"
)

// lockedPublisher records publications; safe for the inventory's goroutine.
type lockedPublisher struct {
	mu   sync.Mutex
	last resourceslice.DriverResources
	n    int
}

func (p *lockedPublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last, p.n = r, p.n+1
	return nil
}

// taints returns the taints of every device in the last publication that has any.
func (p *lockedPublisher) taints() map[string][]resourceapi.DeviceTaint {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string][]resourceapi.DeviceTaint{}
	for _, pool := range p.last.Pools {
		for _, s := range pool.Slices {
			for _, d := range s.Devices {
				if len(d.Taints) > 0 {
					out[d.Name] = d.Taints
				}
			}
		}
	}
	return out
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last: %s", what, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// unhealthyDevices of a report, by device name → message.
func unhealthyDevices(r kubeletplugin.DeviceHealthReport) map[string]string {
	out := map[string]string{}
	for _, d := range r.Devices {
		if d.Health != kubeletplugin.HealthStatusHealthy {
			out[d.DeviceName] = string(d.Health) + ": " + d.Message
		}
	}
	return out
}

// TestHealthTaintsAndReports runs the whole health path over a mock node:
// injected NVML events → watcher → tracker → tainted devices in the published
// slices and Unhealthy devices in the kubelet's health stream; after the
// recovery period without errors both clear.
func TestHealthTaintsAndReports(t *testing.T) {
	ctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	node, err := gpu.NewMockNode("hgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := gpu.Discover(node)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	policy := health.DefaultPolicy()
	tracker := health.NewTracker(policy, clk)

	e := newEnv(t)
	p := e.start(func(o *Options) {
		o.GPUs = gpus
		o.Health = tracker
		o.HealthResend = 20 * time.Millisecond
	})
	pub := &lockedPublisher{}
	inv := &Inventory{NodeName: testNode, DiscoverNode: NVMLDiscovery(node, nil),
		Publisher: pub, OnChange: p.SetGPUs, Taints: tracker.Taints}
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { inv.Run(ctx, time.Hour) })
	wg.Go(func() { FollowHealth(ctx, tracker, inv) })
	watcherDone := make(chan error, 1)
	wg.Go(func() {
		watcherDone <- (&health.Watcher{Lib: node, Tracker: tracker, WaitTimeout: 10 * time.Millisecond}).Run(ctx)
	})

	reports := make(chan kubeletplugin.DeviceHealthReport)
	var mu sync.Mutex
	var last kubeletplugin.DeviceHealthReport
	streamDone := make(chan error, 1)
	wg.Go(func() { streamDone <- p.WatchHealthStatus(ctx, reports) })
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case r := <-reports:
				mu.Lock()
				last = r
				mu.Unlock()
			}
		}
	})
	lastReport := func() kubeletplugin.DeviceHealthReport {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
	eventually(t, "the initial report", func() (bool, string) {
		r := lastReport()
		return len(r.Devices) == 16 && len(unhealthyDevices(r)) == 0, fmt.Sprint(r)
	})

	// Wait for the watcher to register, then inject: an ignored XID and a fatal one.
	eventually(t, "the watcher to register", func() (bool, string) {
		n, err := node.InjectXID(7, 13)
		return err == nil && n > 0, fmt.Sprint(n, err)
	})
	if _, err := node.InjectXID(3, 79); err != nil {
		t.Fatal(err)
	}
	want := resourceapi.DeviceTaint{Key: health.TaintKey, Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoExecute}
	eventually(t, "gpu-3's devices to be tainted in the published slices", func() (bool, string) {
		got := pub.taints()
		ok := len(got) == 2 && len(got["gpu-3"]) == 1 && got["gpu-3"][0] == want &&
			len(got["gpu-3-shared"]) == 1 && got["gpu-3-shared"][0] == want
		return ok, fmt.Sprint(got)
	})
	eventually(t, "the health stream to report gpu-3 unhealthy", func() (bool, string) {
		u := unhealthyDevices(lastReport())
		return len(u) == 2 && u["gpu-3"] != "" && u["gpu-3-shared"] != "", fmt.Sprint(u)
	})
	t.Logf("reported: %s", unhealthyDevices(lastReport())["gpu-3"])

	// Quiet for the recovery period: both clear.
	clk.SetTime(clk.Now().Add(policy.RecoveryPeriod))
	eventually(t, "the taints to clear", func() (bool, string) {
		got := pub.taints()
		return len(got) == 0, fmt.Sprint(got)
	})
	eventually(t, "the health stream to report every device healthy", func() (bool, string) {
		r := lastReport()
		return len(r.Devices) == 16 && len(unhealthyDevices(r)) == 0, fmt.Sprint(unhealthyDevices(r))
	})

	cancel()
	if err := <-streamDone; err != nil {
		t.Errorf("WatchHealthStatus: %v", err)
	}
	if err := <-watcherDone; err != nil {
		t.Errorf("watcher: %v", err)
	}
}

// Without a tracker the plugin declines health reporting as the helper expects.
func TestWatchHealthStatusNotSupported(t *testing.T) {
	p := newEnv(t).start(nil)
	if err := p.WatchHealthStatus(ctxFor(t), make(chan kubeletplugin.DeviceHealthReport)); err != kubeletplugin.ErrHealthNotSupported {
		t.Errorf("got %v, want ErrHealthNotSupported", err)
	}
}

// A discovery failure (a GPU lost from the bus) must not hold back its taint.
func TestInventoryPublishesTaintsWhenDiscoveryFails(t *testing.T) {
	gpus := testGPUs()
	var discoverErr error
	taints := map[string][]resourceapi.DeviceTaint{}
	pub := &lockedPublisher{}
	inv := &Inventory{NodeName: testNode, Publisher: pub,
		DiscoverNode: func() (gpu.Discovery, error) { return gpu.Discovery{GPUs: gpus}, discoverErr },
		Taints:       func() map[string][]resourceapi.DeviceTaint { return taints }}
	ctx := ctxFor(t)
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	discoverErr = fmt.Errorf("GPU index 1: nvmlDeviceGetMemoryInfo: GPU is lost")
	taints = map[string][]resourceapi.DeviceTaint{uuidOf(1): {{Key: health.TaintKey, Value: "GPULost", Effect: resourceapi.DeviceTaintEffectNoExecute}}}
	changed, err := inv.Sync(ctx)
	if err == nil || !changed {
		t.Fatalf("changed %v, err %v; want a publication and the discovery error", changed, err)
	}
	if got := pub.taints(); len(got) != 2 || got["gpu-1"] == nil || got["gpu-1-shared"] == nil {
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
	old.Observe(health.Event{UUID: uuidOf(1), Kind: health.KindXID, XID: 79})

	clk.SetTime(clk.Now().Add(time.Minute))
	young := health.NewTracker(health.DefaultPolicy(), clk)
	young.Persist(ctx, store)
	pub := &lockedPublisher{}
	inv := &Inventory{NodeName: testNode, Publisher: pub, Taints: HealthTaints(young),
		DiscoverNode: func() (gpu.Discovery, error) { return gpu.Discovery{GPUs: testGPUs()}, nil }}
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	fatal := resourceapi.DeviceTaint{Key: health.TaintKey, Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoExecute}
	if got := pub.taints(); len(got) != 2 || len(got["gpu-1"]) != 1 || got["gpu-1"][0] != fatal {
		t.Fatalf("the new instance publishes %v, want gpu-1's devices tainted %v", got, fatal)
	}

	// A fault only the old instance saw (it registered for events first).
	old.Observe(health.Event{UUID: uuidOf(2), Kind: health.KindXID, XID: 94})
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("sync: changed %v, err %v", changed, err)
	}
	if got := pub.taints(); len(got) != 4 || len(got["gpu-2-shared"]) != 1 || got["gpu-2-shared"][0].Value != "XID-94" {
		t.Errorf("after the old instance's fault the new one publishes %v", got)
	}
	if o, y := old.Taints(), young.Taints(); !reflect.DeepEqual(o, y) {
		t.Errorf("taints differ:\nold   %v\nyoung %v", o, y)
	}
}
