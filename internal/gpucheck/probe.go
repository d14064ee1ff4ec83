package gpucheck

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/tessera-dev/tessera/internal/gpucheck/cuda"
)

// MemoryProbe is what the memory probe saw: it allocates device memory until
// the driver (or the backend) refuses, in chunks from 256 MiB down to 1 MiB
// (or the allocator's granularity), with one of the driver's allocators.
type MemoryProbe struct {
	PID    int             `json:"pid"`
	Device cuda.DeviceInfo `json:"device"`
	// Allocator is the driver API the probe allocated with (cuMemAlloc by
	// default).
	Allocator cuda.Allocator `json:"allocator,omitempty"`
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
	// Stopped is true when the probe stopped at its StopAfterBytes bound
	// without being refused: nothing held it to a limit below that.
	Stopped bool `json:"stopped,omitempty"`
}

// MemoryOptions choose how the memory probe allocates.
type MemoryOptions struct {
	Allocator cuda.Allocator
	// StopAfterBytes ends the allocations once this much was allocated
	// without a refusal (managed memory can exceed the GPU's memory; a
	// limit that does not hold would otherwise take the machine's); 0: no
	// bound but the GPU.
	StopAfterBytes uint64
	// WaitStart: report "ready" once the context exists and allocate only
	// after a line on stdin, so that N processes of one claim all hold
	// their contexts before any allocates.
	WaitStart bool
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
	// Kernel is the entry launched: tessera_spin (empty in older reports)
	// or tessera_work, whose blocks each run Iterations loop steps.
	Kernel     string `json:"kernel,omitempty"`
	Iterations uint64 `json:"iterations,omitempty"`
}

// WorkRate is what a work probe did per second: loop iterations of all its
// blocks (Kernels × Grid × Iterations / Seconds); 0 without figures.
func (c ComputeProbe) WorkRate() float64 {
	if c.Seconds <= 0 {
		return 0
	}
	return float64(c.CountedBlocks) * float64(c.Iterations) / c.Seconds
}

