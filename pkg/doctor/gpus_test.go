package doctor

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
)

// mockNode opens a mock node of profile after set has turned its knobs.
func mockNode(t *testing.T, profile string, set func(*gpu.MockNode) error) func() (nvml.Interface, error) {
	return func() (nvml.Interface, error) {
		node := gputest.MockNode(t, profile)
		if err := set(node); err != nil {
			t.Fatal(err)
		}
		if err := gpu.Open(node); err != nil {
			return nil, err
		}
		return node, nil
	}
}

// The doctor names the GPUs the plugin publishes as MIG devices, and those it
// publishes tainted (a pending MIG mode change, compute mode, NVLink
// fabric), with the fix.
func TestGPUConditions(t *testing.T) {
	n := newNode(t, "hgx-h100")
	r := Run(context.Background(), n.config)
	want(t, r, "mig", OK, "no GPU is in MIG mode")
	want(t, r, "compute-mode", OK, "(Default)")
	want(t, r, "nvlink-fabric", OK)

	n.config.OpenNVML = mockNode(t, "hgx-h100", func(node *gpu.MockNode) error {
		if err := node.SetMIG(6, true); err != nil {
			return err
		}
		if err := node.SetMIGPending(4, true); err != nil {
			return err
		}
		if err := node.SetComputeMode(2, gpu.ComputeModeExclusiveProcess); err != nil {
			return err
		}
		return node.SetFabric(5, gpu.FabricInProgress)
	})
	uuids := mockUUIDs(t)
	r = Run(context.Background(), n.config)
	want(t, r, "mig", Warn, "1 GPUs have a MIG mode change waiting for a GPU reset and are published tainted MIGModePending in their current mode: GPU 4 ("+uuids[4]+")",
		"MIG mode is pending enable", "nvidia-smi -r -i 4", "nvidia-smi -i 4 -mig 0")
	want(t, r, "compute-mode", Warn, "GPU 2 ("+uuids[2]+")", "compute mode is ExclusiveProcess, Tessera expects Default", "nvidia-smi -i 2 -c DEFAULT")
	want(t, r, "nvlink-fabric", Warn, "GPU 5 ("+uuids[5]+")", "InProgress", "nvidia-fabricmanager")

	// The plugin expects ExclusiveProcess: the Default GPUs are the odd ones,
	// the MIG GPU 6 among them (it is published, as MIG devices).
	n.config.ComputeModes = gpu.ComputeModePolicy{Default: gpu.ComputeModeExclusiveProcess}
	r = Run(context.Background(), n.config)
	want(t, r, "compute-mode", Warn, "7 of 8 GPUs", "GPU 6 ("+uuids[6]+")", "Tessera expects ExclusiveProcess")

	// A GPU in MIG mode alone is published (as MIG devices): no warning.
	n.config.OpenNVML = mockNode(t, "hgx-h100", func(node *gpu.MockNode) error { return node.SetMIG(6, true) })
	r = Run(context.Background(), n.config)
	want(t, r, "mig", OK, "1 of 8 GPUs are in MIG mode and published as MIG devices only: GPU 6 ("+uuids[6]+")")

	n.config.OpenNVML = mockNode(t, "hgx-h100", func(node *gpu.MockNode) error {
		return node.FailDiscovery(3, "nvmlDeviceGetNvLinkState", nvml.ERROR_UNKNOWN)
	})
	r = Run(context.Background(), n.config)
	want(t, r, "nvlink-fabric", Warn, "NVLink domain of its own: GPU 3 ("+uuids[3]+")", "nvmlDeviceGetNvLinkState")
}
