package gpucheck

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/internal/gpucheck/cuda"
)

// The HAMi-core checks beyond cuMemAlloc: HAMi-core hooks every allocator
// of the driver API (its src/cuda/memory.c: cuMemAllocAsync, cuMemCreate,
// cuMemAllocManaged next to cuMemAlloc_v2), so a share's limit must refuse
// each of them; and every process of one claim shares the claim's limit
// (HAMi-core's shared region, CUDA_DEVICE_MEMORY_SHARED_CACHE, in the
// claim's directory), so N processes together get no more than it.

// DefaultHAMiCoreProcesses is how many processes share one claim in the
// N-process check.
const DefaultHAMiCoreProcesses = 2

// hamiStopMargin is how far past the limit an allocator may go before the
// probe stops by itself: a limit that does not hold shows as a probe that
// was not refused, without taking the GPU (or, for managed memory, the
// host's memory).
const hamiStopMargin = 2 << 30

func (n *node) hamiChecks(ctx context.Context) []Check {
	if !slices.Contains(n.cfg.Isolations, configapi.IsolationHAMiCore) {
		return nil
	}
	checks := []Check{
		{Name: "HAMi-core: cuMemAllocAsync, VMM (cuMemCreate), managed memory refused past the limit"},
		{Name: fmt.Sprintf("HAMi-core: %d processes of one claim share its limit", n.hamiProcesses())},
	}
	ep, ok := n.cfg.Prober.(ExecProber)
	reason := n.backendUnavailable(configapi.IsolationHAMiCore)
	status := StatusSkipped
	if n.cfg.HAMiCoreLibrary == "" && n.cfg.HAMiCoreError != "" && n.noShares == "" {
		status = StatusError
	}
	if !ok {
		reason, status = "no probe processes (--no-probes)", StatusSkipped
	}
	if reason != "" {
		for i := range checks {
			checks[i].Status, checks[i].Detail = status, reason
		}
		return checks
	}
	prep, env, err := n.prepareWhole(ctx, Namespace, "gpucheck-hami-more", configapi.IsolationHAMiCore)
	if err != nil {
		for i := range checks {
			checks[i].Status, checks[i].Detail = StatusError, err.Error()
		}
		return checks
	}
	defer prep.release()
	checks[0] = n.hamiAllocators(ctx, ep, env, checks[0])
	if n.oneContext != "" {
		// N processes of one claim are N contexts.
		checks[1].Status, checks[1].Detail = StatusSkipped, n.oneContext
	} else {
		checks[1] = n.hamiShared(ctx, ep, env, checks[1])
	}
	return checks
}

func (n *node) hamiProcesses() int {
	if n.cfg.HAMiCoreProcesses > 0 {
		return n.cfg.HAMiCoreProcesses
	}
	return DefaultHAMiCoreProcesses
}

// hamiAllocators runs the memory probe with each other allocator in the
// claim's environment. An allocator the driver or device does not support
// is reported, not judged; when none was supported the check is skipped.
func (n *node) hamiAllocators(ctx context.Context, ep ExecProber, env []string, c Check) Check {
	limit := uint64(n.memory)
	tol := n.targets.MemoryToleranceMiB
	var bad, facts, unsupported []string
	checked := 0
	for _, a := range []cuda.Allocator{cuda.AllocAsync, cuda.AllocVMM, cuda.AllocManaged} {
		p, err := ep.MemoryWith(ctx, n.gpu.UUID, env, MemoryOptions{Allocator: a, StopAfterBytes: limit + hamiStopMargin})
		if err != nil {
			if probeErrorCode(err) == ErrCodeUnsupported {
				unsupported = append(unsupported, fmt.Sprintf("%s: not checked, %v", a, err))
				continue
			}
			c.Status, c.Detail = StatusError, fmt.Sprintf("%s: %v", a, err)
			return c
		}
		checked++
		if msg, ok := judgeHAMiAllocation(n.memory, tol, a, p); ok {
			facts = append(facts, msg)
		} else {
			bad = append(bad, msg)
		}
	}
	facts = append(facts, unsupported...)
	switch {
	case len(bad) > 0:
		c.Status, c.Detail = StatusMismatch, strings.Join(append(bad, facts...), "; ")
	case checked == 0:
		c.Status, c.Detail = StatusSkipped, "no allocator but cuMemAlloc is supported here: "+strings.Join(facts, "; ")
	default:
		c.Status, c.Detail = n.measured(), strings.Join(facts, "; ")
	}
	return c
}

