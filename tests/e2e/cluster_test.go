//go:build e2e

package e2e

import (
	"context"
	"net"
	"testing"

	"github.com/tessera-dev/tessera/tests/e2e/framework"
)

// TestBusyboxPodRuns proves the cluster itself: a pod is scheduled, its image is
// pulled, it gets an address on the pod network, runs, and its output is
// readable.
func TestBusyboxPodRuns(t *testing.T) {
	ctx := context.Background()
	cluster := needCluster(t)
	ns := cluster.Namespace(t, "e2e-busybox")
	cluster.ApplyFile(t, ns, framework.Testdata(t, "busybox-env.yaml"))

	pod, err := cluster.WaitForPodSucceeded(ctx, ns, "busybox-env")
	if err != nil {
		t.Fatal(err)
	}
	log, err := cluster.WaitForLog(ctx, ns, pod.Name, "ctr", framework.EnvDoneMarker)
	if err != nil {
		t.Fatal(err)
	}
	env := framework.ParseEnv(log)
	if got := env["TESSERA_E2E"]; got != "hello" {
		t.Errorf("TESSERA_E2E in the container = %q, want %q; log:\n%s", got, "hello", log)
	}
	if got := env["HOSTNAME"]; got != pod.Name {
		t.Errorf("HOSTNAME in the container = %q, want the pod's name %q", got, pod.Name)
	}
	ip := net.ParseIP(pod.Status.PodIP)
	if ip == nil || pod.Status.PodIP == pod.Status.HostIP {
		t.Errorf("pod IP %q (host IP %q): want an address on the pod network", pod.Status.PodIP, pod.Status.HostIP)
	}
}
