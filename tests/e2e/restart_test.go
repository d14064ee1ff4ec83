//go:build e2e

package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// TestPluginRestartLosesNothing deletes the kubelet plugin's pod while pods
// with a share and a whole GPU run. The DaemonSet
// starts a new plugin pod; the running pods keep running (the same
// containers, never restarted); the new plugin prepares a new claim; and
// deleting the old pods afterwards unprepares their claims through the new
// plugin: the pods go, their CDI specs go from /var/run/cdi and their entries
// from the plugin's checkpoint.
func TestPluginRestartLosesNothing(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	framework.RequireNodeFiles(t)
	ctx := context.Background()
	start := time.Now()
	at := func() string { return time.Since(start).Round(100 * time.Millisecond).String() }
	ns := c.Namespace(t, "e2e-restart")
	objs := []*unstructured.Unstructured{
		framework.Claim{Name: "share", Template: true, Memory: "8Gi", Cores: "10"}.Object(),
		framework.Claim{Name: "whole", Template: true}.Object(),
	}
	names := []string{"share", "whole"}
	for _, n := range names {
		objs = append(objs, framework.EnvPod(n, n, true))
	}
	before := c.RunObjects(t, ns, objs...)

	// What each pod holds: its claim, its container, its CDI spec, its
	// checkpoint entry. All must be there before the restart, or the checks
	// after it prove nothing.
	type held struct {
		claim   string
		uid     types.UID
		ctrID   string
		started metav1.Time
	}
	holds := map[string]held{}
	checkpoint, err := framework.ReadCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		p := before[n]
		claimName, err := framework.PodClaimName(p.Pod, "gpu")
		if err != nil {
			t.Fatal(err)
		}
		claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cs := p.Pod.Status.ContainerStatuses[0]
		if cs.State.Running == nil {
			t.Fatalf("pod %s: container not running: %+v", n, cs.State)
		}
		h := held{claim: claimName, uid: claim.UID, ctrID: cs.ContainerID, started: cs.State.Running.StartedAt}
		holds[n] = h
		if _, err := os.Stat(framework.CDISpecPath(h.uid)); err != nil {
			t.Fatalf("pod %s: the CDI spec of its claim %s: %v", n, claimName, err)
		}
		if e, ok := checkpoint[h.uid]; !ok || e.State != "PrepareCompleted" || e.Name != claimName {
			t.Fatalf("pod %s: checkpoint entry for claim %s (uid %s): %+v (present %v), want PrepareCompleted", n, claimName, h.uid, e, ok)
		}
		t.Logf("pod %s: claim %s (uid %s), container %s started %s, CDI spec %s, checkpoint entry PrepareCompleted",
			n, claimName, h.uid, shortContainerID(h.ctrID), h.started.UTC().Format("15:04:05"), framework.CDISpecPath(h.uid))
	}

	// Restart the plugin: delete its pod, wait for the DaemonSet's new one.
	old, err := c.ReadyPluginPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A graceful delete, as `kubectl delete pod` does: the plugin gets SIGTERM.
	if err := c.Client.CoreV1().Pods(framework.PluginNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: deleted plugin pod %s (uid %s)", at(), old.Name, old.UID)
	err = framework.Poll(ctx, "plugin pod "+old.Name+" to be gone", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		pods, err := c.PluginPods(ctx)
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		for _, p := range pods {
			if p.UID == old.UID {
				return false, framework.Retry("still there (phase %s)", p.Status.Phase)
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	plugin, err := c.ReadyPluginPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if plugin.UID == old.UID {
		t.Fatalf("plugin pod %s was not replaced", old.Name)
	}
	t.Logf("%s: new plugin pod %s (uid %s) Ready", at(), plugin.Name, plugin.UID)

	// The running pods did not notice.
	for _, n := range names {
		pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cs := pod.Status.ContainerStatuses[0]
		h := holds[n]
		if pod.Status.Phase != corev1.PodRunning || cs.State.Running == nil || cs.RestartCount != 0 ||
			cs.ContainerID != h.ctrID || !cs.State.Running.StartedAt.Equal(&h.started) {
			t.Errorf("pod %s after the plugin restart: phase %s, container %s (was %s), state %+v, restarts %d",
				n, pod.Status.Phase, shortContainerID(cs.ContainerID), shortContainerID(h.ctrID), cs.State, cs.RestartCount)
			continue
		}
		t.Logf("pod %s still running: container %s, started %s, 0 restarts", n, shortContainerID(cs.ContainerID), cs.State.Running.StartedAt.UTC().Format("15:04:05"))
	}
	checkpoint, err = framework.ReadCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if e, ok := checkpoint[holds[n].uid]; !ok || e.State != "PrepareCompleted" {
			t.Errorf("after the restart the checkpoint lost claim %s of pod %s: %+v", holds[n].claim, n, e)
		}
		if _, err := os.Stat(framework.CDISpecPath(holds[n].uid)); err != nil {
			t.Errorf("after the restart the CDI spec of claim %s is gone: %v", holds[n].claim, err)
		}
	}

	// The new plugin prepares a new claim.
	after := c.RunObjects(t, ns, framework.EnvPod("share-after", "share", true))["share-after"]
	t.Logf("%s: pod share-after running", at())
	dev := framework.ClaimOf(t, c, after, "gpu")
	framework.WantGPUs(t, "pod share-after", after.Env, framework.ShareGPU(t, dev, "8Gi", 10))

	// Deleting the old pods unprepares their claims through the new plugin.
	for _, n := range names {
		if err := c.DeletePodAndWait(ctx, ns, n); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: pod %s gone", at(), n)
	}
	for _, n := range names {
		h := holds[n]
		err := framework.Poll(ctx, "claim "+h.claim+" to be unprepared", framework.LogTimeout, func(ctx context.Context) (bool, error) {
			if _, err := os.Stat(framework.CDISpecPath(h.uid)); !os.IsNotExist(err) {
				return false, framework.Retry("CDI spec %s still there (%v)", framework.CDISpecPath(h.uid), err)
			}
			cp, err := framework.ReadCheckpoint()
			if err != nil {
				return false, framework.Retry("%v", err)
			}
			if e, ok := cp[h.uid]; ok {
				return false, framework.Retry("checkpoint still lists it: %+v", e)
			}
			return true, nil
		})
		if err != nil {
			t.Error(err)
			continue
		}
		t.Logf("%s: pod %s deleted: claim %s unprepared, no CDI spec, no checkpoint entry", at(), n, h.claim)
	}
	// The claim prepared after the restart is still there, untouched.
	afterClaim, _ := framework.PodClaimName(after.Pod, "gpu")
	ac, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, afterClaim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(framework.CDISpecPath(ac.UID)); err != nil {
		t.Errorf("claim %s of the running pod share-after: %v", afterClaim, err)
	}
}

// shortContainerID is the first 12 hex digits of "containerd://<id>".
func shortContainerID(id string) string {
	for i := len(id) - 1; i >= 0; i-- {
		if id[i] == '/' {
			id = id[i+1:]
			break
		}
	}
	if len(id) > 12 {
		id = id[:12]
	}
	return id
}
