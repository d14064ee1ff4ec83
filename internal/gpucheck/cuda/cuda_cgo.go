//go:build cgo && linux

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int tcu_result;
typedef int tcu_device;
typedef void *tcu_context;
typedef void *tcu_module;
typedef void *tcu_function;
typedef unsigned long long tcu_deviceptr;

static void *tcu_lib;
static tcu_result (*p_cuInit)(unsigned int);
static tcu_result (*p_cuDriverGetVersion)(int *);
static tcu_result (*p_cuDeviceGet)(tcu_device *, int);
static tcu_result (*p_cuDeviceGetName)(char *, int, tcu_device);
static tcu_result (*p_cuDeviceGetAttribute)(int *, int, tcu_device);
static tcu_result (*p_cuDevicePrimaryCtxRetain)(tcu_context *, tcu_device);
static tcu_result (*p_cuDevicePrimaryCtxRelease)(tcu_device);
static tcu_result (*p_cuCtxSetCurrent)(tcu_context);
static tcu_result (*p_cuCtxSynchronize)(void);
static tcu_result (*p_cuMemGetInfo)(size_t *, size_t *);
static tcu_result (*p_cuMemAlloc)(tcu_deviceptr *, size_t);
static tcu_result (*p_cuMemFree)(tcu_deviceptr);
static tcu_result (*p_cuMemsetD8)(tcu_deviceptr, unsigned char, size_t);
static tcu_result (*p_cuMemcpyDtoH)(void *, tcu_deviceptr, size_t);
static tcu_result (*p_cuModuleLoadDataEx)(tcu_module *, const void *, unsigned int, int *, void **);
static tcu_result (*p_cuModuleGetFunction)(tcu_function *, tcu_module, const char *);
static tcu_result (*p_cuModuleUnload)(tcu_module);
static tcu_result (*p_cuLaunchKernel)(tcu_function, unsigned int, unsigned int, unsigned int,
	unsigned int, unsigned int, unsigned int, unsigned int, void *, void **, void **);
static tcu_result (*p_cuGetErrorName)(tcu_result, const char **);
// Optional: the devices the process sees and their UUIDs.
static tcu_result (*p_cuDeviceGetCount)(int *);
static tcu_result (*p_cuDeviceGetUuid)(unsigned char *, tcu_device);

// The other allocators (optional: a driver without one still runs the
// cuMemAlloc probe). Declared here as the CUDA driver API (cuda.h, CUDA 12
// and 13) defines them; the structs are laid out field for field.
typedef unsigned long long tcu_handle;
typedef struct {
	int type;         // CUmemLocationType
	int id;
} tcu_mem_location;
typedef struct {
	int type;                 // CUmemAllocationType: 1 = CU_MEM_ALLOCATION_TYPE_PINNED
	int requestedHandleTypes; // CUmemAllocationHandleType: 0 = none
	tcu_mem_location location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} tcu_mem_allocation_prop;
typedef struct {
	tcu_mem_location location;
	int flags;        // CUmemAccess_flags: 3 = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
} tcu_mem_access_desc;
static tcu_result (*p_cuMemAllocAsync)(tcu_deviceptr *, size_t, void *);
static tcu_result (*p_cuMemFreeAsync)(tcu_deviceptr, void *);
static tcu_result (*p_cuMemAllocManaged)(tcu_deviceptr *, size_t, unsigned int);
static tcu_result (*p_cuMemGetAllocationGranularity)(size_t *, const tcu_mem_allocation_prop *, int);
static tcu_result (*p_cuMemCreate)(tcu_handle *, size_t, const tcu_mem_allocation_prop *, unsigned long long);
static tcu_result (*p_cuMemRelease)(tcu_handle);
static tcu_result (*p_cuMemAddressReserve)(tcu_deviceptr *, size_t, size_t, tcu_deviceptr, unsigned long long);
static tcu_result (*p_cuMemAddressFree)(tcu_deviceptr, size_t);
static tcu_result (*p_cuMemMap)(tcu_deviceptr, size_t, size_t, tcu_handle, unsigned long long);
static tcu_result (*p_cuMemUnmap)(tcu_deviceptr, size_t);
static tcu_result (*p_cuMemSetAccess)(tcu_deviceptr, size_t, const tcu_mem_access_desc *, size_t);

