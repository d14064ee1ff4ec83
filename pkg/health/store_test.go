package health

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func testStore(t *testing.T) Store {
	return Store{Path: filepath.Join(t.TempDir(), StateFile)}
}

// persisted returns a tracker that keeps its state in store, on its own clock.
func persisted(t *testing.T, store Store, now time.Time) (*Tracker, *clocktesting.FakePassiveClock) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	clk := clocktesting.NewFakePassiveClock(now)
	p := DefaultPolicy() // RecoveryPeriod 5m
	tr := NewTracker(p, clk)
	tr.Persist(ctx, store)
	return tr, clk
}

// A GPU tainted for a fatal XID stays tainted across a restart of the
// plugin until the recovery period has passed since the fault the previous
// process saw; restarting does not reset the period either way.
func TestTrackerHealthSurvivesRestart(t *testing.T) {
	store := testStore(t)
	before, clk := persisted(t, store, t0)
	before.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 79})
	clk.SetTime(t0.Add(time.Minute))
	before.Observe(Event{UUID: uuidB, Kind: KindXID, XID: 94})
	wantA := before.Status(uuidA)

	// The plugin restarts three minutes after the fault.
	after, clk := persisted(t, store, t0.Add(3*time.Minute))
	st := after.Status(uuidA)
	if st.Healthy || st.Effect != resourceapi.DeviceTaintEffectNoExecute || st.Reason != "XID 79" {
		t.Fatalf("GPU A after the restart: %+v, want unhealthy NoExecute for XID 79", st)
	}
	if !st.LastEvent.Equal(t0) || !st.Since.Equal(t0) || !st.RecoversAt.Equal(t0.Add(DefaultRecoveryPeriod)) || st.Events != wantA.Events {
		t.Errorf("GPU A after the restart: %+v, want the times of the original fault (recovery at %v)", st, t0.Add(DefaultRecoveryPeriod))
	}
	wantTaint := resourceapi.DeviceTaint{Key: TaintKey, Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoExecute}
	if got := after.Taints()[uuidA]; len(got) != 1 || got[0] != wantTaint {
		t.Errorf("taints of GPU A after the restart: %v, want %v", got, wantTaint)
	}
	if st := after.Status(uuidB); st.Healthy || st.Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("GPU B after the restart: %+v", st)
	}

	clk.SetTime(t0.Add(DefaultRecoveryPeriod - time.Second))
	if after.Recover() || after.Status(uuidA).Healthy {
		t.Fatal("GPU A recovered before the period since its fault passed")
	}
	clk.SetTime(t0.Add(DefaultRecoveryPeriod))
	if !after.Recover() || !after.Status(uuidA).Healthy || after.Status(uuidB).Healthy {
		t.Fatalf("at fault + period: A %+v, B %+v; want A healthy, B not yet", after.Status(uuidA), after.Status(uuidB))
	}

	// The recovery was saved: a third start does not bring GPU A back.
	third, _ := persisted(t, store, t0.Add(DefaultRecoveryPeriod))
	if !third.Status(uuidA).Healthy || third.Status(uuidB).Healthy {
		t.Errorf("third start: A %+v, B %+v", third.Status(uuidA), third.Status(uuidB))
	}
	// A start after every period passed finds the node healthy.
	late, _ := persisted(t, store, t0.Add(time.Hour))
	if len(late.Unhealthy()) != 0 {
		t.Errorf("an hour later: %v", late.Unhealthy())
	}
}

