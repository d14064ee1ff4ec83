//go:build cgo && linux

package cuda

import (
	"errors"
	"strings"
	"testing"
)

// fakeDriver is a libcuda.so.1 stand-in with every symbol Open needs,
// cuMemAllocAsync and cuMemAllocManaged but none of the virtual memory
// management calls; its device 0 reports memory pools (attribute 115) as
// unsupported and everything else as supported, and it sees two devices.
const fakeDriver = `#include <stddef.h>
#include <string.h>
typedef unsigned long long u64;
int cuInit(unsigned int f) { return 0; }
int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
int cuDeviceGet(int *d, int o) { *d = o; return o < 2 ? 0 : 101; }
int cuDeviceGetName(char *b, int n, int d) { strncpy(b, "fake", n); return 0; }
int cuDeviceGetAttribute(int *v, int a, int d) { *v = a == 115 ? 0 : 1; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { return 0; }
int cuCtxSetCurrent(void *c) { return 0; }
int cuCtxSynchronize(void) { return 0; }
int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = 1 << 30; *t = 2u << 30; return 0; }
int cuMemAlloc_v2(u64 *p, size_t n) { return 2; }
int cuMemFree_v2(u64 p) { return 0; }
int cuMemsetD8_v2(u64 p, unsigned char c, size_t n) { return 0; }
int cuMemcpyDtoH_v2(void *h, u64 p, size_t n) { return 0; }
int cuModuleLoadDataEx(void **m, const void *i, unsigned n, int *o, void **v) { return 0; }
int cuModuleGetFunction(void **f, void *m, const char *n) { return 0; }
int cuModuleUnload(void *m) { return 0; }
int cuLaunchKernel(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned s, void *st, void **p, void **x) { return 0; }
int cuGetErrorName(int r, const char **s) { *s = "CUDA_ERROR_FAKE"; return 0; }
int cuMemAllocAsync(u64 *p, size_t n, void *s) { return 2; }
int cuMemFreeAsync(u64 p, void *s) { return 0; }
int cuMemAllocManaged(u64 *p, size_t n, unsigned f) { return 2; }
int cuDeviceGetCount(int *n) { *n = 2; return 0; }
int cuDeviceGetUuid_v2(unsigned char *u, int d) { for (int i = 0; i < 16; i++) u[i] = d * 16 + i; return 0; }
`

// TestSupportedReadsDeviceAttributes: an allocator whose entry points the
// driver exports is still unsupported when the device says so, and one
// without entry points is unsupported too, both wrapping ErrNotSupported;
// Init lists the devices the process sees by UUID. (It loads the fake for
// the rest of this test binary: it runs after open_test.go's test, which
// needs no library loaded.)
func TestSupportedReadsDeviceAttributes(t *testing.T) {
	lib := buildLib(t, "the fake driver", "libcuda.so.1", fakeDriver)
	l, err := open(lib)
	if err != nil {
		t.Fatal(err)
	}
	info, err := l.Init()
	if err != nil {
		t.Fatal(err)
	}
	if info.DeviceCount != 2 || len(info.VisibleUUIDs) != 2 || info.VisibleUUIDs[0] != "00010203-0405-0607-0809-0a0b0c0d0e0f" || info.VisibleUUIDs[1] != "10111213-1415-1617-1819-1a1b1c1d1e1f" {
		t.Errorf("devices %d %q", info.DeviceCount, info.VisibleUUIDs)
	}
	if err := l.Supported(AllocAsync); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "MEMORY_POOLS_SUPPORTED") {
		t.Errorf("cuMemAllocAsync on a device without memory pools: %v", err)
	}
	if l.Has(AllocAsync) {
		t.Error("Has(cuMemAllocAsync) on a device without memory pools")
	}
	if err := l.Supported(AllocVMM); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "does not export") {
		t.Errorf("VMM without its entry points: %v", err)
	}
	if err := l.Supported(AllocManaged); err != nil {
		t.Errorf("managed memory: %v", err)
	}
	if err := l.Supported(AllocPlain); err != nil {
		t.Errorf("cuMemAlloc: %v", err)
	}
	if _, err := l.AllocWith(AllocAsync, 1<<20); !errors.Is(err, ErrNotSupported) {
		t.Errorf("AllocWith(cuMemAllocAsync): %v, want ErrNotSupported", err)
	}
}

// TestBareUUID: NVML's prefixed UUIDs compare with FormatUUID's.
func TestBareUUID(t *testing.T) {
	if got := BareUUID("MIG-ABCDEF01-0203-0405-0607-08090a0b0c0d"); got != "abcdef01-0203-0405-0607-08090a0b0c0d" {
		t.Errorf("BareUUID = %q", got)
	}
	if got := BareUUID("GPU-x"); got != "x" {
		t.Errorf("BareUUID = %q", got)
	}
}
