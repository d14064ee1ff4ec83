package plugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/isolation"
)

// TestDriverMemoryOnIncapableNodeFailsClosed: a DriverMemory share on a node
// whose detection said no is refused with the detected reason and the
// selector that finds capable nodes; nothing is left behind.
func TestDriverMemoryOnIncapableNodeFailsClosed(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sys/fs/cgroup"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sys/fs/cgroup/cgroup.controllers"), []byte("cpuset cpu io memory pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	detected := isolation.DriverMemoryProbe{HostRoot: dir, HookPath: "/usr/bin/nvidia-cdi-hook", DriverVersion: "615.10.02"}.Detect()
	p := e.start(func(o *Options) { o.DriverMemory = detected })
	c := newClaim("uid-dm", []result{share("gpu", "gpu-1-shared", "s1", "8Gi", "10")},
		claimConfig(isolationConfig(configapi.IsolationDriverMemory)))
	r := prepare(t, p.Plugin, c)
	if r.Err == nil {
		t.Fatalf("prepared on a node without dmem: %v", r.Devices)
	}
	for _, want := range []string{"device gpu-1-shared", "isolation DriverMemory", "no dmem controller", `device.attributes["gpu.tessera.dev"].driverMemoryLimits == true`} {
		if !strings.Contains(r.Err.Error(), want) {
			t.Errorf("error %q does not say %q", r.Err, want)
		}
	}
	e.assertClean(p)
}

// TestRealGPUWithoutToolkitFailsClosed: on a real node a GPU without a
// device in the toolkit's CDI spec is not prepared (its container would lack
// the driver's libraries) unless the node declares a legacy NVIDIA runtime;
// the start-time check says the same in a Node event.
func TestRealGPUWithoutToolkitFailsClosed(t *testing.T) {
	e := newEnv(t)
	p := e.start(func(o *Options) {
		o.Mock = false
		o.DevNodes = isolation.StaticDevNodes{UVMMajor: 508}
		o.ToolkitSpecDirs = []string{"/etc/cdi", "/var/run/cdi"}
	})
	c := newClaim("uid-nolibs", []result{whole("gpu", "gpu-2")})
	r := prepare(t, p.Plugin, c)
	if r.Err == nil {
		t.Fatalf("prepared a GPU without the toolkit's device: %v", r.Devices)
	}
	for _, want := range []string{"GPU-00000002", "nvidia-ctk cdi generate", "/etc/cdi, /var/run/cdi", "--legacy-nvidia-runtime"} {
		if !strings.Contains(r.Err.Error(), want) {
			t.Errorf("error %q does not say %q", r.Err, want)
		}
	}
	e.assertClean(p)

	p.CheckToolkit(ctxFor(t))
	found := false
	for _, ev := range e.events.List() {
		if strings.Contains(ev, "NoToolkitCDISpec") && strings.Contains(ev, "GPU-00000002 (index 2)") && strings.Contains(ev, "nvidia-ctk cdi generate") {
			found = true
		}
	}
	if !found {
		t.Errorf("no NoToolkitCDISpec event naming the GPUs and the command: %v", e.events.List())
	}
}

// TestHAMiCoreClaimDirLifecycle: a HAMiCore claim's shared-region directory
// exists (world-writable, sticky) while the claim is prepared and is gone
// after unprepare; two claims get two directories.
func TestHAMiCoreClaimDirLifecycle(t *testing.T) {
	e := newEnv(t)
	p := e.start(nil)
	hami := claimConfig(isolationConfig(configapi.IsolationHAMiCore))
	a := newClaim("uid-ha", []result{share("gpu", "gpu-0-shared", "s1", "8Gi", "10")}, hami)
	b := newClaim("uid-hb", []result{share("gpu", "gpu-0-shared", "s2", "8Gi", "10")}, hami)
	mustPrepare(t, p.Plugin, a)
	mustPrepare(t, p.Plugin, b)
	for _, uid := range []string{"uid-ha", "uid-hb"} {
		fi, err := os.Stat(filepath.Join(e.hamiClaims(), uid))
		if err != nil {
			t.Fatalf("claim %s: %v", uid, err)
		}
		if fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
			t.Errorf("claim %s: directory mode %s, want drwxrwxrwt", uid, fi.Mode())
		}
	}
	mustUnprepare(t, p.Plugin, a.UID)
	if _, err := os.Stat(filepath.Join(e.hamiClaims(), "uid-ha")); !os.IsNotExist(err) {
		t.Errorf("unprepared claim's directory: %v", err)
	}
	mustUnprepare(t, p.Plugin, b.UID)
	e.assertClean(p)
}

// TestHAMiCoreClaimRootMoved: a claim prepared while the claim root was
// another directory (an earlier release's <plugin-data-dir>/hami/claims)
// keeps that directory after a restart with the new root: its spec is not
// rewritten, preparing it again changes nothing, and unprepare removes the
// directory. A prepared claim whose directory vanished (the new root is a
// tmpfs) gets it back at start.
func TestHAMiCoreClaimRootMoved(t *testing.T) {
	e := newEnv(t)
	oldRoot := filepath.Join(filepath.Dir(e.checkpoint), "hami", "old-claims")
	old := e.start(func(o *Options) { o.HAMiCore.ClaimRoot = oldRoot })
	hami := claimConfig(isolationConfig(configapi.IsolationHAMiCore))
	a := newClaim("uid-ha", []result{share("gpu", "gpu-0-shared", "s1", "8Gi", "10")}, hami)
	mustPrepare(t, old.Plugin, a)
	oldDir := filepath.Join(oldRoot, "uid-ha")
	if _, err := os.Stat(oldDir); err != nil {
		t.Fatalf("claim directory under the old root: %v", err)
	}
	spec, err := os.ReadFile(old.specs.Path(a.UID))
	if err != nil {
		t.Fatal(err)
	}

	upgraded := func() *instance {
		return e.start(func(o *Options) { o.HAMiCore.OldClaimRoots = []string{oldRoot} })
	}
	p := upgraded()
	for _, ev := range e.events.List() {
		if strings.Contains(ev, "CDISpecRewritten") {
			t.Errorf("restart with a new claim root rewrote a spec: %s", ev)
		}
	}
	mustPrepare(t, p.Plugin, a)
	if got, err := os.ReadFile(p.specs.Path(a.UID)); err != nil || string(got) != string(spec) {
		t.Errorf("spec after restart and prepare again changed (err %v):\n%s\nwant\n%s", err, got, spec)
	}
	if _, err := os.Stat(filepath.Join(e.hamiClaims(), "uid-ha")); !os.IsNotExist(err) {
		t.Errorf("a second directory under the new root for a claim that has one under the old: %v", err)
	}

	// A claim under the new root whose directory is gone gets it back at start.
	b := newClaim("uid-hb", []result{share("gpu", "gpu-1-shared", "s2", "8Gi", "10")}, hami)
	mustPrepare(t, p.Plugin, b)
	newDir := filepath.Join(e.hamiClaims(), "uid-hb")
	if err := os.RemoveAll(newDir); err != nil {
		t.Fatal(err)
	}
	p = upgraded()
	if fi, err := os.Stat(newDir); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("the vanished directory of a prepared claim after a restart: %v, %v; want it made again", fi, err)
	}

	mustUnprepare(t, p.Plugin, a.UID)
	mustUnprepare(t, p.Plugin, b.UID)
	if _, err := os.Stat(oldDir); !os.IsNotExist(err) {
		t.Errorf("unprepare left the old root's directory: %v", err)
	}
	e.assertClean(p)
}
