package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	md := filepath.Join(out, "fleet-lending.md")
	if err := os.WriteFile(md, []byte(rep.Markdown()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "fleet-lending.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s and fleet-lending.json (%d configurations, %.1fs)\n", md, len(rep.Results), rep.Wall.Seconds())
	return nil
}
