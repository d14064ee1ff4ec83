//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// TestSharedClaimGetsItsGPUAndLimits: a pod with a claim for a share of a GPU
// sees that GPU (NVIDIA_VISIBLE_DEVICES is the UUID the allocated device
// advertises) and the share's memory limit, both from the CDI spec the driver
// wrote for the claim.
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
	wantUUID := dev.Attribute("uuid")
	if wantUUID == "" {
		t.Fatalf("allocated device %s advertises no uuid", dev.Result.Device)
	}
	if v := got.Env["NVIDIA_VISIBLE_DEVICES"]; v != wantUUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want %q (device %s); env: %v", v, wantUUID, dev.Result.Device, got.Env)
	}
	wantMemory := resource.MustParse("20Gi")
	if q, ok := dev.Result.ConsumedCapacity["memory"]; !ok || q.Cmp(wantMemory) != 0 {
		t.Errorf("consumedCapacity memory = %v, want %v", dev.Result.ConsumedCapacity, wantMemory.String())
	}
	if v, want := got.Env["TESSERA_MEMORY_LIMIT"], fmt.Sprint(wantMemory.Value()); v != want {
		t.Errorf("TESSERA_MEMORY_LIMIT = %q, want %q; env: %v", v, want, got.Env)
	}
}
