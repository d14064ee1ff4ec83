//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// mpsDaemonSelector selects the MPS control daemon pods the plugin creates
// (pkg/mpsdaemon).
const mpsDaemonSelector = "app.kubernetes.io/component=mps-control-daemon"

// mpsClaim is an MPS share; mpsClient a client of it that prints its
// env and what it can do with the daemon's directories: the control socket
// must be there, the pipe directory read-only, the daemon's logs absent.
var mpsClaim = framework.Claim{Name: "mps", Template: true, Memory: "8Gi", Cores: "20", Config: framework.GpuConfig("sharing: {isolation: MPS}")}

var mpsClient = framework.ScriptPod("mps-client", "mps", true, `
env | grep -E "^(NVIDIA_|CUDA_|TESSERA_)" | sort
if [ -S /tmp/nvidia-mps/control ]; then echo MPS_CONTROL=socket; else echo MPS_CONTROL=missing; fi
if touch /tmp/nvidia-mps/tenant-was-here 2>/dev/null; then echo MPS_PIPE=writable; else echo MPS_PIPE=read-only; fi
if [ -e /var/log/nvidia-mps ]; then echo MPS_LOGS=visible; else echo MPS_LOGS=absent; fi
if touch /dev/shm/tessera-e2e 2>/dev/null; then echo MPS_SHM=writable; else echo MPS_SHM=read-only; fi
`)

// mpsDaemonPod returns the daemon pod of the GPU (by the annotation the
// plugin writes), failing unless there is exactly one.
func mpsDaemonPod(c *framework.Cluster, ctx context.Context, uuid string) (*corev1.Pod, error) {
	found, err := mpsDaemonPods(c, ctx, uuid)
	if err != nil {
		return nil, err
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%d MPS daemon pods for GPU %s, want 1", len(found), uuid)
	}
	return &found[0], nil
}

// mpsDaemonPods returns the daemon pods of the GPU, one per trust domain
// (namespace) with MPS shares on it.
func mpsDaemonPods(c *framework.Cluster, ctx context.Context, uuid string) ([]corev1.Pod, error) {
	pods, err := c.Client.CoreV1().Pods(framework.PluginNamespace).List(ctx, metav1.ListOptions{LabelSelector: mpsDaemonSelector})
	if err != nil {
		return nil, err
	}
	var found []corev1.Pod
	for _, p := range pods.Items {
		if p.Annotations["gpu.tessera.dev/gpu-uuid"] == uuid {
			found = append(found, p)
		}
	}
	return found, nil
}

