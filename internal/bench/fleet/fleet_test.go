package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/internal/bench/chart/charttest"
	"github.com/tessera-dev/tessera/internal/bench/node"
)

// small is a stream that keeps -race runs short: 2 nodes (16 GPUs), 300 jobs.
func small(m float64) (Workload, []Job) {
	w := Workload{Seed: 7, Jobs: 300, MeanDemand: m, SDDemand: 0.1, MeanRuntime: 600, GPUs: 16, Load: 1.25}
	return w, w.Generate()
}

func run(t *testing.T, k Kind, w Workload, jobs []Job, opt Options) Result {
	t.Helper()
	if opt.Nodes == 0 {
		opt.Nodes = 2
	}
	opt.Check = true
	r, err := Run(context.Background(), k, w, jobs, opt)
	if err != nil {
		t.Fatalf("%s at m=%.1f: %v", k, w.MeanDemand, err)
	}
	return r
}

func TestDeterministicForSeed(t *testing.T) {
	w, jobs := small(0.3)
	if diff := cmp.Diff(jobs, w.Generate()); diff != "" {
		t.Fatalf("same seed, different stream (-first +second):\n%s", diff)
	}
	other := w
	other.Seed++
	if cmp.Equal(jobs, other.Generate()) {
		t.Fatal("different seeds gave the same stream")
	}
	for _, k := range []Kind{Tessera, Partition} {
		a, b := run(t, k, w, jobs, Options{}), run(t, k, w, jobs, Options{})
		if diff := cmp.Diff(a, b); diff != "" {
			t.Errorf("%s: two runs of one stream differ (-first +second):\n%s", k, diff)
		}
	}
}

// TestMigratingFirstUnderFIFO: under FIFO the migrating reference starts every
// job no later than any model that places jobs on GPUs without moving them, and
// fluid no later than the migrating reference (the induction in the report's Method).
func TestMigratingFirstUnderFIFO(t *testing.T) {
	for _, m := range []float64{0.2, 0.5} {
		w, jobs := small(m)
		fifo := Options{Queue: QueueFIFO}
		bound, fluid := run(t, Migrating, w, jobs, fifo), run(t, Fluid, w, jobs, fifo)
		for i := range jobs {
			if fluid.Starts[i] > bound.Starts[i]+1e-9 {
				t.Fatalf("m=%.1f: job %d starts at %.0fs under fluid, after the migrating reference (%.0fs)", m, i, fluid.Starts[i], bound.Starts[i])
			}
		}
		for _, k := range []Kind{Whole, Partition, Tessera, TesseraBestFit} {
			for _, choice := range []NodeChoice{ChoiceScore, ChoiceFirst} {
				r := run(t, k, w, jobs, Options{Queue: QueueFIFO, NodeChoice: choice})
				for i := range jobs {
					if bound.Starts[i] > r.Starts[i]+1e-9 {
						t.Fatalf("m=%.1f: %s (%s): job %d starts at %.0fs, before the migrating reference (%.0fs)", m, k, choice, i, r.Starts[i], bound.Starts[i])
					}
				}
				if r.Makespan < bound.Makespan {
					t.Errorf("m=%.1f: %s finishes the stream at %.0fs, before the migrating reference (%.0fs)", m, k, r.Makespan, bound.Makespan)
				}
			}
		}
	}
}

// TestMigratingIsBelowFluid: with demands above a half, the migrating
// reference is far below fluid (two such jobs never share a GPU), and Tessera
// is close to it.
func TestMigratingIsBelowFluid(t *testing.T) {
	w, jobs := small(0.6)
	mig, fluid := run(t, Migrating, w, jobs, Options{}), run(t, Fluid, w, jobs, Options{})
	tessera := run(t, Tessera, w, jobs, Options{})
	if mig.JobsPerHour > 0.85*fluid.JobsPerHour {
		t.Errorf("migrating %.0f jobs/h, fluid %.0f: the reference ignores GPU boundaries", mig.JobsPerHour, fluid.JobsPerHour)
	}
	if tessera.JobsPerHour < 0.9*mig.JobsPerHour {
		t.Errorf("Tessera %.0f jobs/h, migrating %.0f", tessera.JobsPerHour, mig.JobsPerHour)
	}
}

func TestWholeGPUModelNeverShares(t *testing.T) {
	w, jobs := small(0.1)
	if r := run(t, Whole, w, jobs, Options{}); r.MaxJobsPerGPU != 1 {
		t.Errorf("whole-GPU model ran %d jobs on one GPU, want 1", r.MaxJobsPerGPU)
	}
	if r := run(t, Tessera, w, jobs, Options{}); r.MaxJobsPerGPU < 2 {
		t.Errorf("Tessera at m=0.1 never shared a GPU (max %d jobs per GPU)", r.MaxJobsPerGPU)
	}
}

