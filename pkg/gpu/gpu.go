// Package gpu discovers the NVIDIA GPUs of a node through go-nvml's nvml.Interface
// and reduces their NVLink connectivity to one NVLink domain per GPU.
//
// The same code runs over the real NVML library on GPU nodes and over the built-in
// mock node profiles (mocks of the same interface) on laptops, in CI and in the demo.
package gpu

// GPU is what the rest of Tessera knows about one physical GPU. It is filled in by
// discovery and is otherwise plain data: the model, the plugin and the CLI only read it.
type GPU struct {
	// UUID is NVML's stable identifier ("GPU-…"); it is what containers see in
	// NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES.
	UUID string `json:"uuid"`
	// Minor is the device minor number (/dev/nvidia<Minor>); device names use it.
	Minor int `json:"minor"`
	// Index is NVML's enumeration index.
	Index int `json:"index"`
	// ProductName, e.g. "NVIDIA H100 80GB HBM3".
	ProductName string `json:"productName"`
	// Architecture in lower case, e.g. "hopper", "ampere", "ada".
	Architecture string `json:"architecture"`
	// CUDAComputeCapability as "major.minor", e.g. "9.0".
	CUDAComputeCapability string `json:"cudaComputeCapability"`
	// DriverVersion as NVML reports it, e.g. "550.54.15".
	DriverVersion string `json:"driverVersion"`
	// CUDADriverVersion as "major.minor", e.g. "12.4".
	CUDADriverVersion string `json:"cudaDriverVersion"`
	// MemoryBytes is the framebuffer memory workloads can use: NVML's total
	// less what the driver and firmware reserve (nvmlDeviceGetMemoryInfo_v2).
	// It is what Tessera publishes and what shares are cut from. Where the
	// driver cannot say what it reserves it is the total, and
	// MemoryReservedUnknown says why.
	MemoryBytes uint64 `json:"memoryBytes"`
	// MemoryTotalBytes is NVML's total framebuffer memory (nvidia-smi's
	// memory.total), reserved memory included.
	MemoryTotalBytes uint64 `json:"memoryTotalBytes,omitempty"`
	// MemoryReservedBytes is the memory the driver and firmware reserve
	// (nvidia-smi's memory.reserved); no workload can allocate it.
	MemoryReservedBytes uint64 `json:"memoryReservedBytes,omitempty"`
	// MemoryReservedUnknown is empty when NVML reported the reserved memory,
	// else why it did not (an NVML older than R510 has no
	// nvmlDeviceGetMemoryInfo_v2): MemoryBytes is then the total, which
	// promises shares memory no process can get.
	MemoryReservedUnknown string `json:"memoryReservedUnknown,omitempty"`
	// MultiprocessorCount is the number of SMs; 0 when the driver does not report
	// it (NVML documents nvmlDeviceGetAttributes for MIG devices only).
	MultiprocessorCount int `json:"multiprocessorCount"`
	// PCIBusID in the canonical lower-case sysfs form "0000:07:00.0".
	PCIBusID string `json:"pciBusID"`
	// PCIeRoot is the PCIe root complex the GPU sits under, as sysfs names it
	// ("pci0000:15"), the value of the standard resource.kubernetes.io/pcieRoot
	// attribute; empty when discovery does not know it. NVML does not report
	// it: mock nodes know it from their profile (MockNode.PCIeRoot), real
	// nodes resolve it from sysfs when the model is built (SysfsPCIeRoots).
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// NUMANode is the GPU's NUMA node, nil when unknown.
	NUMANode *int `json:"numaNode,omitempty"`
	// MIGEnabled is true when MIG mode is on: the GPU is handed out only as
	// MIG devices, never whole or in shares.
	MIGEnabled bool `json:"migEnabled"`
	// MIG is the GPU's MIG state (pending mode, profiles, instances); nil
	// for a GPU without MIG support.
	MIG *MIG `json:"mig,omitempty"`
	// MIGError is the NVML error of the MIG queries of a GPU in MIG mode
	// (profiles, placements, instances, MIG devices) that left MIG
	// incomplete; empty when they were all read. The GPU is described with
	// what was read, not dropped (see ReasonMIGUnknown).
	MIGError string `json:"migError,omitempty"`
	// NVLinkDomain identifies the set of GPUs connected to this one by NVLink
	// (connected components of the NVLink graph, or the NVLink fabric clique).
	// GPUs with the same value can talk over NVLink. Stable across restarts.
	NVLinkDomain string `json:"nvlinkDomain"`
	// NVLinkError is the NVML error of the NVLink or fabric queries that left
	// this GPU in an NVLink domain of its own although it may have peers;
	// empty when its links and fabric registration were read.
	NVLinkError string `json:"nvlinkError,omitempty"`
	// Fabric is the GPU's NVLink fabric registration
	// (nvmlDeviceGetGpuFabricInfo); FabricNone when the GPU or driver takes
	// no part in an NVLink fabric.
	Fabric FabricState `json:"fabric,omitempty"`
	// FabricError is the error NVML reports for a registration that completed
	// without success; empty otherwise.
	FabricError string `json:"fabricError,omitempty"`
	// ComputeMode is the GPU's compute mode as NVML reports it; empty when
	// the driver does not report one. Discovery only reads it.
	ComputeMode ComputeMode `json:"computeMode,omitempty"`
	// ComputeModeError is the NVML error that left ComputeMode unknown
	// (a read-only fact: the GPU is published without it, not dropped).
	ComputeModeError string `json:"computeModeError,omitempty"`
}
