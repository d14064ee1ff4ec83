package gpucheck

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tessera-dev/tessera/pkg/gpucheck/cuda"
)

// The probe's mock mode ("tessera-gpu-probe probe --simulate-gpu-mib N …",
// what the check runs against a mock profile, and so what the bundle's dry
// run exercises): a probe process that speaks the real probe's protocol but
// loads no driver. Its figures follow only the environment the check built
// from the prepared CDI spec, as the backends would on a GPU:
//
//   - memory: MPS's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M, or
//     HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_0=<MiB>m when LD_PRELOAD loads a
//     library (without it nothing would read the variable), caps what the
//     process gets; without either it gets the whole GPU. A simulated
//     context of SimulatedContextMiB is charged inside the cap.
//   - compute: the share's part is CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, or
//     HAMi-core's CUDA_DEVICE_SM_LIMIT_0 / CUDA_DEVICE_SM_LIMIT (with
//     LD_PRELOAD); without them an even time slice (50).
//
// A spec that lost a variable, a probe that could not start, a pipe the
// protocol does not survive: each shows in the report as it would on a GPU.
// Every figure is labelled simulated (the device name and the report's
// Mock flag); none is what a GPU does.

// SimulatedDeviceName is the device name simulated probes report.
const SimulatedDeviceName = "simulated (mock profile, no GPU)"

// SimulatedContextMiB is the context charge a simulated probe reports.
const SimulatedContextMiB = 500

func simEnv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// simulatedMemoryLimit is the memory cap env gives a process, in bytes.
func simulatedMemoryLimit(env []string) (uint64, bool, error) {
	if v, ok := simEnv(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"); ok {
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(v, "0="), "M"), 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q: want 0=<MiB>M", v)
		}
		return n << 20, true, nil
	}
	if v, ok := simEnv(env, "CUDA_DEVICE_MEMORY_LIMIT_0"); ok {
		n, err := strconv.ParseUint(strings.TrimSuffix(v, "m"), 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("CUDA_DEVICE_MEMORY_LIMIT_0=%q: want <MiB>m", v)
		}
		if lib, _ := simEnv(env, "LD_PRELOAD"); lib == "" {
			return 0, false, nil
		}
		return n << 20, true, nil
	}
	return 0, false, nil
}

// simulatedCores is the compute share env gives a process, in percent.
func simulatedCores(env []string) (float64, error) {
	keys := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}
	if lib, _ := simEnv(env, "LD_PRELOAD"); lib != "" {
		keys = append(keys, "CUDA_DEVICE_SM_LIMIT_0", "CUDA_DEVICE_SM_LIMIT")
	}
	for _, k := range keys {
		if v, ok := simEnv(env, k); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 || f > 100 {
				return 0, fmt.Errorf("%s=%q: want a percentage", k, v)
			}
			return f, nil
		}
	}
	return 50, nil
}

func simulatedDevice(env []string, gpuBytes uint64) (cuda.DeviceInfo, error) {
	if v, _ := simEnv(env, "CUDA_VISIBLE_DEVICES"); v == "" {
		return cuda.DeviceInfo{}, errors.New("CUDA_VISIBLE_DEVICES is not set: the probe would see every GPU")
	}
	return cuda.DeviceInfo{Name: SimulatedDeviceName, TotalBytes: gpuBytes, FreeBytes: gpuBytes}, nil
}

// RunSimulatedMemoryProbe is the memory probe of the mock mode: env is its
// environment (os.Environ()), gpuBytes the mock GPU's memory.
func RunSimulatedMemoryProbe(in io.Reader, out io.Writer, env []string, gpuBytes uint64) error {
	enc := json.NewEncoder(out)
	fail := func(err error) error {
		_ = enc.Encode(probeMessage{Event: "error", Error: "simulated probe: " + err.Error()})
		return err
	}
	info, err := simulatedDevice(env, gpuBytes)
	if err != nil {
		return fail(err)
	}
	total := gpuBytes
	limit, capped, err := simulatedMemoryLimit(env)
	if err != nil {
		return fail(err)
	}
	if capped {
		total = min(limit, gpuBytes)
	}
	const ctx = SimulatedContextMiB << 20
	if total <= ctx {
		return fail(fmt.Errorf("a %d MiB cap leaves nothing after the %d MiB context", total>>20, SimulatedContextMiB))
	}
	p := MemoryProbe{
		PID: os.Getpid(), Device: info, TotalBytes: total, FreeBeforeBytes: total - ctx,
		AllocatedBytes: total - ctx, Allocations: 1, LastError: "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2) [simulated]",
	}
	if err := enc.Encode(probeMessage{Event: "holding", Memory: &p}); err != nil {
		return err
	}
	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil && !errors.Is(err, io.EOF) {
		return fail(fmt.Errorf("wait for the check: %w", err))
	}
	return enc.Encode(probeMessage{Event: "result", Memory: &p})
}

// RunSimulatedComputeProbe is the compute probe of the mock mode: it waits
// for the start line as the real one does, then for d, and reports work in
// proportion to the share env gives it.
func RunSimulatedComputeProbe(in io.Reader, out io.Writer, env []string, d time.Duration) error {
	enc := json.NewEncoder(out)
	fail := func(err error) error {
		_ = enc.Encode(probeMessage{Event: "error", Error: "simulated probe: " + err.Error()})
		return err
	}
	info, err := simulatedDevice(env, 0)
	if err != nil {
		return fail(err)
	}
	share, err := simulatedCores(env)
	if err != nil {
		return fail(err)
	}
	p := ComputeProbe{PID: os.Getpid(), Device: info, Grid: 1000, Block: spinBlock, CyclesPerBlock: defaultClockKHz * spinKernelMillis}
	if err := enc.Encode(probeMessage{Event: "ready", Compute: &p}); err != nil {
		return err
	}
	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil {
		return fail(fmt.Errorf("wait for the start signal: %w", err))
	}
	start := time.Now()
	time.Sleep(d)
	p.Seconds = time.Since(start).Seconds()
	p.Kernels = int(share * 10)
	p.CountedBlocks = uint64(p.Kernels) * uint64(p.Grid)
	return enc.Encode(probeMessage{Event: "result", Compute: &p})
}