// outOfMemory reports whether a probe's last error is the driver's (or
// HAMi-core's) out-of-memory refusal: CUDA_ERROR_OUT_OF_MEMORY, by name or
// as CUresult 2.
func outOfMemory(lastError string) bool {
	return strings.Contains(lastError, "CUDA_ERROR_OUT_OF_MEMORY") || strings.Contains(lastError, "CUresult 2")
}

// judgeHAMiAllocation holds one allocator's memory probe to the share's
// limit (bytes) with the backends' own two-sided rule (Evaluate): the
// process's memory within tol MiB of the limit, either way, and the
// allocations ended by an out-of-memory refusal, not by the probe's own
// bound. It returns the finding and whether it passed.
func judgeHAMiAllocation(limit int64, tol float64, a cuda.Allocator, p MemoryProbe) (string, bool) {
	f := memoryFigures(limit, p)
	got := fmt.Sprintf("%.0f MiB allocated, %.0f MiB obtained (%s) of %.0f MiB", float64(p.AllocatedBytes)/mib, f.ObtainedMiB, f.ObtainedFrom, f.LimitMiB)
	switch {
	case p.Stopped:
		return fmt.Sprintf("%s: %.0f MiB allocated without a refusal (limit %.0f MiB): not enforced", a, float64(p.AllocatedBytes)/mib, f.LimitMiB), false
	case !outOfMemory(p.LastError):
		return fmt.Sprintf("%s: the allocations did not end with an out-of-memory refusal (last error %q; %s)", a, p.LastError, got), false
	case math.Abs(f.ObtainedMiB-f.LimitMiB) > tol || math.IsNaN(f.ObtainedMiB):
		return fmt.Sprintf("%s: refused at %s: more than %.0f MiB from the limit", a, got, tol), false
	}
	return fmt.Sprintf("%s: refused at %s (%s)", a, got, p.LastError), true
}

// hamiShared starts N memory probes in the claim's environment, lets each
// create its context, then lets all allocate until refused (each bounded
// at the limit and hamiStopMargin, as the allocator check is), and holds
// their memory together to the one limit, either way.
func (n *node) hamiShared(ctx context.Context, ep ExecProber, env []string, c Check) Check {
	count := n.hamiProcesses()
	stop := fmt.Sprint((uint64(n.memory) + hamiStopMargin + mib - 1) / mib)
	procs, err := ep.startAll(ctx, slices.Repeat([][]string{env}, count), "memory", "--wait-start", "--stop-after-mib", stop)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	defer killProbes(procs)
	for i, p := range procs {
		if _, err := p.next(ep.timeout(), "ready"); err != nil {
			c.Status, c.Detail = StatusError, fmt.Sprintf("process %d: %v", i+1, err)
			return c
		}
	}
	for _, p := range procs {
		if err := p.send("go"); err != nil {
			c.Status, c.Detail = StatusError, err.Error()
			return c
		}
	}
	probes := make([]MemoryProbe, len(procs))
	for i, p := range procs {
		m, err := p.next(ep.timeout(), "holding")
		if err != nil {
			c.Status, c.Detail = StatusError, fmt.Sprintf("process %d: %v", i+1, err)
			return c
		}
		if m.Memory == nil {
			c.Status, c.Detail = StatusError, fmt.Sprintf("process %d: \"holding\" without figures", i+1)
			return c
		}
		probes[i] = *m.Memory
		probes[i].PID = p.cmd.Process.Pid
		if ep.ProcessMemory != nil {
			probes[i].ProcessBytes, probes[i].ProcessBytesKnown = ep.ProcessMemory(n.gpu.UUID, p.cmd.Process.Pid)
		}
	}
	for _, p := range procs {
		_ = p.send("release")
		_, _ = p.next(ep.timeout(), "result")
	}
	detail, bad := judgeHAMiShared(n.memory, n.targets.MemoryToleranceMiB, probes)
	return n.judged(c, bad, detail)
}

