package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// MIGKinds are the models of the dynamic-MIG comparison: whole GPUs, fixed
// partitions, Tessera's shares and dynamic MIG (rounded by bytes and by
// slices), all through the real allocator.
var MIGKinds = []Kind{Whole, Partition, Tessera, MIG, MIGBySlices}

// MIGReport is the dynamic-MIG comparison (issue 23 item 8): every figure in
// it is a simulation.
type MIGReport struct {
	Command  string
	Workload Workload // MeanDemand and Dist are per row
	Fleet    Fleet
	Sim      Options
	Rows     []MIGRow
	// Wall is how long the runs took (wall clock, informative).
	Wall time.Duration
}

// MIGRow is one demand distribution.
type MIGRow struct {
	Dist       string
	MeanDemand float64
	// Results[k] is MIGKinds[k] on the row's stream.
	Results []Result
	// Profiles counts the row's jobs by the MIG profile they are rounded
	// up to.
	Profiles map[string]int
	// Slots is the mean number of memory slices (of 8) the row's jobs'
	// profiles take, and Demand their mean demand (max of memory and
	// cores fractions): what rounding up to a profile costs per job.
	Slots, Demand float64
}

// MIGBench runs MIGKinds on the rows of cfg (Means or Dists, as Bench
// builds them). The cost grid, the FIFO reference and the bounds of cfg are
// not run.
func MIGBench(ctx context.Context, cfg BenchConfig) (*MIGReport, error) {
	rep := &MIGReport{Command: cfg.Command, Workload: cfg.Workload, Sim: cfg.Sim}
	rep.Sim.Nodes, rep.Sim.Fleet, rep.Sim.Check = cfg.Nodes, cfg.Fleet, cfg.Check
	rep.Fleet = rep.Sim.fleet()
	rep.Workload.GPUs = rep.Fleet.GPUs()
	mm, err := newMIGModel(rep.Fleet)
	if err != nil {
		return nil, err
	}
	rows := benchRows(rep.Workload, cfg.Means, cfg.Dists)
	streams := make([][]Job, len(rows))
	rep.Rows = make([]MIGRow, len(rows))
	type task struct{ i, k int }
	var tasks []task
	for i, w := range rows {
		streams[i] = w.Generate()
		row := MIGRow{Dist: w.Distribution().Name(), MeanDemand: w.MeanDemand, Results: make([]Result, len(MIGKinds)), Profiles: map[string]int{}}
		whole := false
		var n int
		for _, j := range streams[i] {
			if j.CPUOnly {
				continue
			}
			if j.GPUs > 0 {
				whole = true
				continue
			}
			p, err := mm.profileFor(j.Memory, j.Cores)
			if err != nil {
				return nil, err
			}
			row.Profiles[p.Name]++
			row.Slots += float64(p.MemorySlices)
			row.Demand += j.Demand
			n++
		}
		if n > 0 {
			row.Slots /= float64(n)
			row.Demand /= float64(n)
		}
		rep.Rows[i] = row
		for k, kind := range MIGKinds {
			if (kind == MIG || kind == MIGBySlices) && whole {
				rep.Rows[i].Results[k] = Result{Kind: kind, Skipped: "jobs asking for whole GPUs are refused by a fleet in MIG mode"}
				continue
			}
			tasks = append(tasks, task{i, k})
		}
	}
	start := time.Now()
	err = runEach(len(tasks), cfg.Parallel, func(a int) error {
		t := tasks[a]
		r, err := Run(ctx, MIGKinds[t.k], rows[t.i], streams[t.i], rep.Sim)
		r.Starts = nil
		rep.Rows[t.i].Results[t.k] = r
		if err != nil {
			return fmt.Errorf("%s, %s: %w", MIGKinds[t.k], rep.Rows[t.i].Dist, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rep.Wall = time.Since(start)
	return rep, nil
}

// result is kind k's result on row i.
func (r MIGRow) result(k Kind) Result { return r.Results[slices.Index(MIGKinds, k)] }

// Markdown is the report, every figure marked as a simulation.
func (r *MIGReport) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Dynamic MIG against shares (simulation)\n\n")
	fmt.Fprintf(&b, "Every figure here is a **simulation** (internal/bench/fleet): the real allocator "+
		"(k8s.io/dynamic-resource-allocation/structured) over the ResourceSlices the kubelet "+
		"plugin publishes, with kube-scheduler's queue and node choice; no GPU ran anything. "+
		"MIG profiles, memory and placements are the mock's H100 table (NVIDIA's MIG user guide, "+
		"pkg/gpu/mock_mig_tables.go). See docs/fleet-sim.md, \"Dynamic MIG\".\n\n")
	fmt.Fprintf(&b, "Reproduce: `%s`\n\n", r.Command)
	fmt.Fprintf(&b, "Fleet: %s (%d GPUs). Jobs per row: %d, mean run time %.0f s, load %.2f × the fluid capacity. Wall: %s.\n\n",
		r.Fleet, r.Fleet.GPUs(), r.Workload.Jobs, r.Workload.MeanRuntime, r.Workload.Load, r.Wall.Round(time.Second))
	b.WriteString("Jobs/h are completions inside the window (simulation). *MIG* rounds each job up to the " +
		"smallest profile whose memory in bytes and compute slices cover it; *MIG by slices* to the smallest " +
		"whose memory slices / 8 and compute slices / 7 do (as `claim-template --mig --fraction` does; up to 2% " +
		"less memory than asked). *÷ shares* is that model's jobs/h over Tessera's shares': what hardware " +
		"isolation costs in throughput (1 = nothing). *slices/job* is the mean memory slices (of 8) of the " +
		"profiles the jobs get under *MIG*, against their mean demand × 8; *profiles* counts them.\n\n")
	b.WriteString("| demand | whole | partitions | shares (Tessera) | MIG | ÷ shares | MIG by slices | ÷ shares | wait p95 shares / MIG / by slices (s) | slices/job vs demand×8 | profiles (MIG) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, row := range r.Rows {
		w, p, s := row.result(Whole), row.result(Partition), row.result(Tessera)
		cells := func(m Result) (string, string, string) {
			if m.Skipped != "" {
				return "skipped: " + m.Skipped, "—", "—"
			}
			ratio := "—"
			if s.JobsPerHour > 0 {
				ratio = fmt.Sprintf("%.2f", m.JobsPerHour/s.JobsPerHour)
			}
			return fmt.Sprintf("%.1f", m.JobsPerHour), ratio, fmt.Sprintf("%.0f", m.WaitP95)
		}
		mig, migRatio, migWait := cells(row.result(MIG))
		sl, slRatio, slWait := cells(row.result(MIGBySlices))
		names := make([]string, 0, len(row.Profiles))
		for n := range row.Profiles {
			names = append(names, n)
		}
		slices.Sort(names)
		var prof []string
		for _, n := range names {
			prof = append(prof, fmt.Sprintf("%s %d", n, row.Profiles[n]))
		}
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f | %s | %s | %s | %s | %.0f / %s / %s | %.2f vs %.2f | %s |\n",
			row.Dist, w.JobsPerHour, p.JobsPerHour, s.JobsPerHour, mig, migRatio, sl, slRatio,
			s.WaitP95, migWait, slWait, row.Slots, row.Demand*8, strings.Join(prof, ", "))
	}
	b.WriteString("\nAll figures above: simulation.\n")
	return b.String()
}
