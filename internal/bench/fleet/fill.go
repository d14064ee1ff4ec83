package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// The fill experiment is "Beware of Fragmentation"'s (USENIX ATC '23):
// pods arrive one after the other in shuffled order and never leave; after
// each arrival, how much of the fleet's GPU capacity is left unallocated,
// against how much GPU the pods that arrived so far asked for. A pod that
// fits nowhere when it arrives is dropped (counted as failed), as in their
// simulator. Where the jobs/h benchmark asks how fast a fleet serves a
// queue, this asks how much of it a placement strands.
//
// The arrival sequence follows their workload tuning
// (kubernetes-scheduler-simulator, pkg/simulator/simulator.go tuneUpPods /
// tuneDownPods): the trace's pods, plus pods drawn from it with replacement
// while the total GPU request stays within Target × the fleet's GPUs (or
// minus pods drawn at random while it is above), then shuffled.

// FillKinds are the models the fill experiment compares.
var FillKinds = []Kind{Whole, Partition, Tessera, TesseraBestFit}

// FillPoints are the arrived workloads (fractions of the fleet's GPUs) the
// report reads the curves at.
var FillPoints = []float64{0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3}

// FillConfig is one fill experiment.
type FillConfig struct {
	// Command is recorded in the report as the way to reproduce it.
	Command string
	// Source says where the fleet and pods came from (a trace's files, or
	// the synthetic generator), for the report.
	Source string
	Fleet  Fleet
	// Pods are the trace's pods; arrival and run times are not used.
	Pods []Job
	Seed int64
	// Target is the arrived GPU request the sequence stops at, as a
	// fraction of the fleet's GPUs (0: 1.3, FGD's).
	Target float64
	// Kinds are the models run (empty: FillKinds).
	Kinds []Kind
	// Sim is the node choice and scoring of the allocator-backed models
	// (its queue is not used: pods are tried once, in order).
	Sim Options
	// Parallel runs that many models at once (0: GOMAXPROCS).
	Parallel int
	// Note is added to the report (for example how the fleet was scaled down).
	Note string
}

// FillResult is one model's curve.
type FillResult struct {
	Kind Kind
	// Arrived[i] is the arrived GPU request at point i (a fraction of the
	// fleet's GPUs, the first arrival at or past FillPoints[i]);
	// Unallocated[i] the share of the fleet's GPU capacity not holding a
	// placed pod's request then; Failed[i] the GPU pods dropped so far.
	Arrived, Unallocated []float64
	Failed               []int
	// FailedCPUOnly counts CPU-only pods dropped over the whole sequence.
	FailedCPUOnly int
	// Placed counts the pods placed over the whole sequence.
	Placed         int
	AllocatorCalls int
	Wall           time.Duration
}

// FillReport is a fill experiment's results.
type FillReport struct {
	Config   FillConfig
	Sequence int     // pods in the arrival sequence
	Arrived  float64 // their GPU request, a fraction of the fleet's GPUs
	Results  []FillResult
	Wall     time.Duration
}

// FillSequence is the arrival sequence for pods on a fleet of gpus GPUs.
func FillSequence(pods []Job, gpus int, target float64, seed int64) []Job {
	rng := rand.New(rand.NewPCG(uint64(seed), 0xf111))
	seq := append([]Job(nil), pods...)
	var total float64
	for i := range seq {
		total += seq[i].gpuRequest()
	}
	goal := target * float64(gpus)
	if total > goal {
		for total > goal && len(seq) > 0 {
			k := rng.IntN(len(seq))
			total -= seq[k].gpuRequest()
			seq = append(seq[:k], seq[k+1:]...)
		}
	} else if len(pods) > 0 {
		for {
			j := pods[rng.IntN(len(pods))]
			if total+j.gpuRequest() > goal {
				break
			}
			total += j.gpuRequest()
			seq = append(seq, j)
		}
	}
	rng.Shuffle(len(seq), func(a, b int) { seq[a], seq[b] = seq[b], seq[a] })
	for i := range seq {
		seq[i].ID = i
		seq[i].Arrival, seq[i].Runtime = float64(i), 0
	}
	return seq
}

