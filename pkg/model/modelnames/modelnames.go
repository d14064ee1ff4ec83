// Package modelnames holds the names of the resource model that packages
// built without cgo need: pkg/model, which links NVML, publishes devices and
// DeviceClasses under them (and re-exports them), and the admission webhook
// checks, charges and translates claims by them.
package modelnames

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
)

// DriverName is the DRA driver name: the prefix of attribute names, the
// driver in allocation results and the API group of the opaque GpuConfig.
const DriverName = "gpu.tessera.dev"

// DeviceClass names.
const (
	// WholeClassName selects whole GPUs (devices gpu-N).
	WholeClassName = DriverName
	// SharedClassName selects the shared devices (gpu-N-shared); claims from
	// it ask for capacity.requests {memory, cores}.
	SharedClassName = "shared." + DriverName
	// LentClassName selects the lending devices (gpu-N-lent): borrowers of
	// idle GPUs, evicted when the GPU's owner needs it.
	LentClassName = "lent." + DriverName
	// MIGClassName selects MIG devices (type "mig"), static and dynamic.
	MIGClassName = "mig." + DriverName
	// NVIDIAGPUClassName serves plain nvidia.com/gpu with whole GPUs
	// (pkg/legacy.DeviceClass).
	NVIDIAGPUClassName = "nvidia-gpu." + DriverName
)

// Capacity names of the shared and lending devices, as ResourceSlices,
// tooling and capacity.requests name them.
const (
	// Memory is framebuffer memory in bytes.
	Memory resourceapi.QualifiedName = "memory"
	// Cores is the percentage (0–100) of the GPU's compute.
	Cores resourceapi.QualifiedName = "cores"
)

// CoresPerGPU is the value of the cores capacity and counter of every GPU.
const CoresPerGPU = 100

// AttrType is the attribute that tells the kinds of device apart; its values
// follow.
const AttrType resourceapi.QualifiedName = "type"

// Values of the type attribute.
const (
	// TypeWhole marks gpu-N, the exclusive whole GPU.
	TypeWhole = "gpu"
	// TypeShared marks gpu-N-shared, the device that hands out fractions.
	TypeShared = "shared"
	// TypeLent marks gpu-N-lent, the device that lends a held, idle GPU.
	TypeLent = "lent"
	// TypeMIG is the type of MIG devices, static and dynamic.
	TypeMIG = "mig"
)

// Qualified attribute names, as matchAttribute constraints name them.
const (
	// UUIDAttribute is the GPU UUID attribute (pkg/model.AttrUUID).
	UUIDAttribute resourceapi.FullyQualifiedName = DriverName + "/uuid"
	// NVLinkDomainAttribute is the NVLink domain attribute
	// (pkg/model.AttrNVLinkDomain).
	NVLinkDomainAttribute resourceapi.FullyQualifiedName = DriverName + "/nvlinkDomain"
)

// Keys of device taints that only Tessera sets, to keep claims off a device
// for the driver's own reasons: no claim may tolerate them (the admission
// webhook refuses a request that does, and so does prepare).
const (
	// NotLentTaintKey (effect NoSchedule) is on a lending device while its
	// GPU is not lent.
	NotLentTaintKey = DriverName + "/not-lent"
	// MIGInUseTaintKey (effect NoSchedule) is on a static MIG device whose
	// instance runs processes no Tessera claim accounts for.
	MIGInUseTaintKey = DriverName + "/mig-in-use"
)

// internalTaints are the taints of the keys above, with the effect the
// driver sets them with.
var internalTaints = []resourceapi.DeviceTaint{
	{Key: NotLentTaintKey, Effect: resourceapi.DeviceTaintEffectNoSchedule},
	{Key: MIGInUseTaintKey, Effect: resourceapi.DeviceTaintEffectNoSchedule},
}

// ToleratedInternalTaint returns the key of a taint that only Tessera sets
// (NotLentTaintKey, MIGInUseTaintKey) which toleration tolerates, whatever
// value the driver gives the taint; "" when it tolerates none. A toleration
// without a key and with operator Exists tolerates them all, unless its
// effect is another one (NoExecute).
func ToleratedInternalTaint(toleration resourceapi.DeviceToleration) string {
	for _, taint := range internalTaints {
		if toleration.Key == taint.Key {
			// The driver's values vary (the reason a GPU is not lent).
			taint.Value = toleration.Value
		}
		if resourceclaim.ToleratesTaint(toleration, taint) {
			return taint.Key
		}
	}
	return ""
}
