package fleet

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// BenchConfig is one benchmark run: the simulation grid and the cost grid.
type BenchConfig struct {
	// Command is recorded in the report as the way to reproduce it.
	Command  string
	Workload Workload // MeanDemand is overridden by Means; GPUs by Nodes
	Nodes    int
	Means    []float64
	// CostNodes × CostShares is the scheduler cost grid; empty skips it.
	CostNodes, CostShares []int
	// CostMinTime is how long each cost point is measured at least.
	CostMinTime time.Duration
	// Parallel runs that many simulations at once (0: GOMAXPROCS). The results do
	// not depend on it.
	Parallel int
	// Check turns on the conservation check in every simulation.
	Check bool
}

// QuickConfig finishes in well under a minute on two busy cores: the paper's fleet
// size (32 GPUs), 2000 jobs per mean demand.
func QuickConfig(seed int64) BenchConfig {
	return BenchConfig{
		Workload:    Workload{Seed: seed, Jobs: 2000, SDDemand: 0.1, MeanRuntime: 600, Load: 1.25},
		Nodes:       4,
		Means:       []float64{0.1, 0.2, 0.3, 0.4, 0.6},
		CostNodes:   []int{1, 16, 64},
		CostShares:  []int{0, 8, 32, 56, 63},
		CostMinTime: 20 * time.Millisecond,
		Check:       true,
	}
}

// FullConfig is a 128-GPU fleet with 10000 jobs per mean demand (a few minutes).
func FullConfig(seed int64) BenchConfig {
	return BenchConfig{
		Workload:    Workload{Seed: seed, Jobs: 10000, SDDemand: 0.1, MeanRuntime: 600, Load: 1.25},
		Nodes:       16,
		Means:       []float64{0.1, 0.2, 0.3, 0.4, 0.6},
		CostNodes:   []int{1, 16, 64, 256},
		CostShares:  []int{0, 8, 16, 32, 56, 63},
		CostMinTime: 200 * time.Millisecond,
		Check:       true,
	}
}

// Bench runs the simulation for every mean demand and model, then the cost grid.
func Bench(ctx context.Context, cfg BenchConfig) (*Report, error) {
	rep := &Report{Command: cfg.Command, Workload: cfg.Workload, Nodes: cfg.Nodes, Means: cfg.Means}
	rep.Workload.GPUs = cfg.Nodes * GPUsPerNode
	rep.Results = make([][]Result, len(cfg.Means))
	type task struct{ i, k int }
	var tasks []task
	streams := make([][]Job, len(cfg.Means))
	for i, m := range cfg.Means {
		rep.Results[i] = make([]Result, len(AllKinds))
		w := rep.Workload
		w.MeanDemand = m
		streams[i] = w.Generate()
		for k := range AllKinds {
			tasks = append(tasks, task{i, k})
		}
	}
	// The partition runs are the slowest (120 devices per node); start them first.
	for a, t := range tasks {
		if AllKinds[t.k] == Partition {
			copy(tasks[1:a+1], tasks[:a])
			tasks[0] = t
		}
	}

	start := time.Now()
	parallel := cfg.Parallel
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	ch := make(chan task)
	errs := make([]error, len(tasks))
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for t := range ch {
				w := rep.Workload
				w.MeanDemand = cfg.Means[t.i]
				r, err := Run(ctx, AllKinds[t.k], w, streams[t.i], Options{Nodes: cfg.Nodes, Check: cfg.Check})
				r.Starts = nil
				rep.Results[t.i][t.k] = r
				errs[t.i*len(AllKinds)+t.k] = err
			}
		})
	}
	for _, t := range tasks {
		ch <- t
	}
	close(ch)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	rep.SimWall = time.Since(start)

	start = time.Now()
	for _, k := range AllCostKinds {
		for _, n := range cfg.CostNodes {
			for _, s := range cfg.CostShares {
				c, err := MeasureCost(ctx, k, n, s, cfg.CostMinTime)
				if err != nil {
					return nil, fmt.Errorf("cost %s, %d nodes, %d shares: %w", k, n, s, err)
				}
				rep.Costs = append(rep.Costs, c)
			}
		}
	}
	rep.CostWall = time.Since(start)
	return rep, nil
}
