package gpucheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/lending"
)

// TestInspect: the probe in a container reports each of the spec's
// variables it does not have exactly, each device node that is missing or
// has other numbers, and each mount point that is not there.
func TestInspect(t *testing.T) {
	exp := InsideExpect{
		Env:     []string{"A=1", "B=2", "C=3"},
		Devices: []InsideDevice{{Path: "/dev/null", Major: 1, Minor: 3}, {Path: "/dev/zero", Major: 1, Minor: 3}, {Path: "/dev/nvidia-none", Major: 195, Minor: 0}},
		Mounts:  []string{"/", "/no/such/mount"},
	}
	r := Inspect(exp, []string{"A=1", "B=20", "PATH=/bin"})
	if r.OK() {
		t.Fatal("a process without the spec's variables, nodes and mounts passed")
	}
	want := map[string][]string{
		"env":     {"B=20 (spec: 2)", "C missing (spec: 3)"},
		"devices": {"/dev/zero: 1:5 (spec: 1:3)", "/dev/nvidia-none:"},
		"mounts":  {"/no/such/mount:"},
	}
	for kind, got := range map[string][]string{"env": r.EnvWrong, "devices": r.DevicesWrong, "mounts": r.MountsMissing} {
		if len(got) != len(want[kind]) {
			t.Errorf("%s: %q, want %q", kind, got, want[kind])
			continue
		}
		for i := range got {
			if !strings.HasPrefix(got[i], want[kind][i]) {
				t.Errorf("%s[%d] = %q, want %q…", kind, i, got[i], want[kind][i])
			}
		}
	}
	if len(r.Devices) != 1 || r.Devices[0] != "/dev/null 1:3" {
		t.Errorf("devices found %q, want /dev/null 1:3", r.Devices)
	}
	if ok := Inspect(InsideExpect{Env: []string{"A=1"}, Devices: exp.Devices[:1], Mounts: exp.Mounts[:1]}, []string{"A=1"}); !ok.OK() {
		t.Errorf("a process with everything the spec says failed: %+v", ok)
	}
}

// TestSimLedgerSharesLimit: the simulated HAMi-core region gives the
// processes of one claim one limit between them, contexts first.
func TestSimLedgerSharesLimit(t *testing.T) {
	l := &simLedger{path: filepath.Join(t.TempDir(), "cache.tessera-sim"), limit: 1000}
	if got, used, err := l.charge(100, false); err != nil || got != 100 || used != 100 {
		t.Fatalf("context: %d (used %d), %v", got, used, err)
	}
	// Another live process (this test's parent stands in) holds 600.
	if err := l.update(func(m map[int]uint64) { m[os.Getppid()] = 600 }); err != nil {
		t.Fatal(err)
	}
	if got, used, err := l.charge(900, true); err != nil || got != 300 || used != 1000 {
		t.Errorf("allocation of 900 beside 700 used of 1000: got %d (used %d), %v; want 300 (1000)", got, used, err)
	}
	l.release()
	if _, used, _ := l.charge(0, true); used != 600 {
		t.Errorf("after release %d used, want the other process's 600", used)
	}
}

// fakeClock is a samplerWatch's clock that the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// lendWatch is a samplerWatch of one GPU, already stopped, on a fake clock,
// in phase "backend MPS".
func lendWatch() (*samplerWatch, *fakeClock, gpu.GPU) {
	g := gpu.GPU{UUID: "GPU-a", Minor: 0}
	w := newSamplerWatch([]gpu.GPU{g}, g.UUID, samplerInterval)
	clock := &fakeClock{t: time.Unix(1000, 0)}
	w.now = clock.now
	close(w.done)
	w.setPhase("backend MPS")
	return w, clock, g
}

// computes makes probe pid compute for d on the watch's clock, taking a
// sample every samplerInterval of what sample returns for the time into
// the window.
func computes(w *samplerWatch, clock *fakeClock, g gpu.GPU, pid int, d time.Duration, sample func(into time.Duration) (lending.Sample, bool)) {
	w.observe(pid, probeMessage{Event: "ready", Compute: &ComputeProbe{}}, false)
	start := clock.t
	for into := time.Duration(0); into <= d; into += samplerInterval {
		clock.t = start.Add(into)
		smp, busy := sample(into)
		w.add(g.UUID, smp, busy)
	}
	clock.t = start.Add(d)
	w.observe(pid, probeMessage{Event: "result", Compute: &ComputeProbe{Seconds: d.Seconds()}}, false)
}

func readable(pid uint32, sm uint32) lending.Sample {
	return lending.Sample{Observed: true, Utilization: nvml.SUCCESS, Pods: map[types.UID]lending.Activity{"": {PIDs: []uint32{pid}, SM: sm}}}
}

