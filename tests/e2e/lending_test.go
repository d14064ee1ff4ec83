//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// The local cluster's lending settings (demo/clusters/local/overlay/values.yaml).
const (
	lendingIdlePeriod = 10 * time.Second
	// lendingKillMargin is lending.killMargin: a borrower still on its GPU
	// this long after its reclaim grace is killed.
	lendingKillMargin = 15 * time.Second
	// reclaimBudget is what the issue allows beyond the borrower's grace.
	reclaimBudget = 10 * time.Second
)

// setOwnerActivity makes the mock NVML report a compute process of pod on
// the GPU with this NVML index, computing at sm percent and using memory.
func setOwnerActivity(t testing.TB, index string, pod types.UID, sm int, memory string) {
	t.Helper()
	mem, err := strconv.ParseInt(memory, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	q := url.Values{"gpu": {index}, "pid": {"4242"}, "pod": {string(pod)}, "sm": {strconv.Itoa(sm)}, "memory": {strconv.FormatInt(mem, 10)}}
	framework.PostMockKnob(t, "/mock/process", q)
}

// lendingPhase is the plugin's tessera_gpu_lending_phase for the GPU.
func lendingPhase(ctx context.Context, gpu string) (string, error) {
	samples, err := scrapeMetrics(ctx, operateMetricsURL())
	if err != nil {
		return "", err
	}
	for _, s := range samples {
		if s.name == "tessera_gpu_lending_phase" && s.labels["gpu"] == gpu && s.value == 1 {
			return s.labels["phase"], nil
		}
	}
	return "", fmt.Errorf("no tessera_gpu_lending_phase for %s", gpu)
}

func waitForPhase(ctx context.Context, gpu, phase string, timeout time.Duration) error {
	return framework.Poll(ctx, gpu+" lending phase "+phase, timeout, func(ctx context.Context) (bool, error) {
		got, err := lendingPhase(ctx, gpu)
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		if got != phase {
			return false, framework.Retry("phase %s", got)
		}
		return true, nil
	})
}

// lendsWhenIdle is the GpuConfig of an owner that lends its GPU.
var lendsWhenIdle = framework.GpuConfig("lending: {lendWhenIdle: true}")

// borrowerClaimYAML is a borrower of 8Gi that may save its work for grace
// seconds before it is evicted (no toleration: evicted at once).
func borrowerClaimYAML(name string, grace int) string {
	exactly := []string{"capacity: {requests: {memory: 8Gi}}"}
	if grace > 0 {
		exactly = append(exactly, fmt.Sprintf("tolerations: [{key: gpu.tessera.dev/reclaim, operator: Exists, effect: NoExecute, tolerationSeconds: %d}]", grace))
	}
	return lentClaimYAML(name, exactly...)
}

// lentClaimYAML is a claim for a lending device, with these lines (YAML
// flow) added to its request's exactly.
func lentClaimYAML(name string, exactly ...string) string {
	return fmt.Sprintf(`
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: %s}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: lent.gpu.tessera.dev
%s`, name, "        "+strings.Join(exactly, "\n        ")+"\n")
}

// startOwner runs the owner pod on a whole GPU that it lends, with a
// notebook idling on 10 GiB of it; it returns the GPU's name (gpu-N) and
// NVML index, and the owner pod.
func startOwner(t *testing.T, c *framework.Cluster, ns string) (gpu, index string, owner *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	pods := c.RunObjects(t, ns, framework.Claim{Name: "owner", Config: lendsWhenIdle}.WithPod()...)
	owner = pods["owner"].Pod
	devs, err := c.AllocatedDevices(ctx, ns, "owner")
	if err != nil || len(devs) != 1 {
		t.Fatalf("owner's devices: %v, %v", devs, err)
	}
	gpu, index = devs[0].Result.Device, devs[0].Attribute("index")
	setOwnerActivity(t, index, owner.UID, 0, strconv.FormatInt(10<<30, 10))
	return gpu, index, owner
}

// TestLendingIdleGPU: an owner that lends its whole GPU idles, and after the
// idle period a waiting borrower runs on the GPU's lending device with
// TESSERA_PREEMPTIBLE=true and tessera status shows it; a plugin restart
// keeps the loan; when the owner computes again the borrower is
// evicted within its grace plus 10 s, the reason is on its claim, and a
// second borrower waits while the owner is busy; once the owner idles again
// the second borrower runs, and the owner leaving ends its loan.
func TestLendingIdleGPU(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "lent.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-lending")
	const grace = 5
	c.Apply(t, ns, framework.MustDecodeYAML(t, borrowerClaimYAML("borrower-1", grace)+"---"+borrowerClaimYAML("borrower-2", grace))...)

	gpu, index, owner := startOwner(t, c, ns)
	idleFrom := time.Now()
	t.Logf("owner holds %s (NVML index %s) and idles", gpu, index)

	// The borrower waits until the GPU is lent, then runs beside the owner.
	c.Apply(t, ns, framework.EnvPod("borrower-1", "borrower-1", false))
	if err := waitForPhase(ctx, gpu, "Lent", lendingIdlePeriod+30*time.Second); err != nil {
		t.Fatal(err)
	}
	b1, err := c.WaitForEnvPod(ctx, ns, "borrower-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("borrower-1 runs %s after the owner turned idle (idle period %s)", time.Since(idleFrom).Round(100*time.Millisecond), lendingIdlePeriod)
	framework.LogSpecPod(t, b1)
	devs, err := c.AllocatedDevices(ctx, ns, "borrower-1")
	if err != nil || len(devs) != 1 || devs[0].Result.Device != gpu+"-lent" {
		t.Fatalf("borrower-1's devices %v (%v), want %s-lent", devs, err, gpu)
	}
	env := b1.Containers[0].Env
	if env["TESSERA_PREEMPTIBLE"] != "true" {
		t.Errorf("borrower env: TESSERA_PREEMPTIBLE=%q, want true", env["TESSERA_PREEMPTIBLE"])
	}
	minor, err := framework.DeviceMinor(gpu)
	if err != nil {
		t.Fatal(err)
	}
	if env[framework.GPUVar(minor)] != devs[0].Attribute("uuid") {
		t.Errorf("borrower env: %s=%q, want the owner's GPU %s", framework.GPUVar(minor), env[framework.GPUVar(minor)], devs[0].Attribute("uuid"))
	}

	// tessera status shows who borrows what.
	table := framework.RunCLI(t, "status")
	if !strings.Contains(table, "lent ") || !strings.Contains(table, "(claim borrower-1: 8Gi") {
		t.Errorf("tessera status does not show borrower-1 on the lent GPU:\n%s", table)
	}
	t.Logf("tessera status:\n%s", table)

	// That an owner is never kept waiting by borrowers (gpu-N-lent holds
	// none of the GPU's counters) is shown in kube-scheduler's allocator:
	// pkg/model TestBorrowersInTheAllocator.

	// A plugin restart keeps the loan and the borrower.
	restartPlugin(t, c)
	if err := waitForPhase(ctx, gpu, "Lent", 30*time.Second); err != nil {
		t.Fatalf("after the plugin restart: %v", err)
	}
	if p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "borrower-1", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		t.Fatalf("borrower-1 after the plugin restart: %v, %v", p.Status.Phase, err)
	}

	// The owner computes: the borrower is evicted within grace + 10 s.
	busyAt := time.Now()
	setOwnerActivity(t, index, owner.UID, 80, strconv.FormatInt(10<<30, 10))
	if err := c.WaitForPodGone(ctx, ns, "borrower-1", grace*time.Second+reclaimBudget+framework.PodTimeout); err != nil {
		t.Fatal(err)
	}
	took := time.Since(busyAt)
	t.Logf("borrower-1 gone %s after the owner turned busy (grace %ds)", took.Round(100*time.Millisecond), grace)
	if took > grace*time.Second+reclaimBudget {
		t.Errorf("reclaim took %s, more than the grace %ds + %s", took, grace, reclaimBudget)
	}
	wantClaimEvent(t, c, ns, "borrower-1", "Reclaimed", "OwnerBusy")

	// A second borrower waits while the owner is busy.
	c.Apply(t, ns, framework.EnvPod("borrower-2", "borrower-2", false))
	if _, err := c.WaitForUnschedulable(ctx, ns, "borrower-2"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lendingIdlePeriod)
	if p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "borrower-2", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("borrower-2 while the owner is busy: node %q, %v; want pending", p.Spec.NodeName, err)
	}

	// The owner idles again: borrower-2 runs.
	setOwnerActivity(t, index, owner.UID, 0, strconv.FormatInt(10<<30, 10))
	if _, err := c.WaitForEnvPod(ctx, ns, "borrower-2"); err != nil {
		t.Fatal(err)
	}

	// The owner leaves: its loan ends and borrower-2 is evicted.
	leftAt := time.Now()
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "owner", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitForPodGone(ctx, ns, "borrower-2", grace*time.Second+reclaimBudget+framework.PodTimeout); err != nil {
		t.Fatal(err)
	}
	t.Logf("borrower-2 gone %s after the owner's pod was deleted", time.Since(leftAt).Round(100*time.Millisecond))
	samples, err := scrapeMetrics(ctx, operateMetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	if n, lines := sumSamples(samples, "tessera_lending_reclaims_total", nil); n < 1 {
		t.Errorf("tessera_lending_reclaims_total: %v", lines)
	}
}