// tcu_sym resolves the first of up to three names that lib exports
// (versioned names first: the unversioned ones are the old ABI).
static void *tcu_sym(void *lib, const char *a, const char *b, const char *c) {
	void *p = dlsym(lib, a);
	if (!p && b) p = dlsym(lib, b);
	if (!p && c) p = dlsym(lib, c);
	return p;
}

// tcu_reset forgets every symbol, so that a failed open leaves nothing a
// later call could jump through.
static void tcu_reset(void) {
	p_cuInit = NULL; p_cuDriverGetVersion = NULL; p_cuDeviceGet = NULL; p_cuDeviceGetName = NULL;
	p_cuDeviceGetAttribute = NULL; p_cuDevicePrimaryCtxRetain = NULL; p_cuDevicePrimaryCtxRelease = NULL;
	p_cuCtxSetCurrent = NULL; p_cuCtxSynchronize = NULL; p_cuMemGetInfo = NULL; p_cuMemAlloc = NULL;
	p_cuMemFree = NULL; p_cuMemsetD8 = NULL; p_cuMemcpyDtoH = NULL; p_cuModuleLoadDataEx = NULL;
	p_cuModuleGetFunction = NULL; p_cuModuleUnload = NULL; p_cuLaunchKernel = NULL; p_cuGetErrorName = NULL;
	p_cuMemAllocAsync = NULL; p_cuMemFreeAsync = NULL; p_cuMemAllocManaged = NULL; p_cuMemGetAllocationGranularity = NULL;
	p_cuMemCreate = NULL; p_cuMemRelease = NULL; p_cuMemAddressReserve = NULL; p_cuMemAddressFree = NULL;
	p_cuMemMap = NULL; p_cuMemUnmap = NULL; p_cuMemSetAccess = NULL;
}

