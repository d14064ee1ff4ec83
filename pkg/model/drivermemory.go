package model

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

// AttrDriverMemoryLimits is true on the devices of a node whose NVIDIA driver
// can enforce a share's memory (isolation DriverMemory: driver r615 or newer,
// cgroup v2 with the dmem controller, the NVIDIA container toolkit's
// nvidia-cdi-hook), false elsewhere. A DeviceClass or claim selects such
// nodes with
//
//	device.attributes["gpu.tessera.dev"].driverMemoryLimits == true
const AttrDriverMemoryLimits resourceapi.QualifiedName = "driverMemoryLimits"

// WithDriverMemoryLimits publishes the bool attribute driverMemoryLimits,
// the same on every device of the node: the kubelet plugin detects it once,
// at start. Without the option the attribute is left out; a CEL selector that
// reads a missing attribute fails, so the plugin always passes it.
func WithDriverMemoryLimits(capable bool) Option {
	return func(o *options) { o.driverMemoryLimits = ptr.To(capable) }
}
