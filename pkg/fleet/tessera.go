package fleet

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/model"
)

// tesseraResources is the driver's model for one hgx-h100 node.
//
// TODO(fleet): pkg/model.Resources has not landed yet; this mirrors the model in
// ARCHITECTURE.md (counters in their own slice, gpu-N + gpu-N-shared per GPU) and is
// to be replaced by model.Resources(node, gpu.Discover(gpu.NewMock("hgx-h100"))).
func tesseraResources(node string) resourceslice.DriverResources {
	cores := resource.MustParse("100")
	counters := make([]resourceapi.CounterSet, GPUsPerNode)
	var devices []resourceapi.Device
	for g := range GPUsPerNode {
		counters[g] = resourceapi.CounterSet{Name: model.CounterSetName(g), Counters: map[string]resourceapi.Counter{
			"memory": {Value: gpuMemory}, "cores": {Value: cores},
		}}
		consumes := []resourceapi.DeviceCounterConsumption{{CounterSet: model.CounterSetName(g), Counters: map[string]resourceapi.Counter{
			"memory": {Value: gpuMemory}, "cores": {Value: cores},
		}}}
		devices = append(devices,
			resourceapi.Device{
				Name:             model.WholeDeviceName(g),
				Attributes:       map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("gpu"), "index": integer(g), "minor": integer(g)},
				Capacity:         map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: gpuMemory}, "cores": {Value: cores}},
				ConsumesCounters: consumes,
			},
			resourceapi.Device{
				Name:                     model.SharedDeviceName(g),
				AllowMultipleAllocations: ptr.To(true),
				Attributes:               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("shared"), "index": integer(g), "minor": integer(g)},
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					"memory": {Value: gpuMemory, RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default:    ptr.To(gpuMemory),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Mi")), Step: ptr.To(resource.MustParse("1Mi"))},
					}},
					"cores": {Value: cores, RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default:    ptr.To(resource.MustParse("0")),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("0")), Max: ptr.To(cores), Step: ptr.To(resource.MustParse("1"))},
					}},
				},
				ConsumesCounters: consumes,
			})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: []resourceslice.Slice{
		{SharedCounters: counters},
		{Devices: devices},
	}}}}
}

// tesseraClasses are the two DeviceClasses the chart installs.
//
// TODO(fleet): replace by model.DeviceClasses() once it lands.
func tesseraClasses() []*resourceapi.DeviceClass {
	return []*resourceapi.DeviceClass{
		class(WholeClass, typeSelector("gpu")),
		class(SharedClass, typeSelector("shared")),
	}
}
