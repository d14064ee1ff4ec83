package budget

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// Inventory lists the devices of gpu.tessera.dev the cluster's
// ResourceSlices publish (Devices), from an informer once it has synced, a
// LIST before. It needs list and watch on resourceslices.
//
// Versions: the informer's devices are of version 1 or more (it starts at
// 1 and every slice event adds one); a LIST before the informer has synced
// is of version 0, which the Pricer never caches under.
type Inventory struct {
	client  kubernetes.Interface
	factory informers.SharedInformerFactory
	lister  resourcelisters.ResourceSliceLister
	synced  cache.InformerSynced
	version atomic.Uint64

	// flat is the informer's devices flattened, for flatVersion: the
	// reconciler prices every claim of a namespace per pass, so the copy is
	// made once per change of the slices, not once per claim.
	mu          sync.Mutex
	flat        []resourceapi.Device
	flatVersion uint64
	// byName indexes flat by pool and device name.
	byName map[poolDevice]int
}

type poolDevice struct{ pool, device string }

// slimSlice keeps of a ResourceSlice what pricing reads: the driver, the
// pool and each device's name, attributes, capacity and whether it allows
// multiple allocations (what a CEL selector may read). Managed fields,
// taints, counters and node selectors go: a cluster's slices held whole
// are most of a webhook replica's memory.
func slimSlice(obj any) (any, error) {
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return obj, nil
	}
	s.ManagedFields = nil
	s.Annotations = nil
	s.Spec.SharedCounters = nil
	s.Spec.NodeSelector = nil
	for i := range s.Spec.Devices {
		d := &s.Spec.Devices[i]
		*d = resourceapi.Device{Name: d.Name, Attributes: d.Attributes, Capacity: d.Capacity, AllowMultipleAllocations: d.AllowMultipleAllocations}
	}
	return s, nil
}

var sliceDriverSelector = fields.OneTermEqualSelector("spec.driver", modelnames.DriverName).String()

// NewInventory returns an Inventory over client's ResourceSlices.
func NewInventory(client kubernetes.Interface) *Inventory {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = sliceDriverSelector }))
	informer := factory.Resource().V1().ResourceSlices()
	_ = informer.Informer().SetTransform(slimSlice)
	inv := &Inventory{client: client, factory: factory, lister: informer.Lister(), synced: informer.Informer().HasSynced}
	inv.version.Store(1)
	bump := func(any) { inv.version.Add(1) }
	_, _ = informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: bump, DeleteFunc: bump, UpdateFunc: func(_, o any) { bump(o) },
	})
	return inv
}

// Start starts the informer; it runs until ctx ends.
func (inv *Inventory) Start(ctx context.Context) { inv.factory.Start(ctx.Done()) }

// Devices is a Devices function: the published devices and their version.
// The list is shared between callers: they must not modify it.
func (inv *Inventory) Devices(ctx context.Context) ([]resourceapi.Device, uint64, error) {
	var slices []*resourceapi.ResourceSlice
	var version uint64
	if inv.synced() {
		// The version is read before the list: a change between the two
		// bumps it again, so what is cached under this version is never
		// older than the version says.
		version = inv.version.Load()
		inv.mu.Lock()
		defer inv.mu.Unlock()
		if inv.flat != nil && inv.flatVersion == version {
			return inv.flat, version, nil
		}
		var err error
		if slices, err = inv.lister.List(labels.Everything()); err != nil {
			return nil, 0, err
		}
	} else {
		list, err := inv.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sliceDriverSelector})
		if err != nil {
			return nil, 0, fmt.Errorf("list ResourceSlices: %w", err)
		}
		for i := range list.Items {
			slices = append(slices, &list.Items[i])
		}
		// Version 0: not cached, the next call lists again.
	}
	out := []resourceapi.Device{}
	byName := map[poolDevice]int{}
	for _, s := range slices {
		if s.Spec.Driver == modelnames.DriverName {
			for _, d := range s.Spec.Devices {
				byName[poolDevice{s.Spec.Pool.Name, d.Name}] = len(out)
				out = append(out, d)
			}
		}
	}
	if version != 0 {
		inv.flat, inv.flatVersion, inv.byName = out, version, byName
	}
	return out, version, nil
}

// Device finds the published device name of pool, from the informer's
// cache (false before it has synced, or when no slice publishes it): what
// the Reconciler counts an allocated claim at.
func (inv *Inventory) Device(pool, name string) (*resourceapi.Device, bool) {
	if !inv.synced() {
		return nil, false
	}
	if _, _, err := inv.Devices(context.Background()); err != nil {
		return nil, false
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	i, ok := inv.byName[poolDevice{pool, name}]
	if !ok {
		return nil, false
	}
	d := inv.flat[i]
	return &d, true
}