// TestBorrowerTolerationsRefused: the chart's admission policy refuses
// borrowers that tolerate the not-lent taint, or the reclaim taint forever.
func TestBorrowerTolerationsRefused(t *testing.T) {
	c := needDriver(t, "lent.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-borrower-policy")
	for _, tc := range []struct{ name, toleration, want string }{
		{"not-lent", `{key: gpu.tessera.dev/not-lent, operator: Exists}`, "tolerates the taint gpu.tessera.dev/not-lent"},
		{"everything", `{operator: Exists}`, "tolerates the taint gpu.tessera.dev/not-lent"},
		{"forever", `{key: gpu.tessera.dev/reclaim, operator: Exists, effect: NoExecute}`, "within 600 seconds"},
	} {
		objs := framework.MustDecodeYAML(t, lentClaimYAML(tc.name, "tolerations: ["+tc.toleration+"]"))
		_, err := c.Dynamic.Resource(resourceClaimsGVR).Namespace(ns).Create(context.Background(), objs[0], metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("claim %s: %v, want refused (%s)", tc.name, err, tc.want)
		} else {
			t.Logf("claim %s refused: %v", tc.name, err)
		}
	}
}

// TestLendingReclaimLatency measures, over TESSERA_E2E_RECLAIMS cycles, the
// time from the owner turning idle to a borrower running (idle period
// included) and from the owner turning busy to the borrower's pod gone (no
// grace). make bench-reclaim runs it; make test does not.
func TestLendingReclaimLatency(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TESSERA_E2E_RECLAIMS"))
	if n <= 0 {
		t.Skip("set TESSERA_E2E_RECLAIMS=<cycles> (make bench-reclaim)")
	}
	c := needDriver(t, "gpu.tessera.dev", "lent.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-reclaim")
	gpu, index, owner := startOwner(t, c, ns)
	var lend, reclaim []time.Duration
	for i := range n {
		name := fmt.Sprintf("borrower-%d", i)
		idleAt := time.Now()
		setOwnerActivity(t, index, owner.UID, 0, strconv.FormatInt(10<<30, 10))
		c.Apply(t, ns, framework.MustDecodeYAML(t, borrowerClaimYAML(name, 0))...)
		c.Apply(t, ns, framework.EnvPod(name, name, false))
		if _, err := c.WaitForPodRunning(ctx, ns, name); err != nil {
			t.Fatal(err)
		}
		lend = append(lend, time.Since(idleAt))
		busyAt := time.Now()
		setOwnerActivity(t, index, owner.UID, 80, strconv.FormatInt(10<<30, 10))
		if err := c.WaitForPodGone(ctx, ns, name, framework.PodTimeout); err != nil {
			t.Fatal(err)
		}
		reclaim = append(reclaim, time.Since(busyAt))
		t.Logf("cycle %d on %s: borrower ran %s after idle, gone %s after busy", i, gpu, lend[i].Round(10*time.Millisecond), reclaim[i].Round(10*time.Millisecond))
	}
	report := fmt.Sprintf("# Reclaim latency on the local cluster\n\n"+
		"make bench-reclaim (TestLendingReclaimLatency): one node (mock hgx-h100), idle period %s, sample interval 1s. "+
		"lend: from the owner's process turning idle to the waiting borrower's pod Running (the idle period included); "+
		"reclaim: from the owner's process turning busy to the borrower's pod gone from the API (no reclaim grace: the borrower tolerates nothing).\n\n",
		lendingIdlePeriod) + fmt.Sprintf("| cycles | lend p50 | lend p99 | reclaim p50 | reclaim p99 | reclaim max |\n|---|---|---|---|---|---|\n| %d | %s | %s | %s | %s | %s |\n",
		n, quantile(lend, 0.5), quantile(lend, 0.99), quantile(reclaim, 0.5), quantile(reclaim, 0.99), quantile(reclaim, 1))
	t.Logf("reclaim latency on the local cluster (idle period %s, sample interval 1s, no grace):\n%s", lendingIdlePeriod, report)
	if out := os.Getenv("TESSERA_E2E_RESULTS"); out != "" {
		if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if q := quantile(reclaim, 0.99); q > reclaimBudget {
		t.Errorf("reclaim p99 %s, more than %s", q, reclaimBudget)
	}
}

// quantile is the q-quantile (nearest rank) of ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))].Round(10 * time.Millisecond)
}

