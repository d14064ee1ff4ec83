package gpucheck

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// IsolationDriverMemory is the driver-enforced memory backend (cgroup dmem
// through the NVIDIA container toolkit's hook).
const IsolationDriverMemory configapi.Isolation = "DriverMemory"

// Enforcement is what a backend promises to hold, and so what the check
// holds it to. A limit a backend does not enforce is measured and reported,
// never failed.
type Enforcement struct {
	Memory  bool `json:"memory"`
	Compute bool `json:"compute"`
}

// Enforces is the one table of what each backend enforces.
var Enforces = map[configapi.Isolation]Enforcement{
	configapi.IsolationAdvisory: {},
	configapi.IsolationMPS:      {Memory: true, Compute: true},
	configapi.IsolationHAMiCore: {Memory: true, Compute: true},
	IsolationDriverMemory:       {Memory: true},
}

// Targets are the pass marks.
type Targets struct {
	// MemoryToleranceMiB: the memory a process obtains must be within this
	// many MiB of its share's limit (issue 16: exact to 1 MiB).
	MemoryToleranceMiB float64 `json:"memoryToleranceMiB"`
	// SplitTolerancePoints: each share's part of the work two concurrent
	// shares did must be within this many percentage points of its part of
	// the requested cores (issue 16: within 10 %).
	SplitTolerancePoints float64 `json:"splitTolerancePoints"`
}

// DefaultTargets are issue 16's targets.
var DefaultTargets = Targets{MemoryToleranceMiB: 1, SplitTolerancePoints: 10}

// Verdicts.
const (
	Pass        = "pass"
	Miss        = "MISS"
	NotEnforced = "not enforced" // measured, but the backend promises nothing
	Failed      = "ERROR"        // the measurement itself failed
)

// Report is the outcome of a check: what the node publishes and, per
// backend, what was prepared and measured.
type Report struct {
	Node     NodeSummary     `json:"node"`
	GPU      GPUSummary      `json:"gpu"`
	Targets  Targets         `json:"targets"`
	Backends []BackendReport `json:"backends"`
	// Pass is false when a target was missed or a step failed.
	Pass bool `json:"pass"`
	// Measured counts the enforced targets that were measured.
	Measured int `json:"measured"`
	// Mock is true when the node was a mock profile and the probes were
	// simulated: no figure of such a report is what a GPU does.
	Mock bool `json:"mock"`
	// Checks is every thing the check proves, with its outcome; Complete
	// is false when one has none or failed (Incomplete says which).
	Checks     []Check  `json:"checks"`
	Complete   bool     `json:"complete"`
	Incomplete []string `json:"incomplete,omitempty"`
	// Notes are facts about the run from outside the check (run.sh: the
	// user, the driver libraries found, MPS, the HAMi-core build).
	Notes []string `json:"notes,omitempty"`
}

// OK is the check's verdict: every check has a stated outcome and every
// measured target was met.
func (r *Report) OK() bool { return r.Pass && r.Complete }

// backendCheck is a backend's outcome as a check.
func backendCheck(b BackendReport, mock, probed bool) Check {
	c := Check{Name: "backend " + string(b.Isolation)}
	switch {
	case b.Skipped != "":
		c.Status, c.Detail = StatusSkipped, b.Skipped
		return c
	case b.Error != "":
		c.Status, c.Detail = StatusError, b.Error
		return c
	case !probed:
		c.Status, c.Detail = StatusSkipped, "prepared and read back only (--no-probes)"
		return c
	}
	var verdicts []string
	miss := false
	for _, s := range b.Shares {
		if m := s.Memory; m != nil {
			verdicts = append(verdicts, fmt.Sprintf("%s memory %.0f of %.0f MiB (%s): %s", s.Claim, m.ObtainedMiB, m.LimitMiB, m.ObtainedFrom, m.Verdict))
			miss = miss || m.Verdict == Miss
		}
	}
	if cr := b.Compute; cr != nil {
		verdicts = append(verdicts, fmt.Sprintf("compute %.1f/%.1f %% (want %.0f/%.0f): %s", cr.MeasuredPercent[0], cr.MeasuredPercent[1], cr.ExpectedPercent[0], cr.ExpectedPercent[1], cr.Verdict))
		miss = miss || cr.Verdict == Miss
	}
	if b.ComputeSkipped != "" {
		verdicts = append(verdicts, "compute skipped: "+b.ComputeSkipped)
	}
	c.Detail = strings.Join(verdicts, "; ")
	switch {
	case miss:
		c.Status = StatusMismatch
	case mock:
		c.Status = StatusSimulated
	default:
		c.Status = StatusMeasured
	}
	return c
}

