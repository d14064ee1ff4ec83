package fleet

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-dev/tessera/pkg/model"
)

// TestMIGProfileRounding: a job gets the smallest plain H100 profile whose
// memory (bytes) and compute slices both cover its request. Worked by hand
// from the mock's H100 table (1g.10gb 9984 MiB, 1g.20gb and 2g.20gb 20096
// MiB, 3g.40gb and 4g.40gb 40448 MiB, 7g.80gb 81152 MiB; 7 compute slices)
// and the 81089 MiB an H100 publishes out of MIG mode.
func TestMIGProfileRounding(t *testing.T) {
	gib := func(n float64) float64 { return n * 1024 / 81089 }
	for _, c := range []struct {
		memory, cores float64
		want          string
	}{
		{gib(9), 0.10, "1g.10gb"},
		{gib(11), 0.10, "1g.20gb"},   // more than 9984 MiB, one compute slice
		{gib(11), 0.20, "2g.20gb"},   // 0.2 > 1/7: two compute slices
		{1.0 / 8, 0.10, "1g.20gb"},   // an eighth is 10136 MiB > 9984 MiB
		{gib(9), 1.0 / 7, "1g.10gb"}, // exactly one compute slice
		{gib(9), 2.0 / 7, "2g.20gb"}, // exactly two
		{gib(9), 0.30, "3g.40gb"},    // 0.3 > 2/7
		{0.45, 0.30, "3g.40gb"},      // 36490 MiB
		{0.45, 0.50, "4g.40gb"},      // 0.5 > 3/7
		{0.50, 0.10, "7g.80gb"},      // 40544.5 MiB > 40448 MiB of the 3g and 4g
		{0.60, 0.10, "7g.80gb"},      // more than 40448 MiB
		{1, 1, "7g.80gb"},
	} {
		p, err := MIGProfileFor("NVIDIA H100 80GB HBM3", 81089<<20, c.memory, c.cores)
		if err != nil || p.Name != c.want {
			t.Errorf("memory %.4f, cores %.3f: %s, %v; want %s", c.memory, c.cores, p.Name, err, c.want)
		}
	}
	// By slices (MIGBySlices, pkg/fraction's rule): an eighth of the memory
	// is one memory slice, a quarter two, a half four.
	m, err := newMIGModelFor("NVIDIA H100 80GB HBM3", 81089<<20)
	if err != nil {
		t.Fatal(err)
	}
	m.bySlices = true
	for _, c := range []struct {
		memory, cores float64
		want          string
	}{
		{1.0 / 8, 0.1, "1g.10gb"}, {1.0 / 7, 0.1, "1g.20gb"}, {0.25, 0.25, "2g.20gb"},
		{0.5, 0.4, "3g.40gb"}, {0.5, 0.5, "4g.40gb"}, {0.51, 0.1, "7g.80gb"},
	} {
		if p, err := m.profileFor(c.memory, c.cores); err != nil || p.Name != c.want {
			t.Errorf("by slices, memory %.4f, cores %.3f: %s, %v; want %s", c.memory, c.cores, p.Name, err, c.want)
		}
	}
	if _, err := MIGProfileFor("Tesla V100-SXM2-16GB", 16<<30, 0.1, 0.1); err == nil {
		t.Error("a GPU with no MIG table got a profile")
	}
}

// migPlacer is the allocator placer of the dynamic-MIG model over one
// H100 with first-fit node choice.
func migPlacer(t *testing.T) *allocatorPlacer {
	t.Helper()
	f := Fleet{Nodes: []NodeSpec{{Model: h100, GPUs: 1}}}
	m, err := newMIGModel(f)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newAllocatorPlacer(m, Options{Fleet: f, NodeChoice: ChoiceFirst})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Jobs of each profile on an H100 (memory, cores fractions).
var migJobOf = map[string]Job{
	"1g.10gb": {Memory: 0.1, Cores: 0.1},
	"1g.20gb": {Memory: 0.2, Cores: 0.1},
	"2g.20gb": {Memory: 0.2, Cores: 0.25},
	"3g.40gb": {Memory: 0.4, Cores: 0.4},
	"4g.40gb": {Memory: 0.4, Cores: 0.5},
	"7g.80gb": {Memory: 0.9, Cores: 0.9},
}

// placeAll places jobs of these profiles in order on p and returns the
// devices they got ("" for a job that did not fit).
func placeAll(t *testing.T, p *allocatorPlacer, profiles ...string) []string {
	t.Helper()
	var out []string
	for i, name := range profiles {
		j := migJobOf[name]
		j.ID, j.Demand = i, max(j.Memory, j.Cores)
		pl, ok, err := p.place(context.Background(), &j)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			out = append(out, "")
			continue
		}
		if len(pl.results) != 1 {
			t.Fatalf("job %d (%s): %d devices", i, name, len(pl.results))
		}
		out = append(out, pl.results[0].Device)
	}
	return out
}