// TestSamplerWatchFlagsIdleCompute: a step in which probes computed but the
// sampler never saw the GPU busy is a mismatch (lending would lend a GPU
// that computes); MPS clients that NVML does not list are said so.
func TestSamplerWatchFlagsIdleCompute(t *testing.T) {
	w, clock, g := lendWatch()
	// NVML lists only the MPS server (pid 7), idle.
	computes(w, clock, g, 42, 2*time.Second, func(time.Duration) (lending.Sample, bool) { return readable(7, 0), false })
	c := w.finish(&node{gpu: g})
	if c.Status != StatusMismatch || !strings.Contains(c.Detail, "busy (SM ≥ 5%) in only 0 of 5 samples") || !strings.Contains(c.Detail, "MPS clients do not show") {
		t.Errorf("%s: %s", c.Status, c.Detail)
	}
}

// TestSamplerWatchJudgesOnlyTheComputeWindow: busy samples outside the
// probes' compute window do not make up for idle ones inside it.
func TestSamplerWatchJudgesOnlyTheComputeWindow(t *testing.T) {
	w, clock, g := lendWatch()
	for range 4 { // busy before the probe computes (another process)
		w.add(g.UUID, readable(9, 100), true)
		clock.t = clock.t.Add(samplerInterval)
	}
	clock.t = clock.t.Add(time.Second)
	computes(w, clock, g, 42, 2*time.Second, func(into time.Duration) (lending.Sample, bool) {
		return readable(42, 0), into == 0 // busy in one sample of five
	})
	c := w.finish(&node{gpu: g})
	if c.Status != StatusMismatch || !strings.Contains(c.Detail, "in only 1 of 5 samples inside their compute windows") {
		t.Errorf("%s: %s", c.Status, c.Detail)
	}
	// Most samples busy inside the window: measured.
	w, clock, g = lendWatch()
	computes(w, clock, g, 42, 2*time.Second, func(into time.Duration) (lending.Sample, bool) { return readable(42, 100), into > 0 })
	if c := w.finish(&node{gpu: g}); c.Status != StatusMeasured {
		t.Errorf("4 of 5 busy: %s: %s", c.Status, c.Detail)
	}
}

// TestSamplerWatchRefusesTheFallback: samples in which NVML gave no
// per-process utilization are the sampler's fallback (every process busy)
// and prove nothing: inside a compute window they make the check an
// ERROR, not a pass.
func TestSamplerWatchRefusesTheFallback(t *testing.T) {
	w, clock, g := lendWatch()
	computes(w, clock, g, 42, 2*time.Second, func(time.Duration) (lending.Sample, bool) {
		smp := readable(42, 100)
		smp.UtilizationUnknown, smp.Utilization = true, nvml.ERROR_NOT_SUPPORTED
		return smp, true
	})
	c := w.finish(&node{gpu: g})
	if c.Status != StatusError || !strings.Contains(c.Detail, "no per-process utilization in 5 samples") || !strings.Contains(c.Detail, "NOT_SUPPORTED ×5") {
		t.Errorf("%s: %s", c.Status, c.Detail)
	}
}

// TestSamplerWatchTooFewSamples: a compute window with fewer than two
// readable samples cannot be judged: ERROR.
func TestSamplerWatchTooFewSamples(t *testing.T) {
	w, clock, g := lendWatch()
	computes(w, clock, g, 42, samplerInterval/2, func(time.Duration) (lending.Sample, bool) { return readable(42, 100), true })
	if c := w.finish(&node{gpu: g}); c.Status != StatusError || !strings.Contains(c.Detail, "only 1 readable samples") {
		t.Errorf("%s: %s", c.Status, c.Detail)
	}
}

var (
	probeOnce sync.Once
	probeBin  string
	probeErr  error
)

// builtProbe is cmd/tessera-gpu-probe built once for these tests: the
// binary the bundle ships, run as the check's probe, container init and
// namespace shim.
func builtProbe(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain to build the probe:", err)
	}
	probeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tgc-probe")
		if err != nil {
			probeErr = err
			return
		}
		probeBin = filepath.Join(dir, "tessera-gpu-probe")
		out, err := exec.Command("go", "build", "-o", probeBin, "github.com/tessera-dev/tessera/cmd/tessera-gpu-probe").CombinedOutput()
		if err != nil {
			probeErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeBin
}

// simConfig is a mock check whose probes are the built probe's simulated
// mode, as the dry run runs them.
func simConfig(t *testing.T, isos ...configapi.Isolation) Config {
	t.Helper()
	return simConfigOf(t, "hgx-h100", isos...)
}

// simConfigOf is simConfig on another mock profile.
func simConfigOf(t *testing.T, profile string, isos ...configapi.Isolation) Config {
	t.Helper()
	bin := builtProbe(t)
	cfg := mockConfigOf(t, profile, nil)
	// A client of uid 1000 must reach the work directory.
	for d := cfg.WorkDir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		_ = os.MkdirAll(d, 0o755)
		_ = os.Chmod(d, 0o711)
	}
	cfg.Isolations = isos
	cfg.ComputeTime = 500 * time.Millisecond
	cfg.Prober = ExecProber{Command: []string{bin, "probe", "--simulate-gpu-mib", "81089", "--simulate-registry", filepath.Join(cfg.WorkDir, SimRegistryDir)}}
	return cfg
}

