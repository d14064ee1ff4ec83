package model

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
)

// quantities compare by value, not representation ("80Gi" == "85899345920").
var cmpQuantity = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

// discover returns the GPUs of a built-in mock node profile, through the same
// Discover the kubelet plugin runs.
func discover(t testing.TB, profile string) []gpu.GPU {
	t.Helper()
	return gputest.GPUs(t, profile)
}

// fixtureGPUs builds n GPUs with memGiB GiB each, NVLink domain by domain(minor),
// the first half (rounded up) on NUMA node 0 and the others on 1, for shapes
// no mock profile has (16 or 40 GPUs).
func fixtureGPUs(n int, memGiB uint64, domain func(minor int) string) []gpu.GPU {
	gpus := gputest.H100s(n, domain)
	for i := range gpus {
		numa := i * 2 / n
		gpus[i].MemoryBytes = memGiB << 30
		gpus[i].NUMANode = &numa
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
