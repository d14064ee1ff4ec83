package health

import (
	"context"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
)

// startWatcher runs a watcher over a fresh hgx-h100 mock node until the test
// ends and waits until it has registered its event set.
func startWatcher(t *testing.T, p Policy, clk *clocktesting.FakePassiveClock) (*gpu.MockNode, *Tracker) {
	t.Helper()
	node := gputest.MockNode(t, "hgx-h100")
	return node, watch(t, node, p, clk)
}

// watch runs a watcher over node until the test ends and waits until it has
// registered its event set.
func watch(t *testing.T, node *gpu.MockNode, p Policy, clk *clocktesting.FakePassiveClock) *Tracker {
	t.Helper()
	tr := NewTracker(p, clk)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	w := &Watcher{Lib: node, Tracker: tr, WaitTimeout: 10 * time.Millisecond}
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watcher: %v", err)
		}
	})
	// Registration is done once an injected (ignored) event reaches a set.
	waitFor(t, "the watcher to register", func() bool {
		n, err := node.InjectXID(len(node.Devices)-1, 13)
		return err == nil && n > 0
	})
	return tr
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func uuidOf(t *testing.T, node *gpu.MockNode, i int) string {
	uuid, ret := node.Devices[i].GetUUID()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return uuid
}

// Injected XIDs reach the tracker through NVML's event API; ignored ones do
// not; the GPU recovers after the quiet period.
func TestWatcherInjectedXID(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	p := DefaultPolicy()
	node, tr := startWatcher(t, p, clk)
	gpu3 := uuidOf(t, node, 3)

	if _, err := node.InjectXID(3, 31); err != nil {
		t.Fatal(err)
	}
	if _, err := node.InjectXID(3, 79); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "GPU 3 to turn unhealthy", func() bool { return !tr.Status(gpu3).Healthy })
	st := tr.Status(gpu3)
	if st.Effect != resourceapi.DeviceTaintEffectNoExecute || st.Reason != "XID 79" {
		t.Errorf("GPU 3: %+v (XID 31 must have been ignored)", st)
	}
	if len(tr.Unhealthy()) != 1 {
		t.Errorf("unhealthy: %v", tr.Unhealthy())
	}

	if _, err := node.InjectEvent(5, nvml.EventTypeDoubleBitEccError, 0); err != nil {
		t.Fatal(err)
	}
	gpu5 := uuidOf(t, node, 5)
	waitFor(t, "GPU 5 to turn unhealthy", func() bool { return !tr.Status(gpu5).Healthy })
	if st := tr.Status(gpu5); st.Reason != string(KindDoubleBitECC) || st.Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("GPU 5: %+v", st)
	}

	clk.SetTime(clk.Now().Add(p.RecoveryPeriod))
	waitFor(t, "recovery", func() bool { return len(tr.Unhealthy()) == 0 })
}

// A lost GPU stays unhealthy while it is lost, and recovers a period after it
// answers again.
func TestWatcherGPULost(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	p := DefaultPolicy()
	p.RecoveryPeriod = time.Minute
	node, tr := startWatcher(t, p, clk)
	gpu1 := uuidOf(t, node, 1)

	if err := node.SetLost(1, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "GPU 1 to turn unhealthy", func() bool { return !tr.Status(gpu1).Healthy })
	if st := tr.Status(gpu1); !st.Lost || st.Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("GPU 1: %+v", st)
	}
	// Time passes, but the GPU is still lost: every probe renews the event.
	clk.SetTime(clk.Now().Add(2 * time.Minute))
	waitFor(t, "a probe after the clock moved", func() bool {
		return !tr.Status(gpu1).LastEvent.Before(clk.Now())
	})
	if tr.Status(gpu1).Healthy {
		t.Fatal("a lost GPU recovered")
	}
	if err := node.SetLost(1, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // a few waits: no more lost events
	clk.SetTime(clk.Now().Add(time.Minute))
	waitFor(t, "GPU 1 to recover", func() bool { return tr.Status(gpu1).Healthy })
}
