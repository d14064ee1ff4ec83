package gpucheck

import (
	"strings"
	"testing"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// TestEvaluateMemory: a share's memory passes when what the process
// obtained is within the tolerance of its limit, either way; an enforcing
// backend that misses fails the check; Advisory is only reported.
func TestEvaluateMemory(t *testing.T) {
	for name, tc := range map[string]struct {
		iso      configapi.Isolation
		limit    float64
		obtained float64
		want     string
		pass     bool
	}{
		"exact":                {configapi.IsolationMPS, 4096, 4096, Pass, true},
		"1 MiB under":          {configapi.IsolationMPS, 4096, 4095, Pass, true},
		"1 MiB over":           {configapi.IsolationHAMiCore, 4096, 4097, Pass, true},
		"2 MiB over":           {configapi.IsolationHAMiCore, 4096, 4098, Miss, false},
		"context not counted":  {IsolationDriverMemory, 4096, 3596, Miss, false},
		"Advisory whole GPU":   {configapi.IsolationAdvisory, 4096, 81559, NotEnforced, true},
		"Advisory exact, too":  {configapi.IsolationAdvisory, 4096, 4096, NotEnforced, true},
		"a fraction of 1 MiB":  {configapi.IsolationMPS, 4096, 4096.99, Pass, true},
		"just beyond 1 MiB":    {configapi.IsolationMPS, 4096, 4097.01, Miss, false},
		"half the limit (MPS)": {configapi.IsolationMPS, 4096, 2048, Miss, false},
	} {
		t.Run(name, func(t *testing.T) {
			r := &Report{Backends: []BackendReport{{Isolation: tc.iso, Shares: []ShareReport{{Memory: &MemoryReport{LimitMiB: tc.limit, ObtainedMiB: tc.obtained}}}}}}
			r.Evaluate(DefaultTargets)
			if got := r.Backends[0].Shares[0].Memory.Verdict; got != tc.want || r.Pass != tc.pass {
				t.Errorf("verdict %q, pass %v; want %q, %v", got, r.Pass, tc.want, tc.pass)
			}
		})
	}
}

// TestEvaluateCompute: two shares at 30 % and 70 % pass when each did its
// part of the work within 10 points.
func TestEvaluateCompute(t *testing.T) {
	for name, tc := range map[string]struct {
		iso   configapi.Isolation
		work  [2]uint64 // blocks, at equal cycles per block
		want  string
		split [2]float64
	}{
		"exact":             {configapi.IsolationMPS, [2]uint64{300, 700}, Pass, [2]float64{30, 70}},
		"10 points off":     {configapi.IsolationMPS, [2]uint64{400, 600}, Pass, [2]float64{40, 60}},
		"11 points off":     {configapi.IsolationHAMiCore, [2]uint64{410, 590}, Miss, [2]float64{41, 59}},
		"even (no limit)":   {configapi.IsolationMPS, [2]uint64{500, 500}, Miss, [2]float64{50, 50}},
		"Advisory even":     {configapi.IsolationAdvisory, [2]uint64{500, 500}, NotEnforced, [2]float64{50, 50}},
		"memory-only":       {IsolationDriverMemory, [2]uint64{500, 500}, NotEnforced, [2]float64{50, 50}},
		"nothing done at B": {configapi.IsolationMPS, [2]uint64{300, 0}, Miss, [2]float64{100, 0}},
	} {
		t.Run(name, func(t *testing.T) {
			c := computeFigures([2]int64{30, 70}, [2]ComputeProbe{{CountedBlocks: tc.work[0], CyclesPerBlock: 1e6}, {CountedBlocks: tc.work[1], CyclesPerBlock: 1e6}})
			r := &Report{Backends: []BackendReport{{Isolation: tc.iso, Compute: &c}}}
			r.Evaluate(DefaultTargets)
			if c.Verdict != tc.want || c.MeasuredPercent != tc.split || c.ExpectedPercent != [2]float64{30, 70} {
				t.Errorf("got %+v; want verdict %q, split %v of 30/70", c, tc.want, tc.split)
			}
			if r.Pass != (tc.want != Miss) {
				t.Errorf("pass = %v with verdict %q", r.Pass, c.Verdict)
			}
		})
	}
}

// TestComputeFiguresUnequalRequests: the expected split is each share's part
// of what both requested, so 20 % and 40 % expect one third and two thirds.
func TestComputeFiguresUnequalRequests(t *testing.T) {
	c := computeFigures([2]int64{20, 40}, [2]ComputeProbe{{CountedBlocks: 100, CyclesPerBlock: 10}, {CountedBlocks: 200, CyclesPerBlock: 10}})
	if c.ExpectedPercent != [2]float64{33.33, 66.67} || c.MeasuredPercent != [2]float64{33.33, 66.67} || c.Work != [2]float64{1000, 2000} {
		t.Errorf("%+v", c)
	}
}

// TestMemoryFigures: where the obtained figure comes from, in order of
// trust: NVML's per-process count, else cuMemGetInfo when the backend shows
// the limit as the GPU's total, else the allocations alone.
func TestMemoryFigures(t *testing.T) {
	const limit = 4096 << 20
	for name, tc := range map[string]struct {
		probe    MemoryProbe
		obtained float64
		from     string
	}{
		"nvml":              {MemoryProbe{AllocatedBytes: 3500 << 20, TotalBytes: 81559 << 20, FreeBeforeBytes: 81000 << 20, ProcessBytes: 4096 << 20, ProcessBytesKnown: true}, 4096, "nvml"},
		"virtualized total": {MemoryProbe{AllocatedBytes: 3596 << 20, TotalBytes: limit, FreeBeforeBytes: 3596 << 20}, 4096, "cuMemGetInfo"},
		"physical total":    {MemoryProbe{AllocatedBytes: 3596 << 20, TotalBytes: 81559 << 20, FreeBeforeBytes: 81000 << 20}, 3596, "allocations"},
	} {
		t.Run(name, func(t *testing.T) {
			m := memoryFigures(limit, tc.probe)
			if m.ObtainedMiB != tc.obtained || m.ObtainedFrom != tc.from || m.LimitMiB != 4096 {
				t.Errorf("%+v, want %v MiB from %s", m, tc.obtained, tc.from)
			}
		})
	}
}

// TestSkipsAndErrors: a skipped backend neither passes nor fails; a failed
// step fails the check, and both are explained under the table.
func TestSkipsAndErrors(t *testing.T) {
	r := &Report{Backends: []BackendReport{
		{Isolation: configapi.IsolationHAMiCore, Skipped: "no HAMi-core library given"},
	}}
	r.Evaluate(DefaultTargets)
	var out strings.Builder
	_ = r.WriteTable(&out)
	if !r.Pass || r.Measured != 0 || !strings.Contains(out.String(), "HAMiCore skipped: no HAMi-core library given") || !strings.Contains(out.String(), "nothing enforced was measured") {
		t.Errorf("skip: pass %v, measured %d:\n%s", r.Pass, r.Measured, out.String())
	}
	r.Backends = append(r.Backends, BackendReport{Isolation: configapi.IsolationMPS, Error: "memory probe: libcuda.so.1 not found"})
	r.Evaluate(DefaultTargets)
	out.Reset()
	_ = r.WriteTable(&out)
	if r.Pass || !strings.Contains(out.String(), "MPS ERROR: memory probe: libcuda.so.1 not found") {
		t.Errorf("error: pass %v:\n%s", r.Pass, out.String())
	}
	var js strings.Builder
	if err := r.WriteJSON(&js); err != nil || strings.Count(js.String(), "\n") != 1 || !strings.HasPrefix(js.String(), `{"node":`) {
		t.Errorf("JSON line %q, %v", js.String(), err)
	}
}
