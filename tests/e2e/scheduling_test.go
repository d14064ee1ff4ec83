//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// What the scheduler says about a pod whose claims no node can satisfy (the
// DynamicResources plugin's "cannot allocate all claims", behind the usual
// "0/N nodes are available" summary).
const unschedulableClaims = "cannot allocate all claims"

// TestFifthQuarterLandsOnSecondGPU: the four quarters of
// 10-quarter-gpu-shares.yaml fill one GPU (4 x 19Gi of 81089Mi, 4 x 25
// cores), so a fifth pod from the same template gets a share of another GPU,
// and sees that GPU, and only it, with the quarter's limits.
func TestFifthQuarterLandsOnSecondGPU(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	// The scheduler places the four by first fit over what its informers
	// say is allocated. Right after the previous test's claims are deleted
	// that view can still hold one of them (it lags on a loaded two-core
	// machine), and then the four legitimately split over two GPUs. Such a
	// split is retried once, in a fresh namespace after a longer settle; a
	// second split fails the test.
	var ns string
	var first map[string]string // device -> uuid
	for attempt := 1; ; attempt++ {
		ns = c.Namespace(t, "e2e-fifth")
		four := c.RunSpec(t, ns, framework.SpecPath("10-quarter-gpu-shares.yaml"))
		if len(four) != 4 {
			t.Fatalf("%d pods ran, want 4", len(four))
		}
		first = map[string]string{}
		for _, p := range four {
			d := framework.ClaimOf(t, c, p, "gpu")
			first[d.Result.Device] = d.Attribute("uuid")
		}
		if len(first) == 1 {
			break
		}
		framework.LogAllocations(t, c)
		if attempt == 2 {
			t.Fatalf("the four quarters are on %v, want one GPU", first)
		}
		t.Logf("attempt %d: the four quarters are on %v, want one GPU; retrying once after a settle", attempt, first)
		c.DeleteNamespace(t, ns)
		time.Sleep(3 * framework.NamespaceSettle)
	}
	var firstDev, firstUUID string
	for dev, uuid := range first { // the only entry
		firstDev, firstUUID = dev, uuid
	}

	fifth := c.RunObjects(t, ns, framework.EnvPod("quarter-4", "quarter-gpu", true))["quarter-4"]
	d := framework.ClaimOf(t, c, fifth, "gpu")
	uuid := d.Attribute("uuid")
	if d.Result.Device == firstDev || uuid == firstUUID {
		t.Fatalf("the fifth quarter got %s (uuid %s), the GPU the four fill", d.Result.Device, uuid)
	}
	if d.Attribute("type") != "shared" {
		t.Errorf("the fifth quarter got device %s of type %q, want a share", d.Result.Device, d.Attribute("type"))
	}
	framework.WantConsumed(t, "quarter-4", d, map[string]string{"memory": "19Gi", "cores": "25"})
	framework.WantGPUs(t, "pod quarter-4", fifth.Env, framework.ShareGPU(t, d, "19Gi", 25))
	t.Logf("quarters 0-3 on %s (%s); quarter-4 on %s (%s)", firstDev, firstUUID, d.Result.Device, uuid)
}

