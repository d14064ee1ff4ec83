// Package modelnames holds the names of the resource model that packages
// built without cgo need: pkg/model, which links NVML, publishes devices and
// DeviceClasses under them (and re-exports them), and the admission webhook
// checks, charges and translates claims by them.
package modelnames

import resourceapi "k8s.io/api/resource/v1"

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
