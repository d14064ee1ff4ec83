package fleet

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/tessera-dev/tessera/internal/bench/chart"
)

// fgdPublished is "Beware of Fragmentation"'s own result on the openb
// default pod list (openb_pod_list_default, workload tuned to 1.3× the
// 6,212-GPU cluster, mean of 10 seeds): the unallocated share of GPU
// capacity at 100 % and 130 % of the capacity arrived, per policy. It is
// their figure, from their simulator, not ours: computed from
// experiments/analysis/expected_results/analysis_allo_discrete.csv of
// github.com/hkust-adsl/kubernetes-scheduler-simulator at commit 1853fc0
// (100 − allocation rate). Their pods share GPUs by gpu_milli alone (no GPU
// memory), their nodes are the trace's 1,213 GPU nodes and their
// placements their scheduler's plugins.
var fgdPublished = []struct {
	policy       string
	at100, at130 float64
}{
	{"Random", 13.70, 12.53},
	{"DotProd", 9.38, 9.15},
	{"GpuClustering", 8.35, 8.12},
	{"GpuPacking", 8.22, 8.00},
	{"BestFit", 7.14, 6.92},
	{"FGD", 4.77, 4.61},
}

var fillLabels = map[Kind]string{
	Whole:          "(a) whole GPUs",
	Partition:      "(b) fixed partitions",
	Tessera:        "(c) Tessera",
	TesseraBestFit: "(c') best-fit reference",
}

// fillPlotLabels are fillLabels short enough for the plot's legend.
var fillPlotLabels = map[Kind]string{
	Whole:          "(A) WHOLE GPUS",
	Partition:      "(B) PARTITIONS",
	Tessera:        "(C) TESSERA",
	TesseraBestFit: "(C') BEST FIT",
}

// fleetSummary is the fleet's nodes and GPUs per model.
func fleetSummary(f Fleet) string {
	type count struct{ nodes, gpus int }
	per := map[string]*count{}
	var order []string
	cpuNodes := 0
	for _, s := range f.Nodes {
		if s.GPUs == 0 {
			cpuNodes++
			continue
		}
		c, ok := per[s.Model.Name]
		if !ok {
			c = &count{}
			per[s.Model.Name] = c
			order = append(order, s.Model.Name)
		}
		c.nodes++
		c.gpus += s.GPUs
	}
	var parts []string
	for _, m := range order {
		parts = append(parts, fmt.Sprintf("%s %d nodes/%d GPUs", m, per[m].nodes, per[m].gpus))
	}
	if cpuNodes > 0 {
		parts = append(parts, fmt.Sprintf("%d nodes without GPUs", cpuNodes))
	}
	return strings.Join(parts, ", ")
}

// podSummary counts the pods by kind.
func podSummary(pods []Job) string {
	var cpu, shares, whole, multi, typed int
	var request float64
	for i := range pods {
		j := &pods[i]
		switch {
		case j.CPUOnly:
			cpu++
		case j.GPUs > 1:
			multi++
		case j.GPUs == 1:
			whole++
		default:
			shares++
		}
		if len(j.Models) > 0 {
			typed++
		}
		request += j.gpuRequest()
	}
	return fmt.Sprintf("%d pods: %d shares of one GPU, %d of one whole GPU, %d of 2–8 whole GPUs, %d CPU-only; %d restricted to GPU models; %.0f GPUs requested in all",
		len(pods), shares, whole, multi, cpu, typed, request)
}

