// Package accounting is the one rule for how much of a GPU allocated devices
// hold. The kubelet plugin's metrics, `tessera status` and the fleet
// simulation all count with it, so they cannot disagree:
//
//   - a whole GPU (gpu-N) holds all of the GPU's memory and cores;
//   - a share (gpu-N-shared) holds its consumedCapacity memory and cores:
//     what the scheduler took from the GPU, not the limits the container
//     gets (a GpuConfig may lower those);
//   - an admin-access device holds nothing: it observes the GPU, the
//     scheduler does not count it against the GPU, and it blocks no one;
//   - what the devices on one GPU hold adds up, two shares of one claim
//     (two requests, or one request with two shares of the device) included.
//
// Callers convert what they have into [Device] with [FromResult] (an
// allocation result in the API) or [FromCheckpoint] (a prepared device in
// the plugin's checkpoint) and supply each GPU's capacity, which only they
// know (the ResourceSlice or the plugin's inventory).
package accounting

import (
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/model"
)

// GPU names one GPU: the pool that publishes it (the node's name) and its
// minor. Callers that look at one node only may leave Pool empty.
type GPU struct {
	Pool  string
	Minor int
}

// Capacity is an amount of a GPU: memory in bytes and compute in percent.
type Capacity struct {
	MemoryBytes int64
	Cores       int64
}

// Device is one allocated device of this driver, reduced to what the rule
// needs.
type Device struct {
	GPU GPU
	// Shared is true for gpu-N-shared, false for the whole gpu-N.
	Shared bool
	// AdminAccess devices hold nothing.
	AdminAccess bool
	// Consumed is a share's consumedCapacity; ignored for whole GPUs and
	// admin access.
	Consumed Capacity
}

// Holds is what d holds of its GPU, whose capacity is gpu.
func (d Device) Holds(gpu Capacity) Capacity {
	switch {
	case d.AdminAccess:
		return Capacity{}
	case d.Shared:
		return d.Consumed
	default:
		return gpu
	}
}

// Allocation is what a set of devices holds of one GPU.
type Allocation struct {
	// Capacity is the sum of what the devices hold.
	Capacity
	// Whole is true when a whole-GPU device (not admin access) is among them.
	Whole bool
	// Shares counts the shares (not admin access) among them.
	Shares int
}

// Allocated sums what devices hold, per GPU. capacity returns a GPU's
// capacity and whether the caller knows the GPU; devices of GPUs it does not
// know (no longer published, or not of this node) are left out. GPUs no
// device holds anything of are absent from the result.
func Allocated(devices []Device, capacity func(GPU) (Capacity, bool)) map[GPU]Allocation {
	out := map[GPU]Allocation{}
	for _, d := range devices {
		c, ok := capacity(d.GPU)
		if !ok || d.AdminAccess {
			continue
		}
		a := out[d.GPU]
		h := d.Holds(c)
		a.MemoryBytes += h.MemoryBytes
		a.Cores += h.Cores
		if d.Shared {
			a.Shares++
		} else {
			a.Whole = true
		}
		out[d.GPU] = a
	}
	return out
}

// FromResult converts an allocation result from the API. ok is false for
// results of other drivers and device names that are not this driver's.
func FromResult(r resourceapi.DeviceRequestAllocationResult) (d Device, ok bool) {
	if r.Driver != model.DriverName {
		return Device{}, false
	}
	minor, shared, err := model.ParseDeviceName(r.Device)
	if err != nil {
		return Device{}, false
	}
	d = Device{GPU: GPU{Pool: r.Pool, Minor: minor}, Shared: shared, AdminAccess: r.AdminAccess != nil && *r.AdminAccess}
	if q, ok := r.ConsumedCapacity[model.Memory]; ok {
		d.Consumed.MemoryBytes = q.Value()
	}
	if q, ok := r.ConsumedCapacity[model.Cores]; ok {
		d.Consumed.Cores = q.Value()
	}
	return d, true
}

// FromCheckpoint converts a prepared device of the plugin's checkpoint. ok is
// false for a device name that is not this driver's.
//
// Checkpoints written before the plugin recorded consumedCapacity have
// neither ConsumedMemory nor ConsumedCores (nor AdminAccess). For a share
// with both 0, its memory limit stands in for the memory it consumed (equal
// unless a GpuConfig lowered it, so never more) and its cores count as 0: the
// core limit may exceed what was consumed (computeLimit), and counting too
// much would make the plugin refuse valid shares after an upgrade; a share of such a checkpoint
// without a memory limit is admin access, since the plugin never prepared
// a granting share without one. An admin-access whole GPU of such a
// checkpoint cannot be told apart and counts as whole.
func FromCheckpoint(c checkpoint.Device) (d Device, ok bool) {
	_, shared, err := model.ParseDeviceName(c.Device)
	if err != nil {
		return Device{}, false
	}
	d = Device{
		GPU:         GPU{Pool: c.Pool, Minor: c.Minor},
		Shared:      shared,
		AdminAccess: !c.Grants(),
		Consumed:    Capacity{MemoryBytes: c.ConsumedMemory, Cores: c.ConsumedCores},
	}
	if shared && !d.AdminAccess && c.ConsumedMemory == 0 && c.ConsumedCores == 0 {
		// An old checkpoint, see above.
		if c.MemoryLimit == 0 {
			d.AdminAccess = true
		} else {
			d.Consumed = Capacity{MemoryBytes: c.MemoryLimit}
		}
	}
	return d, true
}
