package fraction

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-dev/tessera/pkg/model"
)

// oldH100Slices is what a node of the previous release publishes for one
// H100: NVML's total (81559Mi, reserved memory included) and shares from 1Mi.
func oldH100Slices(t *testing.T) []resourceapi.ResourceSlice {
	gpus := profileGPUs(t, "hgx-h100", 1)
	gpus[0].MemoryBytes = gpus[0].MemoryTotalBytes
	slices := publish(t, gpus)
	for i := range slices {
		for j := range slices[i].Spec.Devices {
			if c, ok := slices[i].Spec.Devices[j].Capacity[model.Memory]; ok && c.RequestPolicy != nil {
				c.RequestPolicy.ValidRange.Min = ptrTo(resource.MustParse("1Mi"))
			}
		}
	}
	return slices
}

func ptrTo(q resource.Quantity) *resource.Quantity { return &q }

// fits is how many claims for req one node of slices takes (at most 9).
func fits(t *testing.T, slices []resourceapi.ResourceSlice, req resourceapi.DeviceRequest) int {
	n := newNode(slices)
	for i := range 9 {
		if n.allocate(t, fmt.Sprintf("c%d", i), req) == nil {
			return i
		}
	}
	return 9
}

// TestRollingUpgradeNeverStrandsFractions: while some nodes still publish
// NVML's total and others total − reserved, a fraction is sized from the
// smallest memory any node publishes for the model, so k shares of 1/k fit
// on a GPU of either; and a claim expanded while only old nodes existed
// still lands on an upgraded node (its selector names the product, not an
// exact memory size).
func TestRollingUpgradeNeverStrandsFractions(t *testing.T) {
	old, upgraded := oldH100Slices(t), profileSlices(t, "hgx-h100", 1)
	models := Models(append(append([]resourceapi.ResourceSlice{}, old...), upgraded...))
	if len(models) != 1 || models[0].Memory.Cmp(resource.MustParse("81089Mi")) != 0 {
		t.Fatalf("models %+v: want one H100 model of 81089Mi, the smaller of the two nodes", models)
	}
	for k := int64(2); k <= 8; k++ {
		req, err := Request("gpu", Fraction{Num: 1, Den: k}, models)
		if err != nil {
			t.Fatal(err)
		}
		for name, slices := range map[string][]resourceapi.ResourceSlice{"old node": old, "upgraded node": upgraded} {
			if got := fits(t, slices, req); got != int(k) {
				t.Errorf("1/%d on the %s: %d fit, want %d", k, name, got, k)
			}
		}
	}

	before, err := Request("gpu", MustParse("1/2"), Models(old))
	if err != nil {
		t.Fatal(err)
	}
	if got := fits(t, upgraded, before); got == 0 {
		mem := before.FirstAvailable[0].Capacity.Requests[capMemory]
		t.Errorf("a half expanded before the upgrade (%s) does not land on an upgraded node: stranded", mem.String())
	}
}

// TestShareBelowTheMinimum: a fraction smaller than the model's minimum share
// is refused with the reason, instead of being rounded up by the scheduler to
// a size of which k no longer fit.
func TestShareBelowTheMinimum(t *testing.T) {
	l4 := Models(profileSlices(t, "l4x4", 1))
	if len(l4) != 1 || l4[0].MemoryMin.Cmp(model.MinShareMemory) != 0 {
		t.Fatalf("models %+v: want one with the minimum share %s", l4, model.MinShareMemory.String())
	}
	_, err := Request("gpu", MustParse("1/50"), l4)
	if err == nil || !strings.Contains(err.Error(), "less than the smallest share the GPU gives (1Gi)") {
		t.Errorf("1/50 of an L4: %v, want refused below the 1Gi minimum share", err)
	}
	if _, err := Request("gpu", MustParse("1/20"), l4); err != nil {
		t.Errorf("1/20 of an L4 (over 1Gi): %v", err)
	}
}

// TestSelectorSkipsDevicesWithoutProduct: a shared device that publishes no
// product name (a GPU discovery could not fully describe) is a model of its
// own, selected by memory, and does not make a product selector fail the
// claim with a CEL error.
func TestSelectorSkipsDevicesWithoutProduct(t *testing.T) {
	gpus := profileGPUs(t, "l4x4", 2)
	gpus[0].ProductName = ""
	gpus[0].MemoryBytes -= 1 << 30
	slices := publish(t, gpus)
	models := Models(slices)
	if len(models) != 2 || len(models[0].Products) != 0 || len(models[1].Products) != 1 {
		t.Fatalf("models %+v: want the anonymous GPU, then the L4", models)
	}
	l4Only, err := Request("gpu", MustParse("1/2"), models[1:])
	if err != nil {
		t.Fatal(err)
	}
	results := newNode(slices).allocate(t, "c", l4Only)
	if len(results) != 1 || results[0].Device != "gpu-1-shared" {
		t.Errorf("results %+v, want gpu-1-shared (the L4)", results)
	}
}
