package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ReadMIG reads the MIG state of the GPU with this UUID now, as discovery
// describes it: UUID, Minor, Index, the memory facts profile names are
// derived from, MIGEnabled and, in MIG mode, MIG (profiles, placements, GPU
// and compute instances with their processes) and MIGError. It is for
// callers that act on the instances as they are, not as the last discovery
// saw them: the kubelet plugin creating, adopting and destroying instances.
// minors are the capability minors of the node (ReadMIGMinors, or a mock
// node's); without them every AccessMinor is -1. A GPU NVML does not know,
// or whose minor or MIG mode cannot be read, is an error; failed MIG
// queries are kept in MIGError as discovery keeps them.
func ReadMIG(lib nvml.Interface, uuid string, minors MIGMinors) (GPU, error) {
	g := GPU{UUID: uuid, Minor: -1}
	dev, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("GPU %s: %w", uuid, nvmlError("nvmlDeviceGetHandleByUUID", ret))
	}
	minor, ret := dev.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("GPU %s: %w", uuid, nvmlError("nvmlDeviceGetMinorNumber", ret))
	}
	g.Minor = minor
	if g.Index, ret = dev.GetIndex(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("GPU %s: %w", uuid, nvmlError("nvmlDeviceGetIndex", ret))
	}
	sym := lookupSymbols(lib)
	if err := readMemory(dev, sym, &g); err != nil {
		return g, fmt.Errorf("GPU %s: %w", uuid, err)
	}
	current, pending, ret := dev.GetMigMode()
	switch {
	case ret == nvml.SUCCESS:
		g.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
		g.MIG = &MIG{PendingEnabled: pending == nvml.DEVICE_MIG_ENABLE}
	case absent(ret):
		return g, nil
	default:
		return g, fmt.Errorf("GPU %s: %w", uuid, nvmlError("nvmlDeviceGetMigMode", ret))
	}
	if g.MIGEnabled {
		loader := &migMinorsLoader{load: func() (MIGMinors, error) { return minors, nil }}
		describeMIG(dev, &g, sym, loader)
	}
	return g, nil
}
