package gpucheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
)

// TestHostProcessEnv: a spec's edits become a host process's environment:
// container paths that a mount provides are rewritten to host paths, a
// preload list becomes LD_PRELOAD, CUDA_VISIBLE_DEVICES stands in for the
// device nodes, the host's CUDA variables are dropped, and what cannot be
// applied is listed.
func TestHostProcessEnv(t *testing.T) {
	dir := t.TempDir()
	preload := filepath.Join(dir, "ld.so.preload")
	if err := os.WriteFile(preload, []byte("/usr/local/vgpu/libvgpu.so\n/usr/lib/missing.so\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{
		Process: &oci.Process{Env: []string{
			"NVIDIA_VISIBLE_DEVICES=void",
			"TESSERA_GPU_3=GPU-three",
			"TESSERA_GPU_1=GPU-one",
			"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
			"REGION=/tmp/hami/region/cache",
			"OTHER=/tmp/nvidia-mps-not-under",
		}},
		Mounts: []oci.Mount{
			{Source: "/host/pipe", Destination: "/tmp/nvidia-mps"},
			{Source: "/host/lib/libvgpu.so", Destination: "/usr/local/vgpu/libvgpu.so"},
			{Source: preload, Destination: "/etc/ld.so.preload"},
			{Source: "/host/claims/x", Destination: "/tmp/hami"},
			{Source: "/usr/lib/libcuda.so.1", Destination: "/usr/lib/libcuda.so.1"},
			{Source: "/host/shm", Destination: "/dev/shm"},
		},
		Linux: &oci.Linux{Devices: []oci.LinuxDevice{{Path: "/dev/nvidia3"}}},
		Hooks: &oci.Hooks{CreateRuntime: []oci.Hook{{Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "apply-cuda-memory-limits"}}}},
	}
	host := []string{"PATH=/usr/bin", "CUDA_VISIBLE_DEVICES=0", "LD_PRELOAD=/evil.so", "NVIDIA_DRIVER_CAPABILITIES=all", "HOME=/root"}
	got := HostProcessEnv(spec, host)
	want := []string{
		"PATH=/usr/bin", "HOME=/root",
		"NVIDIA_VISIBLE_DEVICES=void",
		"TESSERA_GPU_3=GPU-three",
		"TESSERA_GPU_1=GPU-one",
		"CUDA_MPS_PIPE_DIRECTORY=/host/pipe",
		"REGION=/host/claims/x/region/cache",
		"OTHER=/tmp/nvidia-mps-not-under",
		"LD_PRELOAD=/host/lib/libvgpu.so",
		"CUDA_VISIBLE_DEVICES=GPU-one,GPU-three",
	}
	if diff := cmp.Diff(want, got.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	for _, want := range []string{"preloaded /usr/lib/missing.so: no mount provides it", "mount /host/shm at /dev/shm", "createRuntime hook nvidia-cdi-hook apply-cuda-memory-limits"} {
		if !slices.Contains(got.NotApplied, want) {
			t.Errorf("NotApplied %q lacks %q", got.NotApplied, want)
		}
	}
	for _, na := range got.NotApplied {
		if strings.Contains(na, "libcuda") || strings.Contains(na, "/tmp/nvidia-mps") || strings.Contains(na, "/tmp/hami") {
			t.Errorf("NotApplied lists %q, which was applied", na)
		}
	}
	if len(got.Emulated) != 5 {
		t.Errorf("Emulated = %q, want the two rewritten paths, LD_PRELOAD, CUDA_VISIBLE_DEVICES and the device nodes", got.Emulated)
	}
}

// TestHostProcessEnvKeepsSpecVisibleDevices: an enforced share's spec sets
// CUDA_VISIBLE_DEVICES itself; the check does not override it.
func TestHostProcessEnvKeepsSpecVisibleDevices(t *testing.T) {
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"TESSERA_GPU_0=GPU-a", "TESSERA_GPU_1=GPU-b", "CUDA_VISIBLE_DEVICES=GPU-b"}}}
	got := HostProcessEnv(spec, nil)
	if v, _ := envValue(got.Env, "CUDA_VISIBLE_DEVICES"); v != "GPU-b" || strings.Count(strings.Join(got.Env, " "), "CUDA_VISIBLE_DEVICES=") != 1 {
		t.Errorf("env %q, want the spec's CUDA_VISIBLE_DEVICES=GPU-b only", got.Env)
	}
}
