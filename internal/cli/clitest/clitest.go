// Package clitest holds the fixtures the tests of the CLI packages share:
// the GPUs of a mock node and the ResourceSlices it publishes.
package clitest

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

// MockGPUs are the GPUs discovered on a mock node of pkg/gpu's profile
// (hgx-h100, hgx-h100-mig, …).
func MockGPUs(t testing.TB, profile string) []gpu.GPU {
	t.Helper()
	lib, err := gpu.NewMock(profile)
	if err != nil {
		t.Fatal(err)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer lib.Shutdown()
	gpus, err := gpu.Discover(lib)
	if err != nil {
		t.Fatal(err)
	}
	return gpus
}

// Slices are the ResourceSlices node publishes for gpus with opts.
func Slices(t testing.TB, node string, gpus []gpu.GPU, opts ...model.Option) []resourceapi.ResourceSlice {
	t.Helper()
	res, err := model.Resources(node, gpus, opts...)
	if err != nil {
		t.Fatal(err)
	}
	slices, err := model.ResourceSlices(node, res)
	if err != nil {
		t.Fatal(err)
	}
	return slices
}
