package gpucheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/internal/gpucheck/cuda"
)

// probeModeVar makes the test binary act as a probe process (TestMain), so
// that ExecProber runs real child processes.
const probeModeVar = "TESSERA_GPUCHECK_TEST_PROBE"

func TestMain(m *testing.M) {
	switch os.Getenv(probeModeVar) {
	case "":
		os.Exit(m.Run())
	case "real":
		// The real probes: on a machine without the driver they fail to
		// load libcuda.so.1 and say so on stdout.
		var err error
		switch os.Args[len(os.Args)-1] {
		case "memory":
			err = RunMemoryProbe(os.Stdin, os.Stdout, MemoryOptions{})
		default:
			err = RunComputeProbe(os.Stdin, os.Stdout, 100*time.Millisecond)
		}
		if err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	case "scripted":
		// A stand-in that speaks the protocol: it holds memory until told,
		// and spins after the start signal.
		enc := json.NewEncoder(os.Stdout)
		var line string
		if strings.HasSuffix(strings.Join(os.Args, " "), "memory") {
			_ = enc.Encode(probeMessage{Event: "holding", Memory: &MemoryProbe{PID: os.Getpid(), AllocatedBytes: 42 << 20}})
			_, _ = fmt.Scanln(&line)
			_ = enc.Encode(probeMessage{Event: "result", Memory: &MemoryProbe{PID: os.Getpid(), AllocatedBytes: 42 << 20}})
			os.Exit(0)
		}
		fmt.Println("a library's own chatter on stdout")
		_ = enc.Encode(probeMessage{Event: "ready", Compute: &ComputeProbe{PID: os.Getpid()}})
		_, _ = fmt.Scanln(&line)
		_ = enc.Encode(probeMessage{Event: "result", Compute: &ComputeProbe{PID: os.Getpid(), CountedBlocks: 7, Kernels: 1, Grid: 7}})
		os.Exit(0)
	}
}

func selfProber(mode string) (ExecProber, []string) {
	return ExecProber{Command: []string{os.Args[0], "-test.run=^$"}, StartTimeout: 30 * time.Second}, append(os.Environ(), probeModeVar+"="+mode)
}

// TestProbesWithoutDriver: on a machine without the NVIDIA driver (this
// one, in CI) both probes fail fast with an error that names libcuda.so.1;
// on a GPU machine they run.
func TestProbesWithoutDriver(t *testing.T) {
	if lib, err := cuda.Open(); err == nil {
		_ = lib
		t.Skip("libcuda.so.1 loads here: the GPU check itself covers this machine")
	} else if !errors.Is(err, cuda.ErrNotLoaded) || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Fatalf("cuda.Open = %v, want an error wrapping ErrNotLoaded that names libcuda.so.1", err)
	}
	prober, env := selfProber("real")
	ctx := context.Background()
	if _, err := prober.Memory(ctx, "GPU-x", env); err == nil || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Errorf("memory probe = %v, want an error naming libcuda.so.1", err)
	}
	start := time.Now()
	if _, err := prober.Compute(ctx, [][]string{env, env}, time.Second); err == nil || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Errorf("compute probes = %v, want an error naming libcuda.so.1", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the failing probes took %s: they must fail fast", d)
	}
}

// TestExecProberProtocol: the check reads the memory probe's process
// memory from NVML while the probe holds its allocations, and starts both
// compute probes only once both are ready.
func TestExecProberProtocol(t *testing.T) {
	prober, env := selfProber("scripted")
	var askedPID int
	prober.ProcessMemory = func(uuid string, pid int) (uint64, bool) {
		if uuid != "GPU-x" {
			t.Errorf("ProcessMemory for %q, want GPU-x", uuid)
		}
		askedPID = pid
		return 99 << 20, true
	}
	m, err := prober.Memory(context.Background(), "GPU-x", env)
	if err != nil {
		t.Fatal(err)
	}
	if m.AllocatedBytes != 42<<20 || !m.ProcessBytesKnown || m.ProcessBytes != 99<<20 || askedPID != m.PID {
		t.Errorf("memory probe %+v (NVML asked for pid %d)", m, askedPID)
	}
	res, err := prober.Compute(context.Background(), [][]string{env, env}, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].CountedBlocks != 7 || res[0].PID == res[1].PID {
		t.Errorf("compute probes %+v", res)
	}
}
