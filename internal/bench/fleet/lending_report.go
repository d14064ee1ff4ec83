package fleet

import (
	"fmt"
	"strings"
	"time"
)

// LendingBenchConfig is the lending sweep: every idle period against every
// grace, on one workload.
type LendingBenchConfig struct {
	// Command is recorded in the report as the way to reproduce it.
	Command  string
	Workload LendingWorkload
	// Options are the base options; IdlePeriod and Grace are swept.
	Options     LendingOptions
	IdlePeriods []time.Duration
	Graces      []time.Duration
	// Parallel runs that many simulations at once (0: GOMAXPROCS). The
	// results do not depend on it.
	Parallel int
}

// DefaultLendingBench is the sweep: idle periods of 1, 5 and 15 min
// against graces of 0, 10, 30 and 60 s, with the given eviction latency.
func DefaultLendingBench(seed int64, evictionLatency time.Duration) LendingBenchConfig {
	opt := DefaultLendingOptions(5*time.Minute, 30*time.Second)
	opt.EvictionLatency = evictionLatency
	return LendingBenchConfig{
		Workload:    DefaultLendingWorkload(seed),
		Options:     opt,
		IdlePeriods: []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute},
		Graces:      []time.Duration{0, 10 * time.Second, 30 * time.Second, 60 * time.Second},
	}
}

// LendingReport is the sweep's result.
type LendingReport struct {
	Command  string          `json:"command"`
	Workload LendingWorkload `json:"workload"`
	Options  LendingOptions  `json:"options"`
	// Results are by idle period, then grace.
	Results []LendingResult `json:"results"`
	Wall    time.Duration   `json:"wallNanoseconds"`
}

// LendingBench runs the sweep. Every configuration replays the same owners
// and borrowers.
func LendingBench(cfg LendingBenchConfig) (*LendingReport, error) {
	if len(cfg.IdlePeriods) == 0 || len(cfg.Graces) == 0 {
		return nil, fmt.Errorf("lending bench: IdlePeriods %v and Graces %v must not be empty", cfg.IdlePeriods, cfg.Graces)
	}
	if err := cfg.Workload.Validate(cfg.Options.Policy); err != nil {
		return nil, err
	}
	start := time.Now()
	owners, borrowers := cfg.Workload.Generate()
	rep := &LendingReport{Command: cfg.Command, Workload: cfg.Workload, Options: cfg.Options}
	rep.Results = make([]LendingResult, len(cfg.IdlePeriods)*len(cfg.Graces))
	err := runEach(len(rep.Results), cfg.Parallel, func(i int) error {
		opt := cfg.Options
		opt.Policy.IdlePeriod = cfg.IdlePeriods[i/len(cfg.Graces)]
		opt.Grace = cfg.Graces[i%len(cfg.Graces)]
		var err error
		rep.Results[i], err = RunLending(owners, borrowers, cfg.Workload.Horizon, cfg.Workload.GPUMemory, opt)
		return err
	})
	if err != nil {
		return nil, err
	}
	rep.Wall = time.Since(start)
	return rep, nil
}

func pct(x float64) string { return fmt.Sprintf("%.1f %%", 100*x) }

func pct2(x float64) string { return fmt.Sprintf("%.2f %%", 100*x) }

