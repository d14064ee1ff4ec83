package why

import (
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/internal/cli/clusterview"
	"github.com/tessera-dev/tessera/pkg/model"
)

// device is one published device on the node: of this driver, or of
// another one a request asks for (foreign).
type device struct {
	driver string
	pool   string
	dev    *resourceapi.Device
	id     structured.DeviceID
}

func (d device) foreign() bool { return d.driver != model.DriverName }

// gpuName is the GPU a device belongs to (gpu-N for gpu-N, gpu-N-shared,
// gpu-N-lent and the MIG devices gpu-N-mig-…), or the device's name for a
// device not named that way.
func (d device) gpuName() string {
	minor, _, err := model.ParseDevice(d.dev.Name)
	if err != nil {
		if m, migErr := model.ParseMIGDevice(d.dev.Name); migErr == nil && !d.foreign() {
			return model.WholeDeviceName(m.Minor)
		}
		return d.dev.Name
	}
	return model.WholeDeviceName(minor)
}

func (d device) multi() bool { return ptr.Deref(d.dev.AllowMultipleAllocations, false) }

// nodeDevices are this driver's devices on the node (newest generation of
// each pool), in slice order.
func (e *explainer) nodeDevices(node string) []device {
	var out []device
	for _, s := range e.slices {
		if s.Spec.Driver != model.DriverName || ptr.Deref(s.Spec.NodeName, "") != node ||
			s.Spec.Pool.Generation != e.newest[s.Spec.Driver+"/"+s.Spec.Pool.Name] {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			out = append(out, device{driver: model.DriverName, pool: s.Spec.Pool.Name, dev: d, id: structured.MakeDeviceID(model.DriverName, s.Spec.Pool.Name, d.Name)})
		}
	}
	return out
}

// foreignDevices are the devices of every other driver that the node can
// use (slices of the node, or for all nodes; newest generation of each
// pool), in slice order.
func (e *explainer) foreignDevices(node string) []device {
	var out []device
	for _, s := range e.slices {
		if s.Spec.Driver == model.DriverName || (ptr.Deref(s.Spec.NodeName, "") != node && !ptr.Deref(s.Spec.AllNodes, false)) ||
			s.Spec.Pool.Generation != e.newest[s.Spec.Driver+"/"+s.Spec.Pool.Name] {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			out = append(out, device{driver: s.Spec.Driver, pool: s.Spec.Pool.Name, dev: d, id: structured.MakeDeviceID(s.Spec.Driver, s.Spec.Pool.Name, d.Name)})
		}
	}
	return out
}

// poolDevices are all devices of a pool (newest generation).
func (e *explainer) poolDevices(pool string) []device {
	var out []device
	for _, s := range e.slices {
		if s.Spec.Driver != model.DriverName || s.Spec.Pool.Name != pool || s.Spec.Pool.Generation != e.newest[s.Spec.Driver+"/"+pool] {
			continue
		}
		for i := range s.Spec.Devices {
			out = append(out, device{driver: model.DriverName, pool: pool, dev: &s.Spec.Devices[i], id: structured.MakeDeviceID(model.DriverName, pool, s.Spec.Devices[i].Name)})
		}
	}
	return out
}

// counterSet is a pool's shared counter set by name (newest generation).
func (e *explainer) counterSet(pool, name string) (resourceapi.CounterSet, bool) {
	for _, s := range e.slices {
		if s.Spec.Driver != model.DriverName || s.Spec.Pool.Name != pool || s.Spec.Pool.Generation != e.newest[s.Spec.Driver+"/"+pool] {
			continue
		}
		for _, cs := range s.Spec.SharedCounters {
			if cs.Name == name {
				return cs, true
			}
		}
	}
	return resourceapi.CounterSet{}, false
}

// allocated reports whether any claim holds the device (whole, or a share).
func (e *explainer) allocated(id structured.DeviceID) bool { return len(e.holders[id]) > 0 }

// consumed sums what the shares of a device consume, per capacity.
func (e *explainer) consumed(id structured.DeviceID) map[resourceapi.QualifiedName]int64 {
	out := map[resourceapi.QualifiedName]int64{}
	for _, c := range e.in.Claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.ShareID == nil || ptr.Deref(res.AdminAccess, false) || structured.MakeDeviceID(res.Driver, res.Pool, res.Device) != id {
				continue
			}
			for name, q := range res.ConsumedCapacity {
				out[name] += q.Value()
			}
		}
	}
	return out
}

func (e *explainer) holderList(id structured.DeviceID) string {
	var out []string
	for _, h := range e.holders[id] {
		out = append(out, h.String())
	}
	return strings.Join(out, ", ")
}

// names lists the devices' names, gpu-2 before gpu-10.
func names(ds []device) string {
	var out []string
	for _, d := range ds {
		out = append(out, d.dev.Name)
	}
	slices.SortFunc(out, compareDeviceNames)
	return strings.Join(out, ", ")
}

// quantity formats an amount of a capacity: bytes for memory, a plain
// number otherwise.
func quantity(name resourceapi.QualifiedName, v int64) string {
	if name == model.Memory {
		return bytes(v)
	}
	return strconv.FormatInt(v, 10)
}

func bytes(v int64) string { return clusterview.Bytes(v) }