var resourceClaimsGVR = schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaims"}

// restartPlugin deletes the kubelet plugin's pod (SIGTERM, as kubectl
// delete does) and waits for the DaemonSet's new one to be Ready.
func restartPlugin(t testing.TB, c *framework.Cluster) {
	t.Helper()
	ctx := context.Background()
	old, err := c.ReadyPluginPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CoreV1().Pods(framework.PluginNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitForPodGone(ctx, framework.PluginNamespace, old.Name, framework.PodTimeout); err != nil {
		t.Fatal(err)
	}
	p, err := c.ReadyPluginPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plugin pod %s replaced by %s", old.Name, p.Name)
}

// TestDemoLendIdleNotebook runs demo/specs/70-lend-idle-notebook.yaml: the
// notebook holds a whole GPU it lends; once it has idled for the idle period
// the batch pod runs on that GPU's lending device, preemptible, with the
// lent class's enforced isolation (MPS) and its 20Gi limit.
func TestDemoLendIdleNotebook(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "lent.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-demo-lending")
	pods := c.RunSpec(t, ns, framework.SpecPath("70-lend-idle-notebook.yaml"))
	notebook := framework.ClaimOf(t, c, pods["notebook"], "gpu")
	borrowed := framework.ClaimOf(t, c, pods["batch"], "gpu")
	if borrowed.Result.Device != notebook.Result.Device+"-lent" {
		t.Fatalf("batch got %s, want the notebook's GPU's lending device %s-lent", borrowed.Result.Device, notebook.Result.Device)
	}
	framework.WantEnv(t, pods["batch"], map[string]string{
		"TESSERA_PREEMPTIBLE":              "true",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
		"CUDA_VISIBLE_DEVICES":             borrowed.Attribute("uuid"),
	})
	if v := pods["notebook"].Env["TESSERA_PREEMPTIBLE"]; v != "" {
		t.Errorf("the notebook sees TESSERA_PREEMPTIBLE=%q", v)
	}
}

