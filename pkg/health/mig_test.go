package health

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/model"
)

// startMIGWatcher runs a watcher over a fresh hgx-h100-mig mock node (GPU 0
// in MIG mode with a 4g.40gb, GPU instance 1 at slices 0-3, and a 3g.40gb,
// GPU instance 2 at 4-7, each with compute instance 0; GPU 1 in MIG mode
// without instances) and returns it with its GPUs as discovered.
func startMIGWatcher(t *testing.T, p Policy, clk *clocktesting.FakePassiveClock) (*gpu.MockNode, *Tracker, []gpu.GPU) {
	t.Helper()
	node, gpus := gputest.Node(t, "hgx-h100-mig")
	return node, watch(t, node, p, clk), gpus
}

// An XID that the driver attributes to a compute instance marks only that
// MIG device: the GPU stays healthy, its other instance too, and the taint
// goes to gpu-0-mig-2 alone; an XID naming a GPU instance without a
// compute instance marks it too; a fatal XID naming an
// instance marks the whole GPU (a reset destroys every instance); an XID
// without instance IDs marks the whole GPU as before.
func TestWatcherMIGXID(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	p := DefaultPolicy()
	p.RecoveryPeriod = time.Minute
	node, tr, gpus := startMIGWatcher(t, p, clk)
	gpu0 := gpus[0].UUID

	if _, err := node.InjectMIGXID(0, 2, 0, 94); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the 3g.40gb to turn unhealthy", func() bool { return len(tr.MIGStatuses(gpu0)) == 1 })
	if !tr.Status(gpu0).Healthy || len(tr.Taints()) != 0 {
		t.Fatalf("GPU 0 %+v, taints %v: want the GPU healthy and no GPU taint", tr.Status(gpu0), tr.Taints())
	}
	st := tr.MIGStatuses(gpu0)[0]
	want := MIGScope{GPUInstance: 2, ComputeInstance: 0, ProfileID: 9, Placement: gpu.MIGPlacement{Start: 4, Size: 4}}
	if st.MIG == nil || *st.MIG != want || st.Reason != "XID 94" || st.Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("MIG status %+v (scope %+v), want XID 94 NoSchedule on %+v", st, st.MIG, want)
	}
	taints := tr.MIGTaints(gpus, nil)
	if len(taints) != 1 || len(taints["gpu-0-mig-2"]) != 1 || taints["gpu-0-mig-2"][0] != (resourceapi.DeviceTaint{Key: TaintKey, Value: "XID-94", Effect: resourceapi.DeviceTaintEffectNoSchedule}) {
		t.Errorf("MIG taints %v, want XID-94:NoSchedule on gpu-0-mig-2 only", taints)
	}

	if _, err := node.InjectMIGXID(0, 1, -1, 94); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the 4g.40gb to turn unhealthy", func() bool { return len(tr.MIGStatuses(gpu0)) == 2 })
	if got := tr.MIGTaints(gpus, nil); len(got) != 2 || got["gpu-0-mig-1"] == nil {
		t.Errorf("MIG taints %v, want gpu-0-mig-1 (GPU instance 1) too", got)
	}

	if _, err := node.InjectMIGXID(0, 2, 0, 48); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "GPU 0 to turn unhealthy", func() bool { return !tr.Status(gpu0).Healthy })
	if st := tr.Status(gpu0); st.MIG != nil || st.Effect != resourceapi.DeviceTaintEffectNoExecute || st.Reason != "XID 48" {
		t.Errorf("GPU 0: %+v, want XID 48 NoExecute on the whole GPU", st)
	}

	if _, err := node.InjectXID(1, 94); err != nil {
		t.Fatal(err)
	}
	gpu1 := gpus[1].UUID
	waitFor(t, "GPU 1 to turn unhealthy", func() bool { return !tr.Status(gpu1).Healthy })
	if len(tr.MIGStatuses(gpu1)) != 0 {
		t.Errorf("GPU 1 MIG statuses %+v, want none (the XID named no instance)", tr.MIGStatuses(gpu1))
	}

	clk.SetTime(clk.Now().Add(p.RecoveryPeriod))
	waitFor(t, "recovery", func() bool { return len(tr.Unhealthy()) == 0 })
	if len(tr.MIGTaints(gpus, nil)) != 0 {
		t.Errorf("MIG taints left: %v", tr.MIGTaints(gpus, nil))
	}
}

