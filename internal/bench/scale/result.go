package scale

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Sample is one pod's life up to its binding, on the benchmark's clock: Created
// when the API server answered its create request, Bound when the benchmark's
// watch first saw it with spec.nodeName set. A pod never bound has a zero Bound.
type Sample struct {
	Created time.Time
	Bound   time.Time
}

// Result is what one run of one workload measured.
type Result struct {
	Workload string `json:"workload"`
	Nodes    int    `json:"nodes"`
	// Pods were created; Bound of them were bound before the run's timeout.
	Pods  int `json:"pods"`
	Bound int `json:"bound"`
	// PodsPerSecond is Bound over the window from the first pod's creation to the
	// last binding: the rate pods went from created to bound.
	PodsPerSecond float64 `json:"podsPerSecond"`
	// Window is that window; CreateWindow is from the first creation to the last.
	Window       time.Duration `json:"window"`
	CreateWindow time.Duration `json:"createWindow"`
	// P50, P99 and Max are of the bound pods' create→bound latency.
	P50 time.Duration `json:"p50"`
	P99 time.Duration `json:"p99"`
	Max time.Duration `json:"max"`
	// Load1 is the host's 1-minute load average when the run began and ended.
	LoadBefore float64 `json:"loadBefore"`
	LoadAfter  float64 `json:"loadAfter"`
	// CPU is the CPU time each watched process (Config.Processes) used from the
	// first creation until the last binding (or the stall): what the run cost,
	// whatever else shared the machine.
	CPU map[string]time.Duration `json:"cpu,omitempty"`
	// Err is why the run stopped short, empty when every pod was bound.
	Err string `json:"error,omitempty"`
	// Published says what the nodes published during the run (the
	// experiments only; empty: Tessera's slices of the report's profile).
	Published string `json:"published,omitempty"`
	// Run numbers the repetitions of one experiment (Peer), from 1.
	Run int `json:"run,omitempty"`
	// Fill is the share of every node's GPUs taken before the run (MIGFill).
	Fill float64 `json:"fill,omitempty"`
}

// Aggregate turns one run's samples into a Result (Workload, Nodes, load, CPU and
// Err are left to the caller). Latencies are nearest-rank percentiles; a pod seen bound
// before its create request returned counts as latency 0. With no bound pod the
// rate and latencies are 0.
func Aggregate(samples []Sample) Result {
	r := Result{Pods: len(samples)}
	if len(samples) == 0 {
		return r
	}
	var first, lastCreated, lastBound time.Time
	lat := make([]time.Duration, 0, len(samples))
	for i, s := range samples {
		if i == 0 || s.Created.Before(first) {
			first = s.Created
		}
		if s.Created.After(lastCreated) {
			lastCreated = s.Created
		}
		if s.Bound.IsZero() {
			continue
		}
		if s.Bound.After(lastBound) {
			lastBound = s.Bound
		}
		lat = append(lat, max(0, s.Bound.Sub(s.Created)))
	}
	r.CreateWindow = lastCreated.Sub(first)
	r.Bound = len(lat)
	if r.Bound == 0 {
		return r
	}
	r.Window = max(lastBound.Sub(first), time.Millisecond)
	r.PodsPerSecond = float64(r.Bound) / r.Window.Seconds()
	slices.Sort(lat)
	r.P50, r.P99, r.Max = percentile(lat, 50), percentile(lat, 99), lat[len(lat)-1]
	return r
}

// percentile is the nearest-rank p-th percentile of sorted, which is not empty.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Ratio is a/b, or NaN when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// PodsForNodes is the number of pods a run of one workload creates on a cluster
// of n nodes: three per node, at most 500. The nvlink-pair workload then takes
// 6 of a node's 8 GPUs at most, so every workload fits on an empty cluster; 500
// keeps a run at 1000 nodes within minutes on two cores.
func PodsForNodes(n int) int { return min(3*n, 500) }

// CPUPerPod is process name's CPU time per bound pod, 0 when unknown.
func (r Result) CPUPerPod(name string) time.Duration {
	d, ok := r.CPU[name]
	if !ok || r.Bound == 0 {
		return 0
	}
	return d / time.Duration(r.Bound)
}

// ClusterCPUPerPod is the CPU time of all watched processes per bound pod, 0
// when unknown.
func (r Result) ClusterCPUPerPod() time.Duration {
	if len(r.CPU) == 0 || r.Bound == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range r.CPU {
		sum += d
	}
	return sum / time.Duration(r.Bound)
}

func (r Result) String() string {
	return fmt.Sprintf("%s on %d nodes: %d/%d pods bound, %.1f pods/s, p50 %s, p99 %s, scheduler CPU/pod %s",
		r.Workload, r.Nodes, r.Bound, r.Pods, r.PodsPerSecond, r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond),
		r.CPUPerPod(SchedulerProcess).Round(100*time.Microsecond))
}
