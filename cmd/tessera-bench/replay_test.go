package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/internal/bench/fleet"
)

// TestReplayReportRoundTrip: a replay's rows are written as Markdown and JSON,
// and -replay-from simulates the saved runs again into the same report.
func TestReplayReportRoundTrip(t *testing.T) {
	w := fleet.Workload{Seed: 3, Jobs: 120, MeanDemand: 0.3, SDDemand: 0.1, MeanRuntime: 600, GPUs: 16, Load: 1.25}
	jobs := w.Generate()
	sim, err := fleet.Run(context.Background(), fleet.Tessera, w, jobs, fleet.Options{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	r := &replayFlags{nodes: 2, jobs: len(jobs), speed: 10}
	row := replayRow{mean: 0.3, kind: fleet.Tessera, jobs: jobs}
	if err := r.simulate(context.Background(), &row, sim.Starts); err != nil {
		t.Fatal(err)
	}
	if row.real.JobsPerHour != row.sim.JobsPerHour {
		t.Errorf("the simulator's own starts measured as real: %.1f vs %.1f jobs/h", row.real.JobsPerHour, row.sim.JobsPerHour)
	}
	dir := t.TempDir()
	if err := r.write([]replayRow{row}, 3, dir, "tessera-bench -replay"); err != nil {
		t.Fatal(err)
	}
	again := &replayFlags{from: filepath.Join(dir, "sim-vs-scheduler.json")}
	out := t.TempDir()
	if err := again.run(3, out, "tessera-bench -replay -replay-from x"); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(out, "sim-vs-scheduler.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| 0.30 | tessera |") || !strings.Contains(string(md), "+0.0% (met)") {
		t.Errorf("report:\n%s", md)
	}
}

// TestReplayAddKeepsOtherRows: -replay-add keeps the saved rows this run does
// not replay (simulated again), drops the ones it replays, and refuses rows
// replayed with other settings.
func TestReplayAddKeepsOtherRows(t *testing.T) {
	r := &replayFlags{nodes: 2, jobs: 80, speed: 10}
	jobs := r.stream(3, 0.3)
	w := fleet.Workload{MeanDemand: 0.3}
	var rows []replayRow
	for _, kind := range []fleet.Kind{fleet.Tessera, fleet.Whole} {
		sim, err := fleet.Run(context.Background(), kind, w, jobs, fleet.Options{Nodes: 2})
		if err != nil {
			t.Fatal(err)
		}
		row := replayRow{mean: 0.3, kind: kind, jobs: jobs}
		if err := r.simulate(context.Background(), &row, sim.Starts); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, row)
	}
	dir := t.TempDir()
	if err := r.write(rows, 3, dir, "tessera-bench -replay"); err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(dir, "sim-vs-scheduler.json")

	add := &replayFlags{nodes: 2, jobs: len(jobs), speed: 10, means: "0.3", models: "whole,partition"}
	kept, err := add.kept(context.Background(), saved, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 1 || kept[0].kind != fleet.Tessera || kept[0].real.JobsPerHour != rows[0].real.JobsPerHour {
		t.Errorf("kept %d rows (first %+v), want the tessera row only, as measured", len(kept), kept)
	}
	other := &replayFlags{nodes: 4, jobs: len(jobs), speed: 10, means: "0.3", models: "partition"}
	if _, err := other.kept(context.Background(), saved, 3); err == nil || !strings.Contains(err.Error(), "replayed on 2 nodes") {
		t.Errorf("rows of 2 nodes kept for a run on 4: err = %v", err)
	}
	if _, err := add.kept(context.Background(), saved, 4); err == nil || !strings.Contains(err.Error(), "another stream") {
		t.Errorf("rows of seed 3 kept for a run with seed 4: err = %v", err)
	}
}
