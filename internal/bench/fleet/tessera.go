package fleet

import (
	"fmt"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

// Profile is the mock node profile every simulated node is discovered from.
const Profile = "hgx-h100"

// hgxGPUs discovers the profile once; every node of the fleet reports the same GPUs.
var hgxGPUs = sync.OnceValues(func() ([]gpu.GPU, error) {
	lib, err := gpu.NewMock(Profile)
	if err != nil {
		return nil, err
	}
	gpus, err := gpu.Discover(lib)
	if err != nil {
		return nil, fmt.Errorf("mock profile %s: %w", Profile, err)
	}
	return gpus, nil
})

// tesseraSlices is exactly what the kubelet plugin publishes for a node of
// spec s: publishedSlices over its GPUs (for an hgx-h100 node the mock
// profile's, discovered through pkg/gpu).
func tesseraSlices(node string, s NodeSpec) ([]*resourceapi.ResourceSlice, error) {
	gpus, err := gpusOf(s)
	if err != nil {
		return nil, err
	}
	return publishedSlices(node, gpus)
}

// publishedSlices is model.Resources over gpus with opts, turned into
// ResourceSlices by model.ResourceSlices. The API server would name the
// slices from their generateName; the allocator walks slices by name, so the
// name is set the same way.
func publishedSlices(node string, gpus []gpu.GPU, opts ...model.Option) ([]*resourceapi.ResourceSlice, error) {
	res, err := model.Resources(node, gpus, opts...)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	slices, err := model.ResourceSlices(node, res)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	out := make([]*resourceapi.ResourceSlice, len(slices))
	for i := range slices {
		sl := &slices[i]
		if sl.Name == "" {
			sl.Name = sl.GenerateName + "sim"
		}
		out[i] = sl
	}
	return out, nil
}

// tesseraClasses are the DeviceClasses the chart installs.
func tesseraClasses() []*resourceapi.DeviceClass {
	classes := model.DeviceClasses()
	out := make([]*resourceapi.DeviceClass, len(classes))
	for i := range classes {
		out[i] = &classes[i]
	}
	return out
}

// own names the slices of the models this package defines (a) and (b) the way
// model.ResourceSlices names Tessera's, so all three go through the same path.
func own(node string, res resourceslice.DriverResources) ([]*resourceapi.ResourceSlice, error) {
	slices, err := model.ResourceSlices(node, res)
	if err != nil {
		return nil, err
	}
	out := make([]*resourceapi.ResourceSlice, len(slices))
	for i := range slices {
		slices[i].Name = slices[i].GenerateName + "sim"
		out[i] = &slices[i]
	}
	return out, nil
}