// A corrupt or foreign state file is ignored, not fatal, and replaced.
func TestTrackerStateFileCorrupt(t *testing.T) {
	for name, content := range map[string]string{
		"garbage":       "{\"version\": 1, \"gpus\": {\"GPU-a\": ",
		"newer version": `{"version": 2, "gpus": {}}`,
		"bad effect":    `{"version": 1, "gpus": {"GPU-a": {"effect": "Evict", "reason": "XID 79", "since": "2026-03-04T05:06:07Z", "lastEvent": "2026-03-04T05:06:07Z"}}}`,
		"no last fault": `{"version": 1, "gpus": {"GPU-a": {"effect": "NoExecute", "reason": "XID 79"}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			store := testStore(t)
			if err := os.WriteFile(store.Path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Load(); err == nil {
				t.Fatal("Load accepted it")
			}
			tr, _ := persisted(t, store, t0)
			if len(tr.Unhealthy()) != 0 {
				t.Errorf("unhealthy from a corrupt file: %v", tr.Unhealthy())
			}
			if got, err := store.Load(); err != nil || len(got) != 0 {
				t.Errorf("after Persist the file holds %v, %v; want it rewritten empty", got, err)
			}
			tr.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 79})
			if got, err := store.Load(); err != nil || len(got) != 1 {
				t.Errorf("after a fault the file holds %v, %v", got, err)
			}
		})
	}
}

// Saving is atomic: no temporary file is left; the content round-trips.
func TestStoreSaveLoad(t *testing.T) {
	store := testStore(t)
	if got, err := store.Load(); err != nil || got != nil {
		t.Fatalf("missing file: %v, %v", got, err)
	}
	in := map[string]Status{
		uuidA: {UUID: uuidA, Effect: resourceapi.DeviceTaintEffectNoExecute, Reason: "XID 94, GPULost", Since: t0, LastEvent: t0.Add(time.Second), Events: 3, Lost: true},
		uuidB: {UUID: uuidB, Effect: resourceapi.DeviceTaintEffectNoSchedule, Reason: "XID 94", Since: t0, LastEvent: t0, Events: 1},
	}
	if err := store.Save(in); err != nil {
		t.Fatal(err)
	}
	got, err := store.Load()
	if err != nil || !reflect.DeepEqual(got, in) {
		t.Errorf("Load = %v, %v; want %v", got, err, in)
	}
	entries, err := os.ReadDir(filepath.Dir(store.Path))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{StateFile}) {
		t.Errorf("directory holds %v, want only %s", names, StateFile)
	}
}

// The two instances of a surge rolling update share the file: each sees
// the other's faults at its next Refresh, no save drops a fault the saver
// has not seen, and both end with the same status and taint.
func TestTrackerStateSharedByTwoInstances(t *testing.T) {
	store := testStore(t)
	old, oldClk := persisted(t, store, t0)
	young, youngClk := persisted(t, store, t0)

	old.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 94}) // NoSchedule, at t0
	oldClk.SetTime(t0.Add(time.Minute))
	youngClk.SetTime(t0.Add(time.Minute))
	// The young instance saw XID 79 on A without having re-read the file,
	// and XID 48 on B: its save merges the old instance's fault on A.
	young.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 79})
	young.Observe(Event{UUID: uuidB, Kind: KindXID, XID: 48})
	if !old.Status(uuidB).Healthy {
		t.Fatal("the old instance knew of GPU B before re-reading the file")
	}
	// The old instance has not re-read the file, but its save after a fault
	// on a third GPU does, and takes the young instance's faults over.
	old.Observe(Event{UUID: "GPU-c", Kind: KindXID, XID: 94})
	if old.Status(uuidB).Healthy {
		t.Error("the old instance's save did not merge the young instance's fault on GPU B")
	}
	// The young instance takes GPU C over at its next Refresh.
	changes, stop := young.Subscribe()
	defer stop()
	if !young.Refresh() {
		t.Error("the young instance's Refresh reported no change")
	}
	select {
	case <-changes:
	default:
		t.Error("Refresh woke no subscriber")
	}
	old.Refresh()
	for _, uuid := range []string{uuidA, uuidB, "GPU-c"} {
		o, y := old.Status(uuid), young.Status(uuid)
		if o.Healthy || y.Healthy {
			t.Errorf("%s: old %+v, young %+v; want both unhealthy", uuid, o, y)
		}
	}
	if o, y := old.Taints(), young.Taints(); !reflect.DeepEqual(o, y) {
		t.Errorf("the instances publish different taints:\nold   %v\nyoung %v", o, y)
	}
	// A: first fault XID 94 (old, t0), strongest effect NoExecute (young),
	// last fault t0+1m.
	st := old.Status(uuidA)
	if st.Reason != "XID 94" || st.Effect != resourceapi.DeviceTaintEffectNoExecute || !st.Since.Equal(t0) || !st.LastEvent.Equal(t0.Add(time.Minute)) {
		t.Errorf("GPU A: %+v", st)
	}
	if got, err := store.Load(); err != nil || len(got) != 3 {
		t.Errorf("the file holds %v, %v; want all three GPUs", got, err)
	}
}

// Refresh also lifts taints whose recovery period has passed, so a restored
// taint cannot outlive its period where no event watcher runs (NVML events
// unsupported) to call Recover.
func TestRefreshRecovers(t *testing.T) {
	store := testStore(t)
	before, _ := persisted(t, store, t0)
	before.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 79})
	after, clk := persisted(t, store, t0.Add(time.Minute))
	if after.Status(uuidA).Healthy {
		t.Fatal("the fault was not restored")
	}
	clk.SetTime(t0.Add(DefaultRecoveryPeriod))
	if !after.Refresh() || !after.Status(uuidA).Healthy {
		t.Errorf("after Refresh at fault + period: %+v, want healthy", after.Status(uuidA))
	}
}
