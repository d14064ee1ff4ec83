package isolation

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// wantCalls compares the calls in log with want.
func wantCalls(t *testing.T, what string, log []string, want ...string) {
	t.Helper()
	if diff := cmp.Diff(want, log); diff != "" {
		t.Errorf("%s (-want +got):\n%s", what, diff)
	}
}

// wantGone fails the test unless path does not exist.
func wantGone(t *testing.T, path, what string) {
	t.Helper()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: %v, want it gone", what, err)
	}
}

// TestMPSRefcount: one daemon per GPU, started by the first holder and
// stopped after the last; acquire and release are idempotent per claim.
func TestMPSRefcount(t *testing.T) {
	ctx := context.Background()
	r := &startRecorder{FakeRunner: NewFakeRunner()}
	root := t.TempDir()
	m := NewMPS(root, r)
	for _, c := range []types.UID{"a", "b", "a"} {
		d, err := m.Acquire(ctx, "GPU-1", "team-a", c)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(root, "GPU-1", "domains", "team-a")
		want := Daemon{UUID: "GPU-1", Domain: "team-a", Dir: dir, PipeDir: filepath.Join(dir, "pipe"), ShmDir: filepath.Join(dir, "shm"), LogDir: filepath.Join(dir, "log")}
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
		if err := m.Release(ctx, "GPU-1", "team-a", c); err != nil {
			t.Fatal(err)
		}
	}
	if running, _ := r.Running(ctx); len(running) != 1 {
		t.Errorf("daemon stopped while b holds it")
	}
	if err := m.Release(ctx, "GPU-1", "team-a", "b"); err != nil {
		t.Fatal(err)
	}
	if s, st := r.Counts(); s != 1 || st != 1 {
		t.Errorf("starts/stops %d/%d, want 1/1", s, st)
	}

	// A failed start leaves no holder.
	r.FailStarts(errors.New("no image"))
	if _, err := m.Acquire(ctx, "GPU-2", "team-a", "c"); err == nil {
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
	m := NewMPS(t.TempDir(), r)
	if _, err := m.Acquire(ctx, "GPU-1", "ns", "a"); err != nil {
		t.Fatal(err)
	}
	r.Kill(DaemonKey{"GPU-1", "ns"})
	if _, err := m.Acquire(ctx, "GPU-1", "ns", "b"); err != nil {
		t.Fatal(err)
	}
	if running, _ := r.Running(ctx); !cmp.Equal(running, []DaemonKey{{"GPU-1", "ns"}}) {
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
	m := NewMPS(t.TempDir(), r)
	_ = r.FakeRunner.Start(ctx, m.Daemon("GPU-orphan", "ns"), false)
	_ = r.FakeRunner.Start(ctx, m.Daemon("GPU-3", ""), false)
	// GPU-3's daemon is the GPU-wide one of an earlier release (a record
	// without a domain); GPU-4 has two domains.
	held := map[DaemonKey][]types.UID{{"GPU-3", ""}: {"d"}, {"GPU-4", "x"}: {"e"}, {"GPU-4", "y"}: {"f"}, {"GPU-5", "x"}: nil}

	if err := m.Restore(ctx, held, false); err != nil {
		t.Fatal(err)
	}
	running, _ := r.Running(ctx)
	if diff := cmp.Diff([]DaemonKey{{"GPU-3", ""}, {"GPU-4", "x"}, {"GPU-4", "y"}, {"GPU-orphan", "ns"}}, running); diff != "" {
		t.Errorf("running without stopping orphans (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]bool{true, true, true}, r.inUse); diff != "" {
		t.Errorf("Start's inUse at restore (-want +got):\n%s", diff)
	}

	if err := m.Restore(ctx, held, true); err != nil {
		t.Fatal(err)
	}
	running, _ = r.Running(ctx)
	if diff := cmp.Diff([]DaemonKey{{"GPU-3", ""}, {"GPU-4", "x"}, {"GPU-4", "y"}}, running); diff != "" {
		t.Errorf("running after restore (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string][]types.UID{"GPU-3": {"d"}, "GPU-4": {"e", "f"}}, m.Holders()); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}

	// A daemon that cannot start is reported, and its holders are kept
	// (their claims are prepared; a later start may succeed).
	r.FailStarts(errors.New("quota"))
	if err := m.Restore(ctx, map[DaemonKey][]types.UID{{"GPU-6", "x"}: {"g"}}, false); err == nil {
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
	got, err := BackendEdits(Claim{GPUs: []GPU{g}, Isolation: configapi.IsolationMPS, MPS: m.Daemon("GPU-1", "team-a")})
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
			{HostPath: "/var/lib/tessera/mps/GPU-1/domains/team-a/pipe", ContainerPath: "/tmp/nvidia-mps", Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev"}},
			{HostPath: "/var/lib/tessera/mps/GPU-1/domains/team-a/shm", ContainerPath: "/dev/shm", Type: "bind", Options: []string{"bind", "rw", "nosuid", "nodev"}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MPS edits (-want +got):\n%s", diff)
	}
	if _, err := BackendEdits(Claim{GPUs: []GPU{g}, Isolation: configapi.IsolationMPS, MPS: Daemon{UUID: "GPU-1", PipeDir: "/p"}}); err == nil {
		t.Error("MPS edits without a shared-memory directory: no error")
	}
}

// After a restore that may have missed holders (stopOrphans false), the
// first acquire of a GPU without known holders must not let the runner
// replace its daemon, which may still serve clients; after a complete
// restore it may.
func TestMPSAcquireAfterIncompleteRestore(t *testing.T) {
	for _, complete := range []bool{false, true} {
		r := &startRecorder{FakeRunner: NewFakeRunner()}
		m := NewMPS(t.TempDir(), r)
		if err := m.Restore(context.Background(), nil, complete); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Acquire(context.Background(), "GPU-1", "ns", "claim-1"); err != nil {
			t.Fatal(err)
		}
		if len(r.inUse) != 1 || r.inUse[0] != !complete {
			t.Errorf("restore complete=%v: Start inUse %v, want [%v]", complete, r.inUse, !complete)
		}
	}
}

// shmRecorder is a ShmMounter that records its calls, together with the
// runner's, in one log so that tests can check their order.
type shmRecorder struct {
	log *[]string
}

func (s shmRecorder) Mount(dir string, size int64) error {
	*s.log = append(*s.log, fmt.Sprintf("mount %s %d", dir, size))
	return os.MkdirAll(dir, 0o755)
}

func (s shmRecorder) Unmount(dir string) error {
	*s.log = append(*s.log, "unmount "+dir)
	return nil
}

type loggingRunner struct {
	*FakeRunner
	log *[]string
}

func (r loggingRunner) Start(ctx context.Context, d Daemon, inUse bool) error {
	*r.log = append(*r.log, "start "+d.Key().String())
	return r.FakeRunner.Start(ctx, d, inUse)
}

func (r loggingRunner) Stop(ctx context.Context, d Daemon) error {
	*r.log = append(*r.log, "stop "+d.Key().String())
	return r.FakeRunner.Stop(ctx, d)
}

// TestMPSDomainsNeverShare: two namespaces with MPS shares of one GPU get two
// daemons with disjoint directories (pipe, shared memory, logs); the last
// claim of one domain stops only that domain's daemon. Before per-domain
// daemons, both claims got root/<uuid>/shm and one daemon.
func TestMPSDomainsNeverShare(t *testing.T) {
	ctx := context.Background()
	r := NewFakeRunner()
	root := t.TempDir()
	m := NewMPS(root, r)
	a, err := m.Acquire(ctx, "GPU-1", "team-a", "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Acquire(ctx, "GPU-1", "team-b", "b")
	if err != nil {
		t.Fatal(err)
	}
	for _, pa := range []string{a.Dir, a.PipeDir, a.ShmDir, a.LogDir} {
		for _, pb := range []string{b.Dir, b.PipeDir, b.ShmDir, b.LogDir} {
			if rel, err := filepath.Rel(pa, pb); err == nil && !strings.HasPrefix(rel, "..") {
				t.Errorf("domain team-b's %s is inside team-a's %s", pb, pa)
			}
			if rel, err := filepath.Rel(pb, pa); err == nil && !strings.HasPrefix(rel, "..") {
				t.Errorf("domain team-a's %s is inside team-b's %s", pa, pb)
			}
		}
	}
	if running, _ := r.Running(ctx); !cmp.Equal(running, []DaemonKey{{"GPU-1", "team-a"}, {"GPU-1", "team-b"}}) {
		t.Errorf("running daemons %v, want one per domain", running)
	}
	if err := m.Release(ctx, "GPU-1", "team-a", "a"); err != nil {
		t.Fatal(err)
	}
	if running, _ := r.Running(ctx); !cmp.Equal(running, []DaemonKey{{"GPU-1", "team-b"}}) {
		t.Errorf("running after team-a's last release: %v, want only team-b's", running)
	}
	for _, bad := range []string{"", "Team-A", "a/b", "..", strings.Repeat("x", 64)} {
		if _, err := m.Acquire(ctx, "GPU-1", bad, "c"); err == nil {
			t.Errorf("acquire for domain %q: no error", bad)
		}
	}
}

// TestMPSShmLifecycle: a domain's tmpfs is mounted before its daemon starts
// (the daemon and its clients bind the directory, so it must already be the
// tmpfs), and unmounted and removed with the directories after the daemon
// stops; a restore mounts what is held and removes what is not.
func TestMPSShmLifecycle(t *testing.T) {
	ctx := context.Background()
	var log []string
	r := loggingRunner{FakeRunner: NewFakeRunner(), log: &log}
	root := t.TempDir()
	m := NewMPSWith(root, r, MPSOptions{Shm: shmRecorder{log: &log}, ShmSize: 64 << 20})
	d, err := m.Acquire(ctx, "GPU-1", "team-a", "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(ctx, "GPU-1", "team-a", "b"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.ShmDir, "segment"), []byte("tensor"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []types.UID{"a", "b"} {
		if err := m.Release(ctx, "GPU-1", "team-a", c); err != nil {
			t.Fatal(err)
		}
	}
	wantCalls(t, "calls", log,
		"mount "+d.ShmDir+" 67108864",
		"start GPU-1/team-a",
		"mount "+d.ShmDir+" 67108864", // the second holder makes sure it is there
		"start GPU-1/team-a",
		"stop GPU-1/team-a",
		"unmount "+d.ShmDir,
	)
	wantGone(t, d.Dir, "the domain's directory after its last release")

	// A failed start leaves nothing mounted or on disk.
	log = nil
	r.FailStarts(errors.New("no image"))
	if _, err := m.Acquire(ctx, "GPU-1", "team-b", "c"); err == nil {
		t.Fatal("acquire succeeded without a daemon")
	}
	r.FailStarts(nil)
	b := m.Daemon("GPU-1", "team-b")
	wantCalls(t, "calls of a failed acquire", log, "mount "+b.ShmDir+" 67108864", "start GPU-1/team-b", "unmount "+b.ShmDir)
	wantGone(t, b.Dir, "directory of a daemon that did not start")

	// A restore mounts the held domain's tmpfs again; a complete one
	// removes the directories of a domain nobody holds (a crash between
	// stopping a daemon and cleaning up after it). The GPU-wide daemon of
	// an earlier release gets no tmpfs: its clients already share its
	// plain directory.
	log = nil
	orphan := m.Daemon("GPU-2", "gone")
	if err := os.MkdirAll(orphan.ShmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	held := map[DaemonKey][]types.UID{{"GPU-1", "team-a"}: {"a"}, {"GPU-3", ""}: {"old"}}
	if err := m.Restore(ctx, held, true); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, "calls of restore", log, "mount "+d.ShmDir+" 67108864", "start GPU-1/team-a", "start GPU-3", "unmount "+orphan.ShmDir)
	wantGone(t, orphan.Dir, "orphaned domain directory after restore")
	if _, err := os.Stat(d.ShmDir); err != nil {
		t.Errorf("held domain's shared memory after restore: %v", err)
	}
}

// TestMPSEditsServerReserve: each MPS client's pinned-memory limit leaves
// one MPS server's context out of its share, so that shares filling the GPU
// still fit beside one server per domain; a share too small for that is
// refused with the fields to change.
func TestMPSEditsServerReserve(t *testing.T) {
	m := NewMPSWith(t.TempDir(), NewFakeRunner(), MPSOptions{ServerReserve: DefaultMPSServerReserve})
	g := GPU{UUID: "GPU-1", Minor: 1, Shared: true, MemoryLimit: 16 << 30, CoresLimit: 50}
	got, err := BackendEdits(Claim{GPUs: []GPU{g}, Isolation: configapi.IsolationMPS, MPS: m.Daemon("GPU-1", "ns")})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=15872M") {
		t.Errorf("env %v, want CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=15872M (16 GiB less 512 MiB)", got.Env)
	}
	g.MemoryLimit = 512 << 20
	_, err = BackendEdits(Claim{GPUs: []GPU{g}, Isolation: configapi.IsolationMPS, MPS: m.Daemon("GPU-1", "ns")})
	if err == nil || !strings.Contains(err.Error(), "sharing.memoryLimit") {
		t.Errorf("a 512 MiB MPS share: error %v, want one naming the memory fields", err)
	}
}
