// Package cuda is the smallest binding of the CUDA driver API that the GPU
// check's probe needs: it loads libcuda.so.1 with dlopen at run time (nothing
// links against the driver, so the package builds and its tests run on
// machines without one), allocates device memory until the driver refuses,
// and launches a PTX kernel.
//
// A [Lib] is bound to the calling OS thread's CUDA context: callers must keep
// one goroutine on one OS thread (runtime.LockOSThread) from [Lib.Init] until
// [Lib.Close].
package cuda

import (
	"errors"
	"fmt"
	"strings"
)

// LibraryName is the driver library the probe loads.
const LibraryName = "libcuda.so.1"

// ErrNotLoaded wraps every error of [Open] that comes from the library not
// being there or not being usable, so callers can tell "no driver" apart
// from a failing GPU.
var ErrNotLoaded = errors.New("the NVIDIA driver's " + LibraryName + " could not be loaded")

// ErrNotSupported wraps the error of an allocator the driver or the device
// does not support: not a failure of the limit under test.
var ErrNotSupported = errors.New("not supported")

// Result is a CUresult; zero is CUDA_SUCCESS.
type Result int

// The CUresult values the probe tells apart.
const (
	Success     Result = 0
	OutOfMemory Result = 2 // CUDA_ERROR_OUT_OF_MEMORY
)

// Error is a failed driver call.
type Error struct {
	Call   string
	Result Result
	Name   string // cuGetErrorName, when the driver knows it
	Log    string // the JIT's error log (module loads only)
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s: CUresult %d", e.Call, int(e.Result))
	if e.Name != "" {
		msg = fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, int(e.Result))
	}
	if e.Log != "" {
		msg += ": " + e.Log
	}
	return msg
}

// IsOutOfMemory reports whether err is a driver call that failed with
// CUDA_ERROR_OUT_OF_MEMORY.
func IsOutOfMemory(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Result == OutOfMemory
}

// DeviceInfo is what the probe reads about device 0 of its context.
type DeviceInfo struct {
	Name                string
	DriverVersion       int // cuDriverGetVersion, e.g. 12040
	Multiprocessors     int
	MaxThreadsPerSM     int
	ClockKHz            int // 0 when the driver does not report it
	ComputeCapability   string
	TotalBytes          uint64 // cuMemGetInfo right after the context was made current
	FreeBytes           uint64
	ContextCreateMillis float64
	// DeviceCount is cuDeviceGetCount: the devices this process sees (-1
	// or 0 when unknown); VisibleUUIDs their UUIDs (cuDeviceGetUuid_v2,
	// which gives a MIG device's own), as 8-4-4-4-12 hex, without the
	// "GPU-" or "MIG-" prefix NVML writes (the bytes do not say which).
	DeviceCount  int      `json:",omitempty"`
	VisibleUUIDs []string `json:",omitempty"`
}

// FormatUUID writes 16 bytes as 8-4-4-4-12 lower-case hex.
func FormatUUID(b [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// BareUUID is an NVML UUID ("GPU-…", "MIG-…") without its prefix, lower
// case, comparable with FormatUUID's.
func BareUUID(s string) string {
	for _, p := range []string{"GPU-", "MIG-"} {
		if len(s) > len(p) && s[:len(p)] == p {
			return strings.ToLower(s[len(p):])
		}
	}
	return strings.ToLower(s)
}

// Allocator is a CUDA driver API that hands out device memory. HAMi-core
// hooks each of them (its src/cuda/memory.c: cuMemAlloc_v2,
// cuMemAllocAsync, cuMemCreate, cuMemAllocManaged), so each must be refused
// past a share's limit.
type Allocator string

// The allocators the memory probe can use.
const (
	AllocPlain   Allocator = "cuMemAlloc"
	AllocAsync   Allocator = "cuMemAllocAsync"
	AllocVMM     Allocator = "cuMemCreate+cuMemMap"
	AllocManaged Allocator = "cuMemAllocManaged"
)

// Allocators are every allocator, cuMemAlloc first.
var Allocators = []Allocator{AllocPlain, AllocAsync, AllocVMM, AllocManaged}

// ParseAllocator accepts an allocator's name, or "alloc", "async", "vmm",
// "managed".
func ParseAllocator(s string) (Allocator, error) {
	switch s {
	case "", "alloc", string(AllocPlain):
		return AllocPlain, nil
	case "async", string(AllocAsync):
		return AllocAsync, nil
	case "vmm", string(AllocVMM):
		return AllocVMM, nil
	case "managed", string(AllocManaged):
		return AllocManaged, nil
	}
	return "", fmt.Errorf("allocator %q: want alloc, async, vmm or managed", s)
}

// Allocation is one allocation of [Lib.AllocWith].
type Allocation struct {
	Allocator Allocator
	Ptr       Ptr
	Bytes     uint64
	handle    uint64 // VMM: the physical allocation (CUmemGenericAllocationHandle)
}