// Markdown renders the fill report.
func (r *FillReport) Markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	c := r.Config
	p("# Tessera fill experiment (simulation)\n\n")
	p("Reproduce: `%s` (deterministic for the seed; wall times vary).\n\n", c.Command)
	p("Every figure here is from the simulator (internal/bench/fleet: kube-scheduler's own DRA allocator over the slices each model publishes, kube-scheduler 1.37's node choice), " +
		"except the table marked as the FGD paper's, which is theirs. No GPU and no cluster was involved.\n\n")
	p("- Source: %s.\n", c.Source)
	p("- Fleet: %d nodes, %d GPUs (%s).", len(c.Fleet.Nodes), c.Fleet.GPUs(), fleetSummary(c.Fleet))
	if c.Note != "" {
		p(" %s", c.Note)
	}
	p("\n- Trace: %s.\n", podSummary(c.Pods))
	p("- Arrival sequence: %d pods asking for %.1f %% of the fleet's GPUs: the trace's pods plus pods drawn from it with replacement up to %.0f %% (or pods removed at random above it), shuffled (seed %d), as FGD's workload tuning does. Pods never leave; a pod that fits nowhere on arrival is dropped.\n",
		r.Sequence, 100*r.Arrived, 100*c.Target, c.Seed)
	p("- Unallocated: 1 − (GPU requests of the placed pods) / (GPUs in the fleet): a share counts its fraction of a GPU, a whole-GPU pod its GPUs; what a whole GPU or a partition holds beyond the pod's request counts as unallocated. The ideal is max(0, 1 − arrived): no policy does better.\n")
	p("- Simulated wall time %.1fs.\n\n", r.Wall.Seconds())

	p("## Unallocated GPU capacity (%%) as the workload arrives\n\n")
	p("| arrived (%% of GPUs) | ideal |")
	for _, res := range r.Results {
		p(" %s |", fillLabels[res.Kind])
	}
	p("\n|---|---|%s\n", strings.Repeat("---|", len(r.Results)))
	for i, pt := range FillPoints {
		if len(r.Results) == 0 || i >= len(r.Results[0].Arrived) {
			break
		}
		p("| %.0f | %.1f |", 100*pt, 100*max(0, 1-pt))
		for _, res := range r.Results {
			if i < len(res.Unallocated) {
				p(" %.2f |", 100*res.Unallocated[i])
			} else {
				p(" |")
			}
		}
		p("\n")
	}
	p("\n![unallocated GPU capacity vs arrived workload](fleet-fill.png)\n\n")

	p("## Pods dropped\n\n| model | GPU pods dropped by 100 %% arrived | by the end | CPU-only pods dropped | pods placed | allocator calls | wall (s) |\n|---|---|---|---|---|---|---|\n")
	at100 := slices.IndexFunc(FillPoints, func(x float64) bool { return x >= 1-1e-9 })
	for _, res := range r.Results {
		by100 := "–"
		if at100 >= 0 && at100 < len(res.Failed) {
			by100 = fmt.Sprint(res.Failed[at100])
		}
		last := 0
		if len(res.Failed) > 0 {
			last = res.Failed[len(res.Failed)-1]
		}
		p("| %s | %s | %d | %d | %d | %d | %.1f |\n", fillLabels[res.Kind], by100, last, res.FailedCPUOnly, res.Placed, res.AllocatorCalls, res.Wall.Seconds())
	}

	p("\n## Context: the FGD paper's own figure (theirs, not ours)\n\n")
	p("\"Beware of Fragmentation\" (Weng et al., USENIX ATC '23) reports that FGD leaves up to 49 %% fewer GPUs unallocated than packing-based schedulers on an emulated cluster of more than 6,200 GPUs (about 290 GPUs). " +
		"Their published per-policy results for the openb default pod list, tuned to 1.3× the 6,212-GPU cluster (mean of 10 seeds; " +
		"`experiments/analysis/expected_results/analysis_allo_discrete.csv` of github.com/hkust-adsl/kubernetes-scheduler-simulator, commit 1853fc0), unallocated GPU %%:\n\n")
	p("| policy (their simulator) | at 100 %% arrived | at 130 %% arrived |\n|---|---|---|\n")
	for _, x := range fgdPublished {
		p("| %s | %.2f | %.2f |\n", x.policy, x.at100, x.at130)
	}
	p("\nTheir figures are comparable to the table above only when this run read the same trace (openb_pod_list_default with openb_node_list_gpu_node, the whole fleet): " +
		"their simulator places GPU shares by gpu_milli alone, without GPU memory or Tessera's per-model rounding, and its policies are scheduler plugins of its own, " +
		"not kube-scheduler 1.37's default scoring.\n")

	p("\n## Method and assumptions\n\n")
	for _, line := range fillNotes {
		p("- %s\n", line)
	}
	return b.String()
}