// Markdown renders the report: the workload, the assumptions, one row per
// configuration with the two targets, and which configurations meet
// both.
func (r *LendingReport) Markdown() string {
	var b strings.Builder
	w, o := r.Workload, r.Options
	fmt.Fprintf(&b, "# Tessera lending simulation\n\n")
	fmt.Fprintf(&b, "Reproduce: `%s` (deterministic for the seed). %d configurations in %.1fs wall.\n\n", r.Command, len(r.Results), r.Wall.Seconds())
	fmt.Fprintf(&b, "Every lend and reclaim decision is `lending.Step` (pkg/lending) with the node's default policy "+
		"(reserve %d MiB, minimum loan %d MiB, memory slack %d MiB) and the idle period of the row, called for every GPU every %s of simulated time.\n\n",
		o.Policy.Reserve>>20, o.Policy.MinLend>>20, o.Policy.MemorySlack>>20, o.Sample)
	fmt.Fprintf(&b, "## Workload\n\n")
	fmt.Fprintf(&b, "- Owners: %d GPUs of %d GiB, each held whole by one owner for %s, opted in to lending. "+
		"Each owner is busy a share of the time drawn from %.0f–%.0f %%, in exponential bursts with a mean drawn from %s–%s "+
		"and exponential idle gaps sized to that share; it keeps %d–%d GiB while idle and %d GiB more while busy (seed %d).\n",
		w.GPUs, w.GPUMemory>>30, w.Horizon, 100*w.BusyFraction[0], 100*w.BusyFraction[1], w.BurstMean[0], w.BurstMean[1],
		w.OwnerMemory[0]>>30, w.OwnerMemory[1]>>30, w.BusyMemory>>30, w.Seed)
	fmt.Fprintf(&b, "- Borrowers: Poisson arrivals offering %.2f× the owners' expected idle GPU time, GPU work %s–%s and memory %d–%d GiB each (uniform); "+
		"a borrower takes all of a lent GPU's cores, so one borrower per GPU. The queue is kube-scheduler's order for equal priorities: "+
		"earliest arrival first; an evicted borrower goes back with its original arrival. It takes the first free lent GPU with the memory.\n",
		w.BorrowerLoad, w.Work[0], w.Work[1], w.BorrowerMemory[0]>>30, w.BorrowerMemory[1]>>30)
	fmt.Fprintf(&b, "- Borrowers checkpoint every %s of work (free); a grace of at least %s lets a borrower save its work at the taint "+
		"(it stops computing to save), a shorter one keeps only its last periodic checkpoint. From allocation to first GPU work: %s.\n",
		o.CheckpointEvery, o.CheckpointWrite, o.StartLatency)
	fmt.Fprintf(&b, "- Reclaim: the owner turns busy at any instant; the next sample (≤ %s later) sees it and `Step` returns `Reclaiming`: "+
		"the NoExecute taint evicts the borrower after the grace (its tolerationSeconds) plus an eviction latency of %s "+
		"(pod deletion to claim unprepared; an input, to be replaced by the local cluster's measurement).\n",
		o.Sample, o.EvictionLatency)
	fmt.Fprintf(&b, "- The owner keeps its GPU throughout. Owner extra wait is the time an owner is busy while a borrower is still on its GPU "+
		"(from the owner turning busy to the borrower gone), over the owners' busy time. Memory pressure and slowdown while they share are not modelled.\n\n")

	fmt.Fprintf(&b, "## Results\n\n")
	fmt.Fprintf(&b, "Targets (issue #11): borrowers use ≥ 50 %% of the owners' idle GPU-hours; owners' extra wait ≤ 1 %% of their busy time.\n\n")
	fmt.Fprintf(&b, "| idle period | grace | borrower GPU-h (useful) | / owners' idle GPU-h | ≥ 50 %% | owner extra wait | / owners' busy time | ≤ 1 %% | reclaims | reclaim p50 | reclaim p99 | work lost GPU-h | lent GPU-h | completed / arrived |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	var both []string
	for _, x := range r.Results {
		fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s | %.2f h | %s | %s | %d | %.1f s | %.1f s | %.1f | %.0f | %d / %d |\n",
			x.IdlePeriod, x.Grace, x.BorrowerGPUHours, pct(x.BorrowerShare), mark(x.BorrowersMet()),
			x.OwnerWaitHours, pct2(x.OwnerWaitShare), mark(x.OwnersMet()), x.Reclaims, x.ReclaimP50, x.ReclaimP99,
			x.LostGPUHours, x.LentGPUHours, x.Completed, x.Borrowers)
		if x.BorrowersMet() && x.OwnersMet() {
			both = append(both, fmt.Sprintf("idle period %s with grace %s", x.IdlePeriod, x.Grace))
		}
	}
	if len(r.Results) > 0 {
		x := r.Results[0]
		fmt.Fprintf(&b, "\nOwners' GPU time: %.0f GPU-h idle, %.0f GPU-h busy (%s busy).\n", x.OwnerIdleGPUHours, x.OwnerBusyGPUHours,
			pct(ratio(x.OwnerBusyGPUHours, x.OwnerIdleGPUHours+x.OwnerBusyGPUHours)))
	}
	fmt.Fprintf(&b, "\n**Both targets met:** ")
	if len(both) == 0 {
		fmt.Fprintf(&b, "no configuration.\n")
	} else {
		fmt.Fprintf(&b, "%s.\n", strings.Join(both, "; "))
	}
	fmt.Fprintf(&b, "\nReclaim latency is from the owner turning busy to the last borrower gone from its GPU; "+
		"it is at most a sample interval plus the grace plus the eviction latency (%s + grace + %s).\n",
		o.Sample, o.EvictionLatency)
	// The owners' wait is about reclaims × mean reclaim latency, so the 1 %
	// target caps the mean latency, hence the grace, at each idle period.
	fmt.Fprintf(&b, "\nWhat the owner target leaves for the grace (1 %% of the owners' busy time spread over the reclaims, "+
		"less the mean sampling delay %s and the eviction latency):\n\n", o.Sample/2)
	seen := map[time.Duration]bool{}
	for _, x := range r.Results {
		if seen[x.IdlePeriod] || x.Reclaims == 0 {
			continue
		}
		seen[x.IdlePeriod] = true
		mean := 0.01 * x.OwnerBusyGPUHours * 3600 / float64(x.Reclaims)
		grace := mean - (o.Sample / 2).Seconds() - o.EvictionLatency.Seconds()
		fmt.Fprintf(&b, "- idle period %s: %d reclaims, mean reclaim ≤ %.1f s, grace ≤ %.1f s\n", x.IdlePeriod, x.Reclaims, mean, max(grace, 0))
	}
	return b.String()
}
