package main

import (
	"context"
	"fmt"

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
	md, err := writeMarkdownJSON(out, "fleet-mig", rep.Markdown(), rep)
	if err != nil {
		return err
	}
	fmt.Println("wrote", md)
	return nil
}
