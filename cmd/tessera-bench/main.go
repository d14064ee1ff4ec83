// Command tessera-bench runs the fleet simulation and the scheduler cost
// measurement of internal/bench/fleet, and the node-side measurement of internal/bench/node,
// and writes a Markdown report and a PNG plot.
//
//	tessera-bench -quick -out results   # results/fleet-quick.{md,png}, minutes on two busy cores
//	tessera-bench -out results          # results/fleet.{md,png}, about 15 min on two busy cores
//	tessera-bench -node=false ...       # without the node side
//	tessera-bench -lending -out results # results/fleet-lending.{md,json}: lending idle GPUs
//	tessera-bench -mig -quick -out results  # results/fleet-mig.{md,json}: dynamic MIG against shares (simulation)
//	tessera-bench -fill -fill-trace DIR -out results   # results/fleet-fill.{md,png,json}: the fill experiment on openb
//	tessera-bench -quick -fleet v100-16:4x8,t4:8x4 -trace jobs.csv  # a fleet of several GPU models
//	tessera-bench -quick -dist 'discrete:1/8=2,1/4=1,1/2=1' -dist 'pareto:0.05,1.5|cores=0.5*mem'
//	tessera-bench -quick -trace jobs.csv -queue fifo -node-choice first
//	tessera-bench -replay -kubeconfig /tmp/tessera-scale/admin.kubeconfig  # on hack/scale's cluster
//	tessera-bench scale -kubeconfig /tmp/tessera-scale/admin.kubeconfig -nodes 100  # kube-scheduler at scale (scale.go)
//
// The node side runs in child processes (this binary re-executed with
// -node-child as its first argument), one per repetition, so that the
// plugin's resident memory is not mixed up with the fleet simulation's heap
// and each repetition starts from a fresh process.
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
	"time"

	"github.com/tessera-dev/tessera/internal/bench/fleet"
	"github.com/tessera-dev/tessera/internal/bench/node"
)

func main() {
	quick := flag.Bool("quick", false, "32 GPUs, 2000 jobs per mean demand, short cost grid (about two minutes on two busy cores)")
	seed := flag.Int64("seed", 1, "seed of the job streams")
	out := flag.String("out", "results", "directory for the report and the plot")
	nodes := flag.Int("nodes", 0, "override the number of 8-GPU nodes")
	jobs := flag.Int("jobs", 0, "override the number of jobs per mean demand")
	parallel := flag.Int("parallel", 0, "simulations run at once (0: GOMAXPROCS); results do not depend on it")
	noCost := flag.Bool("no-cost", false, "skip the scheduler cost measurement")
	nodeSide := flag.Bool("node", true, "measure the node side (prepare/unprepare latency, plugin RSS, API writes) in child processes")
	nodeRuns := flag.Int("node-runs", 3, "child processes for the node side; the report shows the spread over them")
	migOnly := flag.Bool("mig", false, "run only the dynamic-MIG comparison (whole, partitions, shares, dynamic MIG) on the rows -quick, -dist, -nodes and -jobs give, into fleet-mig.{md,json}")
	lend := flag.Bool("lending", false, "run only the lending simulation (idle periods × graces) into fleet-lending.{md,json}")
	evictionLatency := flag.Duration("eviction-latency", 3*time.Second, "lending: from the end of a borrower's grace to its pod gone and claim unprepared")
	lendGPUs := flag.Int("lending-gpus", 0, "lending: override the number of owned GPUs (default 64)")
	lendHorizon := flag.Duration("lending-horizon", 0, "lending: override the simulated time (default 72h)")
	sim := registerSimFlags(flag.CommandLine)
	rep := registerReplayFlags(flag.CommandLine)
	fill := registerFillFlags(flag.CommandLine)
	if len(os.Args) > 1 && os.Args[1] == "scale" {
		os.Exit(scaleMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == nodeChildArg {
		os.Exit(nodeChild(os.Args[2:]))
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "tessera-bench: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}

	command := strings.TrimSpace("go run ./cmd/tessera-bench " + strings.Join(os.Args[1:], " "))
	if *lend {
		if *evictionLatency < 0 {
			fmt.Fprintf(os.Stderr, "tessera-bench: -eviction-latency %s: must not be negative\n", *evictionLatency)
			os.Exit(2)
		}
		c := lendingConfig{seed: *seed, evictionLatency: *evictionLatency, gpus: *lendGPUs, horizon: *lendHorizon, command: command}
		if err := runLending(c, *out); err != nil {
			fmt.Fprintf(os.Stderr, "tessera-bench: lending: %v\n", err)
			os.Exit(1)
		}
		return
	}

	if fill.on {
		if err := fill.run(*seed, *parallel, *out, command); err != nil {
			fmt.Fprintf(os.Stderr, "tessera-bench: fill: %v\n", err)
			os.Exit(1)
		}
		return
	}

	if rep.on {
		if err := rep.run(*seed, *out, command); err != nil {
			fmt.Fprintf(os.Stderr, "tessera-bench: replay: %v\n", err)
			os.Exit(1)
		}
		return
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
	cfg.Command = command
	if err := sim.apply(&cfg); err != nil {
		fmt.Fprintf(os.Stderr, "tessera-bench: %v\n", err)
		os.Exit(2)
	}
	if *migOnly {
		if err := runMIG(cfg, *out); err != nil {
			fmt.Fprintf(os.Stderr, "tessera-bench: mig: %v\n", err)
			os.Exit(1)
		}
		return
	}
	var nodeCfg *nodeConfig
	if *nodeSide {
		nodeCfg = &nodeConfig{runs: *nodeRuns, opts: fullNode}
		if *quick {
			nodeCfg.opts = quickNode
		}
	}
	if err := run(cfg, nodeCfg, *out, name); err != nil {
		fmt.Fprintf(os.Stderr, "tessera-bench: %v\n", err)
		os.Exit(1)
	}
}

func run(cfg fleet.BenchConfig, nodeCfg *nodeConfig, out, name string) error {
	ctx := context.Background()
	var nodeReports []node.Report
	if nodeCfg != nil {
		var err error
		if nodeReports, err = nodeCfg.measure(ctx); err != nil {
			return fmt.Errorf("node side: %w", err)
		}
	}
	rep, err := fleet.Bench(ctx, cfg)
	if err != nil {
		return err
	}
	rep.Node = nodeReports
	var png bytes.Buffer
	if err := rep.WritePNG(&png); err != nil {
		return err
	}
	if err := writeFiles(out, outFile{name + ".md", []byte(rep.Markdown())}, outFile{name + ".png", png.Bytes()}); err != nil {
		return err
	}
	md := filepath.Join(out, name+".md")
	fmt.Printf("wrote %s and %s.png (simulation %.1fs, scheduler cost %.1fs)\n", md, name, rep.SimWall.Seconds(), rep.CostWall.Seconds())
	return nil
}
