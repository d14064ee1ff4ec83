package gpucheck

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
)

// backendProber is a Prober that behaves as a GPU under each backend would,
// reading only the environment the check built from the CDI spec: MPS and
// HAMi-core cap memory at their variables' limits, MPS splits compute by
// the active thread percentage and HAMi-core by its SM limit; without them
// (Advisory) a process gets the whole GPU and an even time slice. So the
// report's figures pass only if the spec's variables reached the probe.
type backendProber struct {
	t         *testing.T
	gpuMemory uint64
	uuid      string
	// overshoot is added to every capped memory figure (a broken backend).
	overshoot uint64

	mu   sync.Mutex
	envs [][]string
}

func envValue(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

func (b *backendProber) record(env []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.envs = append(b.envs, env)
}

// memoryLimit is the backend's cap in bytes, if the env sets one.
func (b *backendProber) memoryLimit(env []string) (uint64, bool) {
	if v, ok := envValue(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"); ok {
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(v, "0="), "M"), 10, 64)
		if err != nil {
			b.t.Errorf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q", v)
		}
		return n << 20, true
	}
	if v, ok := envValue(env, "CUDA_DEVICE_MEMORY_LIMIT_0"); ok {
		n, err := strconv.ParseUint(strings.TrimSuffix(v, "m"), 10, 64)
		if err != nil {
			b.t.Errorf("CUDA_DEVICE_MEMORY_LIMIT_0=%q", v)
		}
		if lib, _ := envValue(env, "LD_PRELOAD"); lib == "" {
			return 0, false // HAMi-core not loaded: nothing enforces the variable
		}
		return n << 20, true
	}
	return 0, false
}

func (b *backendProber) Memory(_ context.Context, uuid string, env []string) (MemoryProbe, error) {
	b.record(env)
	if v, _ := envValue(env, "CUDA_VISIBLE_DEVICES"); v != b.uuid || uuid != b.uuid {
		return MemoryProbe{}, fmt.Errorf("probe would see GPU %q (asked for %q), want %s", v, uuid, b.uuid)
	}
	const context = 500 << 20
	p := MemoryProbe{PID: 4242, TotalBytes: b.gpuMemory, FreeBeforeBytes: b.gpuMemory - context}
	if limit, ok := b.memoryLimit(env); ok {
		p.TotalBytes, p.FreeBeforeBytes = limit, limit-context
		p.ProcessBytes, p.ProcessBytesKnown = limit+b.overshoot, true
	} else {
		p.ProcessBytes, p.ProcessBytesKnown = b.gpuMemory, true
	}
	p.AllocatedBytes = p.ProcessBytes - context
	return p, nil
}

func (b *backendProber) Compute(_ context.Context, envs [][]string, d time.Duration) ([]ComputeProbe, error) {
	var out []ComputeProbe
	for _, env := range envs {
		b.record(env)
		share := 50.0
		if v, ok := envValue(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); ok {
			share, _ = strconv.ParseFloat(v, 64)
		} else if v, ok := envValue(env, "CUDA_DEVICE_SM_LIMIT_0"); ok {
			// HAMi-core reads the per-index variable before the plain one.
			share, _ = strconv.ParseFloat(v, 64)
		} else if v, ok := envValue(env, "CUDA_DEVICE_SM_LIMIT"); ok {
			share, _ = strconv.ParseFloat(v, 64)
		}
		blocks := uint64(share * 1000)
		out = append(out, ComputeProbe{Grid: 1000, Kernels: int(share), CountedBlocks: blocks, CyclesPerBlock: 1e6, Seconds: d.Seconds()})
	}
	return out, nil
}

// mockConfig is a check of the hgx-h100 mock profile's gpu-2 with every
// backend, HAMi-core's library being a file in the work directory.
func mockConfig(t *testing.T, prober Prober) Config {
	t.Helper()
	return mockConfigOf(t, "hgx-h100", prober)
}

