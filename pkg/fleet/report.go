package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tessera-dev/tessera/pkg/nodebench"
)

// Report is one run of the whole benchmark: the fleet simulation for every mean
// demand and model, and the scheduler cost table.
type Report struct {
	Command  string
	Workload Workload // MeanDemand is per row
	Nodes    int
	Means    []float64
	// Results[i][k] is AllKinds[k] at Means[i].
	Results [][]Result
	Costs   []Cost
	// SimWall and CostWall are how long the two parts took (wall clock, informative).
	SimWall, CostWall time.Duration
	// Node holds the node-side measurements, one per repetition (each in a
	// fresh process, all with the same nodebench.Options); empty when not
	// measured.
	Node []nodebench.Report
}

func (r *Report) result(i int, k Kind) Result {
	return r.Results[i][slices.Index(AllKinds, k)]
}

func (r *Report) cost(k CostKind, nodes, shares int) (Cost, bool) {
	for _, c := range r.Costs {
		if c.Kind == k && c.Nodes == nodes && c.Shares == shares {
			return c, true
		}
	}
	return Cost{}, false
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func mark(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// Target is one figure from the issue with what was measured.
type Target struct {
	Name, Want, Measured string
	Met                  bool
}

// Targets evaluates the targets on this report. Targets whose inputs were
// not measured (a mean demand or cost point missing) are left out.
func (r *Report) Targets() []Target {
	var out []Target
	at := func(m float64) int {
		return slices.IndexFunc(r.Means, func(x float64) bool { return x > m-1e-9 && x < m+1e-9 })
	}
	for _, t := range []struct{ m, want float64 }{{0.2, 2.5}, {0.3, 1.8}} {
		if i := at(t.m); i >= 0 {
			x := ratio(r.result(i, Tessera).JobsPerHour, r.result(i, Whole).JobsPerHour)
			out = append(out, Target{fmt.Sprintf("(c)/(a) throughput at m=%.1f", t.m), fmt.Sprintf(">= %.1fx", t.want), fmt.Sprintf("%.2fx", x), x >= t.want})
		}
	}
	for i, m := range r.Means {
		x := ratio(r.result(i, Tessera).JobsPerHour, r.result(i, Fluid).JobsPerHour)
		out = append(out, Target{fmt.Sprintf("(c) within 10%% of (d) at m=%.1f", m), ">= 0.90 of (d)", fmt.Sprintf("%.3f", x), x >= 0.9})
	}
	for i, m := range r.Means {
		c, b := r.result(i, Tessera).JobsPerHour, r.result(i, Partition).JobsPerHour
		out = append(out, Target{fmt.Sprintf("(c) >= (b) at m=%.1f", m), ">= 1.00 of (b)", fmt.Sprintf("%.3f", ratio(c, b)), c >= b})
	}
	var worst float64
	var worstAt string
	for _, c := range r.Costs {
		if c.Kind != CostTesseraShared {
			continue
		}
		w, ok := r.cost(CostTesseraWhole, c.Nodes, c.Shares)
		if !ok || !w.Fits || !c.Fits {
			continue
		}
		if x := ratio(float64(c.Allocate), float64(w.Allocate)); x > worst {
			worst, worstAt = x, fmt.Sprintf("%d nodes, %d shares", c.Nodes, c.Shares)
		}
	}
	if worst > 0 {
		out = append(out, Target{"Allocate: shared claim vs whole claim (Tessera model), worst point", "<= 2.0x",
			fmt.Sprintf("%.2fx (%s)", worst, worstAt), worst <= 2})
	}
	out = append(out, r.nodeTargets()...)
	return out
}

// prepareTarget is the bound on prepare latency in mock mode.
const prepareTarget = 10 * time.Millisecond

// nodeTargets holds the p99 of prepare+unprepare against prepareTarget, for
// one claim at a time and for the concurrent rounds: the worst backend in the
// worst run.
func (r *Report) nodeTargets() []Target {
	name := "prepare+unprepare p99 per claim in mock mode"
	if len(r.Node) == 0 || len(r.Node[0].Backends) == 0 {
		return []Target{{name, "< 10 ms", "not measured (run without -node=false)", false}}
	}
	var out []Target
	for _, mode := range []struct {
		what string
		get  func(nodebench.Backend) nodebench.Latency
	}{
		{"1 claim at a time", func(b nodebench.Backend) nodebench.Latency { return b.Sequential }},
		{fmt.Sprintf("%d claims at once", r.Node[0].Backends[0].Concurrent.ClaimsPerRound), func(b nodebench.Backend) nodebench.Latency { return b.Concurrent }},
	} {
		var worst time.Duration
		var at string
		for _, run := range r.Node {
			for _, b := range run.Backends {
				if p := mode.get(b).P99; p > worst {
					worst, at = p, string(b.Isolation)
				}
			}
		}
		out = append(out, Target{fmt.Sprintf("%s, %s (worst backend and run)", name, mode.what), "< 10 ms",
			fmt.Sprintf("%s ms (%s)", millis(worst), at), worst < prepareTarget})
	}
	return out
}

func millis(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if ms < 10 {
		return fmt.Sprintf("%.2f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}

// spread is "median (min–max)" of the values over the runs, or the value
// alone for one run.
func spread[T any](runs []nodebench.Report, get func(nodebench.Report) T, format func(T) string, less func(a, b T) bool) string {
	vals := make([]T, len(runs))
	for i, run := range runs {
		vals[i] = get(run)
	}
	slices.SortFunc(vals, func(a, b T) int {
		switch {
		case less(a, b):
			return -1
		case less(b, a):
			return 1
		}
		return 0
	})
	med := format(vals[len(vals)/2])
	if len(vals) == 1 || format(vals[0]) == format(vals[len(vals)-1]) {
		return med
	}
	return fmt.Sprintf("%s (%s–%s)", med, format(vals[0]), format(vals[len(vals)-1]))
}

func durationSpread(runs []nodebench.Report, get func(nodebench.Report) time.Duration) string {
	return spread(runs, get, millis, func(a, b time.Duration) bool { return a < b })
}

func rateSpread(runs []nodebench.Report, get func(nodebench.Report) nodebench.Latency) string {
	return spread(runs, func(x nodebench.Report) float64 {
		l := get(x)
		return ratio(float64(l.Claims), l.Wall.Seconds())
	}, func(v float64) string { return fmt.Sprintf("%.0f", v) }, func(a, b float64) bool { return a < b })
}

func mibSpread(runs []nodebench.Report, get func(nodebench.Report) int64) string {
	return spread(runs, get, func(v int64) string { return fmt.Sprintf("%.0f", float64(v)/(1<<20)) }, func(a, b int64) bool { return a < b })
}

func (r *Report) nodeMarkdown(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("\n## Node side (prepare/unprepare, RSS, API writes)\n\n")
	if len(r.Node) == 0 || len(r.Node[0].Backends) == 0 {
		p("Not measured in this run (`-node=false`).\n")
		return
	}
	first := r.Node[0]
	backends := first.Backends
	conc := backends[0].Concurrent
	p("The kubelet plugin of pkg/plugin in mock mode on one %s node (%d GPUs), built through plugin.New as the kubelet plugin wires it, "+
		"with a real checkpoint file and CDI directory in a temporary directory, logs discarded; measured by pkg/nodebench in %d separate child "+
		"processes (GOMAXPROCS %d). Figures are the median over the runs with the range (min–max) in brackets.\n\n",
		first.Profile, first.GPUs, len(r.Node), first.Procs)

	p("### Prepare + unprepare latency per claim (ms)\n\n")
	p("One claim is a share of gpu-N-shared (4Gi, 5 cores, a ShareID, an opaque GpuConfig choosing the backend), shaped as the allocator writes it; "+
		"the time is one PrepareResourceClaims plus one UnprepareResourceClaims call, in-process. *1 at a time*: %d claims one after the other. "+
		"*%d at once*: %d goroutines start together, each preparing and unpreparing its own claim (spread over the 8 GPUs' shared devices), "+
		"%d rounds; percentiles over all %d claims.\n\n",
		backends[0].Sequential.Claims, conc.ClaimsPerRound, conc.ClaimsPerRound, conc.Claims/max(conc.ClaimsPerRound, 1), conc.Claims)
	p("| backend | 1 at a time p50 | 1 at a time p99 | %d at once p50 | %d at once p99 | %d at once: round wall |\n|---|---|---|---|---|---|\n",
		conc.ClaimsPerRound, conc.ClaimsPerRound, conc.ClaimsPerRound)
	for i, be := range backends {
		get := func(f func(nodebench.Backend) time.Duration) func(nodebench.Report) time.Duration {
			return func(run nodebench.Report) time.Duration { return f(run.Backends[i]) }
		}
		p("| %s | %s | %s | %s | %s | %s |\n", be.Isolation,
			durationSpread(r.Node, get(func(b nodebench.Backend) time.Duration { return b.Sequential.P50 })),
			durationSpread(r.Node, get(func(b nodebench.Backend) time.Duration { return b.Sequential.P99 })),
			durationSpread(r.Node, get(func(b nodebench.Backend) time.Duration { return b.Concurrent.P50 })),
			durationSpread(r.Node, get(func(b nodebench.Backend) time.Duration { return b.Concurrent.P99 })),
			durationSpread(r.Node, get(func(b nodebench.Backend) time.Duration {
				return b.Concurrent.Wall / time.Duration(max(b.Concurrent.Claims/max(b.Concurrent.ClaimsPerRound, 1), 1))
			})))
	}
	p("\nA claim of the concurrent rounds waits for the others: the checkpoint serializes its writes (each Put and Delete encodes and " +
		"checksums every claim in it, writes a temporary file, fsyncs and renames it; the file grows with the claims in flight), and a claim " +
		"makes three of them, so a claim's latency is close to the round's wall time. " +
		"In a cluster the kubelet plugin helper serializes prepare calls by default, so the kubelet would see that queueing in front of " +
		"the plugin rather than inside it.\n\n")
	p("Throughput, claims prepared and unprepared per second (%s backend): %s one at a time, %s with %d at once.\n\n", backends[0].Isolation,
		rateSpread(r.Node, func(x nodebench.Report) nodebench.Latency { return x.Backends[0].Sequential }),
		rateSpread(r.Node, func(x nodebench.Report) nodebench.Latency { return x.Backends[0].Concurrent }), conc.ClaimsPerRound)

	p("### Resident memory of the plugin process (MiB)\n\n")
	p("From /proc/self/status of the child process, which holds the plugin, the ResourceSlice controller and client-go's fake clientset standing " +
		"in for the API server (simple object tracker), and nothing of the fleet simulation. VmRSS is dominated by the pages of the ~100 MB " +
		"tessera-bench binary that happen to be mapped, which varies with the page cache from run to run (and includes code the plugin does " +
		"not use, such as kube-scheduler's allocator); RssAnon, the anonymous part (heap, stacks), is what the program itself allocates.\n\n")
	mib := func(get func(nodebench.Memory) int64) string {
		return mibSpread(r.Node, func(x nodebench.Report) int64 { return get(x.Memory) })
	}
	p("| | VmRSS | RssAnon |\n|---|---|---|\n")
	p("| process at start, before the plugin | %s | %s |\n", mib(func(m nodebench.Memory) int64 { return m.BaseRSS }), mib(func(m nodebench.Memory) int64 { return m.BaseAnon }))
	p("| idle: after plugin.New and the first publish | %s | %s |\n", mib(func(m nodebench.Memory) int64 { return m.IdleRSS }), mib(func(m nodebench.Memory) int64 { return m.IdleAnon }))
	p("| idle minus start: what the plugin and its publisher added | %s | %s |\n",
		mib(func(m nodebench.Memory) int64 { return m.IdleRSS - m.BaseRSS }), mib(func(m nodebench.Memory) int64 { return m.IdleAnon - m.BaseAnon }))
	p("| under the %d-claim load: peak sampled every 2 ms | %s | %s |\n", conc.ClaimsPerRound,
		mib(func(m nodebench.Memory) int64 { return m.LoadPeakRSS }), mib(func(m nodebench.Memory) int64 { return m.LoadPeakAnon }))
	p("| after the load: VmHWM (peak of the whole process) | %s | |\n", mib(func(m nodebench.Memory) int64 { return m.LoadHWM }))

	p("\n### API writes to publish the node\n\n")
	p("ResourceSlice creates, updates and deletes seen by client-go's fake clientset, written by k8s.io/dynamic-resource-allocation's " +
		"resourceslice controller (what kubeletplugin.Helper.PublishResources runs, with the node as owner) fed by plugin.Inventory; reads " +
		"(node lookup, list, watch) not counted. The controller's follow-up syncs were shortened (20 ms sync delay, 100 ms mutation cache TTL) " +
		"and each step waited for 400 ms without writes, so every write it makes after a change is counted.\n\n")
	p("| event | slices | creates | updates | deletes |\n|---|---|---|---|---|\n")
	wr := func(name string, get func(nodebench.APIWrites) nodebench.Writes) {
		cell := func(f func(nodebench.Writes) int) string {
			return spread(r.Node, func(x nodebench.Report) int { return f(get(x.Writes)) }, func(v int) string { return fmt.Sprint(v) }, func(a, b int) bool { return a < b })
		}
		p("| %s | %d | %s | %s | %s |\n", name, first.Writes.Slices,
			cell(func(w nodebench.Writes) int { return w.Create }), cell(func(w nodebench.Writes) int { return w.Update }), cell(func(w nodebench.Writes) int { return w.Delete }))
	}
	wr(fmt.Sprintf("first publish of the %d-GPU node", first.GPUs), func(w nodebench.APIWrites) nodebench.Writes { return w.Publish })
	wr("the same resources published again", func(w nodebench.APIWrites) nodebench.Writes { return w.Republish })
	wr("one GPU turns unhealthy (NoSchedule taint on its two devices)", func(w nodebench.APIWrites) nodebench.Writes { return w.HealthChange })
	skips := true
	for _, run := range r.Node {
		skips = skips && run.Writes.InventorySkipsUnchanged
	}
	if skips {
		p("\nplugin.Inventory does not call PublishResources at all when discovery and taints are unchanged; the second row calls it directly.\n")
	} else {
		p("\nplugin.Inventory called PublishResources again for an unchanged node in at least one run.\n")
	}
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	w := r.Workload
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# Tessera fleet benchmark\n\n")
	p("Reproduce: `%s` (deterministic for the seed; wall times vary).\n\n", r.Command)
	p("Fleet: %d nodes × %d GPUs (mock profile hgx-h100: H100 80GB, 81559Mi each, published by pkg/model), %d GPUs. Stream per mean demand m: %d jobs, Poisson arrivals at %.2f× the fluid capacity "+
		"(rate = %.2f × GPUs / (m × mean run time)), demand ~ Normal(m, %.2f) clipped to [%.2f, 1], memory and cores ∝ demand, "+
		"run time ~ Exp(mean %.0f s), seed %d. Simulation %.1fs, scheduler cost %.1fs wall.\n\n",
		r.Nodes, GPUsPerNode, r.Nodes*GPUsPerNode, w.Jobs, w.Load, w.Load, w.SDDemand, MinDemand, w.MeanRuntime, w.Seed,
		r.SimWall.Seconds(), r.CostWall.Seconds())

	p("## Targets\n\n| target | wanted | measured | |\n|---|---|---|---|\n")
	for _, t := range r.Targets() {
		p("| %s | %s | %s | %s |\n", t.Name, t.Want, t.Measured, mark(t.Met))
	}

	p("\n## Throughput (jobs completed per hour)\n\n")
	p("| m | (a) whole | (b) partition | (c) tessera | (c') tessera best-fit | (d) fluid | (c)/(a) | (c)/(b) | (c)/(d) |\n|---|---|---|---|---|---|---|---|---|\n")
	for i, m := range r.Means {
		a, bb, c, cb, d := r.result(i, Whole), r.result(i, Partition), r.result(i, Tessera), r.result(i, TesseraBestFit), r.result(i, Fluid)
		p("| %.1f | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f× | %.2f× | %.3f |\n", m, a.JobsPerHour, bb.JobsPerHour, c.JobsPerHour, cb.JobsPerHour, d.JobsPerHour,
			ratio(c.JobsPerHour, a.JobsPerHour), ratio(c.JobsPerHour, bb.JobsPerHour), ratio(c.JobsPerHour, d.JobsPerHour))
	}
	p("\n![throughput vs mean demand](%s)\n", "fleet"+map[bool]string{true: "-quick", false: ""}[strings.Contains(r.Command, "-quick")]+".png")

	p("\n## Per model\n\nActive GPUs run at least one job; memory utilisation is the memory the jobs use (demand × GPU memory) over the memory of the active GPUs, " +
		"both time-averaged over the window. Waits are from submission to start, over all jobs, in minutes.\n\n")
	p("| m | model | jobs/h | mean active GPUs | mem util of active | wait p50 (min) | wait p99 (min) | max jobs on one GPU | allocator calls |\n|---|---|---|---|---|---|---|---|---|\n")
	for i, m := range r.Means {
		for _, res := range r.Results[i] {
			maxJobs := fmt.Sprint(res.MaxJobsPerGPU)
			if res.Kind == Fluid {
				maxJobs = "–"
			}
			p("| %.1f | %s | %.0f | %.1f | %.1f%% | %.1f | %.1f | %s | %d |\n", m, res.Kind, res.JobsPerHour, res.MeanActiveGPUs, 100*res.MemUtilActive,
				res.WaitP50/60, res.WaitP99/60, maxJobs, res.AllocatorCalls)
		}
	}

	r.costMarkdown(&b)

	r.nodeMarkdown(&b)

	p("\n## Method and assumptions\n\n")
	for _, line := range methodNotes {
		p("- %s\n", line)
	}
	return b.String()
}

var methodNotes = []string{
	"Discrete-event simulation on a simulated clock (events: arrivals, completions). Every placement attempt for (a), (b), (c) is a real `structured.NewAllocator(...).Allocate` call (feature set of kube-scheduler 1.37: PartitionableDevices, ConsumableCapacity, PrioritizedList, DeviceTaints, AdminAccess, binding conditions) on one node with that node's AllocatedState; results are fed back as the scheduler does (AllocatedDevices for whole devices, AllocatedSharedDeviceIDs + AggregatedCapacity for shares).",
	"Queue: FIFO with head-of-line blocking. When the head job fits nowhere, nothing is retried until a job completes; nothing overtakes the head (the default scheduler with equal priorities, no backfill). A job goes to the first node, in node order, whose allocation succeeds (the scheduler with equal node scores). Within a node the allocator takes the first fitting device in slice order, i.e. first-fit by GPU index.",
	"A node that refused a claim is not asked again for a claim at least as large until something on it changes (the answer is known; a test checks the results are identical with and without this shortcut).",
	"Claims: (a) one whole GPU regardless of demand; (b) the smallest fixed partition ≥ demand among 1/8, 1/4, 1/2, 1/1 — per GPU 15 devices consuming memory, cores and slot counters slot0..7 so overlapping partitions exclude each other (buddy layout, the MIG way); (c) a share on gpu-N-shared with memory = demand × 81559Mi rounded up to 1Mi and cores = ceil(demand × 100); (c') the same requests packed best-fit across the fleet by an oracle (not the scheduler) to show what first-fit costs; (d) fluid: a job starts iff the fleet's total free capacity ≥ its demand (no GPU boundaries) — an upper bound, not reachable by any placement once demands exceed 1/2.",
	"Load: the arrival rate is above the fluid capacity, so every model is saturated and throughput is the service capacity under FIFO (as in KubeShare §5.3, where differences appear when jobs queue). Waits therefore grow with the length of the stream; compare them between models, not as absolute numbers.",
	"Run time is independent of sharing (the paper's inference jobs are served at their requested rate; isolation overhead is not modelled).",
	"Measurement window: from the arrival of the first 10% of jobs (warm-up) to the last arrival; all jobs then run to completion so every wait is known.",
	"(d) counts ceil(total running demand) as its active GPUs (perfect packing).",
}

func (r *Report) costMarkdown(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	var nodes, shares []int
	for _, c := range r.Costs {
		if !slices.Contains(nodes, c.Nodes) {
			nodes = append(nodes, c.Nodes)
		}
		if !slices.Contains(shares, c.Shares) {
			shares = append(shares, c.Shares)
		}
	}
	if len(nodes) == 0 {
		return
	}
	slices.Sort(nodes)
	slices.Sort(shares)
	p("\n## Scheduler cost\n\nTime of one `Allocate` call for one claim on one node (kube-scheduler's Filter), with a fresh allocator built over the whole cluster, " +
		"against the allocations already on every node (in 1/8-GPU units: shares for Tessera, 1/8 partitions for (b), whole GPUs = eighths/8 for (a), at most 7) " +
		"and the number of nodes. The allocated state is cluster-wide, as in the scheduler. µs per call; `(no fit)` is the time to say no. " +
		"Run `go test -bench Allocate ./pkg/fleet` for the same points as Go benchmarks.\n\n")
	p("| claim | nodes |")
	for _, s := range shares {
		p(" %d existing |", s)
	}
	p("\n|---|---|%s\n", strings.Repeat("---|", len(shares)))
	for _, k := range AllCostKinds {
		for _, n := range nodes {
			p("| %s | %d |", k, n)
			for _, s := range shares {
				c, ok := r.cost(k, n, s)
				switch {
				case !ok:
					p(" |")
				case c.Fits:
					p(" %.0f |", float64(c.Allocate)/1e3)
				default:
					p(" %.0f (no fit) |", float64(c.Allocate)/1e3)
				}
			}
			p("\n")
		}
	}
	p("\nBuilding the allocator (once per pod, PreFilter), µs:\n\n| claim |")
	for _, n := range nodes {
		p(" %d nodes |", n)
	}
	p("\n|---|%s\n", strings.Repeat("---|", len(nodes)))
	for _, k := range AllCostKinds {
		p("| %s |", k)
		for _, n := range nodes {
			c, ok := r.cost(k, n, shares[len(shares)-1])
			if ok {
				p(" %.0f |", float64(c.NewAllocator)/1e3)
			} else {
				p(" |")
			}
		}
		p("\n")
	}
}