// MIGDevices maps a scope to the devices a GPU publishes: a static GPU's
// GPU instance, whichever compute instance the event names (none when the
// instance was replaced by one at another placement); on a dynamic GPU
// every placement, of any profile, over the memory slices of the faulty
// instance: the placement recorded with the event, else the instance's
// that has the ID now.
func TestMIGDevices(t *testing.T) {
	_, gpus := gputest.Node(t, "hgx-h100-mig")
	g0 := gpus[0]
	three := MIGScope{GPUInstance: 2, ComputeInstance: 0, ProfileID: 9, Placement: gpu.MIGPlacement{Start: 4, Size: 4}}
	upper := []string{"gpu-0-mig-1g-10gb-4", "gpu-0-mig-1g-10gb-5", "gpu-0-mig-1g-10gb-6", "gpu-0-mig-1g-10gb-me-4", "gpu-0-mig-1g-10gb-me-5", "gpu-0-mig-1g-10gb-me-6",
		"gpu-0-mig-1g-20gb-4", "gpu-0-mig-1g-20gb-6", "gpu-0-mig-2g-20gb-4", "gpu-0-mig-3g-40gb-4", "gpu-0-mig-7g-80gb-0"}
	lower := []string{"gpu-0-mig-1g-10gb-0", "gpu-0-mig-1g-10gb-1", "gpu-0-mig-1g-10gb-2", "gpu-0-mig-1g-10gb-3", "gpu-0-mig-1g-10gb-me-0", "gpu-0-mig-1g-10gb-me-1",
		"gpu-0-mig-1g-10gb-me-2", "gpu-0-mig-1g-10gb-me-3", "gpu-0-mig-1g-20gb-0", "gpu-0-mig-1g-20gb-2", "gpu-0-mig-2g-20gb-0", "gpu-0-mig-2g-20gb-2",
		"gpu-0-mig-3g-40gb-0", "gpu-0-mig-4g-40gb-0", "gpu-0-mig-7g-80gb-0"}
	for _, tc := range []struct {
		name    string
		g       gpu.GPU
		dynamic bool
		scope   MIGScope
		want    []string
	}{
		{"static compute instance", g0, false, three, []string{"gpu-0-mig-2"}},
		{"static GPU instance", g0, false, MIGScope{GPUInstance: 1, ComputeInstance: -1, ProfileID: -1}, []string{"gpu-0-mig-1"}},
		{"static instance replaced at another placement", g0, false, MIGScope{GPUInstance: 2, ComputeInstance: 0, ProfileID: 9, Placement: gpu.MIGPlacement{Start: 0, Size: 4}}, nil},
		{"static instance gone", g0, false, MIGScope{GPUInstance: 7, ComputeInstance: -1, ProfileID: -1}, nil},
		// H100 80GB placements over memory slices 4-7 (NVIDIA MIG user
		// guide, nvidia-smi mig -lgipp): 1g.10gb(+me) at 4, 5, 6; 1g.20gb at
		// 4, 6; 2g.20gb at 4; 3g.40gb at 4; 7g.80gb at 0.
		{"dynamic, placement recorded", g0, true, three, upper},
		{"dynamic, placement recorded, instance gone", g0, true, MIGScope{GPUInstance: 7, ComputeInstance: 0, ProfileID: 9, Placement: gpu.MIGPlacement{Start: 0, Size: 4}}, lower},
		{"dynamic, placement from the instance", g0, true, MIGScope{GPUInstance: 1, ComputeInstance: 0, ProfileID: -1}, lower},
		{"dynamic, a 1g.10gb", g0, true, MIGScope{GPUInstance: 13, ComputeInstance: 0, ProfileID: 19, Placement: gpu.MIGPlacement{Start: 6, Size: 1}}, []string{
			"gpu-0-mig-1g-10gb-6", "gpu-0-mig-1g-10gb-me-6", "gpu-0-mig-1g-20gb-6", "gpu-0-mig-3g-40gb-4", "gpu-0-mig-7g-80gb-0"}},
		{"not in MIG mode", gpus[2], false, three, nil},
	} {
		if got := MIGDevices(tc.g, tc.dynamic, tc.scope); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TaintDevices puts a MIG device's taint on that device of what the model
// publishes, and on no other device (model shares one taint list among a
// GPU's devices).
func TestTaintDevices(t *testing.T) {
	_, gpus := gputest.Node(t, "hgx-h100-mig")
	gpuTaint := resourceapi.DeviceTaint{Key: TaintKey, Value: "XID-94", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	res, err := model.Resources("node-1", gpus, model.WithTaints(map[string][]resourceapi.DeviceTaint{gpus[0].UUID: {{Key: "example.com/maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule}}}))
	if err != nil {
		t.Fatal(err)
	}
	TaintDevices(&res, map[string][]resourceapi.DeviceTaint{"gpu-0-mig-2": {gpuTaint}})
	TaintDevices(&res, map[string][]resourceapi.DeviceTaint{"gpu-0-mig-2": {gpuTaint}}) // twice: added once
	found := 0
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			has := slices.Contains(d.Taints, gpuTaint)
			switch {
			case d.Name == "gpu-0-mig-2":
				found++
				if !has || len(d.Taints) != 2 {
					t.Errorf("%s taints %v, want the maintenance taint and XID-94 once", d.Name, d.Taints)
				}
			case has:
				t.Errorf("%s has the taint of gpu-0-mig-2: %v", d.Name, d.Taints)
			}
		}
	}
	if found != 1 {
		t.Errorf("gpu-0-mig-2 published %d times", found)
	}
	if _, err := model.ResourceSlices("node-1", res); err != nil {
		t.Errorf("slices with the MIG taint: %v", err)
	}
}

// A MIG device's status is kept in the state file under its own key and
// restored by a new tracker, scope included; malformed keys are refused.
func TestStoreMIG(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	tr := NewTracker(DefaultPolicy(), clk)
	scope := &MIGScope{GPUInstance: 2, ComputeInstance: -1, ProfileID: 9, Placement: gpu.MIGPlacement{Start: 4, Size: 4}}
	tr.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 94, MIG: scope})
	tr.Observe(Event{UUID: uuidA, Kind: KindXID, XID: 74})
	store := Store{Path: filepath.Join(t.TempDir(), StateFile)}
	if err := store.Save(tr.Unhealthy()); err != nil {
		t.Fatal(err)
	}
	loaded, err := store.Load()
	if err != nil {
		t.Fatal(err)
	}
	key := uuidA + "/mig-gi2-p9-s4-n4"
	if len(loaded) != 2 || loaded[key].UUID != uuidA || loaded[key].MIG == nil || *loaded[key].MIG != *scope || loaded[uuidA].MIG != nil {
		t.Fatalf("loaded %+v, want GPU %s and its MIG device %s", loaded, uuidA, key)
	}
	fresh := NewTracker(DefaultPolicy(), clk)
	if !fresh.Restore(loaded) {
		t.Fatal("restore changed nothing")
	}
	if got := fresh.MIGStatuses(uuidA); len(got) != 1 || *got[0].MIG != *scope || got[0].Reason != "XID 94" {
		t.Errorf("restored MIG statuses %+v", got)
	}
	if got := fresh.Taints(); len(got) != 1 || got[uuidA] == nil {
		t.Errorf("restored GPU taints %v, want GPU %s's only", got, uuidA)
	}
	for _, bad := range []string{"GPU-a/", "GPU-a/gi2", "GPU-a/mig-ci0", "GPU-a/mig-gi2-p9", "GPU-a/mig-gi2-gi3", "/mig-gi2", "GPU-a/mig-gi-1", "GPU-a/mig-gi2-x1"} {
		if _, _, err := parseStatusKey(bad); err == nil {
			t.Errorf("parseStatusKey(%q) accepted", bad)
		}
	}
	for _, s := range []MIGScope{{GPUInstance: 0, ComputeInstance: -1, ProfileID: -1}, {GPUInstance: 13, ComputeInstance: 3, ProfileID: 0, Placement: gpu.MIGPlacement{Start: 0, Size: 8}}} {
		uuid, got, err := parseStatusKey(statusKey(uuidB, &s))
		if err != nil || uuid != uuidB || *got != s {
			t.Errorf("round trip of %+v: %s %+v %v", s, uuid, got, err)
		}
	}
}