// tcu_open loads the library and its symbols. It returns NULL on success,
// else what failed: dlerror's text or the name of a missing symbol. The
// library counts as open (tcu_lib) only once every symbol resolved; after a
// missing one it is closed and the symbols forgotten, so the next call
// tries again and fails the same way instead of reporting success.
static const char *tcu_open(const char *name) {
	if (tcu_lib) return NULL;
	void *lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
	if (!lib) {
		const char *e = dlerror();
		return e ? e : "dlopen failed";
	}
#define TCU_LOAD(var, a, b, c) do { *(void **)(&var) = tcu_sym(lib, a, b, c); if (!var) { tcu_reset(); dlclose(lib); return "missing symbol " a; } } while (0)
	TCU_LOAD(p_cuInit, "cuInit", NULL, NULL);
	TCU_LOAD(p_cuDriverGetVersion, "cuDriverGetVersion", NULL, NULL);
	TCU_LOAD(p_cuDeviceGet, "cuDeviceGet", NULL, NULL);
	TCU_LOAD(p_cuDeviceGetName, "cuDeviceGetName", NULL, NULL);
	TCU_LOAD(p_cuDeviceGetAttribute, "cuDeviceGetAttribute", NULL, NULL);
	TCU_LOAD(p_cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL, NULL);
	TCU_LOAD(p_cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", NULL);
	TCU_LOAD(p_cuCtxSetCurrent, "cuCtxSetCurrent", NULL, NULL);
	TCU_LOAD(p_cuCtxSynchronize, "cuCtxSynchronize", NULL, NULL);
	TCU_LOAD(p_cuMemGetInfo, "cuMemGetInfo_v2", "cuMemGetInfo", NULL);
	TCU_LOAD(p_cuMemAlloc, "cuMemAlloc_v2", "cuMemAlloc", NULL);
	TCU_LOAD(p_cuMemFree, "cuMemFree_v2", "cuMemFree", NULL);
	TCU_LOAD(p_cuMemsetD8, "cuMemsetD8_v2", "cuMemsetD8", NULL);
	TCU_LOAD(p_cuMemcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH", NULL);
	TCU_LOAD(p_cuModuleLoadDataEx, "cuModuleLoadDataEx", NULL, NULL);
	TCU_LOAD(p_cuModuleGetFunction, "cuModuleGetFunction", NULL, NULL);
	TCU_LOAD(p_cuModuleUnload, "cuModuleUnload", NULL, NULL);
	TCU_LOAD(p_cuLaunchKernel, "cuLaunchKernel", NULL, NULL);
	TCU_LOAD(p_cuGetErrorName, "cuGetErrorName", NULL, NULL);
#undef TCU_LOAD
	// Optional: left NULL when the driver lacks them.
	*(void **)(&p_cuMemAllocAsync) = tcu_sym(lib, "cuMemAllocAsync", NULL, NULL);
	*(void **)(&p_cuMemFreeAsync) = tcu_sym(lib, "cuMemFreeAsync", NULL, NULL);
	*(void **)(&p_cuMemAllocManaged) = tcu_sym(lib, "cuMemAllocManaged", NULL, NULL);
	*(void **)(&p_cuMemGetAllocationGranularity) = tcu_sym(lib, "cuMemGetAllocationGranularity", NULL, NULL);
	*(void **)(&p_cuMemCreate) = tcu_sym(lib, "cuMemCreate", NULL, NULL);
	*(void **)(&p_cuMemRelease) = tcu_sym(lib, "cuMemRelease", NULL, NULL);
	*(void **)(&p_cuMemAddressReserve) = tcu_sym(lib, "cuMemAddressReserve", NULL, NULL);
	*(void **)(&p_cuMemAddressFree) = tcu_sym(lib, "cuMemAddressFree", NULL, NULL);
	*(void **)(&p_cuMemMap) = tcu_sym(lib, "cuMemMap", NULL, NULL);
	*(void **)(&p_cuMemUnmap) = tcu_sym(lib, "cuMemUnmap", NULL, NULL);
	*(void **)(&p_cuMemSetAccess) = tcu_sym(lib, "cuMemSetAccess", NULL, NULL);
	*(void **)(&p_cuDeviceGetCount) = tcu_sym(lib, "cuDeviceGetCount", NULL, NULL);
	// _v2 (CUDA 11.4) gives a MIG device's own UUID; the first version
	// its GPU's.
	*(void **)(&p_cuDeviceGetUuid) = tcu_sym(lib, "cuDeviceGetUuid_v2", "cuDeviceGetUuid", NULL);
	tcu_lib = lib;
	return NULL;
}

static tcu_result tcu_init(void) { return p_cuInit(0); }
static tcu_result tcu_driver_version(int *v) { return p_cuDriverGetVersion(v); }
static tcu_result tcu_device_get(tcu_device *d, int ordinal) { return p_cuDeviceGet(d, ordinal); }
static tcu_result tcu_device_name(char *buf, int n, tcu_device d) { return p_cuDeviceGetName(buf, n, d); }
static tcu_result tcu_device_attribute(int *v, int attr, tcu_device d) { return p_cuDeviceGetAttribute(v, attr, d); }
static tcu_result tcu_ctx_retain(tcu_context *c, tcu_device d) { return p_cuDevicePrimaryCtxRetain(c, d); }
static tcu_result tcu_ctx_release(tcu_device d) { return p_cuDevicePrimaryCtxRelease(d); }
static tcu_result tcu_ctx_set_current(tcu_context c) { return p_cuCtxSetCurrent(c); }
static tcu_result tcu_ctx_synchronize(void) { return p_cuCtxSynchronize(); }
static tcu_result tcu_mem_info(size_t *free, size_t *total) { return p_cuMemGetInfo(free, total); }
static tcu_result tcu_mem_alloc(tcu_deviceptr *p, size_t n) { return p_cuMemAlloc(p, n); }
static tcu_result tcu_mem_free(tcu_deviceptr p) { return p_cuMemFree(p); }
static tcu_result tcu_memset(tcu_deviceptr p, size_t n) { return p_cuMemsetD8(p, 0, n); }
static tcu_result tcu_read_u64(unsigned long long *out, tcu_deviceptr p) { return p_cuMemcpyDtoH(out, p, sizeof(*out)); }
static tcu_result tcu_module_get_function(tcu_function *f, tcu_module m, const char *name) { return p_cuModuleGetFunction(f, m, name); }
static tcu_result tcu_module_unload(tcu_module m) { return p_cuModuleUnload(m); }

// tcu_device_count is cuDeviceGetCount (-1 when the driver lacks it).
static tcu_result tcu_device_count(int *n) {
	if (!p_cuDeviceGetCount) { *n = -1; return 0; }
	return p_cuDeviceGetCount(n);
}
// tcu_device_uuid is the UUID (16 bytes) of device ordinal; 1 (not
// CUDA_SUCCESS) without cuDeviceGetUuid.
static tcu_result tcu_device_uuid(unsigned char *out, int ordinal) {
	tcu_device d;
	tcu_result r;
	if (!p_cuDeviceGetUuid) return 1;
	if ((r = p_cuDeviceGet(&d, ordinal)) != 0) return r;
	return p_cuDeviceGetUuid(out, d);
}

// tcu_has reports which optional allocator a driver has: 1 async, 2 managed,
// 3 virtual memory management.
static int tcu_has(int which) {
	switch (which) {
	case 1: return p_cuMemAllocAsync && p_cuMemFreeAsync;
	case 2: return p_cuMemAllocManaged != NULL;
	case 3: return p_cuMemGetAllocationGranularity && p_cuMemCreate && p_cuMemRelease && p_cuMemAddressReserve &&
		p_cuMemAddressFree && p_cuMemMap && p_cuMemUnmap && p_cuMemSetAccess;
	}
	return 0;
}
// The asynchronous allocator on the legacy default stream (NULL), which the
// memset and frees that follow are ordered with.
static tcu_result tcu_mem_alloc_async(tcu_deviceptr *p, size_t n) { return p_cuMemAllocAsync(p, n, NULL); }
static tcu_result tcu_mem_free_async(tcu_deviceptr p) { return p_cuMemFreeAsync(p, NULL); }
// 1: CU_MEM_ATTACH_GLOBAL.
static tcu_result tcu_mem_alloc_managed(tcu_deviceptr *p, size_t n) { return p_cuMemAllocManaged(p, n, 1); }
static void tcu_vmm_prop(tcu_mem_allocation_prop *prop, int dev) {
	memset(prop, 0, sizeof(*prop));
	prop->type = 1;          // CU_MEM_ALLOCATION_TYPE_PINNED
	prop->location.type = 1; // CU_MEM_LOCATION_TYPE_DEVICE
	prop->location.id = dev;
}
// 0: CU_MEM_ALLOC_GRANULARITY_MINIMUM.
static tcu_result tcu_vmm_granularity(size_t *g, int dev) {
	tcu_mem_allocation_prop prop;
	tcu_vmm_prop(&prop, dev);
	return p_cuMemGetAllocationGranularity(g, &prop, 0);
}
// tcu_vmm_alloc: physical memory (cuMemCreate), an address range
// (cuMemAddressReserve), the mapping (cuMemMap) and read-write access for
// the device (cuMemSetAccess). *stage says how far it got, so that the
// caller undoes exactly that on failure: 1 created, 2 reserved, 3 mapped.
static tcu_result tcu_vmm_alloc(tcu_handle *h, tcu_deviceptr *p, size_t n, int dev, int *stage) {
	tcu_mem_allocation_prop prop;
	tcu_mem_access_desc access;
	tcu_result r;
	*stage = 0;
	tcu_vmm_prop(&prop, dev);
	if ((r = p_cuMemCreate(h, n, &prop, 0)) != 0) return r;
	*stage = 1;
	if ((r = p_cuMemAddressReserve(p, n, 0, 0, 0)) != 0) return r;
	*stage = 2;
	if ((r = p_cuMemMap(*p, n, 0, *h, 0)) != 0) return r;
	*stage = 3;
	memset(&access, 0, sizeof(access));
	access.location = prop.location;
	access.flags = 3; // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	return p_cuMemSetAccess(*p, n, &access, 1);
}
// tcu_vmm_free undoes tcu_vmm_alloc up to stage (4: everything).
static tcu_result tcu_vmm_free(tcu_handle h, tcu_deviceptr p, size_t n, int stage) {
	tcu_result r = 0, x;
	if (stage >= 3 && (x = p_cuMemUnmap(p, n)) != 0 && !r) r = x;
	if (stage >= 2 && (x = p_cuMemAddressFree(p, n)) != 0 && !r) r = x;
	if (stage >= 1 && (x = p_cuMemRelease(h)) != 0 && !r) r = x;
	return r;
}

static const char *tcu_error_name(tcu_result r) {
	const char *s = NULL;
	if (p_cuGetErrorName && p_cuGetErrorName(r, &s) == 0) return s;
	return NULL;
}

// tcu_module_load JIT-compiles PTX text, with the JIT's error log in log.
static tcu_result tcu_module_load(tcu_module *m, const char *ptx, char *log, size_t logSize) {
	// 5: CU_JIT_ERROR_LOG_BUFFER, 6: CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
	int opts[2] = {5, 6};
	void *vals[2] = {log, (void *)(uintptr_t)logSize};
	return p_cuModuleLoadDataEx(m, ptx, 2, opts, vals);
}

// tcu_launch_spin launches an entry with the signature (u64 counter, u64
// cycles) on the default stream; the argument array lives on this stack.
static tcu_result tcu_launch_spin(tcu_function f, unsigned int grid, unsigned int block,
	tcu_deviceptr counter, unsigned long long cycles) {
	void *args[2] = {&counter, &cycles};
	return p_cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, NULL, args, NULL);
}
*/
import "C"

import (
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// CUdevice_attribute values.
const (
	attrClockRate       = 13
	attrMultiprocessors = 16
	attrMaxThreadsPerSM = 39
	attrCCMajor         = 75
	attrCCMinor         = 76
	// What the device supports (cuda.h, CUdevice_attribute).
	attrManagedMemory = 83  // CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
	attrVMM           = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	attrMemoryPools   = 115 // CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
)

var openMu sync.Mutex

// Lib is the loaded driver with device 0's primary context current on the
// calling thread (after [Lib.Init]).
type Lib struct {
	dev C.tcu_device
	ctx C.tcu_context
}

// Open loads libcuda.so.1 (the dynamic loader's search path, as a CUDA
// program would; an LD_PRELOADed interposer such as HAMi-core sees every
// lookup). An error wraps [ErrNotLoaded].
func Open() (*Lib, error) { return open(LibraryName) }

// open loads the driver library from name (a file name for the loader's
// search, or a path).
func open(library string) (*Lib, error) {
	openMu.Lock()
	defer openMu.Unlock()
	name := C.CString(library)
	defer C.free(unsafe.Pointer(name))
	if msg := C.tcu_open(name); msg != nil {
		return nil, fmt.Errorf("%w: %s (the probe needs the driver's library, not the CUDA toolkit; is the NVIDIA driver installed and %s on the loader path?)",
			ErrNotLoaded, C.GoString(msg), library)
	}
	return &Lib{}, nil
}

func check(call string, r C.tcu_result) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, Result: Result(r)}
	if s := C.tcu_error_name(r); s != nil {
		e.Name = C.GoString(s)
	}
	return e
}

