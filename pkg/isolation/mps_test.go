package isolation

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// startRecorder is a DaemonRunner that records the inUse of every Start.
type startRecorder struct {
	*FakeRunner
	inUse []bool
}

func (r *startRecorder) Start(ctx context.Context, d Daemon, inUse bool) error {
	r.inUse = append(r.inUse, inUse)
	return r.FakeRunner.Start(ctx, d, inUse)
}

// TestMPSRefcount: one daemon per GPU, started by the first holder and
// stopped after the last; acquire and release are idempotent per claim.
func TestMPSRefcount(t *testing.T) {
	ctx := context.Background()
	r := &startRecorder{FakeRunner: NewFakeRunner()}
	m := NewMPS("/run/mps", r)
	for _, c := range []types.UID{"a", "b", "a"} {
		d, err := m.Acquire(ctx, "GPU-1", c)
		if err != nil {
			t.Fatal(err)
		}
		want := Daemon{UUID: "GPU-1", PipeDir: "/run/mps/GPU-1/pipe", ShmDir: "/run/mps/GPU-1/shm", LogDir: "/run/mps/GPU-1/log"}
		if diff := cmp.Diff(want, d); diff != "" {
			t.Errorf("daemon (-want +got):\n%s", diff)
		}
	}
	if s, _ := r.Counts(); s != 1 {
		t.Errorf("started %d daemons, want 1", s)
	}
	// The first holder may replace an outdated daemon; the second must not
	// (the first one's containers use it); the repeated acquire asks nothing.
	if diff := cmp.Diff([]bool{false, true}, r.inUse); diff != "" {
		t.Errorf("Start's inUse per acquire (-want +got):\n%s", diff)
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
	r.FailStarts(errors.New("no image"))
	if _, err := m.Acquire(ctx, "GPU-2", "c"); err == nil {
		t.Fatal("acquire succeeded without daemon")
	}
	if len(m.Holders()) != 0 {
		t.Errorf("holders after failed start: %v", m.Holders())
	}
	r.FailStarts(nil)
}

// TestMPSAcquireRestartsVanishedDaemon: a new holder of a GPU whose daemon
// is gone (its pod deleted by hand) gets a running daemon again, so prepare
// never returns a share without one.
func TestMPSAcquireRestartsVanishedDaemon(t *testing.T) {
	ctx := context.Background()
	r := NewFakeRunner()
	m := NewMPS("/run/mps", r)
	if _, err := m.Acquire(ctx, "GPU-1", "a"); err != nil {
		t.Fatal(err)
	}
	r.Kill("GPU-1")
	if _, err := m.Acquire(ctx, "GPU-1", "b"); err != nil {
		t.Fatal(err)
	}
	if running, _ := r.Running(ctx); !cmp.Equal(running, []string{"GPU-1"}) {
		t.Errorf("running after the second acquire: %v, want [GPU-1]", running)
	}
	if diff := cmp.Diff(map[string][]types.UID{"GPU-1": {"a", "b"}}, m.Holders()); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}
}

// TestMPSRestore: held daemons are started (as in use: never replaced),
// orphans stopped only when asked to.
func TestMPSRestore(t *testing.T) {
	ctx := context.Background()
	r := &startRecorder{FakeRunner: NewFakeRunner()}
	m := NewMPS("/run/mps", r)
	_ = r.FakeRunner.Start(ctx, m.Daemon("GPU-orphan"), false)
	_ = r.FakeRunner.Start(ctx, m.Daemon("GPU-3"), false)
	held := map[string][]types.UID{"GPU-3": {"d"}, "GPU-4": {"e", "f"}, "GPU-5": nil}

	if err := m.Restore(ctx, held, false); err != nil {
		t.Fatal(err)
	}
	running, _ := r.Running(ctx)
	if diff := cmp.Diff([]string{"GPU-3", "GPU-4", "GPU-orphan"}, running); diff != "" {
		t.Errorf("running without stopping orphans (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]bool{true, true}, r.inUse); diff != "" {
		t.Errorf("Start's inUse at restore (-want +got):\n%s", diff)
	}

	if err := m.Restore(ctx, held, true); err != nil {
		t.Fatal(err)
	}
	running, _ = r.Running(ctx)
	if diff := cmp.Diff([]string{"GPU-3", "GPU-4"}, running); diff != "" {
		t.Errorf("running after restore (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string][]types.UID{"GPU-3": {"d"}, "GPU-4": {"e", "f"}}, m.Holders()); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}

	// A daemon that cannot start is reported, and its holders are kept
	// (their claims are prepared; a later start may succeed).
	r.FailStarts(errors.New("quota"))
	if err := m.Restore(ctx, map[string][]types.UID{"GPU-6": {"g"}}, false); err == nil {
		t.Error("restore with a failing start: no error")
	}
	if diff := cmp.Diff(map[string][]types.UID{"GPU-6": {"g"}}, m.Holders()); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}
}

// TestMPSEdits: a client gets the pipe directory read-only and the shared
// memory, the limits of its share, and never the daemon's logs.
func TestMPSEdits(t *testing.T) {
	m := NewMPS(filepath.FromSlash("/var/lib/tessera/mps"), NewFakeRunner())
	g := GPU{UUID: "GPU-1", Minor: 1, Shared: true, MemoryLimit: 16 << 30, CoresLimit: 50}
	got, err := BackendEdits(Claim{GPUs: []GPU{g}, Isolation: configapi.IsolationMPS, MPS: m.Daemon("GPU-1")})
	if err != nil {
		t.Fatal(err)
	}
	want := cdispec.ContainerEdits{
		Env: []string{
			"CUDA_VISIBLE_DEVICES=GPU-1",
			"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16384M",
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
		},
		Mounts: []*cdispec.Mount{
			{HostPath: "/var/lib/tessera/mps/GPU-1/pipe", ContainerPath: "/tmp/nvidia-mps", Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev"}},
			{HostPath: "/var/lib/tessera/mps/GPU-1/shm", ContainerPath: "/dev/shm", Type: "bind", Options: []string{"bind", "rw", "nosuid", "nodev"}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MPS edits (-want +got):\n%s", diff)
	}
	if _, err := BackendEdits(Claim{GPUs: []GPU{g}, Isolation: configapi.IsolationMPS, MPS: Daemon{UUID: "GPU-1", PipeDir: "/p"}}); err == nil {
		t.Error("MPS edits without a shared-memory directory: no error")
	}
}

// inUseRunner records the inUse argument of every Start.
type inUseRunner struct {
	*FakeRunner
	inUse []bool
}

func (r *inUseRunner) Start(ctx context.Context, d Daemon, inUse bool) error {
	r.inUse = append(r.inUse, inUse)
	return r.FakeRunner.Start(ctx, d, inUse)
}

// After a restore that may have missed holders (stopOrphans false), the
// first acquire of a GPU without known holders must not let the runner
// replace its daemon, which may still serve clients; after a complete
// restore it may.
func TestMPSAcquireAfterIncompleteRestore(t *testing.T) {
	for _, complete := range []bool{false, true} {
		r := &inUseRunner{FakeRunner: NewFakeRunner()}
		m := NewMPS(t.TempDir(), r)
		if err := m.Restore(context.Background(), nil, complete); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Acquire(context.Background(), "GPU-1", "claim-1"); err != nil {
			t.Fatal(err)
		}
		if len(r.inUse) != 1 || r.inUse[0] != !complete {
			t.Errorf("restore complete=%v: Start inUse %v, want [%v]", complete, r.inUse, !complete)
		}
	}
}
