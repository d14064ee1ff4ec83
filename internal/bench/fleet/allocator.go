package fleet

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/model"
)

// --- allocator-backed models -----------------------------------------------------------

func newClassLister(classes []*resourceapi.DeviceClass) model.ClassLister {
	l := model.ClassLister{}
	for _, c := range classes {
		l[c.Name] = c
	}
	return l
}

func newCELCache() *cel.Cache {
	return cel.NewCache(100, cel.Features{EnableConsumableCapacity: true})
}

// commit records an allocation in the state the way kube-scheduler's allocated-devices
// tracker does: shares by shareID plus their consumed capacity, whole devices by ID.
func commit(state structured.AllocatedState, results []resourceapi.DeviceRequestAllocationResult) {
	for _, r := range results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			state.AllocatedDevices.Insert(id)
			continue
		}
		state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}

// uncommit is the inverse of commit: the claim was deallocated.
func uncommit(state structured.AllocatedState, results []resourceapi.DeviceRequestAllocationResult) {
	for _, r := range results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			state.AllocatedDevices.Delete(id)
			continue
		}
		state.AllocatedSharedDeviceIDs.Delete(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			state.AggregatedCapacity.Remove(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}