// Init initialises the driver and makes device 0's primary context (the one
// the CUDA runtime uses) current on this thread; it returns what it read of
// the device.
func (l *Lib) Init() (DeviceInfo, error) {
	var info DeviceInfo
	start := time.Now()
	if err := check("cuInit", C.tcu_init()); err != nil {
		return info, err
	}
	var v C.int
	if err := check("cuDriverGetVersion", C.tcu_driver_version(&v)); err != nil {
		return info, err
	}
	info.DriverVersion = int(v)
	if err := check("cuDeviceGet(0)", C.tcu_device_get(&l.dev, 0)); err != nil {
		return info, err
	}
	if err := check("cuDevicePrimaryCtxRetain", C.tcu_ctx_retain(&l.ctx, l.dev)); err != nil {
		return info, err
	}
	if err := check("cuCtxSetCurrent", C.tcu_ctx_set_current(l.ctx)); err != nil {
		return info, err
	}
	// The primary context is created lazily; a memory query forces it.
	var free, total C.size_t
	if err := check("cuMemGetInfo", C.tcu_mem_info(&free, &total)); err != nil {
		return info, err
	}
	info.ContextCreateMillis = float64(time.Since(start).Microseconds()) / 1000
	info.FreeBytes, info.TotalBytes = uint64(free), uint64(total)
	var name [256]C.char
	if err := check("cuDeviceGetName", C.tcu_device_name(&name[0], C.int(len(name)), l.dev)); err != nil {
		return info, err
	}
	info.Name = C.GoString(&name[0])
	attr := func(a int) int {
		var out C.int
		if C.tcu_device_attribute(&out, C.int(a), l.dev) != 0 {
			return 0
		}
		return int(out)
	}
	info.Multiprocessors = attr(attrMultiprocessors)
	info.MaxThreadsPerSM = attr(attrMaxThreadsPerSM)
	info.ClockKHz = attr(attrClockRate)
	info.ComputeCapability = fmt.Sprintf("%d.%d", attr(attrCCMajor), attr(attrCCMinor))
	var count C.int
	if C.tcu_device_count(&count) == 0 && count >= 0 {
		info.DeviceCount = int(count)
		for i := range int(count) {
			var raw [16]C.uchar
			if C.tcu_device_uuid(&raw[0], C.int(i)) != 0 {
				break
			}
			var b [16]byte
			for j := range raw {
				b[j] = byte(raw[j])
			}
			info.VisibleUUIDs = append(info.VisibleUUIDs, FormatUUID(b))
		}
	}
	return info, nil
}

