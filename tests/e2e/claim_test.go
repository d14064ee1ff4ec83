//go:build e2e

package e2e

import (
	"context"
	"testing"
)

// TestSharedClaimGetsItsGPUAndLimits: a pod with a claim for a share of a GPU
// sees that GPU and no other (TESSERA_GPU_<minor> is the UUID the allocated
// device advertises) and the share's limits (TESSERA_GPU_<minor>_MEMORY_LIMIT,
// _CORES_LIMIT), all from the CDI spec the driver wrote for the claim.
func TestSharedClaimGetsItsGPUAndLimits(t *testing.T) {
	cluster := needCluster(t)
	cluster.RequireDriver(t, "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := cluster.Namespace(t, "e2e-shared")
	pods := cluster.RunSpec(t, ns, testdata(t, "shared-claim.yaml"))
	got := pods["shared-claim"]

	claimName, err := PodClaimName(got.Pod, "gpu")
	if err != nil {
		t.Fatal(err)
	}
	devices, err := cluster.AllocatedDevices(ctx, ns, claimName)
	if err != nil {
		t.Fatal(err)
	}
	if len(devices) != 1 {
		t.Fatalf("claim %s/%s: %d devices allocated, want 1", ns, claimName, len(devices))
	}
	dev := devices[0]
	if dev.Attribute("type") != "shared" {
		t.Errorf("allocated device %s has type %q, want shared", dev.Result.Device, dev.Attribute("type"))
	}
	wantConsumed(t, "shared-claim", dev, map[string]string{"memory": "20Gi", "cores": "25"})
	wantGPUs(t, "pod shared-claim", got.Env, shareGPU(t, dev, "20Gi", 25))
}

// TestPluginWritesClaimStatus: after prepare the plugin records, in each
// claim's status.devices, what it prepared: the GPU's UUID, the share's
// limits and isolation, and a Ready condition (pkg/plugin, "Claim status").
// Under 1.37's granular status authorization that needs RBAC for the verb
// associated-node:patch on resourceclaims/driver (resourceNames: the driver);
// without it the API server refuses and the plugin only logs the refusal.
func TestPluginWritesClaimStatus(t *testing.T) {
	cluster := needCluster(t)
	cluster.RequireDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ns := cluster.Namespace(t, "e2e-status")
	objs := MustDecodeYAML(t, ShareClaimYAML("share", "12Gi", "20"), WholeClaimYAML("whole"))
	objs = append(objs, EnvPod("share", "share", false), EnvPod("whole", "whole", false))
	pods := cluster.RunObjects(t, ns, objs...)
	share := claimOf(t, cluster, pods["share"], "gpu")
	whole := claimOf(t, cluster, pods["whole"], "gpu")
	checkStatusData(t, cluster, ns, "share", []Allocated{share}, mustInt64(t, bytesOf("12Gi")), 20, "Advisory")
	checkStatusData(t, cluster, ns, "whole", []Allocated{whole}, 0, 0, "")
	wantGPUs(t, "pod share", pods["share"].Env, shareGPU(t, share, "12Gi", 20))
	wantGPUs(t, "pod whole", pods["whole"].Env, wholeGPU(t, whole))
}