// Fill runs the fill experiment for every model.
func Fill(ctx context.Context, cfg FillConfig) (*FillReport, error) {
	if cfg.Target == 0 {
		cfg.Target = 1.3
	}
	if len(cfg.Kinds) == 0 {
		cfg.Kinds = FillKinds
	}
	gpus := cfg.Fleet.GPUs()
	if gpus == 0 {
		return nil, fmt.Errorf("fill: the fleet has no GPUs")
	}
	seq := FillSequence(cfg.Pods, gpus, cfg.Target, cfg.Seed)
	for i := range seq {
		j := &seq[i]
		if j.GPUs == 0 && !j.CPUOnly {
			for _, m := range cfg.Fleet.GPUModels() {
				if _, _, err := shareRequest(Demand{j.Memory, j.Cores}, m); err != nil {
					return nil, fmt.Errorf("fill: pod %d on %s: %w", i, m.Name, err)
				}
			}
		}
	}
	rep := &FillReport{Config: cfg, Sequence: len(seq), Results: make([]FillResult, len(cfg.Kinds))}
	for i := range seq {
		rep.Arrived += seq[i].gpuRequest() / float64(gpus)
	}
	start := time.Now()
	err := runEach(len(cfg.Kinds), cfg.Parallel, func(k int) error {
		var err error
		if rep.Results[k], err = fillOne(ctx, cfg.Kinds[k], cfg, seq); err != nil {
			return fmt.Errorf("fill, %s: %w", cfg.Kinds[k], err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rep.Wall = time.Since(start)
	return rep, nil
}

func fillOne(ctx context.Context, kind Kind, cfg FillConfig, seq []Job) (FillResult, error) {
	start := time.Now()
	res := FillResult{Kind: kind}
	opt := cfg.Sim
	opt.Fleet, opt.Nodes = cfg.Fleet, 0
	var p placer
	var calls *int
	switch kind {
	case TesseraBestFit:
		p = newOraclePlacer(cfg.Fleet, opt, true)
	case Whole, Partition, Tessera:
		m, err := newDeviceModel(kind, cfg.Fleet)
		if err != nil {
			return res, err
		}
		ap, err := newAllocatorPlacer(m, opt)
		if err != nil {
			return res, err
		}
		p, calls = ap, &ap.calls
	default:
		return res, fmt.Errorf("the fill experiment runs %v, not %s", FillKinds, kind)
	}
	gpus := float64(cfg.Fleet.GPUs())
	// Per-GPU use, to check conservation as the jobs/h simulation does.
	var capacity []int64
	for _, s := range cfg.Fleet.Nodes {
		for range s.GPUs {
			capacity = append(capacity, s.Model.MemoryBytes())
		}
	}
	uses := make([][]gpuUse, len(capacity))
	var arrived, allocated float64
	failed, point := 0, 0
	for i := range seq {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		j := &seq[i]
		pl, ok, err := p.place(ctx, j)
		if err != nil {
			return res, fmt.Errorf("pod %d: %w", i, err)
		}
		switch {
		case ok:
			res.Placed++
			allocated += j.gpuRequest()
			if !j.CPUOnly && len(pl.gpus) != j.gpuCount() {
				return res, fmt.Errorf("pod %d holds %d GPUs, asked for %d", i, len(pl.gpus), j.gpuCount())
			}
			for k, g := range pl.gpus {
				uses[g] = append(uses[g], pl.uses[k])
				if err := checkGPU(uses[g], capacity[g]); err != nil {
					return res, fmt.Errorf("GPU %d after pod %d: %w", g, i, err)
				}
			}
		case j.CPUOnly:
			res.FailedCPUOnly++
		default:
			failed++
		}
		arrived += j.gpuRequest()
		for point < len(FillPoints) && arrived/gpus >= FillPoints[point]-1e-9 {
			res.Arrived = append(res.Arrived, arrived/gpus)
			res.Unallocated = append(res.Unallocated, 1-allocated/gpus)
			res.Failed = append(res.Failed, failed)
			point++
		}
	}
	// The sequence stops just short of the target; its end stands for the
	// last point when it is within half a percent of it.
	if point < len(FillPoints) && arrived/gpus >= FillPoints[point]-0.005 {
		res.Arrived = append(res.Arrived, arrived/gpus)
		res.Unallocated = append(res.Unallocated, 1-allocated/gpus)
		res.Failed = append(res.Failed, failed)
	}
	if calls != nil {
		res.AllocatorCalls = *calls
	}
	res.Wall = time.Since(start)
	return res, nil
}