// Close releases the primary context.
func (l *Lib) Close() error {
	return check("cuDevicePrimaryCtxRelease", C.tcu_ctx_release(l.dev))
}

// MemInfo is cuMemGetInfo: free and total bytes as the context sees them.
func (l *Lib) MemInfo() (free, total uint64, err error) {
	var f, t C.size_t
	err = check("cuMemGetInfo", C.tcu_mem_info(&f, &t))
	return uint64(f), uint64(t), err
}

// Ptr is a device allocation.
type Ptr uint64

// Alloc is cuMemAlloc; the memory is written once (cuMemsetD8) so that a
// backend that charges on first touch counts it.
func (l *Lib) Alloc(bytes uint64) (Ptr, error) {
	var p C.tcu_deviceptr
	if err := check(fmt.Sprintf("cuMemAlloc(%d)", bytes), C.tcu_mem_alloc(&p, C.size_t(bytes))); err != nil {
		return 0, err
	}
	if err := check("cuMemsetD8", C.tcu_memset(p, C.size_t(bytes))); err != nil {
		_ = C.tcu_mem_free(p)
		return 0, err
	}
	return Ptr(p), nil
}

// Free is cuMemFree.
func (l *Lib) Free(p Ptr) error { return check("cuMemFree", C.tcu_mem_free(C.tcu_deviceptr(p))) }

