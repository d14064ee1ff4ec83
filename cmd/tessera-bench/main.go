// Command tessera-bench runs the fleet simulation and the scheduler cost
// measurement of pkg/fleet and writes a Markdown report and a PNG plot.
//
//	tessera-bench -quick -out results   # results/fleet-quick.{md,png}, under a minute
//	tessera-bench -out results          # results/fleet.{md,png}, a few minutes
//
// It uses the standard flag package rather than cobra so that the single-dash
// flags of the benchmark's interface (-quick, -seed, -out) work as written.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tessera-dev/tessera/pkg/fleet"
)

func main() {
	quick := flag.Bool("quick", false, "32 GPUs, 2000 jobs per mean demand, short cost grid (under a minute)")
	seed := flag.Int64("seed", 1, "seed of the job streams")
	out := flag.String("out", "results", "directory for the report and the plot")
	nodes := flag.Int("nodes", 0, "override the number of 8-GPU nodes")
	jobs := flag.Int("jobs", 0, "override the number of jobs per mean demand")
	parallel := flag.Int("parallel", 0, "simulations run at once (0: GOMAXPROCS); results do not depend on it")
	noCost := flag.Bool("no-cost", false, "skip the scheduler cost measurement")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "tessera-bench: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}

	cfg, name := fleet.FullConfig(*seed), "fleet"
	if *quick {
		cfg, name = fleet.QuickConfig(*seed), "fleet-quick"
	}
	if *nodes > 0 {
		cfg.Nodes = *nodes
	}
	if *jobs > 0 {
		cfg.Workload.Jobs = *jobs
	}
	if *noCost {
		cfg.CostNodes = nil
	}
	cfg.Parallel = *parallel
	cfg.Command = strings.TrimSpace("go run ./cmd/tessera-bench " + strings.Join(os.Args[1:], " "))
	if err := run(cfg, *out, name); err != nil {
		fmt.Fprintf(os.Stderr, "tessera-bench: %v\n", err)
		os.Exit(1)
	}
}

func run(cfg fleet.BenchConfig, out, name string) error {
	rep, err := fleet.Bench(context.Background(), cfg)
	if err != nil {
		return err
	}
	var png bytes.Buffer
	if err := rep.WritePNG(&png); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	md := filepath.Join(out, name+".md")
	if err := os.WriteFile(md, []byte(rep.Markdown()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, name+".png"), png.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s and %s.png (simulation %.1fs, scheduler cost %.1fs)\n", md, name, rep.SimWall.Seconds(), rep.CostWall.Seconds())
	return nil
}
