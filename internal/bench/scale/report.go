package scale

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Upstream anchor: kube-scheduler's scheduler_perf (test/integration/scheduler_perf,
// dra/performance-config.yaml), SchedulingWithResourceClaimTemplate on 500 nodes.
const (
	// AnchorLow and AnchorHigh bound the pods/s its CI measures.
	AnchorLow, AnchorHigh = 240.0, 273.0
	// AnchorThreshold is its regression threshold (empty_500nodes; 56 for
	// 5000pods_500nodes) and the rate shares must reach at 500 nodes here.
	AnchorThreshold = 64.0
	// TargetShareRatio is the least share rate as a fraction of the whole-GPU
	// claim rate.
	TargetShareRatio = 0.8
	// TargetNodes is the cluster size the targets are judged at.
	TargetNodes = 500
)

// Names of the processes whose CPU time the report shows per pod.
const (
	SchedulerProcess = "kube-scheduler"
	APIServerProcess = "kube-apiserver"
)

// Report is one benchmark run: the results and where they were measured.
type Report struct {
	Results  []Result          `json:"results"`
	Started  time.Time         `json:"started"`
	Finished time.Time         `json:"finished"`
	Host     Host              `json:"host"`
	Cluster  map[string]string `json:"cluster"`
	// Slices describes one fake node's ResourceSlices.
	Slices  string `json:"slices"`
	Command string `json:"command"`
	// Peer are the runs of Peer (Tessera and NVIDIA's driver, alternating).
	Peer []Result `json:"peer,omitempty"`
	// MIGFill are the runs of MIGFill (whole GPUs and MIG devices by fill).
	MIGFill []Result `json:"migFill,omitempty"`
	// PeerSlices and MIGSlices describe one fake node's slices in those
	// experiments.
	PeerSlices string `json:"peerSlices,omitempty"`
	MIGSlices  string `json:"migSlices,omitempty"`
}

// Host is the machine the benchmark ran on.
type Host struct {
	CPU    string `json:"cpu"`
	Cores  int    `json:"cores"`
	Memory string `json:"memory"`
	// Load is /proc/loadavg when the run began and ended.
	LoadStart string `json:"loadStart"`
	LoadEnd   string `json:"loadEnd"`
}

// ReadHost describes this machine from /proc (fields it cannot read stay empty).
func ReadHost() Host {
	h := Host{Cores: runtime.NumCPU(), LoadStart: LoadAvg()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				h.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				if kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64); err == nil {
					h.Memory = fmt.Sprintf("%.1f GiB", kb/(1<<20))
				}
			}
		}
	}
	return h
}

