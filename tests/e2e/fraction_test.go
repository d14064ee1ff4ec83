//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestFractionHalvesTileTheNode: a ResourceClaimTemplate annotated
// gpu.tessera.dev/fraction: "1/2" (no capacity: the admission webhook expands
// each claim the resourceclaim controller creates from it into a share of
// half of each GPU model the cluster publishes) and 16 pods using it, created
// at once on the 8-GPU node: every pod runs, each GPU holds exactly two of
// the shares, and each share is half of the 81089Mi an H100 publishes (NVML's
// 81559Mi less the driver's reserved memory) rounded down to the MiB, through
// the H100 model's subrequest.
func TestFractionHalvesTileTheNode(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	// The scheduler packs by what its informers say is allocated; right
	// after the previous test's claims go, that view can still hold one on
	// a loaded two-core machine, and a half then finds no GPU. One such
	// attempt is retried in a fresh namespace after a longer settle, with
	// every allocation in the cluster logged first; a second fails the
	// test.
	pods, err := runRetryingOnce(t, c, "e2e-fraction", func(ns string) (map[string]framework.SpecPod, error) {
		pods, err := runHalves(t, c, ns)
		if err != nil {
			logFractionClaims(t, c, ns)
		}
		return pods, err
	})
	if err != nil {
		framework.LogAllocations(t, c)
		t.Fatal(err)
	}
	perGPU := map[string][]string{}
	for name, p := range pods {
		d := framework.ClaimOf(t, c, p, "gpu")
		if d.Result.Request != "gpu/m81089mi" {
			t.Errorf("pod %s: allocated for request %s, want the H100 model's subrequest gpu/m81089mi", name, d.Result.Request)
		}
		framework.WantConsumed(t, name, d, map[string]string{"memory": "40544Mi", "cores": "50"})
		perGPU[d.Result.Device] = append(perGPU[d.Result.Device], name)
	}
	if len(perGPU) != 8 {
		t.Errorf("the 16 halves are on %d GPUs, want 8: %v", len(perGPU), perGPU)
	}
	for dev, names := range perGPU {
		if len(names) != 2 {
			t.Errorf("%s holds %d halves %v, want 2", dev, len(names), names)
		}
	}
	t.Logf("halves per GPU: %v", perGPU)
}

// runRetryingOnce runs try in a fresh namespace (prefix) and returns its
// pods. When try fails, it logs every allocation in the cluster, deletes
// the namespace and, after a longer settle, runs try once more in another;
// what that second try returns is returned, error or not.
func runRetryingOnce(t *testing.T, c *framework.Cluster, prefix string, try func(ns string) (map[string]framework.SpecPod, error)) (map[string]framework.SpecPod, error) {
	for attempt := 1; ; attempt++ {
		ns := c.Namespace(t, prefix)
		pods, err := try(ns)
		if err == nil || attempt == 2 {
			return pods, err
		}
		framework.LogAllocations(t, c)
		t.Logf("attempt %d: %v; retrying once after a settle", attempt, err)
		c.DeleteNamespace(t, ns)
		time.Sleep(3 * framework.NamespaceSettle)
	}
}

// runHalves creates the half-GPU template and 16 pods using it in ns at
// once and waits for every pod to run.
func runHalves(t *testing.T, c *framework.Cluster, ns string) (map[string]framework.SpecPod, error) {
	objs := []*unstructured.Unstructured{framework.Claim{Name: "half-gpu", Template: true, Class: framework.SharedClass,
		ClaimAnnotations: map[string]string{"gpu.tessera.dev/fraction": "1/2"}}.Object()}
	for i := range 16 {
		objs = append(objs, framework.EnvPod(fmt.Sprintf("half-%d", i), "half-gpu", true))
	}
	c.Apply(t, ns, objs...)
	pods := map[string]framework.SpecPod{}
	for i := range 16 {
		name := fmt.Sprintf("half-%d", i)
		p, err := c.WaitForEnvPod(context.Background(), ns, name)
		if err != nil {
			return nil, err
		}
		framework.LogSpecPod(t, p)
		pods[name] = p
	}
	return pods, nil
}

// TestDemoFractionQuarter runs demo/specs/80-fraction-quarter.yaml: each pod
// gets a quarter of an H100 (20272Mi of 81089Mi, 25 cores) through the webhook's
// expansion of its claim, and sees exactly that share.
func TestDemoFractionQuarter(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-demo-fraction")
	pods := c.RunSpec(t, ns, framework.SpecPath("80-fraction-quarter.yaml"))
	if len(pods) != 2 {
		t.Fatalf("%d pods ran, want 2", len(pods))
	}
	for name, p := range pods {
		d := framework.ClaimOf(t, c, p, "gpu")
		framework.WantConsumed(t, name, d, map[string]string{"memory": "20272Mi", "cores": "25"})
		framework.WantGPUs(t, "pod "+name, p.Env, framework.ShareGPU(t, d, "20272Mi", 25))
	}
}

// logFractionClaims logs each claim of ns: whether the webhook expanded it
// (its subrequests) and what the scheduler allocated, with what it consumed.
func logFractionClaims(t *testing.T, c *framework.Cluster, ns string) {
	claims, err := c.Client.ResourceV1().ResourceClaims(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Logf("list claims: %v", err)
		return
	}
	for _, cl := range claims.Items {
		var subs []string
		for _, r := range cl.Spec.Devices.Requests {
			for _, s := range r.FirstAvailable {
				subs = append(subs, s.Name)
			}
			if r.Exactly != nil {
				subs = append(subs, "exactly "+r.Exactly.DeviceClassName)
			}
		}
		alloc := "unallocated"
		if a := cl.Status.Allocation; a != nil {
			alloc = ""
			for _, res := range a.Devices.Results {
				alloc += fmt.Sprintf("%s %s %v; ", res.Request, res.Device, res.ConsumedCapacity)
			}
		}
		t.Logf("claim %s: requests %v, reserved for %d, %s", cl.Name, subs, len(cl.Status.ReservedFor), alloc)
	}
}
