package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"github.com/tessera-dev/tessera/internal/bench/node"
)

// nodeChildArg, as the first argument, makes the binary run one node-side
// measurement and print its report as JSON on stdout.
const nodeChildArg = "-node-child"

// The node-side sizes: 500 sequential claims and rounds of 100 concurrent
// claims per isolation backend.
var (
	quickNode = node.Options{Sequential: 500, Concurrent: 100, Rounds: 3}
	fullNode  = node.Options{Sequential: 500, Concurrent: 100, Rounds: 10}
)

type nodeConfig struct {
	runs int
	opts node.Options
}

// measure runs the child runs times, one after the other.
func (c *nodeConfig) measure(ctx context.Context) ([]node.Report, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own binary to re-execute: %w", err)
	}
	var out []node.Report
	for i := range max(c.runs, 1) {
		cmd := exec.CommandContext(ctx, self, nodeChildArg,
			"-sequential", strconv.Itoa(c.opts.Sequential),
			"-concurrent", strconv.Itoa(c.opts.Concurrent),
			"-rounds", strconv.Itoa(c.opts.Rounds))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("run %d (%s): %w: %s", i+1, cmd, err, bytes.TrimSpace(stderr.Bytes()))
		}
		rep, err := node.ParseReport(stdout.Bytes())
		if err != nil {
			return nil, fmt.Errorf("run %d: %w", i+1, err)
		}
		fmt.Fprintf(os.Stderr, "node side run %d/%d done\n", i+1, max(c.runs, 1))
		out = append(out, rep)
	}
	return out, nil
}

// nodeChild is the child's main: it measures and writes JSON to stdout.
func nodeChild(args []string) int {
	fs := flag.NewFlagSet(nodeChildArg, flag.ContinueOnError)
	var opts node.Options
	fs.IntVar(&opts.Sequential, "sequential", 0, "claims prepared one at a time per backend")
	fs.IntVar(&opts.Concurrent, "concurrent", 0, "claims prepared at once per round")
	fs.IntVar(&opts.Rounds, "rounds", 0, "concurrent rounds per backend")
	fs.StringVar(&opts.RunDir, "run-dir", "", "directory for the CDI specs and HAMiCore claim directories (default: a new one on the /dev/shm tmpfs, as a node's /var/run)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rep, err := node.Run(context.Background(), opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tessera-bench %s: %v\n", nodeChildArg, err)
		return 1
	}
	data, err := rep.JSON()
	if err != nil {
		fmt.Fprintf(os.Stderr, "tessera-bench %s: %v\n", nodeChildArg, err)
		return 1
	}
	if _, err := os.Stdout.Write(append(data, '\n')); err != nil {
		return 1
	}
	return 0
}
