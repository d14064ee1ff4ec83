package gpucheck

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/tessera-dev/tessera/pkg/gpucheck/cuda"
)

// MemoryProbe is what the memory probe saw: it allocates device memory until
// the driver (or the backend) refuses, in chunks from 256 MiB down to 1 MiB.
type MemoryProbe struct {
	PID    int             `json:"pid"`
	Device cuda.DeviceInfo `json:"device"`
	// AllocatedBytes is the sum of the allocations that succeeded.
	AllocatedBytes uint64 `json:"allocatedBytes"`
	Allocations    int    `json:"allocations"`
	// TotalBytes and FreeBeforeBytes are cuMemGetInfo before the first
	// allocation, FreeAfterBytes after the last.
	TotalBytes      uint64 `json:"totalBytes"`
	FreeBeforeBytes uint64 `json:"freeBeforeBytes"`
	FreeAfterBytes  uint64 `json:"freeAfterBytes"`
	// ProcessBytes is the probe's device memory as NVML counts it, read by
	// the check while the probe held its allocations.
	ProcessBytes      uint64 `json:"processBytes,omitempty"`
	ProcessBytesKnown bool   `json:"processBytesKnown"`
	// LastError is the refusal that ended the allocations.
	LastError string `json:"lastError"`
}

// ComputeProbe is what the compute probe did in its wall time: kernels of
// Grid blocks × Block threads, each block spinning CyclesPerBlock SM clock
// cycles, launched one after the other until the time was up.
type ComputeProbe struct {
	PID            int             `json:"pid"`
	Device         cuda.DeviceInfo `json:"device"`
	Grid           uint32          `json:"grid"`
	Block          uint32          `json:"block"`
	CyclesPerBlock uint64          `json:"cyclesPerBlock"`
	Kernels        int             `json:"kernels"`
	// CountedBlocks is what the kernels' counter says ran; it must equal
	// Kernels × Grid, or the kernel did not do its work.
	CountedBlocks uint64  `json:"countedBlocks"`
	Seconds       float64 `json:"seconds"`
}

// probeMessage is one line a probe process writes on stdout.
type probeMessage struct {
	// Event is "holding" (memory probe at its peak, waiting for a line on
	// stdin), "ready" (compute probe warmed up, waiting for a line on
	// stdin), "result" or "error".
	Event   string        `json:"event"`
	Error   string        `json:"error,omitempty"`
	Memory  *MemoryProbe  `json:"memory,omitempty"`
	Compute *ComputeProbe `json:"compute,omitempty"`
}

// Chunk sizes of the memory probe: it halves the chunk after each refusal.
const (
	firstChunk = 256 << 20
	lastChunk  = 1 << 20
	// maxAllocations bounds the probe on a driver that never refuses.
	maxAllocations = 1 << 20
)

// RunMemoryProbe is the memory probe process: it loads the driver,
// allocates until refused, reports "holding" on out, waits for a line on in
// (while the check reads the process's memory from NVML), frees everything
// and reports the result.
func RunMemoryProbe(in io.Reader, out io.Writer) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	enc := json.NewEncoder(out)
	fail := func(err error) error {
		_ = enc.Encode(probeMessage{Event: "error", Error: err.Error()})
		return err
	}
	lib, err := cuda.Open()
	if err != nil {
		return fail(err)
	}
	info, err := lib.Init()
	if err != nil {
		return fail(err)
	}
	defer func() { _ = lib.Close() }()
	p := MemoryProbe{PID: os.Getpid(), Device: info, TotalBytes: info.TotalBytes, FreeBeforeBytes: info.FreeBytes}
	var ptrs []cuda.Ptr
	defer func() {
		for _, ptr := range ptrs {
			_ = lib.Free(ptr)
		}
	}()
	for chunk := uint64(firstChunk); chunk >= lastChunk && len(ptrs) < maxAllocations; {
		ptr, err := lib.Alloc(chunk)
		if err != nil {
			if !cuda.IsOutOfMemory(err) {
				return fail(fmt.Errorf("allocate after %d MiB: %w", p.AllocatedBytes>>20, err))
			}
			p.LastError = err.Error()
			chunk /= 2
			continue
		}
		ptrs = append(ptrs, ptr)
		p.AllocatedBytes += chunk
	}
	p.Allocations = len(ptrs)
	if free, _, err := lib.MemInfo(); err == nil {
		p.FreeAfterBytes = free
	}
	if err := enc.Encode(probeMessage{Event: "holding", Memory: &p}); err != nil {
		return err
	}
	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil && !errors.Is(err, io.EOF) {
		return fail(fmt.Errorf("wait for the check: %w", err))
	}
	return enc.Encode(probeMessage{Event: "result", Memory: &p})
}