// TestOversizedClaimsStayPending: a share larger than any GPU (100Gi of an
// 81089Mi GPU) and nine whole GPUs on an eight-GPU node can never be
// allocated. Their pods stay Pending, unbound, their claims unallocated, and
// the pod's PodScheduled condition and FailedScheduling event carry the
// scheduler's reason.
func TestOversizedClaimsStayPending(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-oversized")
	objs := append(framework.Claim{Name: "too-much-memory", Memory: "100Gi", Cores: "10"}.WithPod(),
		framework.Claim{Name: "nine-gpus", Count: 9}.WithPod()...)
	c.Apply(t, ns, objs...)

	for _, name := range []string{"too-much-memory", "nine-gpus"} {
		cond, err := c.WaitForUnschedulable(ctx, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("pod %s: PodScheduled=%s reason %s: %s", name, cond.Status, cond.Reason, cond.Message)
		if !strings.Contains(cond.Message, unschedulableClaims) {
			t.Errorf("pod %s: PodScheduled message %q, want it to say %q", name, cond.Message, unschedulableClaims)
		}
		var events []string
		err = framework.Poll(ctx, "a FailedScheduling event of pod "+name, framework.LogTimeout, func(ctx context.Context) (bool, error) {
			events, err = c.PodEvents(ctx, ns, name, "FailedScheduling")
			if err != nil {
				return false, framework.Retry("%v", err)
			}
			return len(events) > 0, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("pod %s: event FailedScheduling: %s", name, events[len(events)-1])
		if !strings.Contains(events[len(events)-1], unschedulableClaims) {
			t.Errorf("pod %s: FailedScheduling %q, want it to say %q", name, events[len(events)-1], unschedulableClaims)
		}
	}

	// Give the scheduler time to retry, then check nothing was bound or
	// allocated after all.
	time.Sleep(5 * time.Second)
	for _, name := range []string{"too-much-memory", "nine-gpus"} {
		pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Spec.NodeName != "" || pod.Status.Phase != corev1.PodPending {
			t.Errorf("pod %s: phase %s on node %q, want Pending and unbound", name, pod.Status.Phase, pod.Spec.NodeName)
		}
		claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if claim.Status.Allocation != nil {
			t.Errorf("claim %s was allocated: %+v", name, claim.Status.Allocation.Devices.Results)
		}
	}
}

// TestWholeGPUWaitsForSharesToGo: a GPU with shares on it cannot be handed out
// whole (the whole and the shared device consume the same counters). A claim
// for that very GPU (a CEL selector on its minor) stays Pending while the
// shares run; once the share pods are deleted, its pod starts on that GPU and
// sees exactly that GPU, without limits.
func TestWholeGPUWaitsForSharesToGo(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-reclaim")
	objs := []*unstructured.Unstructured{
		framework.Claim{Name: "quarter", Template: true, Memory: "19Gi", Cores: "25"}.Object(),
		framework.EnvPod("share-a", "quarter", true), framework.EnvPod("share-b", "quarter", true),
	}
	shares := c.RunObjects(t, ns, objs...)
	a, b := framework.ClaimOf(t, c, shares["share-a"], "gpu"), framework.ClaimOf(t, c, shares["share-b"], "gpu")
	if a.Result.Device != b.Result.Device {
		t.Fatalf("the two shares went to %s and %s, want one GPU (first-fit)", a.Result.Device, b.Result.Device)
	}
	minor, uuid := a.Attribute("minor"), a.Attribute("uuid")
	if minor == "" {
		t.Fatalf("device %s has no minor attribute", a.Result.Device)
	}
	wholeName := "gpu-" + minor

	c.Apply(t, ns, framework.Claim{Name: "that-gpu", Selectors: []string{framework.PinnedToMinor(minor)}}.Object())
	c.Apply(t, ns, framework.EnvPod("whole", "that-gpu", false))
	cond, err := c.WaitForUnschedulable(ctx, ns, "whole")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("while shares of %s run, pod whole (claim for minor %s): %s: %s", a.Result.Device, minor, cond.Reason, cond.Message)
	if !strings.Contains(cond.Message, unschedulableClaims) {
		t.Errorf("pod whole: PodScheduled message %q, want %q", cond.Message, unschedulableClaims)
	}

	deleted := time.Now()
	for _, name := range []string{"share-a", "share-b"} {
		if err := c.DeletePodAndWait(ctx, ns, name); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("deleted share-a and share-b in %v", time.Since(deleted).Round(100*time.Millisecond))
	whole := c.EnvOf(ctx, t, ns, "whole")
	t.Logf("pod whole running %v after the shares were deleted", time.Since(deleted).Round(100*time.Millisecond))
	dev := framework.ClaimOf(t, c, whole, "gpu")
	if dev.Result.Device != wholeName || dev.Attribute("uuid") != uuid {
		t.Fatalf("pod whole got %s (uuid %s), want %s (uuid %s), the GPU the shares left", dev.Result.Device, dev.Attribute("uuid"), wholeName, uuid)
	}
	framework.WantGPUs(t, "pod whole", whole.Env, framework.WholeGPU(t, dev))
	framework.NoShareEnv(t, "pod whole", whole.Env)
	t.Logf("pod whole started on %s (uuid %s) once its shares were gone", dev.Result.Device, uuid)
}
