package plugin

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
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
// discovery finds and their health: [Inventory.Sync] publishes only when the
// inventory or the taints changed since the last successful publish,
// [Inventory.Run] syncs periodically and whenever [Inventory.Trigger] is
// called (the health tracker does on every change). Sync and Run are safe
// for concurrent use.
type Inventory struct {
	NodeName  string
	Discover  func() ([]gpu.GPU, error)
	Publisher Publisher
	// OnChange, when set, gets every newly published inventory (the plugin's
	// SetGPUs).
	OnChange func([]gpu.GPU)
	// Taints, when set, returns the device taints by GPU UUID (the health
	// tracker's Taints); they go on both devices of the GPU.
	Taints func() map[string][]resourceapi.DeviceTaint
	// Model are more options for model.Resources (model.WithPCIeRoots).
	Model []model.Option

	mu        sync.Mutex
	published []gpu.GPU
	taints    map[string][]resourceapi.DeviceTaint
	synced    bool
	trigger   chan struct{}
	once      sync.Once
}

// Sync discovers and, if anything changed (or nothing was published yet),
// publishes model.Resources of the GPUs with their taints. changed says
// whether it published. On a discovery error the last discovered GPUs are
// republished if their taints changed (a GPU that fell off the bus can make
// discovery fail, and its taint must still go out), and the error is
// returned; on any other error the previous publication stays. Either way
// the next Sync tries again.
func (i *Inventory) Sync(ctx context.Context) (changed bool, err error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	var taints map[string][]resourceapi.DeviceTaint
	if i.Taints != nil {
		taints = i.Taints()
	}
	if len(taints) == 0 {
		taints = nil
	}
	gpus, discoverErr := i.Discover()
	if discoverErr != nil {
		discoverErr = fmt.Errorf("discover GPUs: %w", discoverErr)
		if !i.synced || reflect.DeepEqual(taints, i.taints) {
			return false, discoverErr
		}
		gpus = i.published
	}
	if i.synced && reflect.DeepEqual(gpus, i.published) && reflect.DeepEqual(taints, i.taints) {
		return false, nil
	}
	resources, err := model.Resources(i.NodeName, gpus, append(slices.Clone(i.Model), model.WithTaints(taints))...)
	if err != nil {
		return false, fmt.Errorf("model of %d GPUs: %w", len(gpus), err)
	}
	if err := i.Publisher.PublishResources(ctx, resources); err != nil {
		return false, fmt.Errorf("publish ResourceSlices: %w", err)
	}
	klog.FromContext(ctx).Info("Published GPU inventory", "gpus", len(gpus), "tainted", len(taints), "first", !i.synced)
	gpusChanged := !i.synced || !reflect.DeepEqual(gpus, i.published)
	i.published, i.taints, i.synced = gpus, taints, true
	if gpusChanged && i.OnChange != nil {
		i.OnChange(gpus)
	}
	return true, discoverErr
}

// Trigger asks Run for a Sync soon; calls coalesce.
func (i *Inventory) Trigger() {
	select {
	case i.triggerChan() <- struct{}{}:
	default:
	}
}

func (i *Inventory) triggerChan() chan struct{} {
	i.once.Do(func() { i.trigger = make(chan struct{}, 1) })
	return i.trigger
}

// Run calls Sync every interval and after every Trigger until ctx is done;
// errors are logged.
func (i *Inventory) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	trigger := i.triggerChan()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-trigger:
		}
		if _, err := i.Sync(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "GPU inventory sync failed")
		}
	}
}