// probeMessage is one line a probe process writes on stdout.
type probeMessage struct {
	// Event is "loading" (a hold probe that loaded the driver library and
	// is about to call cuInit: under legacy MPS a client of another uid
	// waits there), "holding" (memory probe at its peak, or a hold probe
	// with its context, waiting for a line on stdin), "ready" (compute or
	// work probe warmed up, or a memory probe with --wait-start, waiting
	// for a line on stdin), "inside" (a probe in a container, before its
	// memory probe), "result" or "error".
	Event string `json:"event"`
	// Time is when the probe sent the message (Unix nanoseconds, this
	// machine's clock), for "loading" and "holding" of the hold probe.
	Time  int64  `json:"time,omitempty"`
	Error string `json:"error,omitempty"`
	// Code classifies an error the check acts on: ErrCodeUnsupported (the
	// driver or device does not support the allocator asked for),
	// ErrCodeNamespace (nsexec was refused a namespace or a mount).
	Code    string        `json:"code,omitempty"`
	Memory  *MemoryProbe  `json:"memory,omitempty"`
	Compute *ComputeProbe `json:"compute,omitempty"`
	// Inside is what a probe in a container saw (event "inside").
	Inside *InsideReport `json:"inside,omitempty"`
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
func RunMemoryProbe(in io.Reader, out io.Writer, opts MemoryOptions) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	enc := json.NewEncoder(out)
	fail := func(err error) error {
		m := probeMessage{Event: "error", Error: err.Error()}
		if errors.Is(err, cuda.ErrNotSupported) {
			m.Code = ErrCodeUnsupported
		}
		_ = enc.Encode(m)
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
	rd := bufio.NewReader(in)
	if opts.WaitStart {
		p := MemoryProbe{PID: os.Getpid(), Device: info, Allocator: opts.Allocator, TotalBytes: info.TotalBytes, FreeBeforeBytes: info.FreeBytes}
		if err := awaitStart(enc, rd, probeMessage{Event: "ready", Memory: &p}, fail); err != nil {
			return err
		}
	}
	p, held, err := allocateUntilRefused(lib, info, opts)
	defer func() {
		for _, a := range held {
			_ = lib.FreeAllocation(a)
		}
	}()
	if err != nil {
		return fail(err)
	}
	if err := awaitCheck(enc, rd, probeMessage{Event: "holding", Memory: &p}, fail); err != nil {
		return err
	}
	return enc.Encode(probeMessage{Event: "result", Memory: &p})
}

// allocateUntilRefused allocates with opts.Allocator in chunks of 256 MiB,
// halving the chunk after each out-of-memory down to 1 MiB (or the
// allocator's granularity), and returns the figures and what it holds.
func allocateUntilRefused(lib *cuda.Lib, info cuda.DeviceInfo, opts MemoryOptions) (MemoryProbe, []cuda.Allocation, error) {
	a := opts.Allocator
	if a == "" {
		a = cuda.AllocPlain
	}
	p := MemoryProbe{PID: os.Getpid(), Device: info, Allocator: a, TotalBytes: info.TotalBytes, FreeBeforeBytes: info.FreeBytes}
	if err := lib.Supported(a); err != nil {
		return p, nil, err
	}
	gran, err := lib.Granularity(a)
	if err != nil {
		return p, nil, err
	}
	last := max(uint64(lastChunk), gran)
	var held []cuda.Allocation
	for chunk := uint64(firstChunk); chunk >= last && len(held) < maxAllocations; {
		if opts.StopAfterBytes > 0 && p.AllocatedBytes >= opts.StopAfterBytes {
			p.Stopped = true
			break
		}
		size := (chunk + gran - 1) / gran * gran
		al, err := lib.AllocWith(a, size)
		if err != nil {
			if !cuda.IsOutOfMemory(err) {
				return p, held, fmt.Errorf("%s after %d MiB: %w", a, p.AllocatedBytes>>20, err)
			}
			p.LastError = err.Error()
			chunk /= 2
			continue
		}
		held = append(held, al)
		p.AllocatedBytes += size
	}
	p.Allocations = len(held)
	if free, _, err := lib.MemInfo(); err == nil {
		p.FreeAfterBytes = free
	}
	return p, held, nil
}

// Error codes of probeMessage.Code.
const (
	ErrCodeUnsupported = "unsupported"
	ErrCodeNamespace   = "namespace"
)

// RunHoldProbe is the smallest client: it loads the driver, reports
// "loading" (stamped) right before cuInit, makes device 0's primary context
// current (under MPS: connects to the server, which for a client of another
// uid waits until the running server has no clients), reports "holding"
// (stamped) with what it read, and keeps the context until a line on in.
func RunHoldProbe(in io.Reader, out io.Writer) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	enc := json.NewEncoder(out)
	fail := probeFail(enc, "")
	lib, err := cuda.Open()
	if err != nil {
		return fail(err)
	}
	if err := enc.Encode(probeMessage{Event: "loading", Time: time.Now().UnixNano()}); err != nil {
		return err
	}
	info, err := lib.Init()
	if err != nil {
		return fail(err)
	}
	defer func() { _ = lib.Close() }()
	p := MemoryProbe{PID: os.Getpid(), Device: info, TotalBytes: info.TotalBytes, FreeBeforeBytes: info.FreeBytes}
	if err := awaitCheck(enc, bufio.NewReader(in), probeMessage{Event: "holding", Time: time.Now().UnixNano(), Memory: &p}, fail); err != nil {
		return err
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

// loadKernel opens the driver, makes a context, loads SpinPTX and finds
// its kernel entry, and allocates a counter of counterBytes. release frees
// them in reverse order; on an error nothing is left to release.
func loadKernel(entry string, counterBytes uint64) (lib *cuda.Lib, info cuda.DeviceInfo, fn *cuda.Function, counter cuda.Ptr, release func(), err error) {
	var undo []func()
	release = func() {
		for _, u := range slices.Backward(undo) {
			u()
		}
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	if lib, err = cuda.Open(); err != nil {
		return
	}
	if info, err = lib.Init(); err != nil {
		return
	}
	undo = append(undo, func() { _ = lib.Close() })
	mod, err := lib.LoadPTX(SpinPTX)
	if err != nil {
		return
	}
	undo = append(undo, func() { _ = mod.Unload() })
	if fn, err = mod.Function(entry); err != nil {
		return
	}
	if counter, err = lib.Alloc(counterBytes); err != nil {
		return
	}
	undo = append(undo, func() { _ = lib.Free(counter) })
	return lib, info, fn, counter, release, nil
}

// RunComputeProbe is the compute probe process: it loads the driver and the
// kernel, runs one kernel to warm up, reports "ready" on out, waits for a
// line on in (the check starts both shares' probes at once), then launches
// kernels one after the other for d and reports the work done.
func RunComputeProbe(in io.Reader, out io.Writer, d time.Duration) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	enc := json.NewEncoder(out)
	fail := probeFail(enc, "")
	if _, err := ParsePTX(SpinPTX); err != nil {
		return fail(err)
	}
	lib, info, fn, counter, release, err := loadKernel(SpinEntry, 8)
	if err != nil {
		return fail(err)
	}
	defer release()

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
	if err := awaitStart(enc, bufio.NewReader(in), probeMessage{Event: "ready", Compute: &p}, fail); err != nil {
		return err
	}
	// One kernel at a time: the work done by the end of d is the work of
	// the kernels launched before it, plus at most one.
	return launchFor(lib, counter, base, &p, d, func() error {
		if err := lib.LaunchSpin(fn, p.Grid, p.Block, counter, p.CyclesPerBlock); err != nil {
			return err
		}
		return lib.Synchronize()
	}, enc, fail)
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

// workKernelMillis is how long one tessera_work kernel runs on an unshared
// GPU, calibrated by the probe before it reports ready.
const workKernelMillis = 20

// RunWorkProbe is the fixed-work probe process: like the compute probe, but
// it launches tessera_work on a quarter of the SMs (at least one block):
// a launch that leaves room beside it, so that two clients of one MPS server
// run side by side, and only time-slicing between contexts (two MPS
// servers, or two plain contexts) halves each one's rate. It calibrates the
// iterations to about workKernelMillis per kernel, reports ready, waits for
// the start line and then launches kernels one after the other for d.
func RunWorkProbe(in io.Reader, out io.Writer, d time.Duration) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	enc := json.NewEncoder(out)
	fail := probeFail(enc, "")
	lib, info, fn, counter, release, err := loadKernel(WorkEntry, 16)
	if err != nil {
		return fail(err)
	}
	defer release()
	p := ComputeProbe{PID: os.Getpid(), Device: info, Block: spinBlock, Kernel: WorkEntry, Grid: uint32(max(info.Multiprocessors/4, 1))}
	launch := func(iterations uint64) (time.Duration, error) {
		start := time.Now()
		if err := lib.LaunchSpin(fn, p.Grid, p.Block, counter, iterations); err != nil {
			return 0, err
		}
		err := lib.Synchronize()
		return time.Since(start), err
	}
	// Calibration (JIT and the first launch excluded): time a short
	// kernel, then scale to workKernelMillis.
	const probeIterations = 1 << 16
	if _, err := launch(probeIterations); err != nil {
		return fail(err)
	}
	took, err := launch(probeIterations)
	if err != nil {
		return fail(err)
	}
	p.Iterations = min(max(uint64(float64(probeIterations)*float64(workKernelMillis*time.Millisecond)/float64(max(took, time.Microsecond))), 1<<10), 1<<34)
	base, err := lib.ReadU64(counter)
	if err != nil {
		return fail(err)
	}
	if base != 2*uint64(p.Grid) {
		return fail(fmt.Errorf("calibration kernels counted %d blocks, want %d: the kernel did not run", base, 2*p.Grid))
	}
	if err := awaitStart(enc, bufio.NewReader(in), probeMessage{Event: "ready", Compute: &p}, fail); err != nil {
		return err
	}
	return launchFor(lib, counter, base, &p, d, func() error {
		_, err := launch(p.Iterations)
		return err
	}, enc, fail)
}