// Has reports whether allocator a can be used here (Supported is nil).
func (l *Lib) Has(a Allocator) bool { return l.Supported(a) == nil }

// Supported says why allocator a cannot be used here, wrapping
// ErrNotSupported: the driver does not export its entry points, or device
// 0 does not support it (memory pools, attribute 115, for cuMemAllocAsync;
// virtual memory management, 102, for cuMemCreate; managed memory, 83, for
// cuMemAllocManaged). nil: it can. Valid after Init. Every driver has
// cuMemAlloc.
func (l *Lib) Supported(a Allocator) error {
	which, attr, attrName := 0, 0, ""
	switch a {
	case AllocPlain:
		return nil
	case AllocAsync:
		which, attr, attrName = 1, attrMemoryPools, "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED"
	case AllocManaged:
		which, attr, attrName = 2, attrManagedMemory, "CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY"
	case AllocVMM:
		which, attr, attrName = 3, attrVMM, "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"
	default:
		return fmt.Errorf("%w: unknown allocator %q", ErrNotSupported, a)
	}
	if C.tcu_has(C.int(which)) == 0 {
		return fmt.Errorf("%w: this driver's %s does not export the entry points of %s", ErrNotSupported, LibraryName, a)
	}
	var v C.int
	if err := check(fmt.Sprintf("cuDeviceGetAttribute(%s)", attrName), C.tcu_device_attribute(&v, C.int(attr), l.dev)); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrNotSupported, a, err)
	}
	if v == 0 {
		return fmt.Errorf("%w: device 0 does not support %s (%s is 0)", ErrNotSupported, a, attrName)
	}
	return nil
}

// Granularity is the smallest size (and alignment) allocator a hands out:
// cuMemGetAllocationGranularity's minimum for VMM, 1 otherwise.
func (l *Lib) Granularity(a Allocator) (uint64, error) {
	if a != AllocVMM {
		return 1, nil
	}
	if err := l.Supported(AllocVMM); err != nil {
		return 0, err
	}
	var g C.size_t
	if err := check("cuMemGetAllocationGranularity", C.tcu_vmm_granularity(&g, C.int(l.dev))); err != nil {
		return 0, err
	}
	return uint64(g), nil
}

