package model

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// borrowerClaim asks the lent class for memory, tolerating the reclaim
// taint (never the not-lent one), as borrowers do.
func borrowerClaim(name, memory string) *resourceapi.ResourceClaim {
	grace := int64(30)
	return newClaim(name, []resourceapi.DeviceRequest{{
		Name: "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: LentClassName,
			Capacity:        &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{Memory: resource.MustParse(memory)}},
			Tolerations: []resourceapi.DeviceToleration{{Key: ReclaimTaintKey, Operator: resourceapi.DeviceTolerationOpExists,
				Effect: resourceapi.DeviceTaintEffectNoExecute, TolerationSeconds: &grace}},
		},
	}})
}

// The lending device: published for every GPU, no counters, capacity of
// what is lent, and both lending taints unless the GPU is lent.
func TestWithLending(t *testing.T) {
	gpus := discover(t, "hgx-h100")
	res := validResources(t, gpus, WithLending(map[string]Lent{gpus[1].UUID: {Open: true, Memory: 40 << 30}}),
		WithTaints(map[string][]resourceapi.DeviceTaint{gpus[2].UUID: {unhealthy}}))
	lent := map[string]resourceapi.Device{}
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			if _, kind, _ := ParseDevice(d.Name); kind == KindLent {
				lent[d.Name] = d
			}
		}
	}
	if len(lent) != len(gpus) {
		t.Fatalf("%d lending devices, want %d", len(lent), len(gpus))
	}
	for name, d := range lent {
		if len(d.ConsumesCounters) != 0 || d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations || *d.Attributes[AttrType].StringValue != TypeLent {
			t.Errorf("%s: %+v", name, d)
		}
	}
	if d, mem := lent["gpu-1-lent"], lent["gpu-1-lent"].Capacity[Memory].Value; len(d.Taints) != 0 || mem.Value() != 40<<30 {
		t.Errorf("lent GPU: taints %v, capacity %v; want none and 40Gi", d.Taints, d.Capacity[Memory])
	}
	if d := lent["gpu-0-lent"]; len(d.Taints) != 2 || d.Taints[0].Key != NotLentTaintKey || d.Taints[0].Value != "NotLent" ||
		d.Taints[1].Key != ReclaimTaintKey || d.Taints[1].Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("unlent GPU: taints %+v", d.Taints)
	}
	if d := lent["gpu-2-lent"]; len(d.Taints) != 3 || d.Taints[0] != unhealthy {
		t.Errorf("unhealthy GPU's lending device: taints %+v, want the health taint first", d.Taints)
	}
	if _, err := Resources("node-1", gpus, WithLending(map[string]Lent{gpus[0].UUID: {Reason: "not a label value!"}})); err == nil {
		t.Error("an invalid taint value was published")
	}
}

// In kube-scheduler's allocator: a borrower lands only on a lent GPU, beside
// its owner, and never delays the owners: a lent GPU's whole device and its
// shares stay allocatable whatever the borrowers hold.
func TestBorrowersInTheAllocator(t *testing.T) {
	gpus := discover(t, "hgx-h100")
	n := newTestNode(t, gpus, WithLending(map[string]Lent{gpus[7].UUID: {Open: true, Memory: 60 << 30}}))
	owner := n.allocate(wholeClaim("owner", 1))
	if owner == nil || owner.Devices.Results[0].Device != "gpu-7" {
		t.Fatalf("owner: %+v, want gpu-7", owner)
	}
	for _, name := range []string{"b1", "b2"} {
		res := n.allocate(borrowerClaim(name, "30Gi"))
		if res == nil || res.Devices.Results[0].Device != "gpu-7-lent" {
			t.Fatalf("borrower %s: %+v, want gpu-7-lent", name, res)
		}
	}
	if res := n.allocate(borrowerClaim("b3", "1Gi")); res != nil {
		t.Fatalf("a borrower beyond what is lent: %+v", res)
	}
	// Owners are not affected: shares and whole GPUs fill the node as before.
	if res := n.allocate(shareClaim("s", "10Gi", "50")); res == nil || res.Devices.Results[0].Device != "gpu-0-shared" {
		t.Fatalf("share beside borrowers: %+v", res)
	}
	if res := n.allocate(wholeClaim("w", 6)); res == nil || len(res.Devices.Results) != 6 {
		t.Fatalf("six whole GPUs beside borrowers: %+v", res)
	}
	// A borrower that tolerates the reclaim taint still cannot land on an
	// unlent GPU.
	n2 := newTestNode(t, gpus, WithLending(nil))
	if res := n2.allocate(borrowerClaim("b", "1Gi")); res != nil {
		t.Fatalf("borrower on a node that lends nothing: %+v", res)
	}
}

// Three devices per GPU stay within the API's limits on large nodes: a
// 32-GPU node publishes 96 devices in slices of at most 64.
func TestLendingOnLargeNodes(t *testing.T) {
	gpus := fixtureGPUs(32, 80, oneDomain)
	res := validResources(t, gpus, WithLending(nil))
	devices := 0
	for _, s := range res.Pools["node-1"].Slices {
		if len(s.Devices) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
			t.Errorf("a slice with %d devices", len(s.Devices))
		}
		devices += len(s.Devices)
	}
	if devices != 96 {
		t.Errorf("%d devices, want 96", devices)
	}
}
