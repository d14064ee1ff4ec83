//go:build e2e

package e2e

// What each container of a pod sees when containers combine claims and
// requests: the CDI spec of a claim holds one device per allocation result,
// each carrying only its own GPU's variables (pkg/isolation.DeviceEdits), and
// the kubelet gives a container the devices of exactly the claims and
// requests it references. So whatever a container combines it sees exactly
// its GPUs (TESSERA_GPU_<minor>=<uuid>, no other) and each share's limits
// (TESSERA_GPU_<minor>_MEMORY_LIMIT, _CORES_LIMIT). Every container prints
// its env; each test uses at most two GPUs and deletes its pod at the end,
// so the claims are unprepared before the next test.

import (
	"maps"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tessera-dev/tessera/tests/e2e/framework"
)

// byRequest returns a claim's allocated devices by request, failing unless
// there is exactly one per named request and no other.
func byRequest(t *testing.T, claim string, devs []framework.Allocated, requests ...string) map[string]framework.Allocated {
	t.Helper()
	out := map[string]framework.Allocated{}
	for _, d := range devs {
		if _, dup := out[d.Result.Request]; dup {
			t.Fatalf("claim %s: two devices for request %s", claim, d.Result.Request)
		}
		out[d.Result.Request] = d
	}
	if len(out) != len(requests) {
		t.Fatalf("claim %s: devices for requests %v, want one each for %v", claim, keysOf(out), requests)
	}
	for _, r := range requests {
		if _, ok := out[r]; !ok {
			t.Fatalf("claim %s: no device for request %s (devices for %v)", claim, r, keysOf(out))
		}
	}
	return out
}

func keysOf(m map[string]framework.Allocated) []string { return slices.Sorted(maps.Keys(m)) }

