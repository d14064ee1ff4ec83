package gpucheck

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpucheck/cuda"
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
	if n.cfg.HAMiCoreLibrary == "" && n.cfg.HAMiCoreError != "" {
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
	prep, err := n.prepareShares(ctx, n.claimsFor(Namespace, "gpucheck-hami-more", configapi.IsolationHAMiCore, []int64{100}))
	if err != nil {
		for i := range checks {
			checks[i].Status, checks[i].Detail = StatusError, err.Error()
		}
		return checks
	}
	defer prep.release()
	env, err := n.hostEnv(prep, 0)
	if err != nil {
		for i := range checks {
			checks[i].Status, checks[i].Detail = StatusError, err.Error()
		}
		return checks
	}
	checks[0] = n.hamiAllocators(ctx, ep, env, checks[0])
	checks[1] = n.hamiShared(ctx, ep, env, checks[1])
	return checks
}

func (n *node) hamiProcesses() int {
	if n.cfg.HAMiCoreProcesses > 0 {
		return n.cfg.HAMiCoreProcesses
	}
	return DefaultHAMiCoreProcesses
}

// hamiAllocators runs the memory probe with each other allocator in the
// claim's environment.
func (n *node) hamiAllocators(ctx context.Context, ep ExecProber, env []string, c Check) Check {
	limit := uint64(n.memory)
	tol := n.targets.MemoryToleranceMiB
	var bad, facts []string
	for _, a := range []cuda.Allocator{cuda.AllocAsync, cuda.AllocVMM, cuda.AllocManaged} {
		p, err := ep.MemoryWith(ctx, n.gpu.UUID, env, MemoryOptions{Allocator: a, StopAfterBytes: limit + hamiStopMargin})
		if err != nil {
			if strings.Contains(err.Error(), "this driver has no") {
				facts = append(facts, fmt.Sprintf("%s: not checked, %v", a, err))
				continue
			}
			c.Status, c.Detail = StatusError, fmt.Sprintf("%s: %v", a, err)
			return c
		}
		f := memoryFigures(n.memory, p)
		over := float64(p.AllocatedBytes)/mib - float64(limit)/mib
		switch {
		case p.Stopped:
			bad = append(bad, fmt.Sprintf("%s: %.0f MiB allocated without a refusal (limit %.0f MiB): not enforced", a, float64(p.AllocatedBytes)/mib, float64(limit)/mib))
		case over > tol:
			bad = append(bad, fmt.Sprintf("%s: refused only after %.0f MiB, %.0f MiB past the %.0f MiB limit", a, float64(p.AllocatedBytes)/mib, over, float64(limit)/mib))
		default:
			facts = append(facts, fmt.Sprintf("%s: refused after %.0f MiB allocated, %.0f MiB obtained (%s) of %.0f MiB (%s)", a, float64(p.AllocatedBytes)/mib, f.ObtainedMiB, f.ObtainedFrom, f.LimitMiB, p.LastError))
		}
	}
	if len(bad) > 0 {
		c.Status, c.Detail = StatusMismatch, strings.Join(append(bad, facts...), "; ")
		return c
	}
	c.Status, c.Detail = n.measured(), strings.Join(facts, "; ")
	return c
}

// hamiShared starts N memory probes in the claim's environment, lets each
// create its context, then lets all allocate until refused, and holds their
// memory (NVML's count per process, contexts included) to the one limit.
func (n *node) hamiShared(ctx context.Context, ep ExecProber, env []string, c Check) Check {
	count := n.hamiProcesses()
	var procs []*probeProcess
	defer func() {
		for _, p := range procs {
			p.kill()
		}
	}()
	for range count {
		p, err := ep.start(ctx, env, "memory", "--wait-start")
		if err != nil {
			c.Status, c.Detail = StatusError, err.Error()
			return c
		}
		procs = append(procs, p)
	}
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
	var total float64
	var parts []string
	from := ""
	for i, p := range procs {
		m, err := p.next(ep.timeout(), "holding")
		if err != nil {
			c.Status, c.Detail = StatusError, fmt.Sprintf("process %d: %v", i+1, err)
			return c
		}
		probe := *m.Memory
		if ep.ProcessMemory != nil {
			probe.ProcessBytes, probe.ProcessBytesKnown = ep.ProcessMemory(n.gpu.UUID, p.cmd.Process.Pid)
		}
		got, src := float64(probe.AllocatedBytes)/mib, "allocations"
		if probe.ProcessBytesKnown {
			got, src = float64(probe.ProcessBytes)/mib, "nvml"
		}
		if from == "" || src != "nvml" {
			from = src
		}
		total += got
		parts = append(parts, fmt.Sprintf("pid %d %.0f MiB (%.0f allocated)", p.cmd.Process.Pid, got, float64(probe.AllocatedBytes)/mib))
	}
	for _, p := range procs {
		_ = p.send("release")
		_, _ = p.next(ep.timeout(), "result")
	}
	limit := float64(n.memory) / mib
	detail := fmt.Sprintf("%d processes of one claim together %.0f MiB (%s; %s) of its %.0f MiB limit", count, total, from, strings.Join(parts, ", "), limit)
	if from != "nvml" {
		detail += "; without NVML's per-process figure the contexts are not counted"
	}
	if total-limit > n.targets.MemoryToleranceMiB || math.IsNaN(total) {
		c.Status, c.Detail = StatusMismatch, fmt.Sprintf("over the limit by %.0f MiB: ", total-limit)+detail
		return c
	}
	c.Status, c.Detail = n.measured(), detail
	return c
}
