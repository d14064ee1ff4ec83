package gpu

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Test knobs of MockNode for the states of a GPU that discovery reports as
// Conditions: compute mode and NVLink fabric registration (the MIG mode
// knobs are in mock_mig_knobs.go). Mock GPUs start in Default compute mode
// and with their profile's fabric registration. Nothing on a real node uses
// them.

// mockConditions are the per-GPU overrides of the knobs.
type mockConditions struct {
	computeMode map[int]nvml.ComputeMode
	fabric      map[int]nvml.GpuFabricInfo
	// noFabric are the GPUs whose product has no fabric info.
	noFabric map[int]bool
}

// SetComputeMode sets GPU i's compute mode, as nvidia-smi -c would (an
// admin's doing: Tessera never sets it).
func (n *MockNode) SetComputeMode(i int, mode ComputeMode) error {
	if err := n.checkIndex(i); err != nil {
		return err
	}
	// The inverse of computeModeName, over the modes NVML names.
	i0 := slices.IndexFunc(nvmlComputeModes, func(m nvml.ComputeMode) bool { return computeModeName(m) == mode })
	if i0 < 0 {
		return fmt.Errorf("mock node %s: compute mode %q: want Default, ExclusiveProcess, Prohibited or ExclusiveThread", n.Profile, mode)
	}
	m := nvmlComputeModes[i0]
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	n.state.conditions.computeMode[i] = m
	return nil
}

// SetFabric makes GPU i report this NVLink fabric registration
// (nvmlDeviceGetGpuFabricInfo): NotStarted (Fabric Manager down),
// InProgress, Completed (in a cluster of its own, clique 0), Failed
// (completed with ERROR_UNKNOWN) or None (GPU_FABRIC_STATE_NOT_SUPPORTED).
// It fails on a profile whose GPUs do not support fabric info.
func (n *MockNode) SetFabric(i int, state FabricState) error {
	if err := n.checkIndex(i); err != nil {
		return err
	}
	if n.state.conditions.noFabric[i] {
		return fmt.Errorf("mock node %s: its GPUs have no NVLink fabric info (NVML answers NOT_SUPPORTED)", n.Profile)
	}
	info := nvml.GpuFabricInfo{ClusterUuid: [16]uint8{0x7e, 0x55, 15: uint8(i + 1)}}
	switch state {
	case FabricNone:
		info = nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_NOT_SUPPORTED}
	case FabricNotStarted:
		info.State = nvml.GPU_FABRIC_STATE_NOT_STARTED
	case FabricInProgress:
		info.State = nvml.GPU_FABRIC_STATE_IN_PROGRESS
	case FabricCompleted:
		info.State = nvml.GPU_FABRIC_STATE_COMPLETED
	case FabricFailed:
		info.State, info.Status = nvml.GPU_FABRIC_STATE_COMPLETED, uint32(nvml.ERROR_UNKNOWN)
	default:
		return fmt.Errorf("mock node %s: fabric state %q: want None, NotStarted, InProgress, Completed or Failed", n.Profile, state)
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	n.state.conditions.fabric[i] = info
	return nil
}

func (n *MockNode) checkIndex(i int) error {
	if i < 0 || i >= len(n.Devices) {
		return fmt.Errorf("mock node %s: no GPU with index %d (it has %d)", n.Profile, i, len(n.Devices))
	}
	return nil
}

// installConditions wraps the compute mode and fabric calls of every
// device with the knobs. Call it after installEvents (which makes the state).
func (n *MockNode) installConditions() {
	n.state.conditions = mockConditions{computeMode: map[int]nvml.ComputeMode{}, fabric: map[int]nvml.GpuFabricInfo{}, noFabric: map[int]bool{}}
	for i, d := range n.Devices {
		d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
			n.state.mu.Lock()
			defer n.state.mu.Unlock()
			return n.state.conditions.computeMode[i], nvml.SUCCESS // zero: Default
		}
		fabric := d.GetGpuFabricInfoFunc
		if _, ret := fabric(); ret == nvml.ERROR_NOT_SUPPORTED {
			n.state.conditions.noFabric[i] = true
		}
		d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
			n.state.mu.Lock()
			info, set := n.state.conditions.fabric[i]
			n.state.mu.Unlock()
			if set {
				return info, nvml.SUCCESS
			}
			return fabric()
		}
	}
}

// nvmlComputeModes are the compute modes NVML names.
var nvmlComputeModes = []nvml.ComputeMode{nvml.COMPUTEMODE_DEFAULT, nvml.COMPUTEMODE_EXCLUSIVE_THREAD, nvml.COMPUTEMODE_PROHIBITED, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS}
