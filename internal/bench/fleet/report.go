package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tessera-dev/tessera/internal/bench/node"
)

// Report is one run of the whole benchmark: the fleet simulation for every mean
// demand and model, and the scheduler cost table.
type Report struct {
	Command  string
	Workload Workload // MeanDemand is per row
	Nodes    int
	// Fleet is the simulated cluster.
	Fleet Fleet
	// Sim is the queue and node-choice model of the runs.
	Sim Options
	// Means[i] is the mean demand of row i, Dists[i] its distribution's name.
	Means []float64
	Dists []string
	// Results[i][k] is AllKinds[k] on row i.
	Results [][]Result
	// FIFO[i][k] is FIFOKinds[k] on row i under QueueFIFO (empty when not run).
	FIFO [][]Result
	// Bounds[i] bounds every schedule of row i's stream.
	Bounds []RowBound
	Costs  []Cost
	// SimWall and CostWall are how long the two parts took (wall clock, informative).
	SimWall, CostWall time.Duration
	// Node holds the node-side measurements, one per repetition (each in a
	// fresh process, all with the same node.Options); empty when not
	// measured.
	Node []node.Report
}

// RowBound is what bounds every schedule of one row's stream.
type RowBound struct {
	// Served bounds ServedPerHour, Running MeanRunning.
	Served, Running Bound
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

// perHour is a result's jobs/h, or "–" when it was not run.
func perHour(r Result) string {
	if r.Skipped != "" {
		return "–"
	}
	return fmt.Sprintf("%.0f", r.JobsPerHour)
}

// ratioCell is a/b's jobs/h to three places, or "–".
func ratioCell(a, b Result) string {
	if a.Skipped != "" || b.Skipped != "" || b.JobsPerHour == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f", a.JobsPerHour/b.JobsPerHour)
}

func (r *Report) boundCell(i int) string {
	if i >= len(r.Bounds) || r.Bounds[i].Served.Value == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", r.Bounds[i].Served.Value)
}

func (r *Report) boundRatio(i int, c Result) string {
	if i >= len(r.Bounds) || r.Bounds[i].Served.Value == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f", c.ServedPerHour/r.Bounds[i].Served.Value)
}

// boundMarkdown is the tables of (f) and (f') against what every policy did.
func (r *Report) boundMarkdown(b *strings.Builder) {
	if len(r.Bounds) == 0 {
		return
	}
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	best := func(i int, get func(Result) float64) (float64, Kind) {
		var v float64
		var k Kind
		for _, res := range r.Results[i] {
			if res.Skipped == "" && res.Kind != Fluid && get(res) > v {
				v, k = get(res), res.Kind
			}
		}
		return v, k
	}
	p("\n### Bounds that hold for every schedule\n\n")
	p("Both bound the schedules whose running jobs' share requests fit on the GPUs at every instant, whatever the queue or placement (Method; "+
		"`TestBoundHoldsOnTinyFleets` checks them against every event-driven schedule of tiny fleets and every simulated policy but fluid, whose jobs need not fit). "+
		"(f) bounds jobs served per hour (each job counted by the share of its run time inside the window), for any schedule, even one that knows run times and serves short jobs first. "+
		"(f') bounds the jobs running at once, time-averaged over the window; with exponential run times independent of everything else (this stream's), "+
		"a scheduler that does not know run times completes in expectation jobs running × 3600 / mean run time jobs per hour, so (c)/(f') is what Tessera's queue and placement reach of the best such scheduler, in expectation. "+
		"The best policy is the best of (a)–(d) in this run. The LP master is the column-generation master with each request type's jobs merged into %d segments: "+
		"how close the dual solution came, not a bound.\n\n", boundSegments)
	p("| demand | (f) served/h bound | (c) served/h | (c)/(f) | best policy served/h | (f') jobs-running bound | (c) jobs running | (c)/(f') | best policy jobs running | (f) LP master | (f') LP master | request types |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i := range r.Means {
		bd := r.Bounds[i]
		c := r.result(i, Tessera)
		bs, ks := best(i, func(x Result) float64 { return x.ServedPerHour })
		br, kr := best(i, func(x Result) float64 { return x.MeanRunning })
		p("| %s | %.0f | %.0f | %.3f | %.0f (%s) | %.1f | %.1f | %.3f | %.1f (%s) | %.0f | %.1f | %d |\n", r.Dists[i],
			bd.Served.Value, c.ServedPerHour, ratio(c.ServedPerHour, bd.Served.Value), bs, ks,
			bd.Running.Value, c.MeanRunning, ratio(c.MeanRunning, bd.Running.Value), br, kr,
			bd.Served.Master, bd.Running.Master, bd.Served.Types)
	}
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
		d := r.result(i, Migrating)
		if d.Skipped != "" {
			continue
		}
		x := ratio(r.result(i, Tessera).JobsPerHour, d.JobsPerHour)
		out = append(out, Target{fmt.Sprintf("(c) >= 0.95 of the migrating reference (d) (a policy, not a bound), %s", r.rowName(i)), ">= 0.95 of (d)", fmt.Sprintf("%.3f", x), x >= 0.95})
	}
	for i := range r.Means {
		c, ok1 := r.fifo(i, Tessera)
		b, ok2 := r.fifo(i, Migrating)
		if ok1 && ok2 && b.Skipped == "" {
			x := ratio(c.JobsPerHour, b.JobsPerHour)
			out = append(out, Target{fmt.Sprintf("FIFO: (c) >= 0.95 of (d), which bounds FIFO placements, %s", r.rowName(i)), ">= 0.95 of (d)", fmt.Sprintf("%.3f", x), x >= 0.95})
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
		get    func(node.Backend) node.Latency
	}{
		{"1 claim at a time", prepareTarget, func(b node.Backend) node.Latency { return b.Sequential }},
		{fmt.Sprintf("%d claims at once", r.Node[0].Backends[0].Concurrent.ClaimsPerRound), concurrentPrepareTarget, func(b node.Backend) node.Latency { return b.Concurrent }},
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
func spread[T any](runs []node.Report, get func(node.Report) T, format func(T) string, less func(a, b T) bool) string {
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

func durationSpread(runs []node.Report, get func(node.Report) time.Duration) string {
	return spread(runs, get, millis, func(a, b time.Duration) bool { return a < b })
}

func rateSpread(runs []node.Report, get func(node.Report) node.Latency) string {
	return spread(runs, func(x node.Report) float64 {
		l := get(x)
		return ratio(float64(l.Claims), l.Wall.Seconds())
	}, func(v float64) string { return fmt.Sprintf("%.0f", v) }, func(a, b float64) bool { return a < b })
}

func mibSpread(runs []node.Report, get func(node.Report) int64) string {
	return spread(runs, get, func(v int64) string { return fmt.Sprintf("%.0f", float64(v)/(1<<20)) }, func(a, b int64) bool { return a < b })
}

// fsName is the filesystem type a node run wrote what to, or "a filesystem
// not recorded" for a report from before it was.
func fsName(run node.Report, what string) string {
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
		"in temporary directories, logs discarded; measured by internal/bench/node in %d separate child "+
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
		get := func(f func(node.Backend) time.Duration) func(node.Report) time.Duration {
			return func(run node.Report) time.Duration { return f(run.Backends[i]) }
		}
		p("| %s | %s | %s | %s | %s | %s |\n", be.Isolation,
			durationSpread(r.Node, get(func(b node.Backend) time.Duration { return b.Sequential.P50 })),
			durationSpread(r.Node, get(func(b node.Backend) time.Duration { return b.Sequential.P99 })),
			durationSpread(r.Node, get(func(b node.Backend) time.Duration { return b.Concurrent.P50 })),
			durationSpread(r.Node, get(func(b node.Backend) time.Duration { return b.Concurrent.P99 })),
			durationSpread(r.Node, get(func(b node.Backend) time.Duration {
				return b.Concurrent.Wall / time.Duration(max(b.Concurrent.Claims/max(b.Concurrent.ClaimsPerRound, 1), 1))
			})))
	}
	p("\nEach Put and Delete rewrites the whole checkpoint file (temporary file, fsync, rename, directory fsync), and a claim makes " +
		"three of them one after the other; concurrent claims share these writes (group commit: about 18 writes per round of 100 claims), " +
		"so a claim's latency is a few batch writes rather than the whole round. " +
		"In a cluster the kubelet plugin helper serializes prepare calls by default, so the kubelet sees that queueing in front of " +
		"the plugin rather than inside it.\n\n")
	p("Throughput, claims prepared and unprepared per second (%s backend): %s one at a time, %s with %d at once.\n\n", backends[0].Isolation,
		rateSpread(r.Node, func(x node.Report) node.Latency { return x.Backends[0].Sequential }),
		rateSpread(r.Node, func(x node.Report) node.Latency { return x.Backends[0].Concurrent }), conc.ClaimsPerRound)

	p("### Resident memory of the plugin process (MiB)\n\n")
	p("From /proc/self/status of the child process, which holds the plugin, the ResourceSlice controller and client-go's fake clientset standing " +
		"in for the API server (simple object tracker), and nothing of the fleet simulation. VmRSS is dominated by the pages of the ~100 MB " +
		"tessera-bench binary that happen to be mapped, which varies with the page cache from run to run (and includes code the plugin does " +
		"not use, such as kube-scheduler's allocator); RssAnon, the anonymous part (heap, stacks), is what the program itself allocates.\n\n")
	mib := func(get func(node.Memory) int64) string {
		return mibSpread(r.Node, func(x node.Report) int64 { return get(x.Memory) })
	}
	p("| | VmRSS | RssAnon |\n|---|---|---|\n")
	p("| process at start, before the plugin | %s | %s |\n", mib(func(m node.Memory) int64 { return m.BaseRSS }), mib(func(m node.Memory) int64 { return m.BaseAnon }))
	p("| idle: after plugin.New and the first publish | %s | %s |\n", mib(func(m node.Memory) int64 { return m.IdleRSS }), mib(func(m node.Memory) int64 { return m.IdleAnon }))
	p("| idle minus start: what the plugin and its publisher added | %s | %s |\n",
		mib(func(m node.Memory) int64 { return m.IdleRSS - m.BaseRSS }), mib(func(m node.Memory) int64 { return m.IdleAnon - m.BaseAnon }))
	p("| under the %d-claim load: peak sampled every 2 ms | %s | %s |\n", conc.ClaimsPerRound,
		mib(func(m node.Memory) int64 { return m.LoadPeakRSS }), mib(func(m node.Memory) int64 { return m.LoadPeakAnon }))
	p("| after the load: VmHWM (peak of the whole process) | %s | |\n", mib(func(m node.Memory) int64 { return m.LoadHWM }))

	p("\n### API writes to publish the node\n\n")
	p("ResourceSlice creates, updates and deletes seen by client-go's fake clientset, written by k8s.io/dynamic-resource-allocation's " +
		"resourceslice controller (what kubeletplugin.Helper.PublishResources runs, with the node as owner) fed by publish.Inventory; reads " +
		"(node lookup, list, watch) not counted. The controller's follow-up syncs were shortened (20 ms sync delay, 100 ms mutation cache TTL) " +
		"and each step waited for 400 ms without writes, so every write it makes after a change is counted.\n\n")
	p("| event | slices | creates | updates | deletes |\n|---|---|---|---|---|\n")
	wr := func(name string, get func(node.APIWrites) node.Writes) {
		cell := func(f func(node.Writes) int) string {
			return spread(r.Node, func(x node.Report) int { return f(get(x.Writes)) }, func(v int) string { return fmt.Sprint(v) }, func(a, b int) bool { return a < b })
		}
		p("| %s | %d | %s | %s | %s |\n", name, first.Writes.Slices,
			cell(func(w node.Writes) int { return w.Create }), cell(func(w node.Writes) int { return w.Update }), cell(func(w node.Writes) int { return w.Delete }))
	}
	wr(fmt.Sprintf("first publish of the %d-GPU node", first.GPUs), func(w node.APIWrites) node.Writes { return w.Publish })
	wr("the same resources published again", func(w node.APIWrites) node.Writes { return w.Republish })
	wr("one GPU turns unhealthy (NoSchedule taint on its two devices)", func(w node.APIWrites) node.Writes { return w.HealthChange })
	skips := true
	for _, run := range r.Node {
		skips = skips && run.Writes.InventorySkipsUnchanged
	}
	if skips {
		p("\npublish.Inventory does not call PublishResources at all when discovery and taints are unchanged; the second row calls it directly.\n")
	} else {
		p("\npublish.Inventory called PublishResources again for an unchanged node in at least one run.\n")
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
	p("Every figure below is from the simulator (internal/bench/fleet, simulated clock, kube-scheduler's own DRA allocator over mock-profile slices), except the node side, which is measured in mock mode on this machine. ")
	if m, ok := r.Fleet.Homogeneous(); ok && m.Name == h100.Name && r.Fleet.String() == HGXFleet(r.Nodes).String() {
		p("Fleet: %d nodes × %d GPUs (mock profile hgx-h100: H100 80GB, %dMi each, published by pkg/model), %d GPUs. ",
			r.Nodes, GPUsPerNode, m.MemoryMiB, r.Fleet.GPUs())
	} else {
		p("Fleet: %s (%d nodes, %d GPUs; GPU models and their memory in docs/fleet-sim.md). ", r.Fleet, len(r.Fleet.Nodes), r.Fleet.GPUs())
	}
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
	p("(d) is the migrating reference (a policy that repacks every running job at every event; it moves running jobs, which no DRA driver can, and is not a bound), " +
		"(e) fluid (a policy without GPU boundaries), (f) the bound on jobs served per hour that holds for every schedule (see the bounds below and Method). " +
		"(c)/(f) compares Tessera's jobs served per hour (each job counted by the share of its run time inside the window) with (f).\n\n")
	p("| demand | mean | (a) whole | (b) partition | (c) tessera | (c') tessera best-fit | (d) migrating ref. | (e) fluid | (f) bound | (c)/(a) | (c)/(b) | (c)/(d) | (c)/(f) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, m := range r.Means {
		a, bb, c, cb, d, e := r.result(i, Whole), r.result(i, Partition), r.result(i, Tessera), r.result(i, TesseraBestFit), r.result(i, Migrating), r.result(i, Fluid)
		p("| %s | %.2f | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %.2f× | %.2f× | %s | %s |\n", r.Dists[i], m, a.JobsPerHour, bb.JobsPerHour, c.JobsPerHour, cb.JobsPerHour,
			perHour(d), perHour(e), r.boundCell(i), ratio(c.JobsPerHour, a.JobsPerHour), ratio(c.JobsPerHour, bb.JobsPerHour),
			ratioCell(c, d), r.boundRatio(i, c))
	}
	p("\n![throughput vs mean demand](%s)\n", "fleet"+map[bool]string{true: "-quick", false: ""}[strings.Contains(r.Command, "-quick")]+".png")

	r.boundMarkdown(&b)

	if len(r.FIFO) > 0 && len(r.FIFO[0]) > 0 {
		p("\n### FIFO reference\n\nThe same streams under a FIFO queue with head-of-line blocking (not kube-scheduler's queue). There (d) starts every job no later than " +
			"any FIFO placement that does not move jobs (proven, Method), so no such placement completes more jobs by any time than (d): (c)/(d) is a floor on what Tessera reaches of the best FIFO placement (up to the jobs counted at the window's edges).\n\n")
		p("| demand | (c) tessera | (d) migrating ref. | (e) fluid | (c)/(d) | (c)/(e) | (d): checks taken as packable unproven |\n|---|---|---|---|---|---|---|\n")
		for i := range r.Means {
			c, _ := r.fifo(i, Tessera)
			d, _ := r.fifo(i, Migrating)
			e, _ := r.fifo(i, Fluid)
			p("| %s | %.0f | %s | %s | %s | %s | %d |\n", r.Dists[i], c.JobsPerHour, perHour(d), perHour(e), ratioCell(c, d), ratioCell(c, e), d.Undecided)
		}
	}

	p("\n## Per model\n\nActive GPUs run at least one job ((d) and (e) count ⌈memory in use⌉); memory utilisation is the memory the jobs use (memory fraction × GPU memory) over the memory of the active GPUs, " +
		"both time-averaged over the window. Waits are from submission to start, over all jobs, in minutes. Attempts are scheduling attempts (a pod popped from the queue and filtered).\n\n")
	p("| demand | model | jobs/h | served/h | jobs running | mean active GPUs | mem util of active | wait mean (min) | wait p50 | wait p95 | wait p99 | max jobs on one GPU | attempts | allocator calls |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i := range r.Means {
		for _, res := range r.Results[i] {
			if res.Skipped != "" {
				p("| %s | %s | – (%s) | | | | | | | | | | | |\n", r.Dists[i], res.Kind, res.Skipped)
				continue
			}
			maxJobs := fmt.Sprint(res.MaxJobsPerGPU)
			if referenceKind(res.Kind) {
				maxJobs = "–"
			}
			p("| %s | %s | %.0f | %.0f | %.1f | %.1f | %.1f%% | %.1f | %.1f | %.1f | %.1f | %s | %d | %d |\n", r.Dists[i], res.Kind, res.JobsPerHour, res.ServedPerHour, res.MeanRunning, res.MeanActiveGPUs, 100*res.MemUtilActive,
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
	"Node choice (kube-scheduler 1.37 schedulePod): Filter from nextStartNodeIndex until numFeasibleNodesToFind feasible nodes (all below 100 nodes; adaptive percentage above); NodeResourcesFit filters on the pods' cpu and memory requests and 110 pods per node (the kubelet's default and hack/scale's fake nodes'). Then the default score plugins: NodeResourcesFit (LeastAllocated on cpu/memory with the non-zero defaults 100m/200Mi for pods without requests), BalancedAllocation (pods with requests) and DynamicResources, which scores only firstAvailable subrequests (8 − the index of the subrequest a node satisfies, normalised to 0–100 over the feasible nodes, weight 1: the same on every node of one GPU model; on a fleet of several models it sends shares to the model listed first, the smallest memory); the winner is popped from a max-heap in filter order with every Randomizer 0 (no extenders), so ties are broken deterministically, not at random.",
	"A node that refused a claim of the same class (kind of request, GPU-type constraint, NVLink need) at least as small in device count, memory and cores, or accepted one at least as large, since it last changed is not asked again (the answer is known; a test checks the starts are identical with and without this shortcut).",
	"Claims: (a) one whole GPU regardless of demand; (b) the smallest fixed partition ≥ max(memory, cores) among 1/8, 1/4, 1/2, 1/1 — per GPU 15 devices consuming memory, cores and slot counters slot0..7 so overlapping partitions exclude each other (buddy layout, the MIG way); (c) a share formed by pkg/fraction as users form one (`tessera claim-template --fraction`): the demand as a fraction (exact for n/k, else rounded up to four decimals), one firstAvailable subrequest per GPU model with that model's share of the memory fraction and of the cores fraction, rounded down to the request policy's step so k shares of 1/k tile (a memory share below the model's smallest share is raised to it); (c') the same requests packed best-fit across the fleet by an oracle (not the scheduler). A job of several GPUs asks for that many whole devices (whole GPUs, whole-GPU partitions, gpu.tessera.dev devices) on one node, with a matchAttribute constraint on nvlinkDomain when it needs NVLink; a GPU-type constraint is a selector on productName.",
	"(d) migrating reference: a job starts iff the share requests of the running jobs and its own can be packed into the fleet's GPUs in both memory and cores, every running job free to move at that instant (repacking at every event, same queue; a multi-GPU job is that many whole-GPU items, node resources ignored). Decided by: the current packing (best fit), then the fluid test, Martello–Toth's L2 and Fekete–Schepers' dual-feasible-function lower bounds per dimension (any above the GPU count: no packing), first-fit-decreasing repacking (a packing found is kept), an exact search with a node budget; a check none of these settles is taken as packable (counted). It is a policy, not a bound: it moves running jobs, and under kube-scheduler's queue starting a large job earlier can delay the small ones behind it, so no policy's result is ordered against it. Under FIFO it is ordered: by induction every job starts no later than under any FIFO placement without migration (its running set is a subset of the other's, and a subset of a packable set is packable; an unproven check only starts a job earlier), so every job completes no later; jobs/h in a window can still differ by the jobs counted at the window's edges.",
	"(e) fluid: a job starts iff the fleet's total free memory and cores cover its share request (no GPU boundaries). A policy whose running jobs need not fit on the GPUs, so (f) does not bound it.",
	"(f) and (f') bounds: (f) bounds jobs served per hour in the window (each job counted by the share of its run time inside the window; equal to completions per hour except at the window's two ends), (f') the jobs running at once, time-averaged over the window. Both hold for every schedule whose running jobs' share requests fit on the GPUs at every instant — any queue, any placement, clairvoyant, migrating or preemptive. Each is the dual of a configuration LP over the multisets of requests that fit on one GPU (cores exact, memory rounded down to 1/200 of the GPU; node resources, pod counts and NVLink ignored, which only raises it), evaluated exactly for every job (docs/fleet-sim.md has the argument; `TestBoundHoldsOnTinyFleets` checks both against every event-driven schedule of tiny fleets and against every simulated policy but fluid). (f) lets a schedule serve short jobs first, which a scheduler that does not know run times cannot do on purpose, so it sits well above what a queue of any kind reaches; (f') does not reward knowing run times, and turns into expected jobs per hour for such schedulers when run times are exponential (jobs running × 3600 / mean run time).",
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
		"Run `go test -bench Allocate ./internal/bench/fleet` for the same points as Go benchmarks.\n\n")
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
