package fleet

import (
	"context"
	"fmt"
	"time"
)

// BenchConfig is one benchmark run: the simulation grid and the cost grid.
type BenchConfig struct {
	// Command is recorded in the report as the way to reproduce it.
	Command  string
	Workload Workload // MeanDemand and Dist are overridden per row; GPUs by the fleet
	// Nodes is the number of hgx-h100 nodes when Fleet is empty.
	Nodes int
	// Fleet, when set, is the cluster instead (heterogeneous pools; the
	// reference models (d) and (e) need one GPU model and are skipped otherwise).
	Fleet Fleet
	// Means are the rows for the paper's normal demand, Normal(m, Workload.SDDemand),
	// when Dists is empty.
	Means []float64
	// Dists, when set, are the rows instead: one demand distribution each.
	Dists []Distribution
	// Sim is the queue and node-choice model of every run (Nodes and Check are
	// set from this config).
	Sim Options
	// FIFOReference also runs Tessera, the migrating reference and fluid under
	// QueueFIFO, where the migrating reference starts every job no later than
	// any placement without migration (proven).
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

// QuickConfig is the paper's fleet size (32 GPUs), 2000 jobs per mean demand
// (about two minutes on the project's two busy cores).
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

// FullConfig is a 128-GPU fleet with 10000 jobs per mean demand (about ten
// minutes on the project's two busy cores).
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
var FIFOKinds = []Kind{Tessera, Migrating, Fluid}

// referenceKind says whether k places on no GPU and so needs a fleet of one model.
func referenceKind(k Kind) bool { return k == Migrating || k == Fluid }

// Bench runs the simulation for every mean demand and model, then the cost grid.
func Bench(ctx context.Context, cfg BenchConfig) (*Report, error) {
	rep := &Report{Command: cfg.Command, Workload: cfg.Workload, Nodes: cfg.Nodes, Sim: cfg.Sim}
	rep.Sim.Nodes, rep.Sim.Fleet, rep.Sim.Check = cfg.Nodes, cfg.Fleet, cfg.Check
	rep.Fleet = rep.Sim.fleet()
	rep.Nodes = len(rep.Fleet.Nodes)
	rep.Workload.GPUs = rep.Fleet.GPUs()
	_, homogeneous := rep.Fleet.Homogeneous()
	rows := benchRows(rep.Workload, cfg.Means, cfg.Dists)
	rep.Results = make([][]Result, len(rows))
	rep.FIFO = make([][]Result, len(rows))
	rep.Bounds = make([]RowBound, len(rows))
	type task struct {
		i, k  int
		fifo  bool
		bound bool
	}
	var tasks []task
	streams := make([][]Job, len(rows))
	for i, w := range rows {
		rep.Means = append(rep.Means, w.MeanDemand)
		rep.Dists = append(rep.Dists, w.Distribution().Name())
		rep.Results[i] = make([]Result, len(AllKinds))
		streams[i] = w.Generate()
		for k, kind := range AllKinds {
			if referenceKind(kind) && !homogeneous {
				rep.Results[i][k] = Result{Kind: kind, Skipped: "needs one GPU model"}
				continue
			}
			tasks = append(tasks, task{i: i, k: k})
		}
		if cfg.FIFOReference {
			rep.FIFO[i] = make([]Result, len(FIFOKinds))
			for k, kind := range FIFOKinds {
				if referenceKind(kind) && !homogeneous {
					rep.FIFO[i][k] = Result{Kind: kind, Skipped: "needs one GPU model"}
					continue
				}
				tasks = append(tasks, task{i: i, k: k, fifo: true})
			}
		}
		tasks = append(tasks, task{i: i, bound: true})
	}
	// The partition runs are the slowest (120 devices per node); start them first.
	for a, t := range tasks {
		if !t.fifo && !t.bound && AllKinds[t.k] == Partition {
			copy(tasks[1:a+1], tasks[:a])
			tasks[0] = t
		}
	}

	start := time.Now()
	err := runEach(len(tasks), cfg.Parallel, func(a int) error {
		t := tasks[a]
		if t.bound {
			jobs := streams[t.i]
			if len(jobs) == 0 {
				return nil
			}
			w0, w1 := jobs[len(jobs)/10].Arrival, jobs[len(jobs)-1].Arrival
			sb, err := ServedBound(rep.Fleet, jobs, w0, w1)
			if err == nil {
				var rb Bound
				rb, err = RunningBound(rep.Fleet, jobs, w0, w1)
				rep.Bounds[t.i] = RowBound{Served: sb, Running: rb}
			}
			if err != nil {
				return fmt.Errorf("bound, %s: %w", rep.Dists[t.i], err)
			}
			return nil
		}
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
			return fmt.Errorf("%s (%s queue), %s: %w", kind, opt.Queue, rep.Dists[t.i], err)
		}
		return nil
	})
	if err != nil {
		return nil, err
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

// benchRows are a bench's workloads: base at each mean demand when no
// distributions are given, else base under each distribution (a trace's
// jobs as they are), its mean demand the distribution's.
func benchRows(base Workload, means []float64, dists []Distribution) []Workload {
	var rows []Workload
	if len(dists) == 0 {
		for _, m := range means {
			w := base
			w.Dist, w.MeanDemand = nil, m
			rows = append(rows, w)
		}
	}
	for _, d := range dists {
		w := base
		w.Dist, w.MeanDemand = d, 0
		if t, ok := d.(Trace); ok {
			w.Trace = t.Jobs
		}
		w.MeanDemand = w.Mean()
		rows = append(rows, w)
	}
	return rows
}