// lendShareToBorrower runs an owner holding a 10Gi/20-core share of a GPU
// it lends, idling on 5 GiB, and a borrower (claim and pod "borrower", this
// grace) on that GPU's lending device; it returns the share's device, the
// GPU's device and minor once the borrower runs.
func lendShareToBorrower(t *testing.T, c *framework.Cluster, ns string, grace int) (shared, gpu string, minor int) {
	t.Helper()
	ctx := context.Background()
	c.Apply(t, ns, framework.MustDecodeYAML(t, borrowerClaimYAML("borrower", grace))...)
	owner := c.RunObjects(t, ns, framework.Claim{Name: "owner", Memory: "10Gi", Cores: "20", Config: lendsWhenIdle}.WithPod()...)["owner"].Pod
	devs, err := c.AllocatedDevices(ctx, ns, "owner")
	if err != nil || len(devs) != 1 {
		t.Fatalf("owner's devices: %v, %v", devs, err)
	}
	shared, index := devs[0].Result.Device, devs[0].Attribute("index")
	gpu = strings.TrimSuffix(shared, "-shared")
	minor, err = framework.DeviceMinor(gpu)
	if err != nil {
		t.Fatal(err)
	}
	setOwnerActivity(t, index, owner.UID, 0, strconv.FormatInt(5<<30, 10))
	c.Apply(t, ns, framework.EnvPod("borrower", "borrower", false))
	if err := waitForPhase(ctx, gpu, "Lent", lendingIdlePeriod+30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForPodRunning(ctx, ns, "borrower"); err != nil {
		t.Fatal(err)
	}
	return shared, gpu, minor
}

// TestLendingOwnerNeverWaits: an owner holds a share of a GPU it lends, and
// a borrower with a 30 s grace runs on the GPU's lending device. A second
// owner's share, pinned to that GPU, is scheduled and runs at once — the
// lending device holds none of the GPU's counters — while the borrower is
// still there; its arrival takes the GPU back (OwnersChanged: the second
// owner lends too, so consent is not what ends the loan).
func TestLendingOwnerNeverWaits(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev", "lent.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-lending-owners")
	shared, gpu, minor := lendShareToBorrower(t, c, ns, 30)

	start := time.Now()
	c.Apply(t, ns, framework.Claim{Name: "second-owner", Memory: "10Gi", Cores: "20", Selectors: []string{framework.PinnedToMinor(minor)},
		Config: lendsWhenIdle}.WithPod()...)
	if _, err := c.WaitForPodRunning(ctx, ns, "second-owner"); err != nil {
		t.Fatal(err)
	}
	ran := time.Since(start)
	b, err := c.Client.CoreV1().Pods(ns).Get(ctx, "borrower", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the borrower was gone before the second owner ran (%v): the owner may have waited for it", err)
	}
	t.Logf("second owner on %s running %s after creation, beside the departing borrower (deleting %v)", gpu, ran.Round(100*time.Millisecond), b.DeletionTimestamp != nil)
	if d, _ := c.AllocatedDevices(ctx, ns, "second-owner"); len(d) != 1 || d[0].Result.Device != shared {
		t.Fatalf("second owner's devices %v, want %s", d, shared)
	}
	if err := c.WaitForPodGone(ctx, ns, "borrower", 30*time.Second+reclaimBudget+framework.PodTimeout); err != nil {
		t.Fatal(err)
	}
	wantClaimEvent(t, c, ns, "borrower", "", "OwnersChanged")
}

// wantClaimEvent fails the test unless the claim has an event of this
// reason ("": any) whose message holds detail, and logs its events.
func wantClaimEvent(t *testing.T, c *framework.Cluster, ns, claim, reason, detail string) {
	t.Helper()
	events, err := c.ClaimEvents(context.Background(), ns, claim)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(events, func(e string) bool {
		return (reason == "" || strings.HasPrefix(e, reason+": ")) && strings.Contains(e, detail)
	}) {
		t.Errorf("%s's claim events %q: want %s (%s)", claim, events, cmp.Or(reason, "an event"), detail)
	}
	t.Logf("%s's claim events: %q", claim, events)
}

// hostPIDOf finds the host PID of the process whose command line holds
// marker (a borrower's container runs `sh -c … <marker>`; the local
// cluster's containers share this host's /proc).
func hostPIDOf(ctx context.Context, marker string) (int, error) {
	var pid int
	err := framework.Poll(ctx, "the process of "+marker, framework.PodTimeout, func(context.Context) (bool, error) {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return false, err
		}
		for _, e := range entries {
			n, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err == nil && strings.HasPrefix(string(cmd), "sh\x00") && strings.Contains(string(cmd), "\x00"+marker) {
				pid = n
				return true, nil
			}
		}
		return false, framework.Retry("no process with %s in its command line", marker)
	})
	return pid, err
}