// finish adds the backends' checks and judges completeness.
func (r *Report) finish(cfg Config) {
	for _, b := range r.Backends {
		r.Checks = append(r.Checks, backendCheck(b, cfg.Mock, cfg.Prober != nil))
	}
	r.Complete, r.Incomplete = Complete(r.Checks, cfg.Mock)
}

// NodeSummary is what discovery and the model made of the node.
type NodeSummary struct {
	Name           string       `json:"name"`
	DriverVersion  string       `json:"driverVersion"`
	CUDAVersion    string       `json:"cudaVersion"`
	GPUs           []GPUSummary `json:"gpus"`
	FailedGPUs     []string     `json:"failedGPUs,omitempty"`
	ResourceSlices int          `json:"resourceSlices"`
	Devices        []string     `json:"devices"`
}

// GPUSummary is one discovered GPU.
type GPUSummary struct {
	Minor        int    `json:"minor"`
	UUID         string `json:"uuid"`
	Product      string `json:"product"`
	MemoryMiB    uint64 `json:"memoryMiB"`
	SMs          int    `json:"sms,omitempty"`
	NVLinkDomain string `json:"nvlinkDomain,omitempty"`
}

// BackendReport is one isolation backend: two shares of the checked GPU
// prepared through the plugin, their memory probed one by one and their
// compute together.
type BackendReport struct {
	Isolation configapi.Isolation `json:"isolation"`
	Enforces  Enforcement         `json:"enforces"`
	// Skipped is why the backend was not checked (the node cannot do it);
	// a skip is not a failure.
	Skipped string `json:"skipped,omitempty"`
	// Error is a step that failed (prepare of a backend the node can do,
	// reading the spec, a probe); it fails the check.
	Error   string         `json:"error,omitempty"`
	Shares  []ShareReport  `json:"shares,omitempty"`
	Compute *ComputeReport `json:"compute,omitempty"`
	// ComputeSkipped is why the two shares' compute was not measured (the
	// GPU allows one context at a time).
	ComputeSkipped string `json:"computeSkipped,omitempty"`
}

// ShareReport is one prepared share.
type ShareReport struct {
	Claim            string   `json:"claim"`
	Device           string   `json:"device"`
	CDIDeviceIDs     []string `json:"cdiDeviceIDs"`
	MemoryLimitBytes int64    `json:"memoryLimitBytes"`
	CoresPercent     int64    `json:"coresPercent"`
	// Attested is status.devices[].data the plugin wrote on the claim.
	Attested json.RawMessage `json:"attested,omitempty"`
	// Env is the spec's environment as the probe got it (host paths).
	Env []string `json:"env"`
	// Emulated and NotApplied say how the spec's edits were applied
	// without a container runtime.
	Emulated   []string      `json:"emulated,omitempty"`
	NotApplied []string      `json:"notApplied,omitempty"`
	Memory     *MemoryReport `json:"memory,omitempty"`
	// MemoryProbe and ComputeProbe are the probes' raw figures.
	MemoryProbe  *MemoryProbe  `json:"memoryProbe,omitempty"`
	ComputeProbe *ComputeProbe `json:"computeProbe,omitempty"`
}

// MemoryReport is the memory figure of one share against its limit.
type MemoryReport struct {
	LimitMiB     float64 `json:"limitMiB"`
	AllocatedMiB float64 `json:"allocatedMiB"`
	// ObtainedMiB is the process's device memory at its peak, from
	// ObtainedFrom: "nvml" (the driver's per-process count, context
	// included), "cuMemGetInfo" (allocations plus the context's charge, when
	// the backend reports the limit as the total) or "allocations".
	ObtainedMiB  float64 `json:"obtainedMiB"`
	ObtainedFrom string  `json:"obtainedFrom"`
	// ReportedTotalMiB is the total cuMemGetInfo reported to the process.
	ReportedTotalMiB float64 `json:"reportedTotalMiB"`
	Verdict          string  `json:"verdict"`
}

// ComputeReport is the work two shares did in the same wall time.
type ComputeReport struct {
	Seconds          float64    `json:"seconds"`
	RequestedPercent [2]int64   `json:"requestedPercent"`
	Work             [2]float64 `json:"work"` // SM clock cycles spun (blocks × cycles per block)
	// ExpectedPercent is each share's part of the requested cores.
	ExpectedPercent [2]float64 `json:"expectedPercent"`
	MeasuredPercent [2]float64 `json:"measuredPercent"`
	Verdict         string     `json:"verdict"`
}

const mib = 1 << 20

func toMiB(b uint64) float64 { return math.Round(float64(b)/mib*100) / 100 }

