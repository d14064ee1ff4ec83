package health

import (
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

const uuidA, uuidB = "GPU-a", "GPU-b"

func TestClassify(t *testing.T) {
	p := DefaultPolicy()
	for _, tc := range []struct {
		event  Event
		effect resourceapi.DeviceTaintEffect
		counts bool
	}{
		{Event{Kind: KindXID, XID: 13}, "", false}, // application's own fault
		{Event{Kind: KindXID, XID: 31}, "", false},
		{Event{Kind: KindXID, XID: 48}, resourceapi.DeviceTaintEffectNoExecute, true},
		{Event{Kind: KindXID, XID: 79}, resourceapi.DeviceTaintEffectNoExecute, true},
		{Event{Kind: KindXID, XID: 95}, resourceapi.DeviceTaintEffectNoExecute, true},
		{Event{Kind: KindXID, XID: 94}, resourceapi.DeviceTaintEffectNoSchedule, true}, // contained ECC
		{Event{Kind: KindXID, XID: 74}, resourceapi.DeviceTaintEffectNoSchedule, true},
		{Event{Kind: KindDoubleBitECC}, resourceapi.DeviceTaintEffectNoExecute, true},
		{Event{Kind: KindGPULost}, resourceapi.DeviceTaintEffectNoExecute, true},
	} {
		effect, counts := p.Classify(tc.event)
		if effect != tc.effect || counts != tc.counts {
			t.Errorf("%s: (%q, %v), want (%q, %v)", tc.event, effect, counts, tc.effect, tc.counts)
		}
	}

	// Configurable: ignore 94, fatal events only NoSchedule.
	p.IgnoredXIDs = append(p.IgnoredXIDs, 94)
	p.FatalEffect = resourceapi.DeviceTaintEffectNoSchedule
	if _, counts := p.Classify(Event{Kind: KindXID, XID: 94}); counts {
		t.Error("XID 94 counts although ignored")
	}
	if effect, _ := p.Classify(Event{Kind: KindXID, XID: 79}); effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("XID 79 with FatalEffect NoSchedule: %q", effect)
	}
}

func TestPolicyValidate(t *testing.T) {
	if err := DefaultPolicy().Validate(); err != nil {
		t.Errorf("default policy: %v", err)
	}
	bad := DefaultPolicy()
	bad.FatalEffect = "PreferNoSchedule"
	if err := bad.Validate(); err == nil {
		t.Error("PreferNoSchedule accepted")
	}
	bad = DefaultPolicy()
	bad.IgnoredXIDs = append(bad.IgnoredXIDs, 79)
	if err := bad.Validate(); err == nil {
		t.Error("an XID both ignored and fatal accepted")
	}
}

// A GPU turns unhealthy on the first counting event, escalates, stays
// unhealthy while events keep coming, and recovers after a quiet period.
func TestTrackerLifecycle(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	p := DefaultPolicy()
	p.RecoveryPeriod = time.Minute
	tr := NewTracker(p, clk)
	changes, stop := tr.Subscribe()
	defer stop()
	changed := func() bool {
		select {
		case <-changes:
			return true
		default:
			return false
		}
	}

	if tr.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 13}) || changed() {
		t.Fatal("an ignored XID changed health")
	}
	if !tr.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 94}) || !changed() {
		t.Fatal("XID 94 did not make the GPU unhealthy")
	}
	st := tr.Status(uuidA)
	if st.Healthy || st.Effect != resourceapi.DeviceTaintEffectNoSchedule || st.Reason != "XID 94" {
		t.Fatalf("after XID 94: %+v", st)
	}
	if got := st.Taint(); got == nil || *got != (resourceapi.DeviceTaint{Key: TaintKey, Value: "XID-94", Effect: resourceapi.DeviceTaintEffectNoSchedule}) {
		t.Errorf("taint %+v", got)
	}
	if !tr.Status(uuidB).Healthy {
		t.Error("an unrelated GPU is unhealthy")
	}

	clk.SetTime(clk.Now().Add(30 * time.Second))
	if !tr.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 79}) || !changed() {
		t.Fatal("XID 79 did not escalate")
	}
	st = tr.Status(uuidA)
	if st.Effect != resourceapi.DeviceTaintEffectNoExecute || st.Reason != "XID 94, XID 79" || st.Events != 2 {
		t.Fatalf("after XID 79: %+v", st)
	}
	// A weaker event neither downgrades nor notifies, but restarts the period.
	clk.SetTime(clk.Now().Add(50 * time.Second))
	if tr.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 94}) {
		t.Error("a repeated weaker event reported a change")
	}
	changed() // the reason went back to the first one: fine either way
	if st = tr.Status(uuidA); st.Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("effect downgraded to %q", st.Effect)
	}

	clk.SetTime(clk.Now().Add(59 * time.Second))
	if tr.Recover() || tr.Status(uuidA).Healthy {
		t.Fatal("recovered before a quiet minute")
	}
	if next, ok := tr.NextRecovery(); !ok || !next.Equal(clk.Now().Add(time.Second)) {
		t.Errorf("NextRecovery %v %v", next, ok)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	if !tr.Recover() || !changed() {
		t.Fatal("no recovery after a quiet minute")
	}
	if st = tr.Status(uuidA); !st.Healthy || st.Taint() != nil {
		t.Errorf("after recovery: %+v", st)
	}
	if len(tr.Taints()) != 0 {
		t.Errorf("taints left: %v", tr.Taints())
	}
}
