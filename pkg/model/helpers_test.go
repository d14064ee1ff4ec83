package model

import (
	"fmt"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// quantities compare by value, not representation ("80Gi" == "85899345920").
var cmpQuantity = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

// discover returns the GPUs of a built-in mock node profile, through the same
// Discover the kubelet plugin runs.
func discover(t testing.TB, profile string) []gpu.GPU {
	t.Helper()
	lib, err := gpu.NewMock(profile)
	if err != nil {
		t.Fatalf("mock profile %s: %v", profile, err)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("mock profile %s: Init: %v", profile, ret)
	}
	defer lib.Shutdown()
	gpus, err := gpu.Discover(lib)
	if err != nil {
		t.Fatalf("mock profile %s: Discover: %v", profile, err)
	}
	return gpus
}

// fixtureGPUs builds n GPUs with memGiB GiB each, NVLink domain by domain(minor),
// for shapes no mock profile has (16 or 40 GPUs).
func fixtureGPUs(n int, memGiB uint64, domain func(minor int) string) []gpu.GPU {
	gpus := make([]gpu.GPU, n)
	for i := range gpus {
		numa := i * 2 / n
		gpus[i] = gpu.GPU{
			UUID:                  fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i),
			Minor:                 i,
			Index:                 i,
			ProductName:           "NVIDIA H100 80GB HBM3",
			Architecture:          "hopper",
			CUDAComputeCapability: "9.0",
			DriverVersion:         "580.95.05",
			CUDADriverVersion:     "13.0",
			MemoryBytes:           memGiB << 30,
			MultiprocessorCount:   132,
			PCIBusID:              fmt.Sprintf("0000:%02x:00.0", 0x10+i),
			NUMANode:              &numa,
			NVLinkDomain:          domain(i),
		}
	}
	return gpus
}

func oneDomain(int) string { return "nvl-0" }

// validResources publishes gpus on node-1 and fails the test unless the
// result is valid.
func validResources(t testing.TB, gpus []gpu.GPU, opts ...Option) resourceslice.DriverResources {
	t.Helper()
	res, err := Resources("node-1", gpus, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(res); err != nil {
		t.Fatal(err)
	}
	return res
}