var fillNotes = []string{
	"(a) whole GPUs: every GPU pod holds whole GPUs (a share pod one GPU). (b) fixed partitions: a share pod takes the smallest of 1/8, 1/4, 1/2, 1/1 covering its fraction (buddy layout over slot counters, like MIG), a multi-GPU pod whole-GPU partitions. (c) Tessera: a share pod asks for its fraction of whichever allowed GPU model it lands on (pkg/fraction's firstAvailable request: one subrequest per model, smallest memory first, each model's share rounded down to the step; a share below a model's smallest share is raised to it), a whole-GPU pod for gpu.tessera.dev devices. (a)–(c) are placed by kube-scheduler 1.37's DRA allocator on each node and its node choice (NodeResourcesFit on the pods' cpu and memory requests and 110 pods per node, LeastAllocated and BalancedAllocation scores, DynamicResources' score for the firstAvailable subrequest a node satisfies, heap tie-break; docs/fleet-sim.md).",
	"(c') best-fit reference: Tessera's requests placed by an oracle, not the scheduler: a share on the GPU, fleet-wide, whose free memory is the smallest fraction of its own after it; a multi-GPU pod on the node with the fewest free whole GPUs that has enough; a CPU-only pod on the first node with room; the same node cpu, memory and pod-count limits.",
	"openb has no GPU memory: a share of gpu_milli asks for gpu_milli/1000 of a GPU's memory and cores alike. memory_mib and cpu_milli are host memory and CPU, the pod's requests against the node's allocatable. Multi-GPU pods need no NVLink unless -fill-nvlink says so. GPU models G1–G3 are undisclosed; their memory is assumed (docs/fleet-sim.md), and matters only where a small share would fall below a model's smallest share.",
	"The trace itself is not in this repository (its repository grants no licence to redistribute it): get it from github.com/alibaba/clusterdata, directory cluster-trace-gpu-v2023/csv, and pass the directory with -fill-trace (make bench-fill TRACE_DIR=...). Without it the run uses SyntheticOpenB's made-up cluster and pods, shaped like the trace but not measured from it.",
}

// WritePNG draws unallocated GPU capacity against arrived workload per model.
func (r *FillReport) WritePNG(w io.Writer) error {
	colors := map[Kind]color.RGBA{Whole: kindColors[Whole], Partition: kindColors[Partition], Tessera: kindColors[Tessera], TesseraBestFit: kindColors[TesseraBestFit]}
	c := chart.Line{
		Title:  fmt.Sprintf("SIMULATED FILL: UNALLOCATED GPU CAPACITY (%d GPUS)", r.Config.Fleet.GPUs()),
		XLabel: "ARRIVED WORKLOAD (% OF GPUS)",
		YLabel: "UNALLOCATED (%)",
	}
	ideal := chart.Series{Label: "IDEAL", Color: color.RGBA{0x7f, 0x7f, 0x7f, 0xff}}
	for i, pt := range FillPoints {
		if len(r.Results) == 0 || i >= len(r.Results[0].Arrived) {
			break
		}
		x := math.Round(1000*pt) / 10 // 110, not 110.00000000000001
		ideal.X, ideal.Y = append(ideal.X, x), append(ideal.Y, max(0, 100-x))
		if int(math.Round(x))%10 == 0 { // labels 10 points apart, so they do not overlap
			c.XTicks = append(c.XTicks, x)
		}
	}
	c.Series = append(c.Series, ideal)
	for _, res := range r.Results {
		s := chart.Series{Label: fillPlotLabels[res.Kind], Color: colors[res.Kind]}
		for i := range res.Unallocated {
			s.X, s.Y = append(s.X, math.Round(1000*FillPoints[i])/10), append(s.Y, 100*res.Unallocated[i])
		}
		c.Series = append(c.Series, s)
	}
	return c.WritePNG(w)
}
