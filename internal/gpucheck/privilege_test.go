package gpucheck

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu"
)

// TestRunExclusiveProcessSkipsTwoContexts: on a GPU in compute mode
// EXCLUSIVE_PROCESS the steps that need two contexts at once (two compute
// probes without MPS, two MPS servers, N processes of a HAMi-core claim)
// are skipped with the reason; the others run, and the check is complete.
func TestRunExclusiveProcessSkipsTwoContexts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulated probes")
	}
	_, ctx := ktesting.NewTestContext(t)
	cfg := simConfig(t, configapi.IsolationAdvisory, configapi.IsolationMPS, configapi.IsolationHAMiCore)
	if err := cfg.NVML.(*gpu.MockNode).SetComputeMode(2, "ExclusiveProcess"); err != nil {
		t.Fatal(err)
	}
	r, err := Run(ctx, cfg, DefaultTargets)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Complete {
		t.Errorf("incomplete: %v", r.Incomplete)
	}
	for _, iso := range []configapi.Isolation{configapi.IsolationAdvisory, configapi.IsolationHAMiCore} {
		b := backend(t, r, iso)
		if b.Compute != nil || !strings.Contains(b.ComputeSkipped, "EXCLUSIVE_PROCESS") || b.Shares[0].Memory == nil {
			t.Errorf("%s: compute %+v, skipped %q, memory %+v: want memory measured, compute skipped", iso, b.Compute, b.ComputeSkipped, b.Shares[0].Memory)
		}
	}
	if b := backend(t, r, configapi.IsolationMPS); b.Compute == nil {
		t.Errorf("MPS compute skipped (%q): its clients share one server's context", b.ComputeSkipped)
	}
	for _, name := range []string{"MPS: two trust domains", "HAMi-core: 2 processes"} {
		if c := checkNamed(t, r, name); c.Status != StatusSkipped || !strings.Contains(c.Detail, "EXCLUSIVE_PROCESS") {
			t.Errorf("%s: %s: %s", name, c.Status, c.Detail)
		}
	}
	if c := checkNamed(t, r, "MPS: memory of a server's context"); c.Status != StatusSimulated {
		t.Errorf("one server's memory: %s: %s", c.Status, c.Detail)
	}
}

// TestContainerFallbackRootWithoutSysAdmin: as root without CAP_SYS_ADMIN
// (a GPU machine that is itself a container) the kernel refuses a mount
// namespace; the container step then runs in a user and mount namespace
// instead of failing.
func TestContainerFallbackRootWithoutSysAdmin(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("drops CAP_SYS_ADMIN from a root process (root only)")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv to drop CAP_SYS_ADMIN:", err)
	}
	bin := builtProbe(t)
	work := t.TempDir()
	out, err := exec.Command(setpriv, "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", "--",
		bin, "check", "--mock-profile", "hgx-h100", "--isolation", "Advisory", "--compute-time", "500ms",
		"--work-dir", filepath.Join(work, "w"), "--json").Output()
	if err != nil {
		t.Fatalf("check without CAP_SYS_ADMIN: %v\n%s", err, out)
	}
	var r Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	c := checkNamed(t, &r, "CDI spec applied in a container: Advisory")
	if c.Status != StatusSimulated || !strings.Contains(c.Detail, "user and mount namespace") || !strings.Contains(c.Detail, "a mount namespace alone was refused") {
		t.Errorf("%s: %s", c.Status, c.Detail)
	}
}

// TestFindContainerLibsMissingPreloadDependency: a preloaded library whose
// own dependency the host lacks is reported as such (the container step
// makes it an error: the loader would refuse the preload).
func TestFindContainerLibsMissingPreloadDependency(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler:", err)
	}
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dep := filepath.Join(dir, "libtgcdep.so")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", dep, write("dep.c", "int tgc_dep(void) { return 1; }\n")).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	lib := filepath.Join(dir, "libvgpu.so")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, write("vgpu.c", "int tgc_dep(void);\nint f(void) { return tgc_dep(); }\n"), "-L"+dir, "-ltgcdep").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if err := os.Remove(dep); err != nil {
		t.Fatal(err)
	}
	libs, err := findContainerLibs("/bin/sh", false, []string{lib})
	if err != nil {
		t.Fatal(err)
	}
	if len(libs.MissingPreload) != 1 || libs.MissingPreload[0] != "libtgcdep.so" {
		t.Errorf("MissingPreload %q, want [libtgcdep.so] (Missing %q)", libs.MissingPreload, libs.Missing)
	}
}