// AllocWith allocates bytes of device memory with allocator a and writes it
// once (cuMemsetD8, then cuCtxSynchronize, so that an allocation the driver
// backs lazily or asynchronously is charged and its failure seen here).
// Managed memory is written from the device too, so it is resident there.
func (l *Lib) AllocWith(a Allocator, bytes uint64) (Allocation, error) {
	al := Allocation{Allocator: a, Bytes: bytes}
	if err := l.Supported(a); err != nil {
		return al, err
	}
	var p C.tcu_deviceptr
	switch a {
	case AllocPlain:
		ptr, err := l.Alloc(bytes)
		al.Ptr = ptr
		return al, err
	case AllocAsync:
		if err := check(fmt.Sprintf("cuMemAllocAsync(%d)", bytes), C.tcu_mem_alloc_async(&p, C.size_t(bytes))); err != nil {
			return al, err
		}
	case AllocManaged:
		if err := check(fmt.Sprintf("cuMemAllocManaged(%d)", bytes), C.tcu_mem_alloc_managed(&p, C.size_t(bytes))); err != nil {
			return al, err
		}
	case AllocVMM:
		var h C.tcu_handle
		var stage C.int
		if err := check(fmt.Sprintf("cuMemCreate/cuMemMap(%d)", bytes), C.tcu_vmm_alloc(&h, &p, C.size_t(bytes), C.int(l.dev), &stage)); err != nil {
			_ = C.tcu_vmm_free(h, p, C.size_t(bytes), stage)
			return al, err
		}
		al.handle = uint64(h)
	default:
		return al, fmt.Errorf("unknown allocator %q", a)
	}
	al.Ptr = Ptr(p)
	err := check("cuMemsetD8", C.tcu_memset(p, C.size_t(bytes)))
	if err == nil {
		err = check("cuCtxSynchronize", C.tcu_ctx_synchronize())
	}
	if err != nil {
		_ = l.FreeAllocation(al)
		return Allocation{Allocator: a, Bytes: bytes}, err
	}
	return al, nil
}

// FreeAllocation frees what AllocWith returned, with the allocator's own
// call (cuMemFreeAsync then a synchronize; cuMemUnmap, cuMemAddressFree and
// cuMemRelease; cuMemFree).
func (l *Lib) FreeAllocation(al Allocation) error {
	p := C.tcu_deviceptr(al.Ptr)
	switch al.Allocator {
	case AllocAsync:
		if err := check("cuMemFreeAsync", C.tcu_mem_free_async(p)); err != nil {
			return err
		}
		return check("cuCtxSynchronize", C.tcu_ctx_synchronize())
	case AllocVMM:
		return check("cuMemUnmap/cuMemAddressFree/cuMemRelease", C.tcu_vmm_free(C.tcu_handle(al.handle), p, C.size_t(al.Bytes), 4))
	}
	return l.Free(al.Ptr)
}

// ReadU64 copies one 64-bit word from the device.
func (l *Lib) ReadU64(p Ptr) (uint64, error) {
	var v C.ulonglong
	err := check("cuMemcpyDtoH", C.tcu_read_u64(&v, C.tcu_deviceptr(p)))
	return uint64(v), err
}

// Synchronize is cuCtxSynchronize.
func (l *Lib) Synchronize() error { return check("cuCtxSynchronize", C.tcu_ctx_synchronize()) }

// Module is a loaded PTX module.
type Module struct{ m C.tcu_module }

// LoadPTX JIT-compiles PTX text; a failure carries the JIT's error log.
func (l *Lib) LoadPTX(ptx string) (*Module, error) {
	src := C.CString(ptx)
	defer C.free(unsafe.Pointer(src))
	const logSize = 8192
	log := (*C.char)(C.calloc(logSize, 1))
	defer C.free(unsafe.Pointer(log))
	var m C.tcu_module
	if err := check("cuModuleLoadDataEx", C.tcu_module_load(&m, src, log, logSize)); err != nil {
		err.(*Error).Log = C.GoString(log)
		return nil, err
	}
	return &Module{m: m}, nil
}

// Unload is cuModuleUnload.
func (m *Module) Unload() error { return check("cuModuleUnload", C.tcu_module_unload(m.m)) }

// Function is a kernel entry of a module.
type Function struct{ f C.tcu_function }

// Function is cuModuleGetFunction.
func (m *Module) Function(name string) (*Function, error) {
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	var f C.tcu_function
	if err := check("cuModuleGetFunction("+name+")", C.tcu_module_get_function(&f, m.m, n)); err != nil {
		return nil, err
	}
	return &Function{f: f}, nil
}

// LaunchSpin launches an entry with parameters (u64 counter pointer, u64
// cycles) as grid blocks of block threads on the default stream.
func (l *Lib) LaunchSpin(f *Function, grid, block uint32, counter Ptr, cycles uint64) error {
	return check("cuLaunchKernel", C.tcu_launch_spin(f.f, C.uint(grid), C.uint(block), C.tcu_deviceptr(counter), C.ulonglong(cycles)))
}