// setProcess makes the mock NVML report the host process pid as pod's GPU
// process on the GPU with this NVML index (remove: stop reporting it).
func setProcess(t testing.TB, index string, pid int, pod types.UID, memory int64, remove bool) {
	t.Helper()
	q := url.Values{"gpu": {index}, "pid": {strconv.Itoa(pid)}, "pod": {string(pod)}, "memory": {strconv.FormatInt(memory, 10)}}
	if remove {
		q.Set("remove", "true")
	}
	framework.PostMockKnob(t, "/mock/process", q)
}

// TestOutstayingBorrowerKilled: a borrower whose pod asks for a day of
// termination grace and whose process ignores SIGTERM (reported by the
// mock as its GPU process, with its real host PID) loses the GPU within
// its reclaim grace plus the plugin's kill margin: the plugin kills its
// container (cgroup.kill), says so on its claim, and the pod goes.
func TestOutstayingBorrowerKilled(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "lent.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-lending-kill")
	const grace = 5
	c.Apply(t, ns, framework.MustDecodeYAML(t, borrowerClaimYAML("borrower", grace))...)
	gpu, index, owner := startOwner(t, c, ns)

	marker := "tessera-outstay-" + ns
	pod := framework.EnvPod("borrower", "borrower", false)
	spec := pod.Object["spec"].(map[string]any)
	spec["terminationGracePeriodSeconds"] = int64(86400)
	ctr := spec["containers"].([]any)[0].(map[string]any)
	ctr["command"] = []any{"sh", "-c", `trap "" TERM; while :; do sleep 1; done`, marker}
	c.Apply(t, ns, pod)
	t.Cleanup(func() {
		zero := int64(0)
		_ = c.Client.CoreV1().Pods(ns).Delete(context.Background(), "borrower", metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	if err := waitForPhase(ctx, gpu, "Lent", lendingIdlePeriod+30*time.Second); err != nil {
		t.Fatal(err)
	}
	b, err := c.WaitForPodRunning(ctx, ns, "borrower")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := hostPIDOf(ctx, marker)
	if err != nil {
		t.Fatal(err)
	}
	setProcess(t, index, pid, b.UID, 1<<30, false)
	t.Cleanup(func() { setProcess(t, index, pid, b.UID, 0, true) })
	t.Logf("borrower runs on %s-lent as host process %d", gpu, pid)

	busyAt := time.Now()
	setOwnerActivity(t, index, owner.UID, 80, strconv.FormatInt(10<<30, 10))
	bound := grace*time.Second + lendingKillMargin + reclaimBudget
	err = framework.Poll(ctx, fmt.Sprintf("process %d to end", pid), bound+framework.PodTimeout, func(context.Context) (bool, error) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return true, nil
		}
		return false, framework.Retry("running")
	})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(busyAt)
	t.Logf("borrower's process ended %s after the owner turned busy (grace %ds, kill margin %s)", took.Round(100*time.Millisecond), grace, lendingKillMargin)
	if took > bound {
		t.Errorf("the borrower kept the GPU %s, more than its grace %ds + the kill margin %s + %s", took, grace, lendingKillMargin, reclaimBudget)
	}
	if took < grace*time.Second+lendingKillMargin-2*time.Second {
		t.Errorf("the borrower's process ended %s after the reclaim, before its grace and the kill margin: it did not ignore SIGTERM, so this test shows nothing", took)
	}
	if err := c.WaitForPodGone(ctx, ns, "borrower", framework.PodTimeout); err != nil {
		t.Fatal(err)
	}
	wantClaimEvent(t, c, ns, "borrower", "BorrowerKilled", "cgroup.kill")
}