// memoryFigures computes a share's memory report from what its probe saw.
// limit is the share's memory limit in bytes.
func memoryFigures(limit int64, p MemoryProbe) MemoryReport {
	r := MemoryReport{
		LimitMiB:         toMiB(uint64(limit)),
		AllocatedMiB:     toMiB(p.AllocatedBytes),
		ReportedTotalMiB: toMiB(p.TotalBytes),
	}
	switch {
	case p.ProcessBytesKnown:
		r.ObtainedMiB, r.ObtainedFrom = toMiB(p.ProcessBytes), "nvml"
	case math.Abs(float64(p.TotalBytes)-float64(limit)) <= mib && p.TotalBytes >= p.FreeBeforeBytes:
		// The backend shows the process its limit as the GPU's size, so
		// what was used before the first allocation is this process's own
		// charge (its context).
		r.ObtainedMiB, r.ObtainedFrom = toMiB(p.AllocatedBytes+p.TotalBytes-p.FreeBeforeBytes), "cuMemGetInfo"
	default:
		r.ObtainedMiB, r.ObtainedFrom = r.AllocatedMiB, "allocations"
	}
	return r
}

// computeFigures computes the split of the work two concurrent shares did.
func computeFigures(requested [2]int64, probes [2]ComputeProbe) ComputeReport {
	r := ComputeReport{RequestedPercent: requested}
	var work, req float64
	for i, p := range probes {
		r.Work[i] = float64(p.CountedBlocks) * float64(p.CyclesPerBlock)
		work += r.Work[i]
		req += float64(requested[i])
		r.Seconds = math.Max(r.Seconds, p.Seconds)
	}
	for i := range probes {
		if req > 0 {
			r.ExpectedPercent[i] = round2(float64(requested[i]) / req * 100)
		}
		if work > 0 {
			r.MeasuredPercent[i] = round2(r.Work[i] / work * 100)
		}
	}
	return r
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// Evaluate sets every verdict against t, and Pass and Measured.
func (r *Report) Evaluate(t Targets) {
	r.Targets = t
	r.Pass, r.Measured = true, 0
	for i := range r.Backends {
		b := &r.Backends[i]
		b.Enforces = Enforces[b.Isolation]
		if b.Skipped != "" {
			continue
		}
		if b.Error != "" {
			r.Pass = false
		}
		for j := range b.Shares {
			m := b.Shares[j].Memory
			if m == nil {
				continue
			}
			m.Verdict = r.judge(b.Enforces.Memory, math.Abs(m.ObtainedMiB-m.LimitMiB) <= t.MemoryToleranceMiB)
		}
		if c := b.Compute; c != nil {
			within := true
			for k := range c.MeasuredPercent {
				within = within && math.Abs(c.MeasuredPercent[k]-c.ExpectedPercent[k]) <= t.SplitTolerancePoints
			}
			c.Verdict = r.judge(b.Enforces.Compute, within)
		}
	}
}

// judge is the verdict on one measurement: NotEnforced where the backend
// does not enforce what it measured, else Pass or Miss as within says. A
// judged measurement counts in r.Measured, and a Miss fails the report.
func (r *Report) judge(enforced, within bool) string {
	if !enforced {
		return NotEnforced
	}
	r.Measured++
	if !within {
		r.Pass = false
		return Miss
	}
	return Pass
}

// WriteTable writes the human-readable report.
func (r *Report) WriteTable(w io.Writer) error {
	n := r.Node
	for _, note := range r.Notes {
		fmt.Fprintln(w, "Note:", note)
	}
	fmt.Fprintf(w, "Node %s: driver %s, CUDA %s, %d GPU(s)", n.Name, n.DriverVersion, n.CUDAVersion, len(n.GPUs))
	if len(n.FailedGPUs) > 0 {
		fmt.Fprintf(w, ", %d failed discovery (%s)", len(n.FailedGPUs), strings.Join(n.FailedGPUs, "; "))
	}
	fmt.Fprintf(w, "\nPublishes %d ResourceSlice(s) with %d device(s): %s\n", n.ResourceSlices, len(n.Devices), strings.Join(n.Devices, ", "))
	g := r.GPU
	fmt.Fprintf(w, "Checked GPU gpu-%d: %s, %s, %d MiB\n\n", g.Minor, g.UUID, g.Product, g.MemoryMiB)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BACKEND\tSHARE\tLIMIT MiB\tALLOCATED MiB\tOBTAINED MiB\tMEMORY\tCORES\tWORK %\tCOMPUTE")
	var notes []string
	for _, b := range r.Backends {
		if b.Skipped != "" {
			notes = append(notes, fmt.Sprintf("%s skipped: %s", b.Isolation, oneLine(b.Skipped)))
			continue
		}
		if b.Error != "" {
			notes = append(notes, fmt.Sprintf("%s %s: %s", b.Isolation, Failed, oneLine(b.Error)))
		}
		if b.ComputeSkipped != "" {
			notes = append(notes, fmt.Sprintf("%s compute skipped: %s", b.Isolation, oneLine(b.ComputeSkipped)))
		}
		for i, s := range b.Shares {
			limit, alloc, got, verdict := "-", "-", "-", "-"
			if m := s.Memory; m != nil {
				limit, alloc = fmt.Sprintf("%.0f", m.LimitMiB), fmt.Sprintf("%.0f", m.AllocatedMiB)
				got, verdict = fmt.Sprintf("%.0f (%s)", m.ObtainedMiB, m.ObtainedFrom), m.Verdict
			}
			work, compute := "-", "-"
			if c := b.Compute; c != nil && i < 2 {
				work = fmt.Sprintf("%.1f (want %.0f)", c.MeasuredPercent[i], c.ExpectedPercent[i])
				compute = c.Verdict
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d%%\t%s\t%s\n", b.Isolation, s.Claim, limit, alloc, got, verdict, s.CoresPercent, work, compute)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	if r.Mock {
		fmt.Fprintln(w, "\nMOCK RUN: mock GPUs and simulated probes; no figure above is what a GPU does.")
	}
	if len(r.Checks) > 0 {
		fmt.Fprintln(w)
		cw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(cw, "CHECK\tSTATUS\tDETAIL")
		for _, c := range r.Checks {
			fmt.Fprintf(cw, "%s\t%s\t%s\n", c.Name, c.Status, oneLine(c.Detail))
		}
		if err := cw.Flush(); err != nil {
			return err
		}
	}
	switch {
	case !r.Pass:
		fmt.Fprintln(w, "\nRESULT: a target was missed or a step failed (targets: memory within",
			r.Targets.MemoryToleranceMiB, "MiB of the limit, compute split within", r.Targets.SplitTolerancePoints, "points of the request)")
	case !r.Complete && len(r.Checks) > 0:
		fmt.Fprintf(w, "\nRESULT: INCOMPLETE: %s\n", strings.Join(r.Incomplete, "; "))
	case r.Measured == 0:
		fmt.Fprintln(w, "\nRESULT: nothing enforced was measured (every enforcing backend was skipped)")
	case r.Mock:
		fmt.Fprintf(w, "\nRESULT: all %d targets met by simulated probes (mock: nothing measured)\n", r.Measured)
	default:
		fmt.Fprintf(w, "\nRESULT: all %d measured targets met\n", r.Measured)
	}
	return nil
}

// WriteJSON writes the report as one JSON line.
func (r *Report) WriteJSON(w io.Writer) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// WriteMarkdown writes the report as results/gpu-check.md: the verdict, the
// checks as a table and the figures as WriteTable prints them.
func (r *Report) WriteMarkdown(w io.Writer) error {
	verdict := "OK: every check was measured or skipped with a stated reason, and every measured target was met"
	switch {
	case !r.Complete:
		verdict = "INCOMPLETE: " + strings.Join(r.Incomplete, "; ")
	case !r.Pass:
		verdict = "FAILED: a target was missed or a step failed"
	}
	fmt.Fprintf(w, "# Tessera real-GPU check\n\n**Verdict:** %s.\n\n", verdict)
	if r.Mock {
		fmt.Fprint(w, "**MOCK RUN:** mock GPUs (a profile of pkg/gpu) and simulated probes. No figure here is what a GPU does; this run proves only that the check runs end to end.\n\n")
	} else {
		fmt.Fprintf(w, "Measured on this machine: %s, driver %s, CUDA %s.\n\n", r.GPU.Product, r.Node.DriverVersion, r.Node.CUDAVersion)
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "## The run")
		fmt.Fprintln(w)
		for _, n := range r.Notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "## Checks")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| Check | Status | Detail |")
	fmt.Fprintln(w, "|---|---|---|")
	cell := func(s string) string { return strings.ReplaceAll(oneLine(s), "|", `\|`) }
	for _, c := range r.Checks {
		fmt.Fprintf(w, "| %s | %s | %s |\n", cell(c.Name), cell(c.Status), cell(c.Detail))
	}
	fmt.Fprintln(w, "\n## Figures\n\n```text")
	if err := r.WriteTable(w); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "```\n\nEvery figure, with the probes' raw readings and the environment each share got, is in gpu-check.json.")
	return err
}