// Kernel shape of the compute probe.
const (
	spinBlock = 256
	// spinKernelMillis is how long one kernel spins on an unshared GPU; the
	// last kernel can overrun the wall time by about that much (under a
	// 30 % limit three times as long), which is small against seconds.
	spinKernelMillis = 20
	defaultClockKHz  = 1_500_000
)

// RunComputeProbe is the compute probe process: it loads the driver and the
// kernel, runs one kernel to warm up, reports "ready" on out, waits for a
// line on in (the check starts both shares' probes at once), then launches
// kernels one after the other for d and reports the work done.
func RunComputeProbe(in io.Reader, out io.Writer, d time.Duration) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	enc := json.NewEncoder(out)
	fail := func(err error) error {
		_ = enc.Encode(probeMessage{Event: "error", Error: err.Error()})
		return err
	}
	if _, err := ParsePTX(SpinPTX); err != nil {
		return fail(err)
	}
	lib, err := cuda.Open()
	if err != nil {
		return fail(err)
	}
	info, err := lib.Init()
	if err != nil {
		return fail(err)
	}
	defer func() { _ = lib.Close() }()
	mod, err := lib.LoadPTX(SpinPTX)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = mod.Unload() }()
	fn, err := mod.Function(SpinEntry)
	if err != nil {
		return fail(err)
	}
	counter, err := lib.Alloc(8)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = lib.Free(counter) }()

	p := ComputeProbe{PID: os.Getpid(), Device: info, Block: spinBlock}
	p.Grid, p.CyclesPerBlock = spinShape(info)
	// Warm-up: JIT, module load and first launch are not measured.
	if err := lib.LaunchSpin(fn, p.Grid, p.Block, counter, 1000); err != nil {
		return fail(err)
	}
	if err := lib.Synchronize(); err != nil {
		return fail(err)
	}
	base, err := lib.ReadU64(counter)
	if err != nil {
		return fail(err)
	}
	if base != uint64(p.Grid) {
		return fail(fmt.Errorf("warm-up kernel counted %d blocks, want %d: the kernel did not run", base, p.Grid))
	}
	if err := enc.Encode(probeMessage{Event: "ready", Compute: &p}); err != nil {
		return err
	}
	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil {
		return fail(fmt.Errorf("wait for the start signal: %w", err))
	}
	start := time.Now()
	for time.Since(start) < d {
		// One kernel at a time: the work done by the end of d is the
		// work of the kernels launched before it, plus at most one.
		if err := lib.LaunchSpin(fn, p.Grid, p.Block, counter, p.CyclesPerBlock); err != nil {
			return fail(err)
		}
		if err := lib.Synchronize(); err != nil {
			return fail(err)
		}
		p.Kernels++
	}
	p.Seconds = time.Since(start).Seconds()
	total, err := lib.ReadU64(counter)
	if err != nil {
		return fail(err)
	}
	p.CountedBlocks = total - base
	if want := uint64(p.Kernels) * uint64(p.Grid); p.CountedBlocks != want {
		return fail(fmt.Errorf("the kernels counted %d blocks, want %d (%d kernels × %d blocks)", p.CountedBlocks, want, p.Kernels, p.Grid))
	}
	return enc.Encode(probeMessage{Event: "result", Compute: &p})
}

// spinShape is the compute probe's kernel: one full wave of 256-thread
// blocks on every SM the device reports, each spinning about
// spinKernelMillis at the device's clock.
func spinShape(info cuda.DeviceInfo) (grid uint32, cycles uint64) {
	perSM := 8
	if info.MaxThreadsPerSM >= spinBlock {
		perSM = info.MaxThreadsPerSM / spinBlock
	}
	sms := max(info.Multiprocessors, 1)
	khz := info.ClockKHz
	if khz <= 0 {
		khz = defaultClockKHz
	}
	return uint32(sms * perSM), uint64(khz) * spinKernelMillis
}
