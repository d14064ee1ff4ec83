package gpu

import (
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Memory a GPU publishes.
//
// NVML's total framebuffer memory (nvmlDeviceGetMemoryInfo, nvidia-smi's
// memory.total) includes what the driver and firmware reserve for
// themselves, which no CUDA allocation can ever get: on an H100 80GB HBM3 the
// total is 81559 MiB and CUDA's total (cudaDeviceProp.totalGlobalMem, which
// leaves the reserved memory out) about 81089 MiB. Shares cut from the NVML
// total add up to more than processes can allocate, so discovery publishes
// total − reserved, read with nvmlDeviceGetMemoryInfo_v2 (NVML R510 and
// later). Where v2 is missing or refused it falls back to the v1 total and
// says why in GPU.MemoryReservedUnknown, so that the kubelet plugin can log
// it: shares on that node then promise memory that does not exist.

// readMemory fills g's memory facts from dev.
func readMemory(dev nvml.Device, sym symbols, g *GPU) error {
	reason := "this NVML library has no nvmlDeviceGetMemoryInfo_v2 (driver older than R510)"
	if sym.memoryInfoV2 {
		mem, ret := dev.GetMemoryInfo_v2()
		switch {
		case ret == nvml.SUCCESS && mem.Total > 0 && mem.Total <= math.MaxInt64 && mem.Reserved < mem.Total:
			g.MemoryTotalBytes, g.MemoryReservedBytes = mem.Total, mem.Reserved
			g.MemoryBytes = mem.Total - mem.Reserved
			g.MemoryReservedUnknown = ""
			return nil
		case ret == nvml.SUCCESS:
			reason = fmt.Sprintf("nvmlDeviceGetMemoryInfo_v2 reported %d bytes reserved of a total of %d", mem.Reserved, mem.Total)
		case memoryV2Refused(ret):
			reason = fmt.Sprintf("nvmlDeviceGetMemoryInfo_v2: %v", ret)
		default:
			return nvmlError("nvmlDeviceGetMemoryInfo_v2", ret)
		}
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nvmlError("nvmlDeviceGetMemoryInfo", ret)
	}
	if mem.Total == 0 || mem.Total > math.MaxInt64 {
		// 0, NVML_VALUE_NOT_AVAILABLE or beyond a quantity: the GPU fails
		// alone instead of making the node's whole pool unpublishable.
		return fmt.Errorf("nvmlDeviceGetMemoryInfo reported a total of %d bytes: not a memory size", mem.Total)
	}
	g.MemoryTotalBytes, g.MemoryReservedBytes = mem.Total, 0
	g.MemoryBytes = mem.Total
	g.MemoryReservedUnknown = reason + "; publishing the total, reserved memory included"
	return nil
}

// memoryV2Refused reports whether ret means that this driver does not answer
// nvmlDeviceGetMemoryInfo_v2 (a refusal, not a failing GPU): v1 is asked
// instead.
func memoryV2Refused(ret nvml.Return) bool {
	switch ret {
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_ARGUMENT_VERSION_MISMATCH, nvml.ERROR_INVALID_ARGUMENT:
		return true
	}
	return false
}
