//go:build e2e

package e2e

import (
	"testing"

	"github.com/tessera-dev/tessera/tests/e2e/framework"
)

// TestSharedClaimGetsItsGPUAndLimits: a pod with a claim for a share of a GPU
// sees that GPU and no other (TESSERA_GPU_<minor> is the UUID the allocated
// device advertises) and the share's limits (TESSERA_GPU_<minor>_MEMORY_LIMIT,
// _CORES_LIMIT), all from the CDI spec the driver wrote for the claim.
func TestSharedClaimGetsItsGPUAndLimits(t *testing.T) {
	cluster := needDriver(t, "shared.gpu.tessera.dev")
	ns := cluster.Namespace(t, "e2e-shared")
	pods := cluster.RunSpec(t, ns, framework.Testdata(t, "shared-claim.yaml"))
	got := pods["shared-claim"]

	dev := framework.ClaimOf(t, cluster, got, "gpu")
	if dev.Attribute("type") != "shared" {
		t.Errorf("allocated device %s has type %q, want shared", dev.Result.Device, dev.Attribute("type"))
	}
	framework.WantConsumed(t, "shared-claim", dev, map[string]string{"memory": "20Gi", "cores": "25"})
	framework.WantGPUs(t, "pod shared-claim", got.Env, framework.ShareGPU(t, dev, "20Gi", 25))
}

// TestPluginWritesClaimStatus: after prepare the plugin records, in each
// claim's status.devices, what it prepared: the GPU's UUID, the share's
// limits and isolation, and a Ready condition (pkg/plugin, "Claim status").
// Under 1.37's granular status authorization that needs RBAC for the verb
// associated-node:patch on resourceclaims/driver (resourceNames: the driver);
// without it the API server refuses and the plugin only logs the refusal.
func TestPluginWritesClaimStatus(t *testing.T) {
	cluster := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ns := cluster.Namespace(t, "e2e-status")
	objs := append(framework.Claim{Name: "share", Memory: "12Gi", Cores: "20"}.WithPod(), framework.Claim{Name: "whole"}.WithPod()...)
	pods := cluster.RunObjects(t, ns, objs...)
	share := framework.ClaimOf(t, cluster, pods["share"], "gpu")
	whole := framework.ClaimOf(t, cluster, pods["whole"], "gpu")
	framework.CheckStatusData(t, cluster, ns, "share", []framework.Allocated{share}, framework.MustInt64(t, framework.BytesOf("12Gi")), 20, "Advisory")
	framework.CheckStatusData(t, cluster, ns, "whole", []framework.Allocated{whole}, 0, 0, "")
	framework.WantGPUs(t, "pod share", pods["share"].Env, framework.ShareGPU(t, share, "12Gi", 20))
	framework.WantGPUs(t, "pod whole", pods["whole"].Env, framework.WholeGPU(t, whole))
}
