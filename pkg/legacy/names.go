package legacy

// The legacy resource names and annotations, with where their meaning comes
// from. Sources (read at the commits named):
//
//   - HAMi: github.com/Project-HAMi/HAMi @4707fb02, pkg/device/nvidia/device.go
//     (GenerateResourceRequests, defaultExclusiveCoreIfNeeded,
//     validateMemoryPercentage; the annotation constants),
//     pkg/device/devices.go (CheckType) and examples/nvidia/*.yaml.
//   - gpushare: github.com/AliyunContainerService/gpushare-scheduler-extender
//     @c0b61411, docs/userguide.md; the unit is the device plugin's
//     --memory-unit flag (GiB or MiB, default GiB):
//     github.com/AliyunContainerService/gpushare-device-plugin @45fb8b88,
//     cmd/nvidia/main.go.
//   - Koordinator: github.com/koordinator-sh/koordinator @a7a1b76b,
//     docs/proposals/scheduling/20220629-fine-grained-device-scheduling.md,
//     docs/proposals/scheduling/20230803-enhance-gpu-share-api.md and
//     pkg/scheduler/plugins/deviceshare/utils.go (ValidateDeviceRequest,
//     ValidDeviceResourceCombinations), devicehandler_gpu.go
//     (calcDesiredRequestsAndCountForGPU).
//   - NVIDIA's device plugin: nvidia.com/gpu, a count of whole GPUs.
const (
	// NvidiaGPU is a count of GPUs. Alone it is whole GPUs (the device
	// plugin's meaning, and HAMi's: with neither gpumem nor
	// gpumem-percentage HAMi gives 100% of the memory and defaults gpucores
	// to 100, an exclusive card). Beside HAMi's names it is the number of
	// shares, each on a different GPU.
	NvidiaGPU = "nvidia.com/gpu"
	// HAMiMemory is the memory of each share in MiB (HAMi multiplies by its
	// memoryFactor, 1 by default; assumed 1).
	HAMiMemory = "nvidia.com/gpumem"
	// HAMiMemoryPercentage is the memory of each share as a percentage of its
	// GPU's, 1 to 100. HAMi refuses it outside 0..100.
	HAMiMemoryPercentage = "nvidia.com/gpumem-percentage"
	// HAMiCores is the percentage of each GPU's compute each share gets,
	// 0 to 100; HAMi's default is its defaultCores setting (0: none reserved).
	HAMiCores = "nvidia.com/gpucores"
	// HAMiPriority is HAMi's task priority (an environment variable for
	// HAMi-core); Tessera has no equivalent, so it is refused.
	HAMiPriority = "nvidia.com/priority"

	// HAMiUseType and HAMiNoUseType are pod annotations: comma-separated GPU
	// types, matched case-insensitively as substrings of the card's type
	// (HAMi's CheckType). They become CEL selectors on productName.
	HAMiUseType   = "nvidia.com/use-gputype"
	HAMiNoUseType = "nvidia.com/nouse-gputype"
	// HAMiUseUUID and HAMiNoUseUUID are pod annotations: comma-separated GPU
	// UUIDs. They become CEL selectors on Tessera's uuid attribute.
	HAMiUseUUID   = "nvidia.com/use-gpuuuid"
	HAMiNoUseUUID = "nvidia.com/nouse-gpuuuid"
	// HAMiNUMABind and HAMiVGPUMode are pod annotations Tessera cannot
	// honour; a pod that sets them is refused rather than placed without them.
	HAMiNUMABind = "nvidia.com/numa-bind"
	HAMiVGPUMode = "nvidia.com/vgpu-mode"

	// GPUShareMemory is the GPU memory of a gpushare container, on one GPU,
	// in the unit of the installation's device plugin (GiB or MiB).
	GPUShareMemory = "aliyun.com/gpu-mem"
	// GPUShareCount is a node resource of gpushare (GPUs per node); in a
	// pod it means nothing to gpushare, and it is refused.
	GPUShareCount = "aliyun.com/gpu-count"

	// KoordCore is compute in percent of one GPU; above 100 a multiple of
	// 100 (several GPUs). It must come with gpu-memory or gpu-memory-ratio.
	KoordCore = "koordinator.sh/gpu-core"
	// KoordMemory is GPU memory in bytes (a quantity such as 8Gi).
	KoordMemory = "koordinator.sh/gpu-memory"
	// KoordMemoryRatio is memory in percent of one GPU's; above 100 a
	// multiple of 100, which is also how many GPUs the container gets.
	KoordMemoryRatio = "koordinator.sh/gpu-memory-ratio"
	// KoordGPU is the shorthand for gpu-core and gpu-memory-ratio both set
	// to its value (deprecated by Koordinator, still supported).
	KoordGPU = "koordinator.sh/gpu"
	// KoordShared is how many GPUs the container's gpu-core and gpu-memory
	// (or ratio) are divided over equally.
	KoordShared = "koordinator.sh/gpu.shared"
)

// Koordinator's pod annotations that constrain where its devices are
// allocated (Koordinator @a7a1b76b, docs/best-practices
// gpu-and-rdma-joint-allocation): device-joint-allocate puts the GPUs and
// the RDMA NICs it names on the same PCIe switch, device-allocate-hint
// selects the devices (an RDMA VF). Tessera's claims cannot express either,
// so a pod whose GPUs are translated is refused when it carries them rather
// than placed without the constraint.
const (
	KoordDeviceJointAllocate = "scheduling.koordinator.sh/device-joint-allocate"
	KoordDeviceAllocateHint  = "scheduling.koordinator.sh/device-allocate-hint"
)

// koordPrefix marks Koordinator's resources; those not listed above (rdma,
// fpga, batch-cpu) are not GPUs and are left alone.
const koordPrefix = "koordinator.sh/"

// MemoryUnit is the unit of aliyun.com/gpu-mem, an installation setting of
// gpushare (its device plugin's --memory-unit).
type MemoryUnit string

const (
	// GiB is gpushare's default unit.
	GiB MemoryUnit = "GiB"
	// MiB is the unit with --memory-unit=MiB.
	MiB MemoryUnit = "MiB"
)
