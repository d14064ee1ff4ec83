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
	"context"
	"maps"
	"slices"
	"testing"
	"time"
)

// containerEnv is what the named container of p printed.
func containerEnv(t *testing.T, p SpecPod, name string) map[string]string {
	t.Helper()
	c, ok := p.Container(name)
	if !ok {
		t.Fatalf("pod %s has no container %s that printed its env", p.Pod.Name, name)
	}
	return c.Env
}

// byRequest returns a claim's allocated devices by request, failing unless
// there is exactly one per named request and no other.
func byRequest(t *testing.T, claim string, devs []Allocated, requests ...string) map[string]Allocated {
	t.Helper()
	out := map[string]Allocated{}
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

func keysOf(m map[string]Allocated) []string { return slices.Sorted(maps.Keys(m)) }

// distinctGPUs fails the test unless the devices are on different GPUs
// (the test's premise: otherwise "exactly its GPUs" cannot tell them apart).
func distinctGPUs(t *testing.T, gpus ...seenGPU) {
	t.Helper()
	seen := map[int]string{}
	for _, g := range gpus {
		if other, ok := seen[g.minor]; ok {
			t.Fatalf("%s and %s are on one GPU (minor %d); the test needs them on different GPUs", other, g.device, g.minor)
		}
		seen[g.minor] = g.device
	}
}

// deletePods deletes the pods gracefully and waits until they are gone, i.e.
// the kubelet unprepared their claims without error (DeletePodAndWait), so
// the GPUs are free for the next test.
func deletePods(t *testing.T, c *Cluster, ns string, names ...string) {
	t.Helper()
	start := time.Now()
	for _, n := range names {
		if err := c.DeletePodAndWait(context.Background(), ns, n); err != nil {
			t.Errorf("delete pod %s: %v", n, err)
			continue
		}
		t.Logf("pod %s gone (claims unprepared) after %v", n, time.Since(start).Round(100*time.Millisecond))
	}
}

// TestContainersSeeOnlyTheirRequest: a claim with two requests, small (a
// share: 8Gi, 10 cores) and big (a whole GPU), used by two containers of one
// pod, each referencing one request (resources.claims[].request). Container
// small sees only the share's GPU with its limits; container big sees only
// the whole GPU, without limits or the share's isolation variables.
func TestContainersSeeOnlyTheirRequest(t *testing.T) {
	c := needCluster(t)
	c.RequireDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-per-request")
	objs := MustDecodeYAML(t, `
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
	objs = append(objs, EnvPodWith("per-request", []PodClaim{{Name: "gpu", Claim: "two-requests"}},
		EnvContainer{Name: "small", Claims: []string{"gpu/small"}},
		EnvContainer{Name: "big", Claims: []string{"gpu/big"}},
	))
	p := c.RunObjects(t, ns, objs...)["per-request"]
	devs := byRequest(t, "two-requests", devicesOf(t, c, p, "gpu"), "small", "big")
	small, big := devs["small"], devs["big"]
	if small.Attribute("type") != "shared" || small.Result.ShareID == nil {
		t.Errorf("request small got %s (type %q, shareID %v), want a share", small.Result.Device, small.Attribute("type"), small.Result.ShareID)
	}
	if big.Attribute("type") != "gpu" || big.Result.ShareID != nil {
		t.Errorf("request big got %s (type %q, shareID %v), want a whole GPU", big.Result.Device, big.Attribute("type"), big.Result.ShareID)
	}
	wantConsumed(t, "per-request", small, map[string]string{"memory": "8Gi", "cores": "10"})
	share, whole := shareGPU(t, small, "8Gi", 10), wholeGPU(t, big)
	distinctGPUs(t, share, whole)

	env := containerEnv(t, p, "small")
	wantGPUs(t, "pod per-request, container small", env, share)
	wantVars(t, "pod per-request, container small", env, map[string]string{"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
	env = containerEnv(t, p, "big")
	wantGPUs(t, "pod per-request, container big", env, whole)
	noShareEnv(t, "pod per-request, container big", env)
	t.Logf("claim two-requests: container small sees %s; container big sees %s", share, whole)
	deletePods(t, c, ns, "per-request")
}

// TestContainerWithTwoShareClaims: one container references two claims, each
// a share with its own limits (8Gi/60 cores and 12Gi/50 cores: 110 cores
// cannot fit one GPU, so they are on two GPUs). The container sees both GPUs,
// each with its own share's limits, and no other.
func TestContainerWithTwoShareClaims(t *testing.T) {
	c := needCluster(t)
	c.RequireDriver(t, "shared.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-two-shares")
	objs := MustDecodeYAML(t, ShareClaimYAML("share-a", "8Gi", "60"), ShareClaimYAML("share-b", "12Gi", "50"))
	objs = append(objs, EnvPodWith("two-shares",
		[]PodClaim{{Name: "a", Claim: "share-a"}, {Name: "b", Claim: "share-b"}},
		EnvContainer{Name: "ctr", Claims: []string{"a", "b"}},
	))
	p := c.RunObjects(t, ns, objs...)["two-shares"]
	a, b := claimOf(t, c, p, "a"), claimOf(t, c, p, "b")
	wantConsumed(t, "two-shares", a, map[string]string{"memory": "8Gi", "cores": "60"})
	wantConsumed(t, "two-shares", b, map[string]string{"memory": "12Gi", "cores": "50"})
	ga, gb := shareGPU(t, a, "8Gi", 60), shareGPU(t, b, "12Gi", 50)
	distinctGPUs(t, ga, gb)

	env := containerEnv(t, p, "ctr")
	wantGPUs(t, "pod two-shares", env, ga, gb)
	wantVars(t, "pod two-shares", env, map[string]string{"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
	t.Logf("pod two-shares sees %s and %s", ga, gb)
	deletePods(t, c, ns, "two-shares")
}

// TestContainerWithShareAndWholeClaims: one container references a share
// claim (8Gi, 10 cores) and a whole-GPU claim. It sees both GPUs: the
// share's with its limits, the whole one without.
func TestContainerWithShareAndWholeClaims(t *testing.T) {
	c := needCluster(t)
	c.RequireDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-share-whole")
	objs := MustDecodeYAML(t, ShareClaimYAML("share", "8Gi", "10"), WholeClaimYAML("whole"))
	objs = append(objs, EnvPodWith("share-and-whole",
		[]PodClaim{{Name: "share", Claim: "share"}, {Name: "whole", Claim: "whole"}},
		EnvContainer{Name: "ctr", Claims: []string{"share", "whole"}},
	))
	p := c.RunObjects(t, ns, objs...)["share-and-whole"]
	s, w := claimOf(t, c, p, "share"), claimOf(t, c, p, "whole")
	wantConsumed(t, "share-and-whole", s, map[string]string{"memory": "8Gi", "cores": "10"})
	if w.Attribute("type") != "gpu" {
		t.Errorf("claim whole got %s of type %q, want a whole GPU", w.Result.Device, w.Attribute("type"))
	}
	share, whole := shareGPU(t, s, "8Gi", 10), wholeGPU(t, w)
	distinctGPUs(t, share, whole)

	env := containerEnv(t, p, "ctr")
	wantGPUs(t, "pod share-and-whole", env, share, whole)
	wantVars(t, "pod share-and-whole", env, map[string]string{"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
	t.Logf("pod share-and-whole sees %s and %s", share, whole)
	deletePods(t, c, ns, "share-and-whole")
}

// TestInitAndMainContainersSeeTheirOwnClaims: an init container references a
// whole-GPU claim, the main container a share claim (8Gi, 10 cores). The
// init container (it prints its env and exits) sees only the whole GPU,
// without limits; the main container only the share's GPU, with its limits.
func TestInitAndMainContainersSeeTheirOwnClaims(t *testing.T) {
	c := needCluster(t)
	c.RequireDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-init-main")
	objs := MustDecodeYAML(t, WholeClaimYAML("init-whole"), ShareClaimYAML("main-share", "8Gi", "10"))
	objs = append(objs, EnvPodWith("init-and-main",
		[]PodClaim{{Name: "whole", Claim: "init-whole"}, {Name: "share", Claim: "main-share"}},
		EnvContainer{Name: "init", Init: true, Claims: []string{"whole"}},
		EnvContainer{Name: "main", Claims: []string{"share"}},
	))
	p := c.RunObjects(t, ns, objs...)["init-and-main"]
	for _, cs := range p.Pod.Status.InitContainerStatuses {
		if cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 {
			t.Errorf("init container %s: state %+v, want terminated with exit code 0", cs.Name, cs.State)
		}
	}
	w, s := claimOf(t, c, p, "whole"), claimOf(t, c, p, "share")
	if w.Attribute("type") != "gpu" {
		t.Errorf("claim init-whole got %s of type %q, want a whole GPU", w.Result.Device, w.Attribute("type"))
	}
	wantConsumed(t, "init-and-main", s, map[string]string{"memory": "8Gi", "cores": "10"})
	whole, share := wholeGPU(t, w), shareGPU(t, s, "8Gi", 10)
	distinctGPUs(t, whole, share)

	env := containerEnv(t, p, "init")
	wantGPUs(t, "pod init-and-main, init container init", env, whole)
	noShareEnv(t, "pod init-and-main, init container init", env)
	env = containerEnv(t, p, "main")
	wantGPUs(t, "pod init-and-main, container main", env, share)
	wantVars(t, "pod init-and-main, container main", env, map[string]string{"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
	t.Logf("pod init-and-main: init container sees %s; main container sees %s", whole, share)
	deletePods(t, c, ns, "init-and-main")
}
