//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// forceDeleteBound is how long the pod that takes a force-deleted pod's GPU may
// take to run. Without the plugin releasing the stale claim, its prepare fails
// until the kubelet unprepares the old claim and then waits out the kubelet's
// backoff (about 90 s in this cluster).
const forceDeleteBound = 60 * time.Second

// TestForceDeletedPodFreesItsGPU: a pod deleted with --grace-period=0 leaves
// its claim prepared on the node while the scheduler already gives its GPU to
// a new claim. The plugin asks the API server, finds the old claim gone,
// releases it (Node event StaleClaimReleased) and prepares the new one, so the
// new pod runs without waiting for the kubelet's late unprepare.
func TestForceDeletedPodFreesItsGPU(t *testing.T) {
	cluster := needDriver(t, "gpu.tessera.dev")
	ctx := context.Background()
	ns := cluster.Namespace(t, "e2e-force")

	pods := cluster.RunObjects(t, ns, framework.Claim{Name: "whole", Template: true}.Object(), framework.EnvPod("first", "whole", true))
	first := pods["first"]
	claimName, err := framework.PodClaimName(first.Pod, "gpu")
	if err != nil {
		t.Fatal(err)
	}
	devs, err := cluster.AllocatedDevices(ctx, ns, claimName)
	if err != nil || len(devs) != 1 {
		t.Fatalf("claim %s: devices %v, %v; want one", claimName, devs, err)
	}
	uuid := devs[0].Attribute("uuid")
	t.Logf("first pod holds %s (%s)", devs[0].Result.Device, uuid)

	// Force-delete and, at once, ask for exactly that GPU.
	start := time.Now()
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	cluster.Apply(t, ns, framework.Claim{Name: "same-gpu", Selectors: []string{framework.PinnedToUUID(uuid)}}.Object(), framework.EnvPod("second", "same-gpu", false))

	waitCtx, cancel := context.WithTimeout(ctx, forceDeleteBound)
	defer cancel()
	second, err := cluster.WaitForEnvPod(waitCtx, ns, "second")
	if err != nil {
		t.Fatalf("the pod asking for the force-deleted pod's GPU did not run within %v: %v", forceDeleteBound, err)
	}
	t.Logf("second pod ran %v after the force delete", time.Since(start).Round(time.Second))
	framework.LogSpecPod(t, second)
	gpus, err := framework.VisibleGPUs(second.Env)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 1 || gpus[mustMinor(t, devs[0].Result.Device)] != uuid {
		t.Errorf("second pod sees %v, want only %s", gpus, uuid)
	}

	// Whether the plugin had to release the old claim depends on whether the
	// kubelet unprepared it first; report which happened.
	events, err := cluster.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=StaleClaimReleased"})
	if err == nil {
		for _, ev := range events.Items {
			if ev.InvolvedObject.Kind == "Node" && strings.Contains(ev.Message, claimName) {
				t.Logf("node event %s: %s", ev.Reason, ev.Message)
			}
		}
	}
	if err := cluster.DeletePodAndWait(ctx, ns, "second"); err != nil {
		t.Error(err)
	}
}

func mustMinor(t *testing.T, device string) int {
	t.Helper()
	m, err := framework.DeviceMinor(device)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
