package gpu

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// partition turns a UUID → domain map into the sorted list of its groups.
func partition(domains map[string]string) [][]string {
	groups := map[string][]string{}
	for uuid, id := range domains {
		groups[id] = append(groups[id], uuid)
	}
	var out [][]string
	for _, g := range groups {
		slices.Sort(g)
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b []string) int { return strings.Compare(a[0], b[0]) })
	return out
}

func bus(n int) string {
	return "0000:" + []string{"00", "01", "02", "03", "04", "05", "06", "07", "08", "09"}[n] + ":00.0"
}

func TestNVLinkDomains(t *testing.T) {
	const switchBus = "0000:c4:00.0"
	tests := []struct {
		name string
		gpus []NVLinkPeers
		want [][]string
	}{
		{name: "no GPUs", gpus: nil, want: nil},
		{
			name: "PCIe only: one domain per GPU",
			gpus: []NVLinkPeers{
				{UUID: "a", PCIBusID: bus(0)},
				{UUID: "b", PCIBusID: bus(1)},
				{UUID: "c", PCIBusID: bus(2)},
			},
			want: [][]string{{"a"}, {"b"}, {"c"}},
		},
		{
			name: "bridged pairs, links seen from both ends",
			gpus: []NVLinkPeers{
				{UUID: "a", PCIBusID: bus(0), Remotes: []string{bus(1), bus(1)}},
				{UUID: "b", PCIBusID: bus(1), Remotes: []string{bus(0), bus(0)}},
				{UUID: "c", PCIBusID: bus(2), Remotes: []string{bus(3)}},
				{UUID: "d", PCIBusID: bus(3), Remotes: []string{bus(2)}},
			},
			want: [][]string{{"a", "b"}, {"c", "d"}},
		},
		{
			name: "a link reported by one end only still connects",
			gpus: []NVLinkPeers{
				{UUID: "a", PCIBusID: bus(0), Remotes: []string{bus(1)}},
				{UUID: "b", PCIBusID: bus(1)},
			},
			want: [][]string{{"a", "b"}},
		},
		{
			name: "chain is transitive",
			gpus: []NVLinkPeers{
				{UUID: "a", PCIBusID: bus(0), Remotes: []string{bus(1)}},
				{UUID: "b", PCIBusID: bus(1), Remotes: []string{bus(2)}},
				{UUID: "c", PCIBusID: bus(2)},
				{UUID: "d", PCIBusID: bus(3)},
			},
			want: [][]string{{"a", "b", "c"}, {"d"}},
		},
		{
			name: "self link is ignored",
			gpus: []NVLinkPeers{
				{UUID: "a", PCIBusID: bus(0), Remotes: []string{bus(0)}},
				{UUID: "b", PCIBusID: bus(1)},
			},
			want: [][]string{{"a"}, {"b"}},
		},
		{
			name: "NVSwitch reported by NVML joins all switch-attached GPUs",
			gpus: []NVLinkPeers{
				{UUID: "a", PCIBusID: bus(0), Switch: true},
				{UUID: "b", PCIBusID: bus(1), Switch: true},
				{UUID: "c", PCIBusID: bus(2), Switch: true},
				{UUID: "d", PCIBusID: bus(3)},
			},
			want: [][]string{{"a", "b", "c"}, {"d"}},
		},
		{
			name: "remote that is no GPU is an NVSwitch",
			gpus: []NVLinkPeers{
				{UUID: "a", PCIBusID: bus(0), Remotes: []string{switchBus}},
				{UUID: "b", PCIBusID: bus(1), Remotes: []string{"0000:c5:00.0"}},
				{UUID: "c", PCIBusID: bus(2)},
			},
			want: [][]string{{"a", "b"}, {"c"}},
		},
		{
			name: "switch group and a bridged pair stay apart",
			gpus: []NVLinkPeers{
				{UUID: "a", PCIBusID: bus(0), Switch: true},
				{UUID: "b", PCIBusID: bus(1), Switch: true},
				{UUID: "c", PCIBusID: bus(2), Remotes: []string{bus(3)}},
				{UUID: "d", PCIBusID: bus(3), Remotes: []string{bus(2)}},
			},
			want: [][]string{{"a", "b"}, {"c", "d"}},
		},
		{
			name: "fabric cliques split GPUs that share switches",
			gpus: []NVLinkPeers{
				{UUID: "a", PCIBusID: bus(0), Switch: true, Fabric: "c1/1"},
				{UUID: "b", PCIBusID: bus(1), Switch: true, Fabric: "c1/1"},
				{UUID: "c", PCIBusID: bus(2), Switch: true, Fabric: "c1/2"},
				{UUID: "d", PCIBusID: bus(3), Switch: true, Fabric: "c1/2"},
				{UUID: "e", PCIBusID: bus(4), Switch: true}, // not registered
				{UUID: "f", PCIBusID: bus(5), Switch: true},
			},
			want: [][]string{{"a", "b"}, {"c", "d"}, {"e", "f"}},
		},
		{
			name: "same clique id in another cluster is another domain",
			gpus: []NVLinkPeers{
				{UUID: "a", PCIBusID: bus(0), Fabric: "c1/1"},
				{UUID: "b", PCIBusID: bus(1), Fabric: "c2/1"},
			},
			want: [][]string{{"a"}, {"b"}},
		},
	}
	idFormat := regexp.MustCompile(`^nvl-[0-9a-f]{8}$`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := NVLinkDomains(tt.gpus)
			if len(got) != len(tt.gpus) {
				t.Fatalf("got %d GPUs with a domain, want %d: %v", len(got), len(tt.gpus), got)
			}
			if p := partition(got); !slices.EqualFunc(p, tt.want, slices.Equal) {
				t.Errorf("domains %v, want %v", p, tt.want)
			}
			for uuid, id := range got {
				if !idFormat.MatchString(id) {
					t.Errorf("GPU %s: domain id %q does not look like nvl-xxxxxxxx", uuid, id)
				}
			}
			reversed := slices.Clone(tt.gpus)
			slices.Reverse(reversed)
			if again := NVLinkDomains(reversed); !mapsEqual(again, got) {
				t.Errorf("input order changed the result:\n%v\n%v", got, again)
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// The ids are published as a device attribute; changing how they are derived
// changes every ResourceSlice, so pin the derivation.
func TestNVLinkDomainIDsArePinned(t *testing.T) {
	got := NVLinkDomains([]NVLinkPeers{
		{UUID: "GPU-b", PCIBusID: bus(1), Remotes: []string{bus(0)}},
		{UUID: "GPU-a", PCIBusID: bus(0)},
		{UUID: "GPU-c", PCIBusID: bus(2), Fabric: "cluster/7"},
	})
	// sha256("gpus:GPU-a,GPU-b") and sha256("fabric:cluster/7"), first 4 bytes.
	want := map[string]string{"GPU-a": "nvl-34f9c121", "GPU-b": "nvl-34f9c121", "GPU-c": "nvl-e860bb9c"}
	if !mapsEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestFabricKey(t *testing.T) {
	cluster := [16]uint8{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8}
	tests := []struct {
		name string
		info nvml.GpuFabricInfo
		want string
	}{
		{"completed", nvml.GpuFabricInfo{ClusterUuid: cluster, CliqueId: 3, State: nvml.GPU_FABRIC_STATE_COMPLETED}, "12345678-9abc-def0-0102-030405060708/3"},
		{"in progress", nvml.GpuFabricInfo{ClusterUuid: cluster, State: nvml.GPU_FABRIC_STATE_IN_PROGRESS}, ""},
		{"completed with failure", nvml.GpuFabricInfo{ClusterUuid: cluster, State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.ERROR_UNKNOWN)}, ""},
		{"zero cluster", nvml.GpuFabricInfo{CliqueId: 1, State: nvml.GPU_FABRIC_STATE_COMPLETED}, ""},
		{"not supported", nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_NOT_SUPPORTED}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fabricKey(tt.info); got != tt.want {
				t.Errorf("fabricKey = %q, want %q", got, tt.want)
			}
		})
	}
}
