package main

import (
	"fmt"
	"time"

	"github.com/tessera-dev/tessera/internal/bench/fleet"
)

// lendingConfig is the -lending run: the lending sweep of internal/bench/fleet.
type lendingConfig struct {
	seed            int64
	evictionLatency time.Duration
	gpus            int
	horizon         time.Duration
	command         string
}

// runLending writes <out>/fleet-lending.md and .json.
func runLending(c lendingConfig, out string) error {
	cfg := fleet.DefaultLendingBench(c.seed, c.evictionLatency)
	cfg.Command = c.command
	if c.gpus > 0 {
		cfg.Workload.GPUs = c.gpus
	}
	if c.horizon > 0 {
		cfg.Workload.Horizon = c.horizon
	}
	rep, err := fleet.LendingBench(cfg)
	if err != nil {
		return err
	}
	md, err := writeMarkdownJSON(out, "fleet-lending", rep.Markdown(), rep)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s and fleet-lending.json (%d configurations, %.1fs)\n", md, len(rep.Results), rep.Wall.Seconds())
	return nil
}
