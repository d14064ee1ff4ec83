// Package gputest holds the GPU fixtures that the tests of pkg/gpu's users
// share: mock nodes of pkg/gpu's profiles with their GPUs as discovered, and
// hand-built H100s for shapes no profile has. Only tests import it.
package gputest

import (
	"fmt"
	"testing"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// MockNode returns a fresh mock node of pkg/gpu's profile (hgx-h100, l4x4,
// …); t fails when there is no such profile.
func MockNode(t testing.TB, profile string) *gpu.MockNode {
	t.Helper()
	node, err := gpu.NewMockNode(profile)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// Node returns a fresh mock node of profile and its GPUs as gpu.Discover
// finds them; t fails when there is no such profile or discovery fails.
func Node(t testing.TB, profile string) (*gpu.MockNode, []gpu.GPU) {
	t.Helper()
	node := MockNode(t, profile)
	gpus, err := gpu.Discover(node)
	if err != nil {
		t.Fatalf("mock profile %s: Discover: %v", profile, err)
	}
	return node, gpus
}

// GPUs returns the GPUs of a fresh mock node of profile as gpu.Discover
// finds them.
func GPUs(t testing.TB, profile string) []gpu.GPU {
	t.Helper()
	_, gpus := Node(t, profile)
	return gpus
}

// H100s returns n H100 80GB GPUs, for node shapes no mock profile has:
// minor and index i, UUID GPU-00000000-0000-0000-0000-<i in 12 digits>, PCI
// bus 0x10+i, NVLink domain domain(i), no NUMA node.
func H100s(n int, domain func(minor int) string) []gpu.GPU {
	gpus := make([]gpu.GPU, n)
	for i := range gpus {
		gpus[i] = gpu.GPU{
			UUID:                  fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i),
			Minor:                 i,
			Index:                 i,
			ProductName:           "NVIDIA H100 80GB HBM3",
			Architecture:          "hopper",
			CUDAComputeCapability: "9.0",
			DriverVersion:         "580.95.05",
			CUDADriverVersion:     "13.0",
			MemoryBytes:           80 << 30,
			MultiprocessorCount:   132,
			PCIBusID:              fmt.Sprintf("0000:%02x:00.0", 0x10+i),
			NVLinkDomain:          domain(i),
		}
	}
	return gpus
}
