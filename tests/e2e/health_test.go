//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The local cluster's health settings (demo/clusters/local/overlay/values.yaml
// sets health.recoveryPeriod; the XID lists are the chart's defaults).
const (
	healthRecoveryPeriod = 30 * time.Second
	// healthTaintKey is pkg/health.TaintKey.
	healthTaintKey = "gpu.tessera.dev/unhealthy"
	// fatalXID is in the chart's health.fatalXIDs (GPU has fallen off the bus).
	fatalXID = 79
	// nonFatalXID is in neither list: it counts, with effect NoSchedule.
	nonFatalXID = 94
	// taintSlack is how long the plugin may take to publish a taint change
	// after it happened (event watch, republish, API write).
	taintSlack = 60 * time.Second
)

// injectXID delivers an XID event for the GPU with this NVML index through
// the plugin's mock knob (--mock-fault-injection).
func injectXID(t testing.TB, index string, xid int) {
	t.Helper()
	q := url.Values{"gpu": {index}, "xid": {fmt.Sprint(xid)}}
	framework.PostMockKnob(t, "/mock/xid", q)
}

// gpuTaints returns, for every published device of the GPU with this minor
// (gpu-N, gpu-N-shared and, with lending, gpu-N-lent), its health taint
// (nil when it has none).
func gpuTaints(c *framework.Cluster, ctx context.Context, minor string) (map[string]*resourceapi.DeviceTaint, error) {
	published, err := c.DriverSlices(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]*resourceapi.DeviceTaint{}
	whole := "gpu-" + minor
	for _, s := range published {
		for _, d := range s.Spec.Devices {
			if d.Name != whole && !strings.HasPrefix(d.Name, whole+"-") {
				continue
			}
			out[d.Name] = nil
			for i := range d.Taints {
				if d.Taints[i].Key == healthTaintKey {
					out[d.Name] = &d.Taints[i]
				}
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no published device %s", whole)
	}
	return out, nil
}

// waitGPUTaint waits until every device of the GPU has the health taint
// with this effect, or (effect "") none has it, and returns how long it took.
func waitGPUTaint(c *framework.Cluster, ctx context.Context, t testing.TB, minor string, effect resourceapi.DeviceTaintEffect, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	what := fmt.Sprintf("devices of GPU %s to be tainted %s=%s", minor, healthTaintKey, effect)
	if effect == "" {
		what = fmt.Sprintf("devices of GPU %s to lose the %s taint", minor, healthTaintKey)
	}
	var last map[string]*resourceapi.DeviceTaint
	err := framework.Poll(ctx, what, timeout, func(ctx context.Context) (bool, error) {
		taints, err := gpuTaints(c, ctx, minor)
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		last = taints
		if len(taints) < 2 {
			return false, framework.Retry("only devices %v published", slices.Sorted(maps.Keys(taints)))
		}
		for name, taint := range taints {
			switch {
			case effect == "" && taint != nil:
				return false, framework.Retry("%s still tainted %s (%s)", name, taint.Effect, taint.Value)
			case effect != "" && taint == nil:
				return false, framework.Retry("%s not tainted", name)
			case effect != "" && taint.Effect != effect:
				return false, framework.Retry("%s tainted %s", name, taint.Effect)
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, taint := range last {
		if taint != nil {
			t.Logf("device %s: taint %s=%s:%s", name, taint.Key, taint.Value, taint.Effect)
		}
	}
	return time.Since(start)
}

// TestHealthFatalXIDEvictsAndRecovers: a fatal XID on a GPU taints both of
// its devices NoExecute, kube-controller-manager evicts the pod using it,
// a pod for that GPU is unschedulable while the taint lasts, and once the
// recovery period passed without another error the taint goes and that pod
// runs on the GPU.
func TestHealthFatalXIDEvictsAndRecovers(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-health-fatal")

	victim := c.RunObjects(t, ns,
		framework.Claim{Name: "whole", Template: true}.Object(), framework.EnvPod("victim", "whole", true))["victim"]
	dev := framework.ClaimOf(t, c, victim, "gpu")
	minor, index := dev.Attribute("minor"), dev.Attribute("index")
	if minor == "" || index == "" {
		t.Fatalf("device %s: minor %q, index %q: want both attributes", dev.Result.Device, minor, index)
	}
	t.Logf("pod victim runs on %s (index %s)", dev.Result.Device, index)

	injected := time.Now()
	injectXID(t, index, fatalXID)
	took := waitGPUTaint(c, ctx, t, minor, resourceapi.DeviceTaintEffectNoExecute, taintSlack)
	t.Logf("XID %d: every device of GPU %s tainted NoExecute after %v", fatalXID, minor, took.Round(100*time.Millisecond))

	// The device taint eviction controller deletes the pod (it does not
	// tolerate the taint).
	err := framework.Poll(ctx, "pod victim to be evicted", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "victim", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, framework.Retry("%v", err)
		case p.UID != victim.Pod.UID:
			return false, fmt.Errorf("pod victim was replaced (uid %s)", p.UID)
		case p.DeletionTimestamp != nil:
			return true, nil
		}
		return false, framework.Retry("phase %s, not deleted", p.Status.Phase)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod victim evicted %v after the XID", time.Since(injected).Round(100*time.Millisecond))

	// While tainted, a new pod for that GPU stays off it.
	c.Apply(t, ns, framework.Claim{Name: "that-gpu", Selectors: []string{framework.PinnedToMinor(minor)}}.Object())
	c.Apply(t, ns, framework.EnvPod("after", "that-gpu", false))
	cond, err := c.WaitForUnschedulable(ctx, ns, "after")
	if err != nil {
		t.Fatal(err)
	}
	if taints, err := gpuTaints(c, ctx, minor); err != nil || taints["gpu-"+minor] == nil {
		t.Fatalf("pod after was found unschedulable, but GPU %s's taint is gone already (%v): the test cannot tell the taint was the cause; is health.recoveryPeriod shorter than %v?", minor, err, healthRecoveryPeriod)
	}
	t.Logf("pod after (claim for minor %s) while tainted: %s: %s", minor, cond.Reason, cond.Message)

	waitGPUTaint(c, ctx, t, minor, "", healthRecoveryPeriod+taintSlack)
	since := time.Since(injected)
	if since < healthRecoveryPeriod {
		t.Errorf("the taint went %v after the XID, before the recovery period (%v)", since.Round(100*time.Millisecond), healthRecoveryPeriod)
	}
	t.Logf("GPU %s untainted %v after the XID (recovery period %v)", minor, since.Round(100*time.Millisecond), healthRecoveryPeriod)

	after := c.EnvOf(ctx, t, ns, "after")
	got := framework.ClaimOf(t, c, after, "gpu")
	if got.Result.Device != "gpu-"+minor || got.Attribute("uuid") != dev.Attribute("uuid") {
		t.Fatalf("pod after got %s (uuid %s), want gpu-%s (uuid %s)", got.Result.Device, got.Attribute("uuid"), minor, dev.Attribute("uuid"))
	}
	framework.WantGPUs(t, "pod after", after.Env, framework.WholeGPU(t, got))
	t.Logf("pod after runs on the recovered GPU %s", got.Result.Device)
}

// TestHealthNonFatalXIDKeepsNewPodsOff: an XID in neither list taints both
// devices of the GPU NoSchedule: the pod already on it keeps running (same
// container, no restart), a new pod for that GPU stays unschedulable until
// the taint is gone after the recovery period, and then runs there.
func TestHealthNonFatalXIDKeepsNewPodsOff(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-health-noschedule")

	running := c.RunObjects(t, ns,
		framework.Claim{Name: "share", Template: true, Memory: "8Gi", Cores: "10"}.Object(), framework.EnvPod("running", "share", true))["running"]
	dev := framework.ClaimOf(t, c, running, "gpu")
	minor, index := dev.Attribute("minor"), dev.Attribute("index")
	if minor == "" || index == "" {
		t.Fatalf("device %s: minor %q, index %q: want both attributes", dev.Result.Device, minor, index)
	}
	containerOf := func(p *corev1.Pod) (string, int32) {
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == "ctr" {
				return s.ContainerID, s.RestartCount
			}
		}
		return "", 0
	}
	startID, _ := containerOf(running.Pod)
	t.Logf("pod running has a share of %s (index %s), container %s", dev.Result.Device, index, framework.ShortID(startID))

	injected := time.Now()
	injectXID(t, index, nonFatalXID)
	took := waitGPUTaint(c, ctx, t, minor, resourceapi.DeviceTaintEffectNoSchedule, taintSlack)
	t.Logf("XID %d: every device of GPU %s tainted NoSchedule after %v", nonFatalXID, minor, took.Round(100*time.Millisecond))

	// A share of that GPU (there is room beside the running one): only the
	// taint keeps it off.
	c.Apply(t, ns, framework.Claim{Name: "that-gpu", Memory: "8Gi", Cores: "10", Selectors: []string{framework.PinnedToMinor(minor)}}.Object())
	c.Apply(t, ns, framework.EnvPod("new", "that-gpu", false))
	cond, err := c.WaitForUnschedulable(ctx, ns, "new")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod new (a share of minor %s) while tainted: %s: %s", minor, cond.Reason, cond.Message)

	// The running pod is not evicted: same pod, same container, no restart.
	checkRunning := func(when string) {
		t.Helper()
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "running", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: pod running: %v", when, err)
		}
		id, restarts := containerOf(p)
		if p.UID != running.Pod.UID || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || id != startID || restarts != 0 {
			t.Fatalf("%s: pod running: uid %s (was %s), deleting %v, phase %s, container %s (was %s), %d restarts: want it untouched by a NoSchedule taint",
				when, p.UID, running.Pod.UID, p.DeletionTimestamp != nil, p.Status.Phase, framework.ShortID(id), framework.ShortID(startID), restarts)
		}
	}
	checkRunning("while tainted")

	waitGPUTaint(c, ctx, t, minor, "", healthRecoveryPeriod+taintSlack)
	since := time.Since(injected)
	if since < healthRecoveryPeriod {
		t.Errorf("the taint went %v after the XID, before the recovery period (%v)", since.Round(100*time.Millisecond), healthRecoveryPeriod)
	}
	t.Logf("GPU %s untainted %v after the XID", minor, since.Round(100*time.Millisecond))
	newPod := c.EnvOf(ctx, t, ns, "new")
	got := framework.ClaimOf(t, c, newPod, "gpu")
	if got.Result.Device != dev.Result.Device {
		t.Fatalf("pod new got %s, want %s", got.Result.Device, dev.Result.Device)
	}
	checkRunning("after the recovery")
	t.Logf("pod new runs on %s beside pod running, which kept its container", got.Result.Device)
}
