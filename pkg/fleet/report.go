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
	// Sim is the queue and node-choice model of the runs.
	Sim Options
	// Means[i] is the mean demand of row i, Dists[i] its distribution's name.
	Means []float64
	Dists []string
	// Results[i][k] is AllKinds[k] on row i.
	Results [][]Result
	// FIFO[i][k] is FIFOKinds[k] on row i under QueueFIFO (empty when not run).
	FIFO  [][]Result
	Costs []Cost
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

func (r *Report) fifo(i int, k Kind) (Result, bool) {
	if i >= len(r.FIFO) || len(r.FIFO[i]) == 0 {
		return Result{}, false
	}
	return r.FIFO[i][slices.Index(FIFOKinds, k)], true
}

// normalRows says whether the rows are the paper's normal demand.
func (r *Report) normalRows() bool {
	for _, d := range r.Dists {
		if !strings.HasPrefix(d, "normal(") {
			return false
		}
	}
	return true
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
	if r.normalRows() {
		for _, t := range []struct{ m, want float64 }{{0.2, 2.5}, {0.3, 1.8}} {
			if i := at(t.m); i >= 0 {
				x := ratio(r.result(i, Tessera).JobsPerHour, r.result(i, Whole).JobsPerHour)
				out = append(out, Target{fmt.Sprintf("(c)/(a) throughput at m=%.1f", t.m), fmt.Sprintf(">= %.1fx", t.want), fmt.Sprintf("%.2fx", x), x >= t.want})
			}
		}
	}
	for i := range r.Means {
		x := ratio(r.result(i, Tessera).JobsPerHour, r.result(i, Bound).JobsPerHour)
		out = append(out, Target{fmt.Sprintf("(c) >= 0.95 of the GPU-boundary bound (d), %s", r.rowName(i)), ">= 0.95 of (d)", fmt.Sprintf("%.3f", x), x >= 0.95})
	}
	for i := range r.Means {
		c, ok1 := r.fifo(i, Tessera)
		b, ok2 := r.fifo(i, Bound)
		if ok1 && ok2 {
			x := ratio(c.JobsPerHour, b.JobsPerHour)
			out = append(out, Target{fmt.Sprintf("FIFO reference: (c) >= 0.95 of (d), %s", r.rowName(i)), ">= 0.95 of (d)", fmt.Sprintf("%.3f", x), x >= 0.95})
		}
	}
	for i := range r.Means {
		c, b := r.result(i, Tessera).JobsPerHour, r.result(i, Partition).JobsPerHour
		out = append(out, Target{fmt.Sprintf("(c) >= (b), %s", r.rowName(i)), ">= 1.00 of (b)", fmt.Sprintf("%.3f", ratio(c, b)), c >= b})
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

// rowName is "m=0.3" for the paper's normal rows, else the distribution.
func (r *Report) rowName(i int) string {
	if r.normalRows() {
		return fmt.Sprintf("m=%.1f", r.Means[i])
	}
	return fmt.Sprintf("%s (mean %.2f)", r.Dists[i], r.Means[i])
}

// Bounds on the p99 of prepare+unprepare in mock mode: one claim at a time,
// and a claim of a round of concurrent ones.
const (
	prepareTarget           = 10 * time.Millisecond
	concurrentPrepareTarget = 50 * time.Millisecond
)

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
		what   string
		target time.Duration
		get    func(nodebench.Backend) nodebench.Latency
	}{
		{"1 claim at a time", prepareTarget, func(b nodebench.Backend) nodebench.Latency { return b.Sequential }},
		{fmt.Sprintf("%d claims at once", r.Node[0].Backends[0].Concurrent.ClaimsPerRound), concurrentPrepareTarget, func(b nodebench.Backend) nodebench.Latency { return b.Concurrent }},
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
		out = append(out, Target{fmt.Sprintf("%s, %s (worst backend and run)", name, mode.what), fmt.Sprintf("< %d ms", mode.target.Milliseconds()),
			fmt.Sprintf("%s ms (%s)", millis(worst), at), worst < mode.target})
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

// fsName is the filesystem type a node run wrote what to, or "a filesystem
// not recorded" for a report from before it was.
func fsName(run nodebench.Report, what string) string {
	if t := run.Filesystems[what]; t != "" {
		return t
	}
	return "a filesystem not recorded"
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
		"with a real checkpoint file (on %s, as on a node's root disk) and real CDI specs and HAMiCore claim directories (on %s, as a node's /var/run is a tmpfs) "+
		"in temporary directories, logs discarded; measured by pkg/nodebench in %d separate child "+
		"processes (GOMAXPROCS %d). Figures are the median over the runs with the range (min–max) in brackets.\n\n",
		first.Profile, first.GPUs, fsName(first, "checkpoint"), fsName(first, "run"), len(r.Node), first.Procs)

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
	p("\nEach Put and Delete rewrites the whole checkpoint file (temporary file, fsync, rename, directory fsync), and a claim makes " +
		"three of them one after the other; concurrent claims share these writes (group commit: about 18 writes per round of 100 claims), " +
		"so a claim's latency is a few batch writes rather than the whole round. " +
		"In a cluster the kubelet plugin helper serializes prepare calls by default, so the kubelet sees that queueing in front of " +
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
	queue, choice := r.Sim.Queue, r.Sim.NodeChoice
	if queue == "" {
		queue = QueueKube
	}
	if choice == "" {
		choice = ChoiceScore
	}
	p("Fleet: %d nodes × %d GPUs (mock profile hgx-h100: H100 80GB, 81089Mi each, published by pkg/model), %d GPUs. ",
		r.Nodes, GPUsPerNode, r.Nodes*GPUsPerNode)
	if w.Trace != nil {
		p("Stream: the trace's %d jobs as they are. ", len(w.Trace))
	} else {
		p("Stream per row: %d jobs, Poisson arrivals at %.2f× the fluid capacity (rate = %.2f × GPUs / (mean demand × mean run time)), "+
			"run time ~ Exp(mean %.0f s), seed %d. ", w.Jobs, w.Load, w.Load, w.MeanRuntime, w.Seed)
	}
	p("Demand: ")
	if r.normalRows() {
		p("Normal(m, %.2f) clipped to [%.2f, 1], memory and cores alike (KubeShare §5.3). ", w.SDDemand, MinDemand)
	} else {
		p("one distribution per row, named in the tables (mean = mean of max(memory, cores)). ")
	}
	p("Scheduler model: queue %s, node choice %s", queue, choice)
	if choice == ChoiceScore {
		sc := r.Sim.Scoring
		if sc == (Scoring{}) {
			sc = DefaultScoring
		}
		p(" (nodes %dm cpu, %dGi memory; pods request %dm cpu, %d bytes memory — 0: none)", sc.NodeMilliCPU, sc.NodeMemory>>30, sc.PodMilliCPU, sc.PodMemory)
	}
	p(". Simulation %.1fs, scheduler cost %.1fs wall.\n\n", r.SimWall.Seconds(), r.CostWall.Seconds())

	p("## Targets\n\n| target | wanted | measured | |\n|---|---|---|---|\n")
	for _, t := range r.Targets() {
		p("| %s | %s | %s | %s |\n", t.Name, t.Want, t.Measured, mark(t.Met))
	}

	p("\n## Throughput (jobs completed per hour)\n\n")
	p("(d) is the GPU-boundary bound (optimal repacking at every event, see Method), (e) the fluid bound without GPU boundaries, kept for reference.\n\n")
	p("| demand | mean | (a) whole | (b) partition | (c) tessera | (c') tessera best-fit | (d) GPU bound | (e) fluid | (c)/(a) | (c)/(b) | (c)/(d) | (c)/(e) |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, m := range r.Means {
		a, bb, c, cb, d, e := r.result(i, Whole), r.result(i, Partition), r.result(i, Tessera), r.result(i, TesseraBestFit), r.result(i, Bound), r.result(i, Fluid)
		p("| %s | %.2f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f× | %.2f× | %.3f | %.3f |\n", r.Dists[i], m, a.JobsPerHour, bb.JobsPerHour, c.JobsPerHour, cb.JobsPerHour, d.JobsPerHour, e.JobsPerHour,
			ratio(c.JobsPerHour, a.JobsPerHour), ratio(c.JobsPerHour, bb.JobsPerHour), ratio(c.JobsPerHour, d.JobsPerHour), ratio(c.JobsPerHour, e.JobsPerHour))
	}
	p("\n![throughput vs mean demand](%s)\n", "fleet"+map[bool]string{true: "-quick", false: ""}[strings.Contains(r.Command, "-quick")]+".png")

	if len(r.FIFO) > 0 && len(r.FIFO[0]) > 0 {
		p("\n### FIFO reference\n\nThe same streams under a FIFO queue with head-of-line blocking (not kube-scheduler's queue), where (d) is a proven bound on every job's start (Method).\n\n")
		p("| demand | (c) tessera | (d) GPU bound | (e) fluid | (c)/(d) | (c)/(e) | (d): checks taken as packable unproven |\n|---|---|---|---|---|---|---|\n")
		for i := range r.Means {
			c, _ := r.fifo(i, Tessera)
			d, _ := r.fifo(i, Bound)
			e, _ := r.fifo(i, Fluid)
			p("| %s | %.0f | %.0f | %.0f | %.3f | %.3f | %d |\n", r.Dists[i], c.JobsPerHour, d.JobsPerHour, e.JobsPerHour, ratio(c.JobsPerHour, d.JobsPerHour), ratio(c.JobsPerHour, e.JobsPerHour), d.Undecided)
		}
	}

	p("\n## Per model\n\nActive GPUs run at least one job ((d) and (e) count ⌈memory in use⌉); memory utilisation is the memory the jobs use (memory fraction × GPU memory) over the memory of the active GPUs, " +
		"both time-averaged over the window. Waits are from submission to start, over all jobs, in minutes. Attempts are scheduling attempts (a pod popped from the queue and filtered).\n\n")
	p("| demand | model | jobs/h | mean active GPUs | mem util of active | wait mean (min) | wait p50 | wait p95 | wait p99 | max jobs on one GPU | attempts | allocator calls |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i := range r.Means {
		for _, res := range r.Results[i] {
			maxJobs := fmt.Sprint(res.MaxJobsPerGPU)
			if res.Kind == Fluid || res.Kind == Bound {
				maxJobs = "–"
			}
			p("| %s | %s | %.0f | %.1f | %.1f%% | %.1f | %.1f | %.1f | %.1f | %s | %d | %d |\n", r.Dists[i], res.Kind, res.JobsPerHour, res.MeanActiveGPUs, 100*res.MemUtilActive,
				res.WaitMean/60, res.WaitP50/60, res.WaitP95/60, res.WaitP99/60, maxJobs, res.Attempts, res.AllocatorCalls)
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
	"Discrete-event simulation on a simulated clock (events: arrivals, completions, scheduling attempts). Every placement attempt for (a), (b), (c) is a real `structured.NewAllocator(...).Allocate` call (feature set of kube-scheduler 1.37, model.SchedulerFeatures) on one node with that node's AllocatedState; results are fed back as the scheduler does (AllocatedDevices for whole devices, AllocatedSharedDeviceIDs + AggregatedCapacity for shares). Within a node the allocator takes the first fitting device in slice order, i.e. first-fit by GPU index.",
	"Queue (kube-scheduler 1.37, pkg/scheduler/backend/queue, pods of equal priority rejected only by DynamicResources): activeQ ordered by timestamp (arrival, then the end of the last failed attempt); a pod that fits nowhere is parked in the unschedulable pool with backoff 1 s × 2^(failures−1) ≤ 10 s (1 s windows) and the next pod is tried; a completion deallocates a claim, which DynamicResources' queueing hint answers with Queue, so every parked pod moves to backoffQ (still backing off) or activeQ; with activeQ empty the scheduler pops backoffQ (SchedulerPopFromBackoffQ). Attempts take no simulated time unless an attempt cost is set.",
	"Node choice (kube-scheduler 1.37 schedulePod): Filter from nextStartNodeIndex until numFeasibleNodesToFind feasible nodes (all below 100 nodes; adaptive percentage above), then the default score plugins: only NodeResourcesFit (LeastAllocated on cpu/memory with the non-zero defaults 100m/200Mi for pods without requests) and BalancedAllocation (pods with requests) differ between identical nodes; DynamicResources scores only firstAvailable subrequests; the winner is popped from a max-heap in filter order with every Randomizer 0 (no extenders), so ties are broken deterministically, not at random.",
	"A node that refused a claim at least as small in memory and cores, or accepted one at least as large, since it last changed is not asked again (the answer is known; a test checks the starts are identical with and without this shortcut).",
	"Claims: (a) one whole GPU regardless of demand; (b) the smallest fixed partition ≥ max(memory, cores) among 1/8, 1/4, 1/2, 1/1 — per GPU 15 devices consuming memory, cores and slot counters slot0..7 so overlapping partitions exclude each other (buddy layout, the MIG way); (c) a share formed by pkg/fraction as users form one (`tessera claim-template --fraction`): the demand as a fraction (exact for n/k, else rounded up to four decimals), memory and cores that fraction of the GPU model's rounded down to the request policy's step so k shares of 1/k tile, one firstAvailable subrequest per GPU model (pkg/claimtemplate's share with the two fractions' sizes when memory and cores differ); (c') the same requests packed best-fit across the fleet by an oracle (not the scheduler).",
	"(d) GPU-boundary bound: a job starts iff the share requests of the running jobs and its own can be packed into the fleet's GPUs in both memory and cores, every running job free to move at that instant (optimal repacking at every event, same queue). Decided by: the current packing (best fit), then the fluid test, Martello–Toth's L2 and Fekete–Schepers' dual-feasible-function lower bounds per dimension (any above the GPU count: no packing), first-fit-decreasing repacking (a packing found is kept), an exact search with a node budget; a check none of these settles is taken as packable (counted), which can only start jobs earlier. Under FIFO this is a proven upper bound: by induction every job starts no later than under any placement without migration (its running set is a subset of the other's, and a subset of a packable set is packable), so every job completes no later; jobs/h in a window can still differ by the jobs counted at the window's edges. Under kube-scheduler's queue no such order holds (starting a large job earlier can delay small ones), so (d) there is the same queue with perfect repacking, a reference rather than a theorem.",
	"(e) fluid: a job starts iff the fleet's total free memory and cores cover its share request (no GPU boundaries).",
	"Load: the arrival rate is above the fluid capacity, so every model is saturated and throughput is the service capacity (as in KubeShare §5.3, where differences appear when jobs queue). Waits therefore grow with the length of the stream; compare them between models, not as absolute numbers. With a short window (the quick run) jobs/h carries sampling noise of a few percent: which jobs start in the window differs between queues and models.",
	"Run time is independent of sharing (the paper's inference jobs are served at their requested rate; isolation overhead is not modelled).",
	"Measurement window: from the arrival of the first 10% of jobs (warm-up) to the last arrival; all jobs then run to completion so every wait is known.",
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