// TestNonLendingOwnerReclaimsAtPrepare: a share that does not lend, pinned
// to a GPU whose owner lends it to a borrower, is scheduled there (the
// lending device holds no counters). Its prepare takes the GPU back at once
// and fails, with an event on its claim, until the borrower is gone; then it
// runs.
func TestNonLendingOwnerReclaimsAtPrepare(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev", "lent.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-lending-consent")
	const grace = 5
	shared, _, minor := lendShareToBorrower(t, c, ns, grace)

	c.Apply(t, ns, framework.Claim{Name: "private", Memory: "10Gi", Cores: "20", Selectors: []string{framework.PinnedToMinor(minor)}}.Object())
	placedAt := time.Now()
	c.Apply(t, ns, framework.EnvPod("private", "private", false))
	// Its prepare is refused and the GPU taken back at once.
	err := framework.Poll(ctx, "the private claim to wait for the borrower", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		events, err := c.ClaimEvents(ctx, ns, "private")
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		if slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, "WaitingForBorrowers: ") }) {
			return true, nil
		}
		return false, framework.Retry("events %q", events)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitForPodGone(ctx, ns, "borrower", grace*time.Second+reclaimBudget+framework.PodTimeout); err != nil {
		t.Fatal(err)
	}
	t.Logf("borrower gone %s after the private share was created", time.Since(placedAt).Round(100*time.Millisecond))
	wantClaimEvent(t, c, ns, "borrower", "Reclaimed", "OwnerDoesNotLend")
	// The kubelet's retry prepares it once the borrower is gone.
	p, err := c.WaitForPodRunning(ctx, ns, "private")
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := c.AllocatedDevices(ctx, ns, "private"); len(d) != 1 || d[0].Result.Device != shared {
		t.Fatalf("private share's devices %v, want %s", d, shared)
	}
	t.Logf("private share running %s after creation (node %s)", time.Since(placedAt).Round(100*time.Millisecond), p.Spec.NodeName)
}
