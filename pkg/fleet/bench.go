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
	Workload Workload // MeanDemand and Dist are overridden per row; GPUs by Nodes
	Nodes    int
	// Means are the rows for the paper's normal demand, Normal(m, Workload.SDDemand),
	// when Dists is empty.
	Means []float64
	// Dists, when set, are the rows instead: one demand distribution each.
	Dists []Distribution
	// Sim is the queue and node-choice model of every run (Nodes and Check are
	// set from this config).
	Sim Options
	// FIFOReference also runs Tessera, the bound and fluid under QueueFIFO, where
	// the bound is a proven bound.
	FIFOReference bool
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
		Workload:      Workload{Seed: seed, Jobs: 2000, SDDemand: 0.1, MeanRuntime: 600, Load: 1.25},
		Nodes:         4,
		Means:         []float64{0.1, 0.2, 0.3, 0.4, 0.6},
		CostNodes:     []int{1, 16, 64},
		CostShares:    []int{0, 8, 32, 56, 63},
		CostMinTime:   20 * time.Millisecond,
		Check:         true,
		FIFOReference: true,
	}
}

// FullConfig is a 128-GPU fleet with 10000 jobs per mean demand (a few minutes).
func FullConfig(seed int64) BenchConfig {
	return BenchConfig{
		Workload:      Workload{Seed: seed, Jobs: 10000, SDDemand: 0.1, MeanRuntime: 600, Load: 1.25},
		Nodes:         16,
		Means:         []float64{0.1, 0.2, 0.3, 0.4, 0.6},
		CostNodes:     []int{1, 16, 64, 256},
		CostShares:    []int{0, 8, 16, 32, 56, 63},
		CostMinTime:   200 * time.Millisecond,
		Check:         true,
		FIFOReference: true,
	}
}

// FIFOKinds are the models of the FIFO reference runs.
var FIFOKinds = []Kind{Tessera, Bound, Fluid}

// Bench runs the simulation for every mean demand and model, then the cost grid.
func Bench(ctx context.Context, cfg BenchConfig) (*Report, error) {
	rep := &Report{Command: cfg.Command, Workload: cfg.Workload, Nodes: cfg.Nodes, Sim: cfg.Sim}
	rep.Sim.Nodes, rep.Sim.Check = cfg.Nodes, cfg.Check
	rep.Workload.GPUs = cfg.Nodes * GPUsPerNode
	var rows []Workload
	if len(cfg.Dists) == 0 {
		for _, m := range cfg.Means {
			w := rep.Workload
			w.Dist, w.MeanDemand = nil, m
			rows = append(rows, w)
		}
	}
	for _, d := range cfg.Dists {
		w := rep.Workload
		w.Dist, w.MeanDemand = d, 0
		if t, ok := d.(Trace); ok {
			w.Trace = t.Jobs
		}
		w.MeanDemand = w.Mean()
		rows = append(rows, w)
	}
	rep.Results = make([][]Result, len(rows))
	rep.FIFO = make([][]Result, len(rows))
	type task struct {
		i, k int
		fifo bool
	}
	var tasks []task
	streams := make([][]Job, len(rows))
	for i, w := range rows {
		rep.Means = append(rep.Means, w.MeanDemand)
		rep.Dists = append(rep.Dists, w.Distribution().Name())
		rep.Results[i] = make([]Result, len(AllKinds))
		streams[i] = w.Generate()
		for k := range AllKinds {
			tasks = append(tasks, task{i: i, k: k})
		}
		if cfg.FIFOReference {
			rep.FIFO[i] = make([]Result, len(FIFOKinds))
			for k := range FIFOKinds {
				tasks = append(tasks, task{i: i, k: k, fifo: true})
			}
		}
	}
	// The partition runs are the slowest (120 devices per node); start them first.
	for a, t := range tasks {
		if !t.fifo && AllKinds[t.k] == Partition {
			copy(tasks[1:a+1], tasks[:a])
			tasks[0] = t
		}
	}

	start := time.Now()
	parallel := cfg.Parallel
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	ch := make(chan int)
	errs := make([]error, len(tasks))
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for a := range ch {
				t := tasks[a]
				opt, kind := rep.Sim, AllKinds[t.k]
				if t.fifo {
					opt.Queue, kind = QueueFIFO, FIFOKinds[t.k]
				}
				r, err := Run(ctx, kind, rows[t.i], streams[t.i], opt)
				r.Starts = nil
				if t.fifo {
					rep.FIFO[t.i][t.k] = r
				} else {
					rep.Results[t.i][t.k] = r
				}
				if err != nil {
					errs[a] = fmt.Errorf("%s (%s queue), %s: %w", kind, opt.Queue, rep.Dists[t.i], err)
				}
			}
		})
	}
	for a := range tasks {
		ch <- a
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
