package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tessera-dev/tessera/internal/bench/fleet"
)

// runMIG runs the dynamic-MIG comparison (fleet.MIGBench: whole GPUs,
// partitions, shares and dynamic MIG) on cfg's rows and writes
// out/fleet-mig.{md,json}. Every figure is a simulation.
func runMIG(cfg fleet.BenchConfig, out string) error {
	rep, err := fleet.MIGBench(context.Background(), cfg)
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
	md := filepath.Join(out, "fleet-mig.md")
	if err := os.WriteFile(md, []byte(rep.Markdown()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "fleet-mig.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Println("wrote", md)
	return nil
}
