package fleet

import (
	"math"
	"strings"
	"testing"
)

// TestKubeQueueParksAndRequeues: a pod that fits nowhere does not block the
// next; it comes back on a cluster event, after the pods not backing off.
func TestKubeQueueParksAndRequeues(t *testing.T) {
	q, _ := newQueue(QueueKube)
	q.arrive(0, 0)
	q.arrive(1, 0.5)
	a := q.pop(1)
	if a.job != 0 {
		t.Fatalf("popped job %d first, want 0", a.job)
	}
	q.failed(a, 1, false)
	if !q.ready(1) || q.pop(1).job != 1 {
		t.Fatal("the job behind a parked job is not tried")
	}
	if q.ready(1) {
		t.Fatal("a parked job was tried again without an event")
	}
	// Job 2 fails at 1.2 (backoff until 2); job 0's backoff (from 1, 1 s) is over at 2.5.
	q.arrive(2, 1.2)
	b := q.pop(1.2)
	q.failed(b, 1.2, false)
	q.clusterEvent(2.5)
	if got := q.pop(2.5).job; got != 0 {
		t.Fatalf("after the event popped job %d, want 0 (earliest timestamp)", got)
	}
	if got := q.pop(2.5).job; got != 2 {
		t.Fatalf("then job %d, want 2", got)
	}
	// A job still backing off is popped from backoffQ once activeQ is empty.
	c := &queuedJob{job: 3}
	q.failed(c, 3, false)
	q.failed(c, 3, false) // second failure: 2 s backoff
	q.clusterEvent(3.5)
	if !q.ready(3.5) || q.pop(3.5).job != 3 {
		t.Fatal("a backing-off job is not popped from backoffQ when activeQ is empty")
	}
	// An event during a failed attempt sends the job back at once.
	q.failed(c, 4, true)
	if !q.ready(4) {
		t.Fatal("a job that failed while an event arrived was parked")
	}
}

func TestBackoff(t *testing.T) {
	q := &kubeQueue{backoff: jobHeap{byExpry: true}}
	it := &queuedJob{}
	for i, want := range []float64{1, 2, 4, 8, 10, 10} {
		q.failed(it, 100, false)
		if got := it.expiry - 100; got != want {
			t.Errorf("failure %d: backoff %.0fs, want %.0fs", i+1, got, want)
		}
	}
	if !backingOff(it, 109.5) || backingOff(it, 111) {
		t.Errorf("backing off at 109.5 = %v, at 111 = %v", backingOff(it, 109.5), backingOff(it, 111))
	}
}

func TestFIFOQueueBlocks(t *testing.T) {
	q, _ := newQueue(QueueFIFO)
	q.arrive(0, 0)
	q.arrive(1, 1)
	q.failed(q.pop(1), 1, false)
	if q.ready(2) {
		t.Fatal("FIFO tried past a blocked head")
	}
	q.clusterEvent(3)
	if got := q.pop(3).job; got != 0 {
		t.Fatalf("FIFO popped %d after the event, want the head 0", got)
	}
}

func TestNumFeasibleNodesToFind(t *testing.T) {
	for _, tc := range []struct{ pct, n, want int32 }{
		{0, 16, 16}, {0, 99, 99}, {0, 100, 100}, {0, 500, 230}, {0, 1000, 420}, {0, 5000, 500}, {0, 10000, 500}, {10, 1000, 100}, {100, 1000, 1000},
	} {
		if got := numFeasibleNodesToFind(tc.pct, tc.n); got != tc.want {
			t.Errorf("numFeasibleNodesToFind(%d, %d) = %d, want %d", tc.pct, tc.n, got, tc.want)
		}
	}
}

func TestScoring(t *testing.T) {
	s := DefaultScoring
	// 128 cpu: each pod's 100m is 0.08 points, so nodes with a few pods tie.
	if s.score(0) != s.score(5) {
		t.Errorf("scores 0 vs 5 pods: %d vs %d, want a tie", s.score(0), s.score(5))
	}
	if s.score(0) <= s.score(80) {
		t.Errorf("scores 0 vs 80 pods: %d vs %d, want fewer pods to win", s.score(0), s.score(80))
	}
	small := Scoring{NodeMilliCPU: 4000, NodeMemory: 16 << 30, PodMilliCPU: 1000, PodMemory: 1 << 30}
	if small.score(0) <= small.score(2) {
		t.Errorf("pods with requests: %d vs %d", small.score(0), small.score(2))
	}
}

func TestScoreHeapTies(t *testing.T) {
	// With every Randomizer 0, container/heap decides ties: [5 5 7 7] pops the
	// second 7, not the first.
	h := scoreHeap{{0, 5}, {1, 5}, {2, 7}, {3, 7}}
	if got := popBest(h); got != 3 {
		t.Errorf("popped node %d, want 3", got)
	}
	if got := popBest(scoreHeap{{0, 9}, {1, 9}, {2, 9}}); got != 0 {
		t.Errorf("all equal: popped node %d, want 0", got)
	}
}