// mockConfigOf is mockConfig on another mock profile.
func mockConfigOf(t *testing.T, profile string, prober Prober) Config {
	t.Helper()
	lib := gputest.MockNode(t, profile)
	if err := gpu.Open(lib); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hami := filepath.Join(dir, "libvgpu.so")
	if err := os.WriteFile(hami, []byte("\x7fELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Config{
		NodeName: "gpu-node-1", NVML: lib, Mock: true, WorkDir: filepath.Join(dir, "w"), GPUMinor: 2,
		ShareMemory: 4 << 30, Cores: [2]int64{30, 70}, Isolations: DefaultIsolations,
		HAMiCoreLibrary: hami, DriverRoot: "/", Prober: prober, ComputeTime: time.Second,
	}
}

func backend(t *testing.T, r *Report, iso configapi.Isolation) BackendReport {
	t.Helper()
	i := slices.IndexFunc(r.Backends, func(b BackendReport) bool { return b.Isolation == iso })
	if i < 0 {
		t.Fatalf("no %s in the report", iso)
	}
	return r.Backends[i]
}

// TestRunMock runs the whole check short of dlopen on a mock node: real
// discovery over the mock NVML, the model, the plugin's prepare, the CDI
// spec read back by the CDI library and applied to a host process, and the
// evaluation of what the probes (here a stand-in that obeys the spec's
// variables) report.
func TestRunMock(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	gpuUUID, _ := gputest.MockNode(t, "hgx-h100").Devices[2].GetUUID()
	prober := &backendProber{t: t, gpuMemory: 81559 << 20, uuid: gpuUUID}
	cfg := mockConfig(t, prober)
	r, err := Run(ctx, cfg, DefaultTargets)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var table strings.Builder
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", table.String())

	if len(r.Node.GPUs) != 8 || r.Node.ResourceSlices != 2 || len(r.Node.Devices) != 16 {
		t.Errorf("node summary: %d GPUs, %d slices, %d devices; want 8, 2, 16", len(r.Node.GPUs), r.Node.ResourceSlices, len(r.Node.Devices))
	}
	if r.GPU.Minor != 2 || r.GPU.UUID != gpuUUID {
		t.Errorf("checked GPU %+v, want gpu-2 %s", r.GPU, gpuUUID)
	}
	if !r.Pass || r.Measured != 6 {
		t.Errorf("pass %v with %d measured targets, want pass with 6 (MPS and HAMiCore: 2 memory + 1 compute each)", r.Pass, r.Measured)
	}

	adv := backend(t, r, configapi.IsolationAdvisory)
	if adv.Error != "" || adv.Skipped != "" || len(adv.Shares) != 2 {
		t.Fatalf("Advisory: %+v", adv)
	}
	if m := adv.Shares[0].Memory; m.Verdict != NotEnforced || m.ObtainedMiB != 81559 {
		t.Errorf("Advisory memory %+v: want the whole GPU, not enforced", m)
	}
	if c := adv.Compute; c.Verdict != NotEnforced || c.MeasuredPercent != [2]float64{50, 50} {
		t.Errorf("Advisory compute %+v: want an even split, not enforced", c)
	}

	mps := backend(t, r, configapi.IsolationMPS)
	if mps.Error != "" || mps.Skipped != "" {
		t.Fatalf("MPS: %+v", mps)
	}
	for _, s := range mps.Shares {
		if m := s.Memory; m.Verdict != Pass || m.LimitMiB != 4096 || m.ObtainedMiB != 4096 || m.ObtainedFrom != "nvml" {
			t.Errorf("MPS %s memory %+v: want 4096 MiB of 4096, pass", s.Claim, m)
		}
		pipe, _ := envValue(s.Env, "CUDA_MPS_PIPE_DIRECTORY")
		if !strings.HasPrefix(pipe, cfg.WorkDir+"/mps/") {
			t.Errorf("MPS %s: CUDA_MPS_PIPE_DIRECTORY=%q, want the daemon's host pipe directory under %s", s.Claim, pipe, cfg.WorkDir)
		}
		if len(s.Attested) == 0 || !strings.Contains(string(s.Attested), `"isolation":"MPS"`) {
			t.Errorf("MPS %s: attestation %s does not name MPS", s.Claim, s.Attested)
		}
	}
	if c := mps.Compute; c.Verdict != Pass || c.MeasuredPercent != [2]float64{30, 70} || c.ExpectedPercent != [2]float64{30, 70} {
		t.Errorf("MPS compute %+v: want 30/70, pass", c)
	}

	hami := backend(t, r, configapi.IsolationHAMiCore)
	if hami.Error != "" || hami.Skipped != "" {
		t.Fatalf("HAMiCore: %+v", hami)
	}
	for _, s := range hami.Shares {
		if preload, _ := envValue(s.Env, "LD_PRELOAD"); preload != cfg.HAMiCoreLibrary {
			t.Errorf("HAMiCore %s: LD_PRELOAD=%q, want the host library %s (from the spec's ld.so.preload mount)", s.Claim, preload, cfg.HAMiCoreLibrary)
		}
		if m := s.Memory; m.Verdict != Pass {
			t.Errorf("HAMiCore %s memory %+v: want pass", s.Claim, m)
		}
		if region, _ := envValue(s.Env, "CUDA_DEVICE_MEMORY_SHARED_CACHE"); !strings.HasPrefix(region, cfg.WorkDir+"/") {
			t.Errorf("HAMiCore %s: CUDA_DEVICE_MEMORY_SHARED_CACHE=%q, want the claim's host directory under %s", s.Claim, region, cfg.WorkDir)
		}
	}

	dm := backend(t, r, IsolationDriverMemory)
	if dm.Error != "" || !strings.Contains(dm.Skipped, "cannot enforce driver memory limits") || !strings.Contains(dm.Skipped, "refused") {
		t.Errorf("DriverMemory on a mock node: %+v, want skipped because the node cannot, and the plugin refusing", dm)
	}

	// Nothing is left prepared: no CDI spec, no checkpoint entry.
	specs, _ := filepath.Glob(filepath.Join(cfg.WorkDir, "cdi", "*"))
	if len(specs) != 0 {
		t.Errorf("CDI specs left after the check: %v", specs)
	}
}

// TestRunMissedTargets: a backend that lets a process take 2 MiB more than
// its limit misses the target and fails the check.
func TestRunMissedTargets(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	gpuUUID, _ := gputest.MockNode(t, "hgx-h100").Devices[2].GetUUID()
	cfg := mockConfig(t, &backendProber{t: t, gpuMemory: 81559 << 20, uuid: gpuUUID, overshoot: 2 << 20})
	cfg.Isolations = []configapi.Isolation{configapi.IsolationMPS}
	r, err := Run(ctx, cfg, DefaultTargets)
	if err != nil {
		t.Fatal(err)
	}
	if r.Pass {
		t.Fatal("a 2 MiB overshoot passed")
	}
	if m := r.Backends[0].Shares[0].Memory; m.Verdict != Miss || m.ObtainedMiB != 4098 {
		t.Errorf("memory %+v, want 4098 MiB, missed", m)
	}
	var table strings.Builder
	_ = r.WriteTable(&table)
	if !strings.Contains(table.String(), "MISS") || !strings.Contains(table.String(), "a target was missed") {
		t.Errorf("table does not show the miss:\n%s", table.String())
	}
}

// TestRunRefusesBadInput: mistakes in the check's own input are errors that
// name what is wrong.
func TestRunRefusesBadInput(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for name, tc := range map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"unknown GPU":       {func(c *Config) { c.GPUMinor = 9 }, "--gpu 9: no such GPU"},
		"unknown isolation": {func(c *Config) { c.Isolations = []configapi.Isolation{"Magic"} }, `unknown isolation "Magic"`},
		"too many cores":    {func(c *Config) { c.Cores = [2]int64{60, 70} }, "exceed the GPU's 100%"},
		"shares too big":    {func(c *Config) { c.ShareMemory = 60 << 30 }, "do not fit"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := mockConfig(t, nil)
			tc.mutate(&cfg)
			if _, err := Run(ctx, cfg, DefaultTargets); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestRunRefusesBusyGPU: other processes on the GPU would distort the
// figures, so the check refuses to probe unless told to.
func TestRunRefusesBusyGPU(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	cfg := mockConfig(t, &backendProber{t: t})
	node := cfg.NVML.(*gpu.MockNode)
	if err := node.SetProcesses(2, []nvml.ProcessInfo{{Pid: 4711, UsedGpuMemory: 1 << 30}}); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(ctx, cfg, DefaultTargets); err == nil || !strings.Contains(err.Error(), "compute process(es) already run on GPU gpu-2") {
		t.Fatalf("Run = %v, want a refusal naming the busy GPU", err)
	}
}