// TestMPSDaemonOutlivesPlugin: an MPS share's daemon runs in a pod of its
// own that the plugin creates before the claim's pod starts; the client gets
// the daemon's control socket through a read-only pipe directory and never
// its logs. Restarting the plugin and a helm upgrade keep the daemon pod (the
// same UID, never restarted) and the client's container; deleting the client
// (the claim's unprepare) deletes the daemon pod.
func TestMPSDaemonOutlivesPlugin(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-mps")
	client := c.RunObjects(t, ns, mpsClaim.Object(), framework.Unstructured(mpsClient))["mps-client"]

	uuid := framework.ClaimOf(t, c, client, "gpu").Attribute("uuid")
	for k, want := range map[string]string{
		"CUDA_VISIBLE_DEVICES":              uuid,
		"CUDA_MPS_PIPE_DIRECTORY":           "/tmp/nvidia-mps",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=8192M",
		"MPS_CONTROL":                       "socket",
		"MPS_PIPE":                          "read-only",
		"MPS_LOGS":                          "absent",
		"MPS_SHM":                           "writable",
	} {
		if got := client.Env[k]; got != want {
			t.Errorf("client: %s=%q, want %q", k, got, want)
		}
	}

	daemon, err := mpsDaemonPod(c, ctx, uuid)
	if err != nil {
		t.Fatal(err)
	}
	if !framework.ReadyPod(daemon) || daemon.Spec.NodeName != client.Pod.Spec.NodeName || len(daemon.OwnerReferences) != 0 {
		t.Fatalf("daemon pod %s: ready %v, node %q (client on %q), owners %v", daemon.Name, framework.ReadyPod(daemon), daemon.Spec.NodeName, client.Pod.Spec.NodeName, daemon.OwnerReferences)
	}
	t.Logf("client on GPU %s; daemon pod %s (uid %s) Ready on %s", uuid, daemon.Name, daemon.UID, daemon.Spec.NodeName)
	ctrID := client.Pod.Status.ContainerStatuses[0].ContainerID

	// unchanged checks that the daemon pod and the client survived.
	unchanged := func(after string) {
		t.Helper()
		now, err := mpsDaemonPod(c, ctx, uuid)
		if err != nil {
			t.Fatalf("after %s: %v", after, err)
		}
		restarts := int32(-1)
		if len(now.Status.ContainerStatuses) == 1 {
			restarts = now.Status.ContainerStatuses[0].RestartCount
		}
		if now.UID != daemon.UID || !framework.ReadyPod(now) || restarts != 0 {
			t.Fatalf("after %s: daemon pod %s uid %s (was %s), ready %v, restarts %d; want the same pod, Ready, never restarted",
				after, now.Name, now.UID, daemon.UID, framework.ReadyPod(now), restarts)
		}
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "mps-client", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cs := p.Status.ContainerStatuses[0]
		if p.Status.Phase != corev1.PodRunning || cs.ContainerID != ctrID || cs.RestartCount != 0 {
			t.Fatalf("after %s: client phase %s, container %s (was %s), restarts %d", after, p.Status.Phase, cs.ContainerID, ctrID, cs.RestartCount)
		}
		t.Logf("after %s: daemon pod %s is the same (uid %s, 0 restarts), the client keeps container %s", after, now.Name, now.UID, framework.ShortID(ctrID))
	}

	// 1. Restart the plugin: delete its pod, wait for the DaemonSet's new one.
	old, err := c.ReadyPluginPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CoreV1().Pods(framework.PluginNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitPluginReplaced(ctx, old.UID); err != nil {
		t.Fatal(err)
	}
	unchanged("a plugin restart")

	// 2. helm upgrade with a changed value rolls the plugin.
	helm := framework.HelmBinary(t)
	if out, err := exec.Command(helm, "status", "-n", framework.InstallNamespace, framework.InstallRelease).CombinedOutput(); err != nil {
		if os.Getenv("TESSERA_E2E_INSTALL") == "1" {
			t.Fatalf("helm status: %v\n%s", err, out)
		}
		t.Logf("Tessera is not installed with helm as release %s/%s; skipping the upgrade: %s", framework.InstallNamespace, framework.InstallRelease, out)
	} else {
		before, err := c.ReadyPluginPod(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stamp := time.Now().UTC().Format("20060102T150405Z")
		out, err := exec.Command(helm, "upgrade", framework.InstallRelease, filepath.Join(framework.RepoRoot, "deployments", "helm", "tessera"),
			"--namespace", framework.InstallNamespace, "--reuse-values",
			"--set-string", "kubeletPlugin.podAnnotations.tessera\\.dev/e2e-mps-upgrade="+stamp,
			"--wait", "--timeout", "4m").CombinedOutput()
		if err != nil {
			t.Fatalf("helm upgrade: %v\n%s", err, out)
		}
		if err := c.WaitPluginReplaced(ctx, before.UID); err != nil {
			t.Fatal(err)
		}
		unchanged("helm upgrade")
	}

	// 3. The claim's unprepare (its pod deleted) deletes the daemon pod.
	if err := c.DeletePodAndWait(ctx, ns, "mps-client"); err != nil {
		t.Fatal(err)
	}
	err = framework.Poll(ctx, "daemon pod "+daemon.Name+" to be deleted", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(framework.PluginNamespace).Get(ctx, daemon.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, framework.Retry("%v", err)
		case p.UID != daemon.UID:
			return false, fmt.Errorf("daemon pod %s was recreated (uid %s) after its last client went", p.Name, p.UID)
		}
		return false, framework.Retry("still there (phase %s, deleting %v)", p.Status.Phase, p.DeletionTimestamp != nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("client deleted; its claim was unprepared and daemon pod %s deleted", daemon.Name)
}
