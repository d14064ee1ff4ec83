package plugin

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/publish"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

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
	node, gpus := gputest.Node(t, "hgx-h100")
	clk := clocktesting.NewFakePassiveClock(time.Now())
	policy := health.DefaultPolicy()
	tracker := health.NewTracker(policy, clk)

	e := newEnv(t)
	p := e.start(func(o *Options) {
		o.GPUs = gpus
		o.Health = tracker
		o.HealthResend = 20 * time.Millisecond
	})
	pub := &publishtest.LockedPublisher{}
	inv := &publish.Inventory{NodeName: testNode, DiscoverNode: publish.NVMLDiscovery(node, nil),
		Publisher: pub, OnChange: p.SetGPUs, Taints: tracker.Taints}
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { inv.Run(ctx, time.Hour) })
	wg.Go(func() { publish.FollowHealth(ctx, tracker, inv) })
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
		got := pub.Taints()
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
		got := pub.Taints()
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
