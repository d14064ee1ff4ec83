package plugin

import (
	"context"
	"errors"
	"testing"

	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

type fakePublisher struct {
	published []resourceslice.DriverResources
}

func (f *fakePublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	f.published = append(f.published, r)
	return nil
}

// TestInventorySync publishes at first sync and then only when discovery
// finds something different; a discovery error keeps the last publication.
func TestInventorySync(t *testing.T) {
	gpus := testGPUs()
	var discoverErr error
	pub := &fakePublisher{}
	var seen [][]gpu.GPU
	inv := &Inventory{
		NodeName:  testNode,
		Discover:  func() ([]gpu.GPU, error) { return gpus, discoverErr },
		Publisher: pub,
		OnChange:  func(g []gpu.GPU) { seen = append(seen, g) },
	}
	ctx := ctxFor(t)
	for step, want := range []bool{true, false, false} {
		changed, err := inv.Sync(ctx)
		if err != nil || changed != want {
			t.Fatalf("sync %d: changed %v err %v, want changed %v", step, changed, err, want)
		}
	}
	gpus = gpus[:3] // a GPU fell off the bus
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("after losing a GPU: changed %v err %v", changed, err)
	}
	discoverErr = errors.New("nvml gone")
	if _, err := inv.Sync(ctx); err == nil {
		t.Fatal("discovery error not returned")
	}
	if len(pub.published) != 2 || len(seen) != 2 || len(seen[1]) != 3 {
		t.Errorf("published %d times, OnChange %d times", len(pub.published), len(seen))
	}
}