func dev(profile string, start int) string { return model.MIGPlacementDeviceName(0, profile, start) }

// TestMIGPackingByHand: packings of one H100 worked out by hand from
// NVIDIA's placements (1g.10gb at 0..6, 1g.20gb at 0,2,4,6, 2g.20gb at
// 0,2,4, 3g.40gb at 0,4, 4g.40gb at 0, 7g.80gb at 0; 7 compute slices) and
// the order Tessera publishes them in (small profiles from the highest
// start, docs/mig.md), each through the real allocator.
func TestMIGPackingByHand(t *testing.T) {
	seven := slices.Repeat([]string{"1g.10gb"}, 8)
	for _, c := range []struct {
		name     string
		profiles []string
		want     []string
	}{
		{"seven 1g fit, the eighth waits", seven,
			[]string{dev("1g.10gb", 6), dev("1g.10gb", 5), dev("1g.10gb", 4), dev("1g.10gb", 3), dev("1g.10gb", 2), dev("1g.10gb", 1), dev("1g.10gb", 0), ""}},
		{"3g then 4g", []string{"3g.40gb", "4g.40gb"}, []string{dev("3g.40gb", 4), dev("4g.40gb", 0)}},
		{"4g then 3g", []string{"4g.40gb", "3g.40gb"}, []string{dev("4g.40gb", 0), dev("3g.40gb", 4)}},
		{"never two 4g", []string{"4g.40gb", "4g.40gb"}, []string{dev("4g.40gb", 0), ""}},
		{"two 3g, then no 4g", []string{"3g.40gb", "3g.40gb", "4g.40gb"}, []string{dev("3g.40gb", 4), dev("3g.40gb", 0), ""}},
		// Three 1g take slices 6, 5, 4: 0-3 stay whole for a 4g.40gb; a
		// 3g.40gb would then find no place (its starts 0 and 4 are taken).
		{"three 1g leave room for a 4g", []string{"1g.10gb", "1g.10gb", "1g.10gb", "4g.40gb", "3g.40gb"},
			[]string{dev("1g.10gb", 6), dev("1g.10gb", 5), dev("1g.10gb", 4), dev("4g.40gb", 0), ""}},
		// 1g.20gb takes two memory slices: four fill the eight.
		{"four 1g.20gb", slices.Repeat([]string{"1g.20gb"}, 5),
			[]string{dev("1g.20gb", 6), dev("1g.20gb", 4), dev("1g.20gb", 2), dev("1g.20gb", 0), ""}},
		// Three 2g take six compute slices and memory slices 0-5; a 1g
		// takes 6 and the last compute slice; slice 7 is no 1g.10gb start
		// and no compute slice is left.
		{"compute slices run out", []string{"2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb", "1g.10gb"},
			[]string{dev("2g.20gb", 4), dev("2g.20gb", 2), dev("2g.20gb", 0), dev("1g.10gb", 6), ""}},
		{"7g is the GPU", []string{"7g.80gb", "1g.10gb"}, []string{dev("7g.80gb", 0), ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if diff := cmp.Diff(c.want, placeAll(t, migPlacer(t), c.profiles...)); diff != "" {
				t.Errorf("devices (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMIGReleaseFreesSlices: after a 1g.10gb of a full GPU ends, an eighth
// 1g.10gb fits in its place.
func TestMIGReleaseFreesSlices(t *testing.T) {
	p := migPlacer(t)
	var pls []placement
	for i := range 7 {
		j := migJobOf["1g.10gb"]
		j.ID = i
		pl, ok, err := p.place(context.Background(), &j)
		if err != nil || !ok {
			t.Fatalf("job %d: %v, %v", i, ok, err)
		}
		pls = append(pls, pl)
	}
	j := migJobOf["1g.10gb"]
	j.ID = 7
	if _, ok, _ := p.place(context.Background(), &j); ok {
		t.Fatal("an eighth 1g.10gb fit")
	}
	p.release(pls[2], &Job{ID: 2})
	pl, ok, err := p.place(context.Background(), &j)
	if err != nil || !ok || pl.results[0].Device != dev("1g.10gb", 4) {
		t.Fatalf("after a release: %v %v %v, want %s", ok, err, pl.results, dev("1g.10gb", 4))
	}
}

// TestMIGRunChecked runs a KubeShare stream on two HGX nodes with the
// conservation check (no overlapping placements, memory and cores within
// the GPU) and with and without skipping allocator calls (sizeKey): the
// runs must agree.
func TestMIGRunChecked(t *testing.T) {
	for _, m := range []float64{0.15, 0.4} {
		w := Workload{Seed: 7, Jobs: 120, MeanDemand: m, SDDemand: 0.1, MeanRuntime: 600, GPUs: 16, Load: 1.25}
		jobs := w.Generate()
		for _, k := range []Kind{MIG, MIGBySlices} {
			a := run(t, k, w, jobs, Options{})
			b := run(t, k, w, jobs, Options{AlwaysAsk: true})
			if diff := cmp.Diff(a.Starts, b.Starts); diff != "" {
				t.Fatalf("%s, m=%.2f: skipping known answers changed the schedule:\n%s", k, m, diff)
			}
			if a.JobsPerHour <= 0 || a.MaxJobsPerGPU > 7 {
				t.Errorf("%s, m=%.2f: %.1f jobs/h, at most %d jobs on one GPU (MIG holds 7)", k, m, a.JobsPerHour, a.MaxJobsPerGPU)
			}
		}
	}
}

// TestMIGRefusesWholeGPUJobs: a job asking for whole GPUs is refused, not
// placed on a MIG device.
func TestMIGRefusesWholeGPUJobs(t *testing.T) {
	w, jobs := small(0.3)
	jobs[5].GPUs, jobs[5].Memory, jobs[5].Cores, jobs[5].Demand = 2, 1, 1, 1
	if _, err := Run(context.Background(), MIG, w, jobs, Options{Nodes: 2}); err == nil {
		t.Fatal("a 2-GPU job ran on a fleet in MIG mode")
	}
}

// TestMIGBenchReport: the comparison runs every model on a row, counts the
// profiles the jobs are rounded up to, and marks its figures as a
// simulation.
func TestMIGBenchReport(t *testing.T) {
	cfg := BenchConfig{
		Command:  "test",
		Workload: Workload{Seed: 3, Jobs: 60, SDDemand: 0.1, MeanRuntime: 600, Load: 1.25},
		Nodes:    1,
		Means:    []float64{0.2},
		Check:    true,
		Parallel: 1,
	}
	rep, err := MIGBench(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	row := rep.Rows[0]
	var n int
	for _, c := range row.Profiles {
		n += c
	}
	if n != cfg.Workload.Jobs {
		t.Errorf("profiles count %d jobs, want %d", n, cfg.Workload.Jobs)
	}
	for k, r := range row.Results {
		if r.Kind != MIGKinds[k] || r.Skipped != "" || r.JobsPerHour <= 0 {
			t.Errorf("result %d: %s, %.1f jobs/h, skipped %q", k, r.Kind, r.JobsPerHour, r.Skipped)
		}
	}
	// Memory slices per job are at least the jobs' memory in eighths: a
	// profile covers the job's memory, and its slices hold at least its
	// memory (H100: an eighth of 81089 MiB is 10136 MiB; 1g.10gb has 9984
	// MiB in one slice, 3g.40gb 40448 MiB in four).
	w := cfg.Workload
	w.MeanDemand, w.GPUs = 0.2, 8
	var mem float64
	for _, j := range w.Generate() {
		mem += j.Memory * 8 / float64(w.Jobs)
	}
	if row.Slots < mem-1e-9 {
		t.Errorf("%.2f memory slices per job, less than the jobs' %.2f eighths of memory", row.Slots, mem)
	}
	md := rep.Markdown()
	for _, want := range []string{"simulation", "÷ shares", "1g."} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
