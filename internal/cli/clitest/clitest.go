// Package clitest holds the fixture the tests of the CLI packages share: the
// ResourceSlices a node publishes for its GPUs.
package clitest

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

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