// TestNoGPUOverCapacity runs every model with the conservation check on (run sets
// Options.Check), with demands large enough that GPUs fill up.
func TestNoGPUOverCapacity(t *testing.T) {
	for _, m := range []float64{0.1, 0.4} {
		w, jobs := small(m)
		for _, k := range AllKinds {
			run(t, k, w, jobs, Options{})
		}
	}
}

func TestConservationCheckCatchesViolations(t *testing.T) {
	half := gpuMemory.Value() / 2
	for name, uses := range map[string][]gpuUse{
		"whole shared":        {{whole: true, memory: gpuMemory.Value(), cores: 100}, {memory: 1, cores: 1}},
		"memory over":         {{memory: half, cores: 10}, {memory: half + 1, cores: 10}},
		"cores over":          {{memory: 1, cores: 60}, {memory: 1, cores: 41}},
		"partitions overlap":  {{memory: 1, slots: 0x0f}, {memory: 1, slots: 0x0c}},
		"whole GPU partition": {{whole: true, slots: 0xff}, {slots: 0x01}},
	} {
		if err := checkGPU(uses, gpuMemory.Value()); err == nil {
			t.Errorf("%s: check passed", name)
		}
	}
	if err := checkGPU([]gpuUse{{memory: half, cores: 50, slots: 0x0f}, {memory: half, cores: 50, slots: 0xf0}}, gpuMemory.Value()); err != nil {
		t.Errorf("exactly full GPU: %v", err)
	}
}

