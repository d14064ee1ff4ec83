package isolation

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// TestMPSRefcount: one daemon per GPU, started by the first holder and
// stopped after the last; acquire and release are idempotent per claim.
func TestMPSRefcount(t *testing.T) {
	ctx := context.Background()
	r := NewFakeRunner()
	m := NewMPS("/run/mps", r)
	for _, c := range []types.UID{"a", "b", "a"} {
		d, err := m.Acquire(ctx, "GPU-1", c)
		if err != nil {
			t.Fatal(err)
		}
		if d.PipeDir != filepath.Join("/run/mps", "GPU-1", "pipe") || d.LogDir != filepath.Join("/run/mps", "GPU-1", "log") {
			t.Errorf("daemon dirs %+v", d)
		}
	}
	if s, _ := r.Counts(); s != 1 {
		t.Errorf("started %d daemons, want 1", s)
	}
	for _, c := range []types.UID{"a", "a", "unknown"} {
		if err := m.Release(ctx, "GPU-1", c); err != nil {
			t.Fatal(err)
		}
	}
	if running, _ := r.Running(ctx); len(running) != 1 {
		t.Errorf("daemon stopped while b holds it")
	}
	if err := m.Release(ctx, "GPU-1", "b"); err != nil {
		t.Fatal(err)
	}
	if s, st := r.Counts(); s != 1 || st != 1 {
		t.Errorf("starts/stops %d/%d, want 1/1", s, st)
	}

	// A failed start leaves no holder.
	r.FailStarts(errors.New("no binary"))
	if _, err := m.Acquire(ctx, "GPU-2", "c"); err == nil {
		t.Fatal("acquire succeeded without daemon")
	}
	if len(m.Holders()) != 0 {
		t.Errorf("holders after failed start: %v", m.Holders())
	}
	r.FailStarts(nil)

	// Restore: held daemons run, orphans stop.
	_ = r.Start(ctx, m.Daemon("GPU-orphan"))
	if err := m.Restore(ctx, map[string][]types.UID{"GPU-3": {"d"}}, true); err != nil {
		t.Fatal(err)
	}
	running, _ := r.Running(ctx)
	if diff := cmp.Diff([]string{"GPU-3"}, running); diff != "" {
		t.Errorf("running after restore (-want +got):\n%s", diff)
	}
}

func TestBackendEditsErrors(t *testing.T) {
	shareGPU := GPU{UUID: "GPU-1", Shared: true, MemoryLimit: 1 << 30, CoresLimit: 10}
	for name, tc := range map[string]struct {
		in   Claim
		want string
	}{
		"no GPUs":            {Claim{}, "no GPUs"},
		"bad limits":         {Claim{GPUs: []GPU{{UUID: "GPU-1", Shared: true}}}, "invalid limits"},
		"MPS without daemon": {Claim{GPUs: []GPU{shareGPU}, Isolation: configapi.IsolationMPS}, "no MPS daemon"},
		"HAMi unconfigured":  {Claim{GPUs: []GPU{shareGPU}, Isolation: configapi.IsolationHAMiCore}, "--hami-core-library is empty"},
		"unknown backend":    {Claim{GPUs: []GPU{shareGPU}, Isolation: "Magic"}, `unknown isolation "Magic"`},
	} {
		if _, err := BackendEdits(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", name, err, tc.want)
		}
	}
}

// TestDeviceEditsCompose: the edits of devices on different GPUs never set
// one variable to two values, so any set of them (what one container
// references) merges into exactly those GPUs and their limits, whatever the
// order the runtime applies them in.
func TestDeviceEditsCompose(t *testing.T) {
	devices := []GPU{
		{UUID: "GPU-a", Minor: 0, Shared: true, MemoryLimit: 1 << 30, CoresLimit: 10},
		{UUID: "GPU-b", Minor: 1},
		{UUID: "GPU-c", Minor: 2, Shared: true, MemoryLimit: 2 << 30, CoresLimit: 20},
	}
	for mask := 1; mask < 1<<len(devices); mask++ {
		merged := map[string]string{}
		var want []string
		for i, g := range devices {
			if mask&(1<<i) == 0 {
				continue
			}
			edits, err := DeviceEdits(g, false)
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range edits.Env {
				k, v, _ := strings.Cut(kv, "=")
				if old, ok := merged[k]; ok && old != v {
					t.Fatalf("devices %b: %s set to %q and %q", mask, k, old, v)
				}
				merged[k] = v
			}
			want = append(want, GPUVariable(g.Minor)+"="+g.UUID)
		}
		var got []string
		for k, v := range merged {
			if strings.HasPrefix(k, "TESSERA_GPU_") && !strings.HasSuffix(k, "_LIMIT") {
				got = append(got, k+"="+v)
			}
		}
		slices.Sort(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("devices %b: visible GPUs (-want +got):\n%s", mask, diff)
		}
		if merged["NVIDIA_VISIBLE_DEVICES"] != "void" {
			t.Errorf("devices %b: NVIDIA_VISIBLE_DEVICES=%q, want void", mask, merged["NVIDIA_VISIBLE_DEVICES"])
		}
	}
	if _, err := DeviceEdits(GPU{Minor: 3}, false); err == nil {
		t.Error("DeviceEdits without a UUID: no error")
	}
}

// TestHAMiCoreFailsClosed: a missing library is an error naming path and flag.
func TestHAMiCoreFailsClosed(t *testing.T) {
	dir := t.TempDir()
	preload, err := WritePreloadFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := HAMiCore{Library: filepath.Join(dir, "libvgpu.so"), PreloadFile: preload}
	err = h.Check()
	if err == nil || !strings.Contains(err.Error(), h.Library) || !strings.Contains(err.Error(), "--hami-core-library") {
		t.Errorf("Check = %v", err)
	}
}