func TestParseDistribution(t *testing.T) {
	for _, tc := range []struct {
		spec string
		mean float64
		name string
	}{
		{"normal:0.3,0.1", 0.3, "normal(0.30, 0.10)"},
		{"discrete:1/8=2,1/4=1,1/2=1", (2.0/8 + 1.0/4 + 1.0/2) / 4, "discrete(1/8:50% 1/4:25% 1/2:25%)"},
		{"uniform:0.1,0.5", 0.3, "uniform(0.10, 0.50)"},
		{"mix:0.5*discrete:1=1+0.5*discrete:0.5=1", 0.75, "mix(50% discrete(1:100%) + 50% discrete(0.5:100%))"},
		{"discrete:25%=1|cores=2*mem", 0.5, "memory discrete(25%:100%), cores 2 × memory"},
	} {
		d, err := ParseDistribution(tc.spec)
		if err != nil {
			t.Errorf("%s: %v", tc.spec, err)
			continue
		}
		if d.Name() != tc.name {
			t.Errorf("%s: name %q, want %q", tc.spec, d.Name(), tc.name)
		}
		if m := MeanDemand(d); math.Abs(m-tc.mean) > 0.005 {
			t.Errorf("%s: mean %.4f, want %.4f", tc.spec, m, tc.mean)
		}
	}
	for _, spec := range []string{"pareto:0.05,1.5", "lognormal:0.2,0.8", "pareto:0.05,1.5|cores=uniform:0.1,0.2"} {
		if _, err := ParseDistribution(spec); err != nil {
			t.Errorf("%s: %v", spec, err)
		}
	}
	for _, spec := range []string{"", "normal", "normal:0.3", "normal:2,0.1", "discrete:3/2", "discrete:1/4=-1", "zipf:1,2", "mix:normal:0.1,0.1", "normal:0.1,0.1|mem=2"} {
		if _, err := ParseDistribution(spec); err == nil {
			t.Errorf("%q: accepted", spec)
		}
	}
}

func TestSplitDemand(t *testing.T) {
	w := Workload{Seed: 1, Jobs: 200, Dist: SplitCores{Memory: Uniform{0.1, 0.4}, Scale: 0.5}, MeanRuntime: 600, GPUs: 16, Load: 1.25}
	jobs := w.Generate()
	for _, j := range jobs {
		if math.Abs(j.Cores-max(j.Memory*0.5, MinDemand)) > 1e-12 || j.Demand != j.Memory {
			t.Fatalf("job %+v: cores not half the memory", j)
		}
	}
	r := run(t, Tessera, w, jobs, Options{})
	if r.MaxJobsPerGPU < 3 {
		t.Errorf("max %d jobs on one GPU", r.MaxJobsPerGPU)
	}
}

func TestReadTrace(t *testing.T) {
	jobs, err := ReadTrace(strings.NewReader("# a trace\narrival,runtime,memory,cores\n10,60,1/4,0.5\n0,30,25%,10%\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 || jobs[0].Arrival != 0 || jobs[0].ID != 0 || jobs[1].Memory != 0.25 || jobs[1].Cores != 0.5 || jobs[1].Demand != 0.5 || jobs[1].Runtime != 60 {
		t.Errorf("jobs = %+v", jobs)
	}
	if _, err := ReadTrace(strings.NewReader("arrival,runtime,demand\n0,10,0.3\n")); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"", "arrival,demand\n0,0.5\n", "arrival,runtime,demand\n0,10,1.5\n", "arrival,runtime,demand\n-1,10,0.5\n", "arrival,runtime,demand\n"} {
		if _, err := ReadTrace(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestLowerBounds(t *testing.T) {
	// Three items of 60 need three bins of 100 (L2), fluid says two.
	if got := l2([]int64{60, 60, 60}, 100); got != 3 {
		t.Errorf("l2(60,60,60) = %d, want 3", got)
	}
	// Ten items of 30: at most three per bin (DFF k=3), so four bins; fluid and L2 say three.
	if got := dffBound([]int64{30, 30, 30, 30, 30, 30, 30, 30, 30, 30}, 100); got != 4 {
		t.Errorf("dffBound(10 × 30) = %d, want 4", got)
	}
	if got := l2([]int64{70, 40, 40, 30}, 100); got != 2 {
		t.Errorf("l2(70,40,40,30) = %d, want 2", got)
	}
	// 2-D: four items of (60% memory, 10% cores) cannot share in pairs.
	sizes := []request{{60, 10}, {60, 10}, {10, 60}, {10, 60}}
	c := request{100, 100}
	if _, _, res := exactPack(sizes, 2, c, 1000); res != packFound {
		t.Errorf("exactPack: %v, want found (each memory-heavy item with a core-heavy one)", res)
	}
	if _, _, res := exactPack(append(sizes, request{60, 10}), 2, c, 1000); res != packImpossible {
		t.Errorf("exactPack with a fifth item: %v, want impossible", res)
	}
}

// TestPublishedObjects: what a replay publishes for each model is the
// simulation's own slices (unnamed, for the API server to name) and the
// classes its claims name.
func TestPublishedObjects(t *testing.T) {
	for _, kind := range []Kind{Whole, Partition, Tessera} {
		slices, classes, err := Published(kind, "node-3")
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if len(slices) == 0 || len(classes) == 0 {
			t.Fatalf("%s: %d slices, %d classes", kind, len(slices), len(classes))
		}
		for _, s := range slices {
			if s.Name != "" || s.GenerateName == "" || s.Spec.NodeName == nil || *s.Spec.NodeName != "node-3" || s.Spec.Pool.Name != "node-3" {
				t.Errorf("%s: slice name %q generateName %q node %v pool %q", kind, s.Name, s.GenerateName, s.Spec.NodeName, s.Spec.Pool.Name)
			}
		}
		names := map[string]bool{}
		for _, c := range classes {
			names[c.Name] = true
		}
		for _, demand := range []float64{0.05, 0.3, 0.6, 1} {
			spec, err := ClaimSpec(kind, &Job{ID: 1, Demand: demand})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range spec.Devices.Requests {
				var class string
				switch {
				case r.Exactly != nil:
					class = r.Exactly.DeviceClassName
				case len(r.FirstAvailable) > 0:
					class = r.FirstAvailable[0].DeviceClassName
				}
				if !names[class] {
					t.Errorf("%s: a claim for demand %.2f names class %q, which the model does not publish (%v)", kind, demand, class, names)
				}
			}
		}
	}
}
