package plugin

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

// Publisher publishes the node's ResourceSlices; kubeletplugin.Helper is the
// real one.
type Publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// Inventory keeps the published ResourceSlices in line with the GPUs
// discovery finds: [Inventory.Sync] publishes only when the inventory changed
// since the last successful publish, [Inventory.Run] syncs periodically.
type Inventory struct {
	NodeName  string
	Discover  func() ([]gpu.GPU, error)
	Publisher Publisher
	// OnChange, when set, gets every newly published inventory (the plugin's
	// SetGPUs).
	OnChange func([]gpu.GPU)

	published []gpu.GPU
	synced    bool
}

// Sync discovers and, if anything changed (or nothing was published yet),
// publishes model.Resources of the GPUs. changed says whether it published.
// On error the previous publication stays and the next Sync tries again.
func (i *Inventory) Sync(ctx context.Context) (changed bool, err error) {
	gpus, err := i.Discover()
	if err != nil {
		return false, fmt.Errorf("discover GPUs: %w", err)
	}
	if i.synced && reflect.DeepEqual(gpus, i.published) {
		return false, nil
	}
	resources, err := model.Resources(i.NodeName, gpus)
	if err != nil {
		return false, fmt.Errorf("model of %d GPUs: %w", len(gpus), err)
	}
	if err := i.Publisher.PublishResources(ctx, resources); err != nil {
		return false, fmt.Errorf("publish ResourceSlices: %w", err)
	}
	klog.FromContext(ctx).Info("Published GPU inventory", "gpus", len(gpus), "first", !i.synced)
	i.published, i.synced = gpus, true
	if i.OnChange != nil {
		i.OnChange(gpus)
	}
	return true, nil
}

// Run calls Sync every interval until ctx is done; errors are logged.
func (i *Inventory) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := i.Sync(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "GPU inventory sync failed")
			}
		}
	}
}
