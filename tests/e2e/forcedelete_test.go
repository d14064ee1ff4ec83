//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// stuckFor is how long the force-deleted pod's container outlives its
// deletion: long enough to see the next claim for its GPU refused.
const stuckFor = 15 * time.Second

// handoverBound is how long after the force-deleted pod's container ended
// the pod that asked for its GPU may take to run: the kubelet unprepares the
// old claim (or the plugin releases it), and the kubelet's next try of the
// new prepare succeeds (about a minute after the refused one here).
const handoverBound = 100 * time.Second

// TestForceDeletedPodKeepsItsGPUWhileItsContainerRuns: a pod deleted with
// --grace-period=0 is gone from the API server at once, and so is the claim
// generated for it, while the scheduler gives its GPU to a new claim; its
// container, though, stays until the kubelet has killed it. The kubelet here
// kills it within 2 s; a process stuck in an uninterruptible call (in the
// GPU driver, say) outlives the SIGKILL, and this test makes the container
// such a process by freezing it (cgroup v1 freezer, which holds off a
// SIGKILL until thawed), with the GPU's device node still in it. A claim
// pinned to the same GPU is not prepared while that container exists: its
// pod does not start, and its claim's PrepareFailed names the old claim.
// Once the container is gone the new pod runs and sees only that GPU.
func TestForceDeletedPodKeepsItsGPUWhileItsContainerRuns(t *testing.T) {
	cluster := needDriver(t, "gpu.tessera.dev")
	ctx := context.Background()
	ns := cluster.Namespace(t, "e2e-force")

	marker := "tessera-stays-" + ns
	first := framework.EnvPod("first", "whole", true)
	ctr := first.Object["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	ctr["command"] = []any{"sh", "-c", `while :; do sleep 1; done`, marker}
	cluster.Apply(t, ns, framework.Claim{Name: "whole", Template: true}.Object(), first)
	pod, err := cluster.WaitForPodRunning(ctx, ns, "first")
	if err != nil {
		t.Fatal(err)
	}
	claimName, err := framework.PodClaimName(pod, "gpu")
	if err != nil {
		t.Fatal(err)
	}
	devs, err := cluster.AllocatedDevices(ctx, ns, claimName)
	if err != nil || len(devs) != 1 {
		t.Fatalf("claim %s: devices %v, %v; want one", claimName, devs, err)
	}
	uuid := devs[0].Attribute("uuid")
	pid, err := hostPIDOf(ctx, marker)
	if err != nil {
		t.Fatal(err)
	}
	thaw := freezeContainer(t, pid)
	t.Logf("first pod holds %s (%s); its container (host process %d) is frozen", devs[0].Result.Device, uuid, pid)

	deleted := time.Now()
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	cluster.Apply(t, ns, framework.Claim{Name: "same-gpu", Selectors: []string{framework.PinnedToUUID(uuid)}}.Object(), framework.EnvPod("second", "same-gpu", false))

	// While the old container exists, the new pod must not start.
	notRunning := func(ctx context.Context) error {
		second, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{})
		if err != nil {
			return nil
		}
		for _, cs := range second.Status.ContainerStatuses {
			if cs.State.Running != nil {
				return fmt.Errorf("pod second runs on %s %v after the force delete while the force-deleted pod's container still exists (host process %d): two pods on one whole GPU",
					uuid, time.Since(deleted).Round(time.Second), pid)
			}
		}
		return nil
	}
	err = framework.Poll(ctx, "the force-deleted pod's container to be stuck", stuckFor+framework.PodTimeout, func(ctx context.Context) (bool, error) {
		if err := notRunning(ctx); err != nil {
			return false, err
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return false, fmt.Errorf("host process %d of the frozen container ended %v after the force delete: this test shows nothing", pid, time.Since(deleted))
		}
		if time.Since(deleted) < stuckFor {
			return false, framework.Retry("stuck")
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	events, err := cluster.ClaimEvents(ctx, ns, "same-gpu")
	if err != nil {
		t.Fatal(err)
	}
	refused := false
	for _, e := range events {
		if strings.HasPrefix(e, "PrepareFailed: ") && strings.Contains(e, claimName) {
			refused = true
			t.Logf("claim same-gpu: %s", e)
			break
		}
	}
	if !refused {
		t.Errorf("claim same-gpu has no PrepareFailed event naming %s while its GPU was held; events: %q", claimName, events)
	}

	thaw()
	err = framework.Poll(ctx, fmt.Sprintf("host process %d to end", pid), framework.PodTimeout, func(ctx context.Context) (bool, error) {
		if err := notRunning(ctx); err != nil {
			return false, err
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return true, nil
		}
		return false, framework.Retry("running")
	})
	if err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	t.Logf("the force-deleted pod's container ended %v after the delete", ended.Sub(deleted).Round(100*time.Millisecond))

	waitCtx, cancel := context.WithTimeout(ctx, handoverBound)
	defer cancel()
	second, err := cluster.WaitForEnvPod(waitCtx, ns, "second")
	if err != nil {
		t.Fatalf("the pod asking for the force-deleted pod's GPU did not run within %v of its container ending: %v", handoverBound, err)
	}
	t.Logf("second pod ran %v after the old container ended", time.Since(ended).Round(time.Second))
	framework.LogSpecPod(t, second)
	gpus, err := framework.VisibleGPUs(second.Env)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 1 || gpus[mustMinor(t, devs[0].Result.Device)] != uuid {
		t.Errorf("second pod sees %v, want only %s", gpus, uuid)
	}
	if err := cluster.DeletePodAndWait(ctx, ns, "second"); err != nil {
		t.Error(err)
	}
}

// freezeContainer freezes every process of the container of the host
// process pid, in a child of the container's cgroup v1 freezer cgroup: a
// frozen process takes a SIGKILL only when thawed, and the container's own
// cgroup stays thawed, so the runtime's kill does not thaw it. It returns
// the thaw, which also runs at cleanup. Hosts without the v1 freezer skip
// the test (cgroup v2's freezer lets a SIGKILL through).
func freezeContainer(t *testing.T, pid int) (thaw func()) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	rel := ""
	for line := range strings.SplitSeq(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "freezer") {
			rel = parts[2]
		}
	}
	dir := filepath.Join("/sys/fs/cgroup/freezer", rel)
	if _, err := os.Stat(filepath.Join(dir, "freezer.state")); rel == "" || rel == "/" || err != nil {
		t.Skipf("no cgroup v1 freezer cgroup of process %d (%q, %v): cannot keep a container past its kill", pid, rel, err)
	}
	child := filepath.Join(dir, "tessera-e2e-frozen")
	if err := os.Mkdir(child, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		t.Fatal(err)
	}
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(procs)) {
		// A process that ended meanwhile (a sleep) is not an error.
		_ = os.WriteFile(filepath.Join(child, "cgroup.procs"), []byte(p), 0)
	}
	thawed := false
	thaw = func() {
		if thawed {
			return
		}
		thawed = true
		if err := os.WriteFile(filepath.Join(child, "freezer.state"), []byte("THAWED"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("thaw %s: %v", child, err)
		}
	}
	t.Cleanup(func() {
		thaw()
		// Empty once its processes ended; the runtime removes it with the
		// container's cgroup otherwise.
		for range 20 {
			if err := os.Remove(child); err == nil || errors.Is(err, fs.ErrNotExist) {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
	})
	if err := os.WriteFile(filepath.Join(child, "freezer.state"), []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	if in, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err != nil || !strings.Contains(string(in), "tessera-e2e-frozen") {
		t.Fatalf("process %d is not in %s: %s %v", pid, child, in, err)
	}
	return thaw
}

func mustMinor(t *testing.T, device string) int {
	t.Helper()
	m, err := framework.DeviceMinor(device)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
