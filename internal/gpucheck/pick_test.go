package gpucheck

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
)

func migEnabled() (int, int, nvml.Return) {
	return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
}

// TestRunSkipsMIGGPUs: without --gpu the check takes the first GPU not in
// MIG mode instead of stopping on GPU 0; a MIG GPU asked for by minor, or a
// node of MIG GPUs only, is an error naming them.
func TestRunSkipsMIGGPUs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	cfg := mockConfig(t, nil)
	node := cfg.NVML.(*gpu.MockNode)
	node.Devices[0].GetMigModeFunc = migEnabled
	node.Devices[1].GetMigModeFunc = migEnabled
	cfg.GPUMinor = -1
	r, err := Run(ctx, cfg, DefaultTargets)
	if err != nil {
		t.Fatalf("Run with GPUs 0 and 1 in MIG mode: %v", err)
	}
	if r.GPU.Minor != 2 {
		t.Errorf("checked gpu-%d, want gpu-2 (the first not in MIG mode)", r.GPU.Minor)
	}

	cfg = mockConfig(t, nil)
	cfg.NVML.(*gpu.MockNode).Devices[2].GetMigModeFunc = migEnabled
	if _, err := Run(ctx, cfg, DefaultTargets); err == nil || !strings.Contains(err.Error(), "--gpu 2: GPU gpu-2") || !strings.Contains(err.Error(), "MIG enabled") {
		t.Errorf("--gpu 2 in MIG mode: %v, want an error naming gpu-2 and MIG", err)
	}

	// A node of MIG GPUs only checks no share, says why, and still runs
	// the MIG checks.
	cfg = mockConfig(t, nil)
	cfg.GPUMinor = -1
	for _, d := range cfg.NVML.(*gpu.MockNode).Devices {
		d.GetMigModeFunc = migEnabled
	}
	r, err = Run(ctx, cfg, DefaultTargets)
	if err != nil {
		t.Fatalf("all GPUs in MIG mode: %v", err)
	}
	for _, b := range r.Backends {
		if !strings.Contains(b.Skipped, "every GPU is in MIG mode") {
			t.Errorf("backend %s: %+v, want skipped because every GPU is in MIG mode", b.Isolation, b)
		}
	}
	if c := checkNamed(t, r, migCreateCheckName); c.Status == "" {
		t.Errorf("no MIG check outcome: %+v", c)
	}
}

// TestRunRefusesUnavailableMemory: NVML_VALUE_NOT_AVAILABLE is not a
// memory size.
func TestRunRefusesUnavailableMemory(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	cfg := mockConfig(t, nil)
	cfg.NVML.(*gpu.MockNode).Devices[2].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{Total: ^uint64(0), Free: ^uint64(0)}, nvml.SUCCESS
	}
	// Discovery itself refuses such a GPU (pkg/gpu); the check says why
	// the GPU asked for is not there.
	if _, err := Run(ctx, cfg, DefaultTargets); err == nil || !strings.Contains(err.Error(), "--gpu 2: no such GPU") || !strings.Contains(err.Error(), "GPU index 2") || !strings.Contains(err.Error(), "not a memory size") {
		t.Errorf("Run = %v, want a refusal of gpu-2 that names its memory", err)
	}
	// pickGPU refuses it too, should discovery ever pass one on.
	if _, err := pickGPU([]gpu.GPU{{Minor: 2, UUID: "GPU-x", MemoryBytes: ^uint64(0)}}, 2); err == nil || !strings.Contains(err.Error(), "no usable memory size") {
		t.Errorf("pickGPU of a GPU with NVML's not-available memory: %v", err)
	}
}

// TestNVMLProcessMemoryNotAvailable: a process whose memory NVML reports as
// NVML_VALUE_NOT_AVAILABLE has no NVML figure (the probe's own stand).
func TestNVMLProcessMemoryNotAvailable(t *testing.T) {
	node := gputest.MockNode(t, "hgx-h100")
	uuid, _ := node.Devices[2].GetUUID()
	if err := node.SetProcesses(2, []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: ^uint64(0)}, {Pid: 4343, UsedGpuMemory: 3 << 30}}); err != nil {
		t.Fatal(err)
	}
	read := NVMLProcessMemory(node)
	if b, ok := read(uuid, 4242); ok {
		t.Errorf("not-available memory read as %d bytes", b)
	}
	if b, ok := read(uuid, 4343); !ok || b != 3<<30 {
		t.Errorf("a real figure: %d, %v; want 3 GiB", b, ok)
	}
}