// judgeHAMiShared holds N processes of one claim (their probes, holding
// what they could allocate) to the claim's limit (bytes), within tol MiB
// either way: each ended by an out-of-memory refusal, and together
//
//   - with NVML's per-process figures (contexts included): their sum;
//   - without them: at most the limit in allocations alone, and at least
//     the limit less tol in what HAMi-core charged the claim as the probes
//     saw it (cuMemGetInfo's total less its free after the last
//     allocation, the most any process saw: HAMi-core shows the claim's
//     limit as the total and what its processes left of it as free), with
//     that total the limit.
//
// It returns the detail and what is wrong.
func judgeHAMiShared(limit int64, tol float64, probes []MemoryProbe) (string, []string) {
	var bad, parts []string
	var nvml, alloc float64
	var charged uint64
	known := len(probes) > 0
	for i, p := range probes {
		got := float64(p.AllocatedBytes) / mib
		alloc += got
		if p.ProcessBytesKnown {
			nvml += float64(p.ProcessBytes) / mib
			parts = append(parts, fmt.Sprintf("pid %d %.0f MiB (%.0f allocated)", p.PID, float64(p.ProcessBytes)/mib, got))
		} else {
			known = false
			parts = append(parts, fmt.Sprintf("pid %d %.0f MiB allocated", p.PID, got))
		}
		if p.TotalBytes >= p.FreeAfterBytes {
			charged = max(charged, p.TotalBytes-p.FreeAfterBytes)
		}
		switch {
		case p.Stopped:
			bad = append(bad, fmt.Sprintf("process %d allocated %.0f MiB without a refusal: not enforced", i+1, got))
		case !outOfMemory(p.LastError):
			bad = append(bad, fmt.Sprintf("process %d: the allocations did not end with an out-of-memory refusal (last error %q)", i+1, p.LastError))
		}
	}
	lim := float64(limit) / mib
	var detail string
	if known {
		detail = fmt.Sprintf("%d processes of one claim together %.0f MiB (nvml, contexts included; %s) of its %.0f MiB limit", len(probes), nvml, strings.Join(parts, ", "), lim)
		switch {
		case nvml-lim > tol || math.IsNaN(nvml):
			bad = append(bad, fmt.Sprintf("over the limit by %.0f MiB", nvml-lim))
		case lim-nvml > tol:
			bad = append(bad, fmt.Sprintf("%.0f MiB short of the limit: the claim's processes could not use all of it", lim-nvml))
		}
		return detail, bad
	}
	detail = fmt.Sprintf("%d processes of one claim allocated %.0f MiB together (%s) of its %.0f MiB limit; without NVML's per-process figures the contexts are taken from what HAMi-core charged the claim as cuMemGetInfo showed it: %.0f MiB",
		len(probes), alloc, strings.Join(parts, ", "), lim, float64(charged)/mib)
	if alloc-lim > tol {
		bad = append(bad, fmt.Sprintf("the allocations alone are over the limit by %.0f MiB", alloc-lim))
	}
	if lim-float64(charged)/mib > tol {
		bad = append(bad, fmt.Sprintf("HAMi-core charged the claim %.0f MiB, %.0f MiB short of the limit", float64(charged)/mib, lim-float64(charged)/mib))
	}
	for i, p := range probes {
		if math.Abs(float64(p.TotalBytes)/mib-lim) > tol {
			bad = append(bad, fmt.Sprintf("process %d saw a total of %.0f MiB, not the claim's limit", i+1, float64(p.TotalBytes)/mib))
		}
	}
	return detail, bad
}
