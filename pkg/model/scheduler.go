package model

import (
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
)

// SchedulerFeatures is the allocator feature set kube-scheduler 1.37 enables
// with its default feature gates (GA: AdminAccess, PrioritizedList,
// DeviceTaints, device status; beta and on: PartitionableDevices,
// ConsumableCapacity, DeviceBindingConditions, FractionalCapacityRange). It
// selects the allocator's "incubating" implementation, the one the scheduler
// runs. Everything that runs the scheduler's allocator in-process — the
// model's allocator tests, the fleet simulation, tessera why — uses this set.
var SchedulerFeatures = structured.Features{
	AdminAccess:             true,
	ConsumableCapacity:      true,
	DeviceBindingAndStatus:  true,
	DeviceTaints:            true,
	FractionalCapacityRange: true,
	PartitionableDevices:    true,
	PrioritizedList:         true,
}

// NewAllocatedState is the allocator's record of a cluster where nothing is
// allocated yet; what is allocated goes into its sets and collection.
func NewAllocatedState() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

// ClassLister serves DeviceClasses to the allocator by name
// (structured.DeviceClassLister) from memory: List returns them sorted by
// name, so allocations are reproducible; a class it does not hold is
// NotFound, as from the API server.
type ClassLister map[string]*resourceapi.DeviceClass

// NewClassLister holds classes by name.
func NewClassLister(classes []resourceapi.DeviceClass) ClassLister {
	l := ClassLister{}
	for i := range classes {
		l[classes[i].Name] = &classes[i]
	}
	return l
}

// List returns the classes sorted by name.
func (l ClassLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, name := range slices.Sorted(maps.Keys(l)) {
		out = append(out, l[name])
	}
	return out, nil
}

// Get returns the class called name.
func (l ClassLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: resourceapi.GroupName, Resource: "deviceclasses"}, name)
}
