package accounting

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/model"
)

const gib = 1 << 30

// The rule, over both inputs: allocation results from the API and prepared
// devices from the checkpoint (new and old format).
func TestAllocated(t *testing.T) {
	gpu := func(minor int) GPU { return GPU{Pool: "node-a", Minor: minor} }
	// gpu-0 and gpu-1 of node-a are known; gpu-9 and other nodes are not.
	capacity := func(g GPU) (Capacity, bool) {
		if g.Pool != "node-a" || g.Minor > 1 {
			return Capacity{}, false
		}
		return Capacity{MemoryBytes: 80 * gib, Cores: 100}, true
	}
	result := func(device, memory, cores string) resourceapi.DeviceRequestAllocationResult {
		r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: model.DriverName, Pool: "node-a", Device: device}
		if memory != "" {
			r.ShareID = ptr.To(types.UID("share-" + memory))
			r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
				model.Memory: resource.MustParse(memory), model.Cores: resource.MustParse(cores),
			}
		}
		return r
	}
	admin := func(r resourceapi.DeviceRequestAllocationResult) resourceapi.DeviceRequestAllocationResult {
		r.AdminAccess = ptr.To(true)
		return r
	}
	share := func(device string, consumedMemory, consumedCores, memoryLimit, coresLimit int64) checkpoint.Device {
		return checkpoint.Device{Request: "gpu", Pool: "node-a", Device: device, ShareID: "s", Minor: 0,
			ConsumedMemory: consumedMemory, ConsumedCores: consumedCores, MemoryLimit: memoryLimit, CoresLimit: coresLimit}
	}

	for _, tc := range []struct {
		name       string
		results    []resourceapi.DeviceRequestAllocationResult
		checkpoint []checkpoint.Device
		want       map[GPU]Allocation
	}{
		{name: "nothing", want: map[GPU]Allocation{}},
		{
			name:    "whole GPU holds all of it",
			results: []resourceapi.DeviceRequestAllocationResult{result("gpu-1", "", "")},
			want:    map[GPU]Allocation{gpu(1): {Capacity: Capacity{80 * gib, 100}, Whole: true}},
		},
		{
			name:    "a share holds its consumedCapacity",
			results: []resourceapi.DeviceRequestAllocationResult{result("gpu-0-shared", "20Gi", "25")},
			want:    map[GPU]Allocation{gpu(0): {Capacity: Capacity{20 * gib, 25}, Shares: 1}},
		},
		{
			name: "shares of one GPU add up, two of one claim included",
			results: []resourceapi.DeviceRequestAllocationResult{
				result("gpu-0-shared", "20Gi", "25"), result("gpu-0-shared", "10Gi", "5"), result("gpu-0-shared", "1Gi", "0"),
			},
			want: map[GPU]Allocation{gpu(0): {Capacity: Capacity{31 * gib, 30}, Shares: 3}},
		},
		{
			name: "admin access holds nothing",
			results: []resourceapi.DeviceRequestAllocationResult{
				admin(result("gpu-1", "", "")), admin(result("gpu-0-shared", "20Gi", "25")), result("gpu-0-shared", "8Gi", "10"),
			},
			want: map[GPU]Allocation{gpu(0): {Capacity: Capacity{8 * gib, 10}, Shares: 1}},
		},
		{
			name: "other drivers, foreign names and unknown GPUs are left out",
			results: []resourceapi.DeviceRequestAllocationResult{
				{Driver: "example.com", Pool: "node-a", Device: "gpu-0"},
				{Driver: model.DriverName, Pool: "node-a", Device: "mig-0"},
				result("gpu-9", "", ""),
				{Driver: model.DriverName, Pool: "node-b", Device: "gpu-0"},
			},
			want: map[GPU]Allocation{},
		},
		{
			name:       "checkpoint: a share holds what it consumed, not its limits",
			checkpoint: []checkpoint.Device{share("gpu-0-shared", 20*gib, 25, 10*gib, 50)},
			want:       map[GPU]Allocation{gpu(0): {Capacity: Capacity{20 * gib, 25}, Shares: 1}},
		},
		{
			name:       "checkpoint: a best-effort share consumes no cores",
			checkpoint: []checkpoint.Device{share("gpu-0-shared", 20*gib, 0, 20*gib, 40)},
			want:       map[GPU]Allocation{gpu(0): {Capacity: Capacity{20 * gib, 0}, Shares: 1}},
		},
		{
			name:       "checkpoint without consumed capacity (old format): the memory limit stands in, cores are unknown",
			checkpoint: []checkpoint.Device{share("gpu-0-shared", 0, 0, 12*gib, 30)},
			want:       map[GPU]Allocation{gpu(0): {Capacity: Capacity{12 * gib, 0}, Shares: 1}},
		},
		{
			name:       "old checkpoint: a share without limits is admin access",
			checkpoint: []checkpoint.Device{share("gpu-0-shared", 0, 0, 0, 0), share("gpu-0-shared", 0, 0, 2*gib, 0)},
			want:       map[GPU]Allocation{gpu(0): {Capacity: Capacity{2 * gib, 0}, Shares: 1}},
		},
		{
			name: "checkpoint: whole GPU, admin access, and API results on the same GPU add up",
			checkpoint: []checkpoint.Device{
				{Request: "gpu", Pool: "node-a", Device: "gpu-1", Minor: 1},
				{Request: "watch", Pool: "node-a", Device: "gpu-0", Minor: 0, AdminAccess: true},
				{Request: "watch", Pool: "node-a", Device: "gpu-0-shared", ShareID: "a", Minor: 0, AdminAccess: true, ConsumedMemory: gib},
				share("gpu-0-shared", 4*gib, 10, 4*gib, 10),
				{Request: "gpu", Pool: "node-a", Device: "not-a-gpu"},
			},
			results: []resourceapi.DeviceRequestAllocationResult{result("gpu-0-shared", "2Gi", "5")},
			want: map[GPU]Allocation{
				gpu(0): {Capacity: Capacity{6 * gib, 15}, Shares: 2},
				gpu(1): {Capacity: Capacity{80 * gib, 100}, Whole: true},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var devices []Device
			for _, r := range tc.results {
				if d, ok := FromResult(r); ok {
					devices = append(devices, d)
				}
			}
			for _, c := range tc.checkpoint {
				if d, ok := FromCheckpoint(c); ok {
					devices = append(devices, d)
				}
			}
			if diff := cmp.Diff(tc.want, Allocated(devices, capacity)); diff != "" {
				t.Errorf("Allocated (-want +got):\n%s", diff)
			}
			// Holds is the per-device part of the same rule: summed over the
			// known devices it gives the totals.
			sum := map[GPU]Capacity{}
			for _, d := range devices {
				if c, ok := capacity(d.GPU); ok {
					h := d.Holds(c)
					if h != (Capacity{}) {
						s := sum[d.GPU]
						sum[d.GPU] = Capacity{s.MemoryBytes + h.MemoryBytes, s.Cores + h.Cores}
					}
				}
			}
			for g, a := range tc.want {
				if sum[g] != a.Capacity {
					t.Errorf("sum of Holds on %v = %+v, want %+v", g, sum[g], a.Capacity)
				}
			}
		})
	}
}
