package gpu

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestDiscoverPublishesMemoryLessReserved: a GPU publishes NVML's total less
// the driver's reserved memory (nvmlDeviceGetMemoryInfo_v2); where v2 is
// refused it publishes the v1 total and says why; a v2 failure that is not a
// refusal fails the GPU like any other NVML failure.
func TestDiscoverPublishesMemoryLessReserved(t *testing.T) {
	const total, reserved = 81559 << 20, 470 << 20
	v2 := func(ret nvml.Return, m nvml.Memory_v2) func() (nvml.Memory_v2, nvml.Return) {
		return func() (nvml.Memory_v2, nvml.Return) { return m, ret }
	}
	for _, tt := range []struct {
		name         string
		v2           func() (nvml.Memory_v2, nvml.Return)
		wantBytes    uint64
		wantReserved uint64
		wantUnknown  string // substring of MemoryReservedUnknown; "" for none
		wantErr      string
	}{
		{name: "v2", v2: v2(nvml.SUCCESS, nvml.Memory_v2{Total: total, Reserved: reserved}), wantBytes: total - reserved, wantReserved: reserved},
		{name: "v2 not supported", v2: v2(nvml.ERROR_NOT_SUPPORTED, nvml.Memory_v2{}), wantBytes: total, wantUnknown: "nvmlDeviceGetMemoryInfo_v2: ERROR_NOT_SUPPORTED"},
		{name: "v2 struct version refused", v2: v2(nvml.ERROR_ARGUMENT_VERSION_MISMATCH, nvml.Memory_v2{}), wantBytes: total, wantUnknown: "nvmlDeviceGetMemoryInfo_v2"},
		{name: "v2 reserves everything", v2: v2(nvml.SUCCESS, nvml.Memory_v2{Total: total, Reserved: total}), wantBytes: total, wantUnknown: "reserved of a total of"},
		{name: "v2 total not available", v2: v2(nvml.SUCCESS, nvml.Memory_v2{Total: ^uint64(0), Reserved: reserved}), wantBytes: total, wantUnknown: "reserved of a total of"},
		{name: "v2 fails", v2: v2(nvml.ERROR_GPU_IS_LOST, nvml.Memory_v2{}), wantErr: "nvmlDeviceGetMemoryInfo_v2: "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			node := mustMockNode(t, "hgx-h100")
			node.Devices[0].GetMemoryInfo_v2Func = tt.v2
			d, err := DiscoverNode(node)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantErr != "" {
				if len(d.Failed) != 1 || !strings.Contains(d.Failed[0].Error(), tt.wantErr) || !errors.Is(d.Failed[0], nvml.ERROR_GPU_IS_LOST) {
					t.Fatalf("failed %v, want GPU 0 failed with %q", d.Failed, tt.wantErr)
				}
				return
			}
			if len(d.Failed) != 0 {
				t.Fatalf("failed: %v", d.Failed)
			}
			g := d.GPUs[0]
			if g.MemoryBytes != tt.wantBytes || g.MemoryTotalBytes != total || g.MemoryReservedBytes != tt.wantReserved {
				t.Errorf("memory %d, total %d, reserved %d; want %d, %d, %d", g.MemoryBytes, g.MemoryTotalBytes, g.MemoryReservedBytes, tt.wantBytes, total, tt.wantReserved)
			}
			if (tt.wantUnknown == "") != (g.MemoryReservedUnknown == "") || !strings.Contains(g.MemoryReservedUnknown, tt.wantUnknown) {
				t.Errorf("MemoryReservedUnknown %q, want %q", g.MemoryReservedUnknown, tt.wantUnknown)
			}
			// The other GPUs answer v2 as the mock profile does.
			if o := d.GPUs[1]; o.MemoryBytes != total-reserved || o.MemoryReservedUnknown != "" {
				t.Errorf("GPU 1: memory %d (%q), want %d", o.MemoryBytes, o.MemoryReservedUnknown, total-reserved)
			}
		})
	}
}

// TestDiscoverFailsGPUWithoutMemorySize: a GPU whose v1 total is no size
// (0, NVML's "not available", beyond what a quantity holds) is a failed GPU,
// not one that stops the node's other GPUs from being published.
func TestDiscoverFailsGPUWithoutMemorySize(t *testing.T) {
	for _, total := range []uint64{0, ^uint64(0), 1 << 63} {
		t.Run(strconv.FormatUint(total, 10), func(t *testing.T) {
			node := mustMockNode(t, "hgx-h100")
			node.Devices[0].GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{}, nvml.ERROR_NOT_SUPPORTED }
			node.Devices[0].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: total}, nvml.SUCCESS }
			d, err := DiscoverNode(node)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Failed) != 1 || !strings.Contains(d.Failed[0].Error(), "not a memory size") {
				t.Fatalf("failed %v, want GPU 0 failed: not a memory size", d.Failed)
			}
			if len(d.GPUs) != 7 {
				t.Errorf("%d GPUs described, want the other 7", len(d.GPUs))
			}
		})
	}
}
