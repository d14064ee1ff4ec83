//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/tests/e2e/framework"
)

// mpsTenant is an MPS share and a client, run as runAsUser (0: the
// image's user), that writes a marker into its /dev/shm and prints the
// inode of the control socket it reaches, then waits. A non-empty uuid pins
// the share to that GPU.
func mpsTenant(runAsUser int, uuid string) []*unstructured.Unstructured {
	claim := framework.Claim{Name: "mps", Template: true, Memory: "4Gi", Cores: "10", Config: framework.GpuConfig("sharing: {isolation: MPS}")}
	if uuid != "" {
		claim.Selectors = []string{framework.PinnedToUUID(uuid)}
	}
	pod := framework.ScriptPod("tenant", "mps", true, `
echo "MPS_UID=$(id -u)"
if [ -S /tmp/nvidia-mps/control ]; then echo MPS_CONTROL=socket; else echo MPS_CONTROL=missing; fi
echo "MPS_CONTROL_INODE=$(stat -c %i /tmp/nvidia-mps/control 2>/dev/null)"
if echo "$POD_NAMESPACE" > /dev/shm/tenant-secret 2>/dev/null; then echo MPS_SHM=writable; else echo MPS_SHM=not-writable; fi
`)
	ctr := &pod.Spec.Containers[0]
	ctr.Env = []corev1.EnvVar{{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}
	if runAsUser != 0 {
		id := int64(runAsUser)
		ctr.SecurityContext = &corev1.SecurityContext{RunAsUser: &id, RunAsGroup: &id, RunAsNonRoot: ptr.To(true)}
	}
	return []*unstructured.Unstructured{claim.Object(), framework.Unstructured(pod)}
}

// TestMPSTrustDomains: MPS shares in two namespaces on one GPU run with two
// daemons: the file one tenant writes into its /dev/shm is not in the
// other's, their control sockets are different files, and both run; a
// client running as uid 1000 runs too (its pipe, log and shared-memory
// directories are writable by any uid). On a release with one daemon per
// GPU, tenant B read tenant A's /dev/shm file.
func TestMPSTrustDomains(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	ctx := context.Background()
	nsA := c.Namespace(t, "e2e-mps-a")
	nsB := c.Namespace(t, "e2e-mps-b")
	// Both shares on one GPU: B's claim selects the GPU the scheduler
	// gave A, so the two domains meet on one GPU.
	a := c.RunObjects(t, nsA, mpsTenant(0, "")...)["tenant"]
	uuidOf := func(ns string, p framework.SpecPod) string {
		name, err := framework.PodClaimName(p.Pod, "gpu")
		if err != nil {
			t.Fatal(err)
		}
		devs, err := c.AllocatedDevices(ctx, ns, name)
		if err != nil || len(devs) != 1 {
			t.Fatalf("claim %s/%s: %v devices, %v", ns, name, len(devs), err)
		}
		return devs[0].Attribute("uuid")
	}
	b := c.RunObjects(t, nsB, mpsTenant(1000, uuidOf(nsA, a))...)["tenant"]
	sameGPU := uuidOf(nsA, a) == uuidOf(nsB, b)
	if !sameGPU {
		t.Fatalf("the two shares landed on different GPUs (%s, %s) although B selected A's", uuidOf(nsA, a), uuidOf(nsB, b))
	}

	for name, p := range map[string]framework.SpecPod{"A": a, "B (runAsUser 1000)": b} {
		if !strings.Contains(p.Log, "MPS_CONTROL=socket") || !strings.Contains(p.Log, "MPS_SHM=writable") {
			t.Errorf("tenant %s: want the control socket and a writable /dev/shm, got:\n%s", name, p.Log)
		}
	}
	if !strings.Contains(b.Log, "MPS_UID=1000") {
		t.Errorf("tenant B runs as %q, want uid 1000", b.Log)
	}
	inode := func(log string) string {
		for _, l := range strings.Split(log, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "MPS_CONTROL_INODE="); ok {
				return v
			}
		}
		return ""
	}
	if ia, ib := inode(a.Log), inode(b.Log); ia == "" || ia == ib {
		t.Errorf("control socket inodes %q (A) and %q (B): want two different sockets", ia, ib)
	}

	// What each tenant sees in its /dev/shm now that both wrote.
	for _, tc := range []struct{ ns, other string }{{nsA, nsB}, {nsB, nsA}} {
		out, err := kubectlExec(t, tc.ns, "tenant", "cat", "/dev/shm/tenant-secret")
		if err != nil {
			t.Fatalf("read /dev/shm in %s: %v: %s", tc.ns, err, out)
		}
		if got := strings.TrimSpace(out); got != tc.ns {
			t.Errorf("tenant in %s reads %q from its /dev/shm/tenant-secret, want its own %q (the other namespace %s wrote over it)", tc.ns, got, tc.ns, tc.other)
		}
	}

	if sameGPU {
		uuid := uuidOf(nsA, a)
		pods, err := mpsDaemonPods(c, ctx, uuid)
		if err != nil {
			t.Fatal(err)
		}
		domains := map[string]bool{}
		for _, p := range pods {
			domains[p.Annotations["gpu.tessera.dev/mps-domain"]] = true
		}
		if !domains[nsA] || !domains[nsB] {
			t.Errorf("daemon pods of GPU %s serve domains %v, want %s and %s", uuid, domains, nsA, nsB)
		}
	}
}

// kubectlExec runs a command in a pod's first container.
func kubectlExec(t *testing.T, ns, pod string, command ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(kubectlBinary(t), append([]string{"exec", "-n", ns, pod, "--"}, command...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+framework.Kubeconfig(t))
	out, err := cmd.CombinedOutput()
	return string(out), err
}