func checkNamed(t *testing.T, r *Report, prefix string) Check {
	t.Helper()
	for _, c := range r.Checks {
		if strings.HasPrefix(c.Name, prefix) {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", prefix, r.Checks)
	return Check{}
}

// TestRunMockEveryCheck: on a mock node with the simulated probes, every
// check the check makes ends with an outcome: the CDI spec applied in a
// container (the namespace fallback, for real), the MPS checks, the
// HAMi-core checks, the health-event registration and the lending sampler;
// none is left "not implemented".
func TestRunMockEveryCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulated probes (about 20 s)")
	}
	_, ctx := ktesting.NewTestContext(t)
	cfg := simConfig(t, configapi.IsolationAdvisory, configapi.IsolationMPS, configapi.IsolationHAMiCore)
	r, err := Run(ctx, cfg, DefaultTargets)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	_ = r.WriteTable(&table)
	if !r.OK() {
		t.Fatalf("mock run not OK: %v\n%s", r.Incomplete, table.String())
	}
	for _, c := range r.Checks {
		if c.Status != StatusSimulated && c.Status != StatusSkipped {
			t.Errorf("%s: %s (%s), want simulated or skipped in a mock run", c.Name, c.Status, c.Detail)
		}
	}
	for _, iso := range []string{"Advisory", "MPS", "HAMiCore"} {
		c := checkNamed(t, r, "CDI spec applied in a container: "+iso)
		if c.Status != StatusSimulated || !strings.Contains(c.Detail, "nsexec in a new") || !strings.Contains(c.Detail, "3 device nodes") {
			t.Errorf("container %s: %s: %s", iso, c.Status, c.Detail)
		}
	}
	if c := checkNamed(t, r, "CDI spec applied in a container: HAMiCore"); !strings.Contains(c.Detail, "/etc/ld.so.preload: /usr/local/vgpu/libvgpu.so") {
		t.Errorf("the HAMi-core container did not see the preload file: %s", c.Detail)
	}
	uid := checkNamed(t, r, "MPS: a root client")
	if os.Geteuid() == 0 {
		if uid.Status != StatusSimulated || !strings.Contains(uid.Detail, "waited in cuInit while the root client held") || !strings.Contains(uid.Detail, "uid 1000, clients") {
			t.Errorf("uid check: %s: %s", uid.Status, uid.Detail)
		}
	} else if uid.Status != StatusSkipped {
		t.Errorf("uid check as uid %d: %s, want skipped", os.Geteuid(), uid.Status)
	}
	if c := checkNamed(t, r, "MPS: two trust domains"); !strings.HasPrefix(c.Detail, "servers of two domains time-slice") || !strings.Contains(c.Detail, "100 % and 100 %") {
		t.Errorf("domains: %s", c.Detail)
	}
	if c := checkNamed(t, r, "HAMi-core: 2 processes"); !strings.Contains(c.Detail, "together 4096 MiB") {
		t.Errorf("shared limit: %s", c.Detail)
	}
	if c := checkNamed(t, r, "HAMi-core: cuMemAllocAsync"); strings.Count(c.Detail, "refused at") != 3 {
		t.Errorf("allocators: %s", c.Detail)
	}
	if c := checkNamed(t, r, "health-event registration"); !strings.Contains(c.Detail, "the watcher registered XidCriticalError, DoubleBitEccError") {
		t.Errorf("health: %s", c.Detail)
	}
	if c := checkNamed(t, r, "lending sampler"); !strings.Contains(c.Detail, "backend MPS: busy in") {
		t.Errorf("lending: %s", c.Detail)
	}
	if strings.Contains(table.String(), "not implemented") {
		t.Errorf("a check is still not implemented:\n%s", table.String())
	}
}

// TestMPSDomainsInOneDaemonFail: when "two trust domains" share one MPS
// daemon (one server), their clients run side by side, and the check says
// they were not time-sliced.
func TestMPSDomainsInOneDaemonFail(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulated probes")
	}
	old := mpsDomainB
	mpsDomainB = mpsDomainA
	t.Cleanup(func() { mpsDomainB = old })
	n, ep, ctx := simNode(t, nil, configapi.IsolationMPS)
	c := n.mpsDomainsCheck(ctx, ep, Check{Name: "domains"})
	if c.Status != StatusMismatch || !strings.Contains(c.Detail, "not time-sliced") {
		t.Errorf("%s: %s, want a mismatch saying the servers were not time-sliced", c.Status, c.Detail)
	}
}