// TestTesseraUse: the simulation counts what a Tessera device takes of its GPU
// by package accounting: a whole GPU all of it, a share its consumedCapacity,
// admin access nothing.
func TestTesseraUse(t *testing.T) {
	mem, cores := ShareRequest(Demand{0.25, 0.25})
	shareID := types.UID("s1")
	for _, tc := range []struct {
		name  string
		r     resourceapi.DeviceRequestAllocationResult
		minor int
		want  gpuUse
	}{
		{"whole", resourceapi.DeviceRequestAllocationResult{Driver: Driver, Device: "gpu-3"}, 3,
			gpuUse{whole: true, memory: gpuMemory.Value(), cores: 100}},
		{"share", resourceapi.DeviceRequestAllocationResult{Driver: Driver, Device: "gpu-2-shared", ShareID: &shareID,
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": mem, "cores": cores}}, 2,
			gpuUse{memory: mem.Value(), cores: cores.Value()}},
		{"admin access", resourceapi.DeviceRequestAllocationResult{Driver: Driver, Device: "gpu-1", AdminAccess: ptr.To(true)}, 1, gpuUse{}},
	} {
		minor, got, err := tesseraModel{}.use(&tc.r, HGXFleet(1).Nodes[0])
		if err != nil || minor != tc.minor || got != tc.want {
			t.Errorf("%s: use = %d, %+v, %v; want %d, %+v", tc.name, minor, got, err, tc.minor, tc.want)
		}
	}
	if _, _, err := (tesseraModel{}).use(&resourceapi.DeviceRequestAllocationResult{Driver: Driver, Device: "gpu-0-shared"}, HGXFleet(1).Nodes[0]); err == nil {
		t.Error("a share without a shareID was accepted")
	}
	if _, _, err := (tesseraModel{}).use(&resourceapi.DeviceRequestAllocationResult{Driver: Driver, Device: "gpu-0-p1-0"}, HGXFleet(1).Nodes[0]); err == nil {
		t.Error("a partition device was accepted")
	}
}

// TestSkippingKnownRefusalsChangesNothing: not asking a node that refused a smaller
// claim since it last changed gives the same placements as asking every time.
func TestSkippingKnownRefusalsChangesNothing(t *testing.T) {
	w, jobs := small(0.3)
	jobs = jobs[:150]
	for _, k := range []Kind{Whole, Partition, Tessera} {
		for _, opt := range []Options{{}, {Queue: QueueFIFO, NodeChoice: ChoiceFirst}} {
			fast := run(t, k, w, jobs, opt)
			opt.AlwaysAsk = true
			slow := run(t, k, w, jobs, opt)
			if diff := cmp.Diff(fast.Starts, slow.Starts); diff != "" {
				t.Errorf("%s %+v: start times differ (-skipping +asking):\n%s", k, opt, diff)
			}
			if fast.AllocatorCalls >= slow.AllocatorCalls {
				t.Errorf("%s %+v: skipping made %d calls, asking %d", k, opt, fast.AllocatorCalls, slow.AllocatorCalls)
			}
		}
	}
}

// TestAllocatorPacksFirstFit: the scheduler's allocator over Tessera's slices places
// exactly like first-fit by node, then GPU minor.
func TestAllocatorPacksFirstFit(t *testing.T) {
	w, jobs := small(0.2)
	real := run(t, Tessera, w, jobs, Options{Queue: QueueFIFO, NodeChoice: ChoiceFirst})
	starts := replay(t, newOraclePlacer(HGXFleet(2), Options{}, false), jobs)
	if diff := cmp.Diff(starts, real.Starts); diff != "" {
		t.Errorf("allocator vs first-fit (-first-fit +allocator):\n%s", diff)
	}
}

// replay runs the simulation loop with a given placer.
func replay(t *testing.T, p placer, jobs []Job) []float64 {
	t.Helper()
	w, _ := small(0.2)
	r, err := simulate(context.Background(), TesseraBestFit, w, jobs, Options{Nodes: 2, Check: true, Queue: QueueFIFO}, p)
	if err != nil {
		t.Fatal(err)
	}
	return r.Starts
}

func TestGPUMemoryMatchesProfile(t *testing.T) {
	gpus, err := hgxGPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != GPUsPerNode {
		t.Fatalf("%s has %d GPUs, want %d", Profile, len(gpus), GPUsPerNode)
	}
	for _, g := range gpus {
		if int64(g.MemoryBytes) != gpuMemory.Value() {
			t.Errorf("GPU %d: %d bytes, the simulation assumes %d", g.Minor, g.MemoryBytes, gpuMemory.Value())
		}
	}
}

// TestClaimSizes: partitions cover the demand; shares are pkg/fraction's for
// the demand rounded up to four decimals (memory and cores rounded down to
// the step), so that k shares of 1/k tile a GPU.
func TestClaimSizes(t *testing.T) {
	for _, tc := range []struct {
		demand  float64
		eighths int
		cores   int64
		memMi   int64
	}{
		// 0.01 of the memory is less than the 1Gi minimum share: the
		// smallest fraction above it (0.0127).
		{0.01, 1, 1, 1029}, {0.125, 1, 12, 10136}, {0.13, 2, 13, 10541}, {0.25, 2, 25, 20272}, {0.3, 4, 30, 24326},
		{0.51, 8, 51, 41355}, {1.0 / 3, 4, 33, 27029}, {1, 8, 100, 81089},
	} {
		if got := partitionEighths(tc.demand); got != tc.eighths {
			t.Errorf("demand %.3f: partition of %d eighths, want %d", tc.demand, got, tc.eighths)
		}
		mem, cores := ShareRequest(Demand{tc.demand, tc.demand})
		if cores.Value() != tc.cores || mem.Value() != tc.memMi<<20 {
			t.Errorf("demand %.4f: %s and %d cores, want %dMi and %d", tc.demand, mem.String(), cores.Value(), tc.memMi, tc.cores)
		}
	}
	for k := 1; k <= 8; k++ {
		mem, cores := ShareRequest(Demand{1 / float64(k), 1 / float64(k)})
		if int64(k)*mem.Value() > gpuMemory.Value() || int64(k)*cores.Value() > 100 {
			t.Errorf("%d shares of 1/%d (%s, %d cores) do not fit on one GPU", k, k, mem.String(), cores.Value())
		}
	}
	mem, cores := ShareRequest(Demand{0.5, 0.2})
	if mem.Value() != 40544<<20 || cores.Value() != 20 {
		t.Errorf("memory 1/2, cores 1/5: %s, %d cores", mem.String(), cores.Value())
	}
}

func TestReport(t *testing.T) {
	cfg := QuickConfig(3)
	cfg.Nodes, cfg.Workload.Jobs, cfg.Means = 1, 100, []float64{0.2, 0.3}
	cfg.CostNodes, cfg.CostShares, cfg.CostMinTime = []int{1}, []int{0, 63}, 0
	cfg.Command = "go run ./cmd/tessera-bench -quick"
	rep, err := Bench(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	md := rep.Markdown()
	for _, want := range []string{"| normal(0.20, 0.10) | 0.20 | ", "(c)/(a) throughput at m=0.2", "tessera-shared | 1 |", "(no fit)", "fleet-quick.png",
		"(c) >= 0.95 of the migrating reference (d) (a policy, not a bound), m=0.3", "FIFO: (c) >= 0.95 of (d), which bounds FIFO placements, m=0.2", "queue kube-scheduler, node choice score",
		"### Bounds that hold for every schedule", "(d) migrating ref.",
		"## Node side", "Not measured in this run", "| prepare+unprepare p99 per claim in mock mode | < 10 ms | not measured"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if b := charttest.PNG(t, rep).Bounds(); b.Dx() < 400 || b.Dy() < 300 {
		t.Errorf("plot is %v", b)
	}
}

// BenchmarkAllocate is part 2 of the fleet benchmark: one Allocate call for one
// claim on one node of a cluster whose nodes each hold `shares` 1/8-GPU allocations.
// Each iteration builds a fresh allocator (untimed) as the scheduler does per pod.
func BenchmarkAllocate(b *testing.B) {
	ctx := context.Background()
	for _, k := range AllCostKinds {
		for _, nodes := range []int{1, 16, 64} {
			for _, shares := range []int{0, 8, 32, 56, 63} {
				b.Run(fmt.Sprintf("%s/nodes=%d/shares=%d", k, nodes, shares), func(b *testing.B) {
					s, err := NewCostScenario(k, nodes, shares)
					if err != nil {
						b.Fatal(err)
					}
					for b.Loop() {
						b.StopTimer()
						a, err := s.NewAllocator(ctx)
						if err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
						if _, err := s.AllocateOnce(ctx, a); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// TestCostScenarioFits: the cost grid measures what it says — a claim that fits
// where there is room and is refused where there is none.
func TestCostScenarioFits(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		kind   CostKind
		shares int
		fits   bool
	}{
		{CostWhole, 63, true}, {CostPartition, 63, true}, {CostTesseraShared, 63, true},
		{CostTesseraWhole, 56, true}, {CostTesseraWhole, 63, false}, {CostPartition, 64, false}, {CostTesseraShared, 64, false},
	} {
		s, err := NewCostScenario(tc.kind, 2, tc.shares)
		if err != nil {
			t.Fatal(err)
		}
		a, err := s.NewAllocator(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if fits, err := s.AllocateOnce(ctx, a); err != nil || fits != tc.fits {
			t.Errorf("%s with %d existing: fits=%v, err=%v; want fits=%v", tc.kind, tc.shares, fits, err, tc.fits)
		}
	}
}

// TestNodeReport checks how the node-side runs are rendered and judged: the
// worst p99 over backends and runs decides each target, and the spread over
// the runs appears as median (min–max).
func TestNodeReport(t *testing.T) {
	run := func(seqP99, concP99 time.Duration, idleMiB int64) node.Report {
		lat := func(p99 time.Duration, claims, perRound int) node.Latency {
			return node.Latency{Claims: claims, P50: p99 / 4, P99: p99, Max: p99, Wall: p99, ClaimsPerRound: perRound}
		}
		return node.Report{
			Profile: "hgx-h100", GPUs: 8, Procs: 2,
			Backends: []node.Backend{
				{Isolation: "Advisory", Sequential: lat(seqP99, 500, 0), Concurrent: lat(concP99, 300, 100)},
				{Isolation: "MPS", Sequential: lat(seqP99/2, 500, 0), Concurrent: lat(concP99/2, 300, 100)},
			},
			Memory: node.Memory{BaseRSS: 60 << 20, BaseAnon: 5 << 20, IdleRSS: idleMiB << 20, IdleAnon: 12 << 20, IdleHWM: idleMiB << 20,
				LoadPeakRSS: (idleMiB + 2) << 20, LoadPeakAnon: 14 << 20, LoadHWM: (idleMiB + 2) << 20},
			Writes: node.APIWrites{Slices: 2, Publish: node.Writes{Create: 2}, InventorySkipsUnchanged: true, HealthChange: node.Writes{Update: 1}},
		}
	}
	rep := &Report{Command: "go run ./cmd/tessera-bench", Node: []node.Report{
		run(4*time.Millisecond, 300*time.Millisecond, 80),
		run(6*time.Millisecond, 250*time.Millisecond, 82),
		run(5*time.Millisecond, 400*time.Millisecond, 81),
	}}
	var got []Target
	for _, tg := range rep.Targets() {
		if strings.HasPrefix(tg.Name, "prepare+unprepare") {
			got = append(got, tg)
		}
	}
	want := []Target{
		{"prepare+unprepare p99 per claim in mock mode, 1 claim at a time (worst backend and run)", "< 10 ms", "6.00 ms (Advisory)", true},
		{"prepare+unprepare p99 per claim in mock mode, 100 claims at once (worst backend and run)", "< 50 ms", "400 ms (Advisory)", false},
	}
	if !slices.Equal(got, want) {
		t.Errorf("node targets:\n got %+v\nwant %+v", got, want)
	}
	md := rep.Markdown()
	for _, s := range []string{
		"in 3 separate child processes",
		"| Advisory | 1.25 (1.00–1.50) | 5.00 (4.00–6.00) | 75 (62–100) | 300 (250–400) |",
		"| idle: after plugin.New and the first publish | 81 (80–82) | 12 |",
		"| first publish of the 8-GPU node | 2 | 2 | 0 | 0 |",
		"| one GPU turns unhealthy (NoSchedule taint on its two devices) | 2 | 0 | 1 | 0 |",
		"does not call PublishResources at all",
		"(Advisory backend): 100000 (83333–125000) one at a time, 1000 (750–1200) with 100 at once",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	if strings.Contains(md, "TODO(node-side)") {
		t.Error("report still has the TODO(node-side) placeholder")
	}
}
