package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/tessera-dev/tessera/internal/bench/fleet"
)

// simFlags are the fleet simulation's model and workload flags.
type simFlags struct {
	dists      []fleet.Distribution
	trace      string
	queue      string
	nodeChoice string
	load       float64
	runtime    float64
	fifo       bool
	fleet      string
}

func registerSimFlags(fs *flag.FlagSet) *simFlags {
	s := &simFlags{}
	fs.Func("dist", "a demand distribution, one row of the report each (repeat the flag, or separate with ;): "+fleet.DistributionSyntax+
		"; default: normal(m, 0.1) for m in 0.1 … 0.6", func(v string) error {
		for _, spec := range strings.Split(v, ";") {
			if strings.TrimSpace(spec) == "" {
				continue
			}
			d, err := fleet.ParseDistribution(spec)
			if err != nil {
				return err
			}
			s.dists = append(s.dists, d)
		}
		return nil
	})
	fs.StringVar(&s.trace, "trace", "", "a CSV job trace (columns arrival,runtime and demand or memory,cores; seconds and fractions; optional gpus, nvlink, models) replayed as one row")
	fs.StringVar(&s.queue, "queue", string(fleet.QueueKube), "scheduling queue model: kube-scheduler or fifo")
	fs.StringVar(&s.nodeChoice, "node-choice", string(fleet.ChoiceScore), "node choice model: score (kube-scheduler's) or first")
	fs.Float64Var(&s.load, "load", 0, "offered load relative to the fluid capacity (default 1.25)")
	fs.Float64Var(&s.runtime, "mean-runtime", 0, "mean job run time in seconds (default 600)")
	fs.StringVar(&s.fleet, "fleet", "", "the fleet instead of -nodes hgx-h100 nodes: "+fleet.FleetSyntax)
	fs.BoolVar(&s.fifo, "fifo-reference", true, "also run Tessera, the migrating reference and fluid under a FIFO queue")
	return s
}

func (s *simFlags) apply(cfg *fleet.BenchConfig) error {
	cfg.Dists = s.dists
	if s.trace != "" {
		f, err := os.Open(s.trace)
		if err != nil {
			return fmt.Errorf("-trace: %w", err)
		}
		defer f.Close()
		jobs, err := fleet.ReadTrace(f)
		if err != nil {
			return fmt.Errorf("-trace %s: %w", s.trace, err)
		}
		cfg.Dists = append(cfg.Dists, fleet.Trace{Path: s.trace, Jobs: jobs})
	}
	switch fleet.QueueModel(s.queue) {
	case fleet.QueueKube, fleet.QueueFIFO:
		cfg.Sim.Queue = fleet.QueueModel(s.queue)
	default:
		return fmt.Errorf("-queue %q: want %s or %s", s.queue, fleet.QueueKube, fleet.QueueFIFO)
	}
	switch fleet.NodeChoice(s.nodeChoice) {
	case fleet.ChoiceScore, fleet.ChoiceFirst:
		cfg.Sim.NodeChoice = fleet.NodeChoice(s.nodeChoice)
	default:
		return fmt.Errorf("-node-choice %q: want %s or %s", s.nodeChoice, fleet.ChoiceScore, fleet.ChoiceFirst)
	}
	if s.load < 0 || s.runtime < 0 {
		return fmt.Errorf("-load and -mean-runtime must be positive")
	}
	if s.load > 0 {
		cfg.Workload.Load = s.load
	}
	if s.runtime > 0 {
		cfg.Workload.MeanRuntime = s.runtime
	}
	cfg.FIFOReference = cfg.FIFOReference && s.fifo
	if s.fleet != "" {
		f, err := fleet.ParseFleet(s.fleet)
		if err != nil {
			return fmt.Errorf("-fleet: %w", err)
		}
		cfg.Fleet = f
	}
	return nil
}
