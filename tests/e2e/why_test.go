//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/internal/cli/why"
)

// TestWhyExplainsPendingPods: tessera why, run against the cluster, names
// for each pending pod what fails on which GPU. A share (20Gi/25) holds
// gpu-0; then three pods stay pending: a share larger than any GPU, nine
// whole GPUs on an eight-GPU node, and the whole gpu-0 (blocked by the
// share). Their explanations must say so, per GPU, with the holder. A fourth
// pod asks for a small share of gpu-1, whose shared device a DeviceTaintRule
// the test creates (and deletes) taints NoSchedule: the scheduler keeps it
// pending, and the explanation names the rule.
func TestWhyExplainsPendingPods(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-why")
	// The rule first, so that the scheduler has seen it long before the pod
	// that it keeps off gpu-1 comes. It selects gpu-1-shared of every pool
	// of the driver: the pod must stay pending on every node.
	rules := c.Client.ResourceV1().DeviceTaintRules()
	rule := &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-fence-gpu-1"},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To("gpu.tessera.dev"), Device: ptr.To("gpu-1-shared")},
			Taint:          resourceapi.DeviceTaint{Key: "e2e.tessera.dev/why-fence", Value: "maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		},
	}
	if _, err := rules.Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceTaintRule: %v", err)
	}
	t.Cleanup(func() {
		if err := rules.Delete(context.Background(), rule.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete DeviceTaintRule %s: %v", rule.Name, err)
		}
	})
	onGPU0, onGPU1 := framework.PinnedToMinor(0), framework.PinnedToMinor(1)
	objs := []*unstructured.Unstructured{
		framework.Claim{Name: "holder", Memory: "20Gi", Cores: "25", Selectors: []string{onGPU0}}.Object(),
		framework.Claim{Name: "too-much-memory", Memory: "100Gi", Cores: "10"}.Object(),
		framework.Claim{Name: "nine-gpus", Count: 9}.Object(),
		framework.Claim{Name: "whole-gpu-0", Selectors: []string{onGPU0}}.Object(),
		framework.Claim{Name: "fenced-share", Memory: "1Gi", Cores: "1", Selectors: []string{onGPU1}}.Object(),
	}
	c.Apply(t, ns, append(objs, framework.EnvPod("holder", "holder", false))...)
	if _, err := c.WaitForPodRunning(ctx, ns, "holder"); err != nil {
		t.Fatal(err)
	}
	pending := []string{"too-much-memory", "nine-gpus", "whole-gpu-0", "fenced-share"}
	for _, name := range pending {
		c.Apply(t, ns, framework.EnvPod(name, name, false))
	}
	for _, name := range pending {
		if _, err := c.WaitForUnschedulable(ctx, ns, name); err != nil {
			t.Fatal(err)
		}
	}

	kubeconfig := framework.Kubeconfig(t)
	explain := func(target string) (string, why.Report) {
		t.Helper()
		table := framework.RunCLI(t, "why", target, "-n", ns, "--kubeconfig", kubeconfig)
		t.Logf("tessera why %s -n %s:\n%s", target, ns, table)
		var r why.Report
		if err := json.Unmarshal([]byte(framework.RunCLI(t, "why", target, "-n", ns, "--kubeconfig", kubeconfig, "-o", "json")), &r); err != nil {
			t.Fatalf("tessera why %s -o json: %v", target, err)
		}
		if len(r.Nodes) == 0 {
			t.Fatalf("tessera why %s: no node in %+v", target, r)
		}
		for _, n := range r.Nodes {
			if n.Fits {
				t.Errorf("tessera why %s: node %s fits (%v), but the pod is pending", target, n.Name, n.Allocation)
			}
		}
		return table, r
	}
	gpuReasons := func(r why.Report, gpu string) string {
		var out []string
		for _, n := range r.Nodes {
			for _, g := range n.GPUs {
				if g.Name == gpu {
					out = append(out, g.Reasons...)
				}
			}
		}
		return strings.Join(out, "\n")
	}
	wantIn := func(what, got string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: want %q in\n%s", what, w, got)
			}
		}
	}
	heldBy := ns + "/holder (20Gi, 25 cores)"

	// The oversized share: every GPU is too small, and the node still has
	// seven free GPUs and a whole GPU's worth of share.
	table, r := explain("too-much-memory")
	wantIn("table", table, "pod "+ns+"/too-much-memory", "gpu: 1 of shared.gpu.tessera.dev, cores 10, memory 100Gi", "fits now: a share of up to ")
	for minor := range 8 {
		g := fmt.Sprintf("gpu-%d", minor)
		wantIn(g, gpuReasons(r, g), g+"-shared: memory: asks 100Gi, more than the whole GPU")
	}
	fits := r.Nodes[0].FitsNow
	if fits.WholeGPUs != 7 || fits.LargestShare == nil || fits.LargestShare.GPU == "gpu-0" || fits.LargestShare.Cores != 100 {
		t.Errorf("fits now %+v, want 7 whole GPUs and an untouched GPU's share", fits)
	}

	// Nine whole GPUs: gpu-0 is blocked by the share, the other seven fit.
	_, r = explain("nine-gpus")
	wantIn("nine-gpus: gpu-0", gpuReasons(r, "gpu-0"), "gpu-0: whole GPU blocked by shares: "+heldBy)
	wantIn("nine-gpus: node", strings.Join(r.Nodes[0].Reasons, "\n"), `request "gpu": needs 9 devices, 7 fit`)

	// The whole gpu-0: blocked by the share; every other GPU fails the selector.
	_, r = explain("pod/whole-gpu-0")
	wantIn("whole-gpu-0: gpu-0", gpuReasons(r, "gpu-0"), "whole GPU blocked by shares: "+heldBy)
	wantIn("whole-gpu-0: gpu-3", gpuReasons(r, "gpu-3"), "gpu-3: selector "+onGPU0+" is false")

	// The small share of gpu-1: only the DeviceTaintRule keeps it off, and
	// the explanation names the rule with its taint.
	table, r = explain("fenced-share")
	wantIn("fenced-share: gpu-1", gpuReasons(r, "gpu-1"),
		`request "gpu": gpu-1-shared: tainted by DeviceTaintRule `+rule.Name+": e2e.tessera.dev/why-fence=maintenance:NoSchedule")
	if strings.Contains(table, "fits:") {
		t.Errorf("fenced-share: the table says it fits:\n%s", table)
	}

	// The claim itself can be asked about as well.
	_, r = explain("claim/whole-gpu-0")
	if r.Target != "claim "+ns+"/whole-gpu-0" {
		t.Errorf("claim target %q", r.Target)
	}
}