// LoadAvg is the first three fields of /proc/loadavg, or "" where unreadable.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// Load1 is the 1-minute load average, 0 where unreadable.
func Load1() float64 {
	f := strings.Fields(LoadAvg())
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// Find returns the result of workload at nodes.
func (r *Report) Find(workload string, nodes int) (Result, bool) {
	for _, res := range r.Results {
		if res.Workload == workload && res.Nodes == nodes {
			return res, true
		}
	}
	return Result{}, false
}

// NodeCounts are the cluster sizes measured, ascending.
func (r *Report) NodeCounts() []int {
	var out []int
	for _, res := range r.Results {
		if !slices.Contains(out, res.Nodes) {
			out = append(out, res.Nodes)
		}
	}
	slices.Sort(out)
	return out
}

// Workloads are the workloads measured, in report order.
func (r *Report) Workloads() []string {
	var out []string
	for _, name := range WorkloadNames() {
		for _, res := range r.Results {
			if res.Workload == name {
				out = append(out, name)
				break
			}
		}
	}
	return out
}

// Target is one of the benchmark's pass marks, judged on the results.
type Target struct {
	Name  string
	Value string
	Met   bool
	// Known is false where the results lack what the target needs.
	Known bool
}

// Targets judges the shares against whole-GPU claims (by pods/s, and by the
// scheduler's CPU per pod, which other load on the machine does not skew) and
// against the anchor threshold, at TargetNodes nodes.
func (r *Report) Targets() []Target {
	n := TargetNodes
	whole, okW := r.Find("whole-claim", n)
	var out []Target
	for _, share := range []string{"share", "share-cel"} {
		s, okS := r.Find(share, n)
		t := Target{Name: fmt.Sprintf("%s ≥ %.1f× whole-claim at %d nodes", share, TargetShareRatio, n), Known: okS && okW && s.Err == "" && whole.Err == ""}
		if t.Known {
			ratio := Ratio(s.PodsPerSecond, whole.PodsPerSecond)
			t.Value, t.Met = fmt.Sprintf("%.2f× (%.1f vs %.1f pods/s)", ratio, s.PodsPerSecond, whole.PodsPerSecond), ratio >= TargetShareRatio
		}
		out = append(out, t)
		// The same comparison by the scheduler's CPU per pod: the rates a free core
		// would give, whatever else shared the machine during either run.
		sc, wc := s.CPUPerPod(SchedulerProcess), whole.CPUPerPod(SchedulerProcess)
		t = Target{Name: fmt.Sprintf("%s ≥ %.1f× whole-claim at %d nodes, by scheduler CPU/pod", share, TargetShareRatio, n), Known: t.Known && sc > 0 && wc > 0}
		if t.Known {
			ratio := float64(wc) / float64(sc)
			t.Value, t.Met = fmt.Sprintf("%.2f× (%.1f vs %.1f ms/pod)", ratio, float64(sc)/float64(time.Millisecond), float64(wc)/float64(time.Millisecond)), ratio >= TargetShareRatio
		}
		out = append(out, t)
		t = Target{Name: fmt.Sprintf("%s ≥ %.0f pods/s at %d nodes", share, AnchorThreshold, n), Known: okS && s.Err == ""}
		if t.Known {
			t.Value, t.Met = fmt.Sprintf("%.1f pods/s", s.PodsPerSecond), s.PodsPerSecond >= AnchorThreshold
		}
		out = append(out, t)
	}
	for _, fill := range sortedFills(r.MIGFill) {
		whole, okW := findFill(r.MIGFill, "whole-claim", fill)
		mig, okM := findFill(r.MIGFill, MIGWorkload, fill)
		wc, mc := whole.CPUPerPod(SchedulerProcess), mig.CPUPerPod(SchedulerProcess)
		t := Target{Name: fmt.Sprintf("%s scheduler CPU/pod ≤ whole-claim's with %.1f %% of the GPUs taken (%d nodes)", MIGWorkload, 100*fill, mig.Nodes),
			Known: okW && okM && whole.Err == "" && mig.Err == "" && wc > 0 && mc > 0}
		if t.Known {
			t.Value, t.Met = fmt.Sprintf("%.1f vs %.1f ms/pod (%.2f×)", float64(mc)/float64(time.Millisecond), float64(wc)/float64(time.Millisecond), float64(mc)/float64(wc)), mc <= wc
		}
		out = append(out, t)
	}
	return out
}

// Markdown renders the report: the setup, one table per cluster size, the
// targets and the upstream anchor.
func (r *Report) Markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Scheduling throughput of the real kube-scheduler on simulated nodes\n\n")
	w("Generated by `%s` (`make bench-scale`); see docs/scale.md for what is measured and how.\n\n", r.Command)
	w("![pods/s by cluster size](scale.png)\n\n")
	w("## Setup\n\n")
	w("- Run: %s → %s UTC (%s).\n", r.Started.UTC().Format("2006-01-02 15:04"), r.Finished.UTC().Format("15:04"), r.Finished.Sub(r.Started).Round(time.Second))
	w("- Machine: %s, %d cores, %s memory; load average (1, 5, 15 min) %s at the start, %s at the end. "+
		"The machine may be shared (other processes, such as compilers and tests, running beside the benchmark), so each row gives the 1-minute load before and after its run.\n",
		orDash(r.Host.CPU), r.Host.Cores, orDash(r.Host.Memory), orDash(r.Host.LoadStart), orDash(r.Host.LoadEnd))
	keys := make([]string, 0, len(r.Cluster))
	for k := range r.Cluster {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) > 0 {
		var kv []string
		for _, k := range keys {
			kv = append(kv, fmt.Sprintf("%s=%s", k, r.Cluster[k]))
		}
		w("- Cluster (hack/scale/cluster.sh): etcd, kube-apiserver, kube-controller-manager and kube-scheduler on this machine, kwok for the nodes, no kubelet: %s.\n", strings.Join(kv, ", "))
	}
	if r.Slices != "" {
		w("- Each fake node publishes what Tessera's plugin publishes for its mock profile: %s.\n", r.Slices)
	}
	w("- Each run creates its pods at once on the empty cluster, then deletes them and waits for their claims to go. " +
		"pods/s = pods bound ÷ (last binding − first creation); latency = watch saw spec.nodeName − create request returned. " +
		"CPU/pod = the process's CPU time (/proc/<pid>/stat) from the first creation to the last binding ÷ pods bound: " +
		"what a pod costs whatever else ran. Cluster CPU/pod sums etcd, the API server, the controller manager, the scheduler and kwok; " +
		"the ceiling is the rate at which they would use every core of this machine and nothing else ran.\n\n")

	for _, n := range r.NodeCounts() {
		w("## %d nodes × 8 GPUs\n\n", n)
		w("| workload | bound/pods | pods/s | vs whole-claim | p50 | p99 | max | pods created in | scheduler CPU/pod | API server CPU/pod | cluster CPU/pod | %d-core ceiling | load before → after |\n", r.Host.Cores)
		w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
		whole, hasWhole := r.Find("whole-claim", n)
		for _, name := range r.Workloads() {
			res, ok := r.Find(name, n)
			if !ok {
				continue
			}
			vs := "–"
			if hasWhole && whole.PodsPerSecond > 0 {
				vs = fmt.Sprintf("%.2f×", res.PodsPerSecond/whole.PodsPerSecond)
			}
			ceiling := "–"
			if c := res.ClusterCPUPerPod(); c > 0 && r.Host.Cores > 0 {
				ceiling = fmt.Sprintf("%.0f pods/s", float64(r.Host.Cores)*float64(time.Second)/float64(c))
			}
			w("| %s | %d/%d | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f → %.2f |\n", name, res.Bound, res.Pods, res.PodsPerSecond, vs,
				ms(res.P50), ms(res.P99), ms(res.Max), secs(res.CreateWindow),
				msFrac(res.CPUPerPod(SchedulerProcess)), msFrac(res.CPUPerPod(APIServerProcess)), msFrac(res.ClusterCPUPerPod()), ceiling,
				res.LoadBefore, res.LoadAfter)
		}
		sep := "\n"
		for _, name := range r.Workloads() {
			if res, ok := r.Find(name, n); ok && res.Err != "" {
				w("%s- %s: %s\n", sep, name, res.Err)
				sep = ""
			}
		}
		w("\n")
	}

	r.peerMarkdown(w)
	r.migMarkdown(w)

	w("## Targets\n\n| target | measured | met |\n| --- | --- | --- |\n")
	for _, t := range r.Targets() {
		met, v := "no", t.Value
		switch {
		case !t.Known:
			met, v = "not measured", "–"
		case t.Met:
			met = "yes"
		}
		w("| %s | %s | %s |\n", t.Name, v, met)
	}
	w("\n## Upstream anchor\n\n")
	w("kube-scheduler's scheduler_perf (test/integration/scheduler_perf/dra) measures about %.0f–%.0f pods/s for "+
		"SchedulingWithResourceClaimTemplate at 500 nodes on CI hardware, with a regression threshold of %.0f pods/s; "+
		"it runs the scheduler in-process against an in-process API server with client QPS/burst 5000/5000, "+
		"a device class whose only selector is device.driver == …, "+
		"10 devices per node in one slice and a claim controller of its own. ", AnchorLow, AnchorHigh, AnchorThreshold)
	if res, ok := r.Find("whole-claim", TargetNodes); ok {
		w("Here whole-claim, the same request shape on Tessera's slices, reached %.1f pods/s at %d nodes (%.2f× the anchor's low end), "+
			"on %d cores shared by etcd, the API server, the controller manager, the scheduler, kwok and this benchmark.", res.PodsPerSecond, TargetNodes, res.PodsPerSecond/AnchorLow, r.Host.Cores)
		if c := res.CPUPerPod(SchedulerProcess); c > 0 {
			w(" The scheduler alone spent %.1f ms of CPU per pod, so even with a core to itself it would bind at most %.0f pods/s.",
				float64(c)/float64(time.Millisecond), float64(time.Second)/float64(c))
		}
	}
	w("\n")
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func ms(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

// msFrac is d in milliseconds with one decimal, "–" for 0 (not measured).
func msFrac(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// finite is v, or 0 for NaN and infinities (for plotting).
func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// findFill returns the MIGFill result of workload at fill.
func findFill(rs []Result, workload string, fill float64) (Result, bool) {
	for _, r := range rs {
		if r.Workload == workload && r.Fill == fill {
			return r, true
		}
	}
	return Result{}, false
}

// PeerRatios are, per run of Peer that has both rows, Tessera's pods/s over
// NVIDIA's and Tessera's scheduler CPU per pod over NVIDIA's.
func (r *Report) PeerRatios() (rate, cpu []float64) {
	byRun := map[int]map[string]Result{}
	for _, res := range r.Peer {
		if byRun[res.Run] == nil {
			byRun[res.Run] = map[string]Result{}
		}
		byRun[res.Run][res.Workload] = res
	}
	runs := make([]int, 0, len(byRun))
	for run := range byRun {
		runs = append(runs, run)
	}
	slices.Sort(runs)
	for _, run := range runs {
		t, okT := byRun[run]["whole-claim"]
		n, okN := byRun[run][NVIDIAWholeWorkload]
		if !okT || !okN || t.Err != "" || n.Err != "" {
			continue
		}
		rate = append(rate, Ratio(t.PodsPerSecond, n.PodsPerSecond))
		tc, nc := t.CPUPerPod(SchedulerProcess), n.CPUPerPod(SchedulerProcess)
		if tc > 0 && nc > 0 {
			cpu = append(cpu, float64(tc)/float64(nc))
		}
	}
	return rate, cpu
}

// spread is "mean (min–max over n runs)" of vs, "–" for none.
func spread(vs []float64) string {
	if len(vs) == 0 {
		return "–"
	}
	lo, hi, sum := vs[0], vs[0], 0.0
	for _, v := range vs {
		lo, hi, sum = min(lo, v), max(hi, v), sum+v
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f over %d runs)", sum/float64(len(vs)), lo, hi, len(vs))
}

// experimentRow is one table row of an experiment's run.
func experimentRow(w func(string, ...any), first string, res Result) {
	w("| %s | %s | %d/%d | %.1f | %s | %s | %s | %s | %s | %.2f → %.2f |\n", first, res.Workload, res.Bound, res.Pods, res.PodsPerSecond,
		ms(res.P50), ms(res.P99), msFrac(res.CPUPerPod(SchedulerProcess)), msFrac(res.CPUPerPod(APIServerProcess)), msFrac(res.ClusterCPUPerPod()),
		res.LoadBefore, res.LoadAfter)
}

const experimentHeader = "| workload | bound/pods | pods/s | p50 | p99 | scheduler CPU/pod | API server CPU/pod | cluster CPU/pod | load before → after |\n" +
	"| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n"

func (r *Report) peerMarkdown(w func(string, ...any)) {
	if len(r.Peer) == 0 {
		return
	}
	w("## Peer: NVIDIA's DRA driver on the same nodes\n\n")
	w("Whole-GPU claims (one GPU per pod, count 1, the class's selector only) on %d nodes, alternating between Tessera's slices "+
		"(%s) and the slices NVIDIA's DRA driver publishes for the same 8 GPUs (%s; shape read from its source, "+
		"cmd/gpu-kubelet-plugin at commit 2240711, MIG and dynamic MIG off); every node's slices are replaced before each run. "+
		"Simulated nodes (kwok), the real kube-scheduler.\n\n", r.Peer[0].Nodes, orDash(r.Slices), orDash(r.PeerSlices))
	w("| run " + experimentHeader)
	for _, res := range r.Peer {
		experimentRow(w, fmt.Sprint(res.Run), res)
	}
	rate, cpu := r.PeerRatios()
	w("\nTessera ÷ NVIDIA: pods/s %s; scheduler CPU per pod %s (below 1: Tessera's pods cost the scheduler less).\n", spread(rate), spread(cpu))
	for _, res := range r.Peer {
		if res.Err != "" {
			w("- run %d %s: %s\n", res.Run, res.Workload, res.Err)
		}
	}
	w("\n")
}

func (r *Report) migMarkdown(w func(string, ...any)) {
	if len(r.MIGFill) == 0 {
		return
	}
	w("## Dynamic MIG at fill levels\n\n")
	w("On %d nodes: %s pods on nodes that publish every GPU with dynamic MIG (%s) against whole-claim pods on the same GPUs "+
		"published as usual. Before each run the benchmark takes the first k GPUs of every node with one claim per node whose "+
		"allocation it writes itself (the GPU's largest MIG placement on the MIG nodes, the whole GPU on the others); the scheduler "+
		"places the run's pods around them. A taken MIG GPU is published as the plugin republishes it once prepare has made its "+
		"instance (only the held full-GPU placement; see each row's published slices in the JSON): the best case, where a GPU "+
		"full of small instances would keep one placement per instance. One run per row. Simulated nodes (kwok), the real kube-scheduler.\n\n", r.MIGFill[0].Nodes, MIGWorkload, orDash(r.MIGSlices))
	w("| GPUs taken " + experimentHeader)
	for _, res := range r.MIGFill {
		experimentRow(w, fmt.Sprintf("%.1f %%", 100*res.Fill), res)
	}
	for _, res := range r.MIGFill {
		if res.Err != "" {
			w("- %.1f %% %s: %s\n", 100*res.Fill, res.Workload, res.Err)
		}
	}
	w("\n")
}