// TestContainersSeeOnlyTheirRequest: a claim with two requests, small (a
// share: 8Gi, 10 cores) and big (a whole GPU), used by two containers of one
// pod, each referencing one request (resources.claims[].request). Container
// small sees only the share's GPU with its limits; container big sees only
// the whole GPU, without limits or the share's isolation variables.
func TestContainersSeeOnlyTheirRequest(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-per-request")
	objs := framework.MustDecodeYAML(t, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: two-requests}
spec:
  devices:
    requests:
    - name: small
      exactly:
        deviceClassName: shared.gpu.tessera.dev
        capacity:
          requests: {memory: 8Gi, cores: "10"}
    - name: big
      exactly:
        deviceClassName: gpu.tessera.dev
`)
	objs = append(objs, framework.EnvPodWith("per-request", []framework.PodClaim{{Name: "gpu", Claim: "two-requests"}},
		framework.EnvContainer{Name: "small", Claims: []string{"gpu/small"}},
		framework.EnvContainer{Name: "big", Claims: []string{"gpu/big"}},
	))
	p := c.RunObjects(t, ns, objs...)["per-request"]
	devs := byRequest(t, "two-requests", framework.DevicesOf(t, c, p, "gpu"), "small", "big")
	small, big := devs["small"], devs["big"]
	if small.Attribute("type") != "shared" || small.Result.ShareID == nil {
		t.Errorf("request small got %s (type %q, shareID %v), want a share", small.Result.Device, small.Attribute("type"), small.Result.ShareID)
	}
	if big.Attribute("type") != "gpu" || big.Result.ShareID != nil {
		t.Errorf("request big got %s (type %q, shareID %v), want a whole GPU", big.Result.Device, big.Attribute("type"), big.Result.ShareID)
	}
	framework.WantConsumed(t, "per-request", small, map[string]string{"memory": "8Gi", "cores": "10"})
	share, whole := framework.ShareGPU(t, small, "8Gi", 10), framework.WholeGPU(t, big)
	framework.DistinctGPUs(t, share, whole)

	env := framework.ContainerEnvOf(t, p, "small")
	framework.WantGPUs(t, "pod per-request, container small", env, share)
	framework.WantVars(t, "pod per-request, container small", env, map[string]string{"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
	env = framework.ContainerEnvOf(t, p, "big")
	framework.WantGPUs(t, "pod per-request, container big", env, whole)
	framework.NoShareEnv(t, "pod per-request, container big", env)
	t.Logf("claim two-requests: container small sees %s; container big sees %s", share, whole)
	framework.DeletePods(t, c, ns, "per-request")
}

// TestContainerWithTwoShareClaims: one container references two claims, each
// a share with its own limits (8Gi/60 cores and 12Gi/50 cores: 110 cores
// cannot fit one GPU, so they are on two GPUs). The container sees both GPUs,
// each with its own share's limits, and no other.
func TestContainerWithTwoShareClaims(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-two-shares")
	p, a, b := runWithTwoClaims(t, c, ns, "two-shares",
		"a", framework.Claim{Name: "share-a", Memory: "8Gi", Cores: "60"},
		"b", framework.Claim{Name: "share-b", Memory: "12Gi", Cores: "50"})
	framework.WantConsumed(t, "two-shares", a, map[string]string{"memory": "8Gi", "cores": "60"})
	framework.WantConsumed(t, "two-shares", b, map[string]string{"memory": "12Gi", "cores": "50"})
	ga, gb := framework.ShareGPU(t, a, "8Gi", 60), framework.ShareGPU(t, b, "12Gi", 50)
	framework.DistinctGPUs(t, ga, gb)

	wantContainerSeesBoth(t, c, ns, p, ga, gb)
}

// TestContainerWithShareAndWholeClaims: one container references a share
// claim (8Gi, 10 cores) and a whole-GPU claim. It sees both GPUs: the
// share's with its limits, the whole one without.
func TestContainerWithShareAndWholeClaims(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-share-whole")
	p, s, w := runWithTwoClaims(t, c, ns, "share-and-whole",
		"share", framework.Claim{Name: "share", Memory: "8Gi", Cores: "10"},
		"whole", framework.Claim{Name: "whole"})
	framework.WantConsumed(t, "share-and-whole", s, map[string]string{"memory": "8Gi", "cores": "10"})
	if w.Attribute("type") != "gpu" {
		t.Errorf("claim whole got %s of type %q, want a whole GPU", w.Result.Device, w.Attribute("type"))
	}
	share, whole := framework.ShareGPU(t, s, "8Gi", 10), framework.WholeGPU(t, w)
	framework.DistinctGPUs(t, share, whole)

	wantContainerSeesBoth(t, c, ns, p, share, whole)
}

// runWithTwoClaims runs pod, whose one container ctr references both its
// pod claims: podA for claim a and podB for claim b. It returns the pod and
// the device each claim got.
func runWithTwoClaims(t *testing.T, c *framework.Cluster, ns, pod, podA string, a framework.Claim, podB string, b framework.Claim) (framework.SpecPod, framework.Allocated, framework.Allocated) {
	t.Helper()
	p := c.RunObjects(t, ns, a.Object(), b.Object(), framework.EnvPodWith(pod,
		[]framework.PodClaim{{Name: podA, Claim: a.Name}, {Name: podB, Claim: b.Name}},
		framework.EnvContainer{Name: "ctr", Claims: []string{podA, podB}},
	))[pod]
	return p, framework.ClaimOf(t, c, p, podA), framework.ClaimOf(t, c, p, podB)
}

// wantContainerSeesBoth checks that p's container ctr sees the GPUs a and b
// and no other, with TF_FORCE_GPU_ALLOW_GROWTH, then deletes the pod.
func wantContainerSeesBoth(t *testing.T, c *framework.Cluster, ns string, p framework.SpecPod, a, b framework.SeenGPU) {
	t.Helper()
	who := "pod " + p.Pod.Name
	env := framework.ContainerEnvOf(t, p, "ctr")
	framework.WantGPUs(t, who, env, a, b)
	framework.WantVars(t, who, env, map[string]string{"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
	t.Logf("%s sees %s and %s", who, a, b)
	framework.DeletePods(t, c, ns, p.Pod.Name)
}

// TestInitAndMainContainersSeeTheirOwnClaims: an init container references a
// whole-GPU claim, the main container a share claim (8Gi, 10 cores). The
// init container (it prints its env and exits) sees only the whole GPU,
// without limits; the main container only the share's GPU, with its limits.
func TestInitAndMainContainersSeeTheirOwnClaims(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-init-main")
	objs := []*unstructured.Unstructured{
		framework.Claim{Name: "init-whole"}.Object(),
		framework.Claim{Name: "main-share", Memory: "8Gi", Cores: "10"}.Object(),
	}
	objs = append(objs, framework.EnvPodWith("init-and-main",
		[]framework.PodClaim{{Name: "whole", Claim: "init-whole"}, {Name: "share", Claim: "main-share"}},
		framework.EnvContainer{Name: "init", Init: true, Claims: []string{"whole"}},
		framework.EnvContainer{Name: "main", Claims: []string{"share"}},
	))
	p := c.RunObjects(t, ns, objs...)["init-and-main"]
	for _, cs := range p.Pod.Status.InitContainerStatuses {
		if cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 {
			t.Errorf("init container %s: state %+v, want terminated with exit code 0", cs.Name, cs.State)
		}
	}
	w, s := framework.ClaimOf(t, c, p, "whole"), framework.ClaimOf(t, c, p, "share")
	if w.Attribute("type") != "gpu" {
		t.Errorf("claim init-whole got %s of type %q, want a whole GPU", w.Result.Device, w.Attribute("type"))
	}
	framework.WantConsumed(t, "init-and-main", s, map[string]string{"memory": "8Gi", "cores": "10"})
	whole, share := framework.WholeGPU(t, w), framework.ShareGPU(t, s, "8Gi", 10)
	framework.DistinctGPUs(t, whole, share)

	env := framework.ContainerEnvOf(t, p, "init")
	framework.WantGPUs(t, "pod init-and-main, init container init", env, whole)
	framework.NoShareEnv(t, "pod init-and-main, init container init", env)
	env = framework.ContainerEnvOf(t, p, "main")
	framework.WantGPUs(t, "pod init-and-main, container main", env, share)
	framework.WantVars(t, "pod init-and-main, container main", env, map[string]string{"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
	t.Logf("pod init-and-main: init container sees %s; main container sees %s", whole, share)
	framework.DeletePods(t, c, ns, "init-and-main")
}
