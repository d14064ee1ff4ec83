package gpu

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// guideProfile is one row of a GPU-instance profile table of NVIDIA's MIG
// user guide ("Supported MIG Profiles", the `nvidia-smi mig -lgip` and
// `-lgipp` examples), typed here from the guide, not from the mock's
// tables: the name, profile ID, instance count, placements, and the
// decoders, JPEG decoders, OFAs and copy engines.
type guideProfile struct {
	name                string
	id, count           int
	size                int
	starts              []int
	dec, jpeg, ofa, ces int
}

// guideTable is the guide's table of one product family with its names.
func guideTable(names [7]string, engines [7][4]int) []guideProfile {
	geometry := []guideProfile{
		{id: 19, count: 7, size: 1, starts: []int{0, 1, 2, 3, 4, 5, 6}},
		{id: 20, count: 1, size: 1, starts: []int{0, 1, 2, 3, 4, 5, 6}},
		{id: 15, count: 4, size: 2, starts: []int{0, 2, 4, 6}},
		{id: 14, count: 3, size: 2, starts: []int{0, 2, 4}},
		{id: 9, count: 2, size: 4, starts: []int{0, 4}},
		{id: 5, count: 1, size: 4, starts: []int{0}},
		{id: 0, count: 1, size: 8, starts: []int{0}},
	}
	for i := range geometry {
		geometry[i].name = names[i]
		geometry[i].dec, geometry[i].jpeg, geometry[i].ofa, geometry[i].ces = engines[i][0], engines[i][1], engines[i][2], engines[i][3]
	}
	return geometry
}

var (
	// A100: "1g.5gb 0 NVDECs /0 JPEG /0 OFA ... 7g.40gb 5 NVDECs /1 JPEG /1 OFA", copy engines 1 1 1 2 3 4 7.
	a100Engines = [7][4]int{{0, 0, 0, 1}, {1, 1, 1, 1}, {1, 0, 0, 1}, {1, 0, 0, 2}, {2, 0, 0, 3}, {2, 0, 0, 4}, {5, 1, 1, 7}}
	// H100 and H200: "1 NVDECs /1 JPEG /0 OFA ... 7 NVDECs /7 JPEG /1 OFA", copy engines 1 1 1 2 3 4 8.
	hopperEngines = [7][4]int{{1, 1, 0, 1}, {1, 1, 1, 1}, {1, 1, 0, 1}, {2, 2, 0, 2}, {3, 3, 0, 3}, {4, 4, 0, 4}, {7, 7, 1, 8}}

	guideA100x40 = guideTable([7]string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}, a100Engines)
	guideA100x80 = guideTable([7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}, a100Engines)
	guideH100    = guideTable([7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}, hopperEngines)
	guideH200    = guideTable([7]string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}, hopperEngines)
)

// h200Node is an 8-GPU H200 board: the hgx-h100 node with H200s.
func h200Node(t *testing.T) *MockNode {
	t.Helper()
	p := mockProfiles["hgx-h100"]
	p.product, p.memoryMiB = "NVIDIA H200", mockH200MemoryMiB
	node := newMockNode("h200-test", p)
	must(t, node.initMIG(p, MockOptions{}))
	return node
}

// Discovery of a GPU in MIG mode of each product describes the profiles of
// NVIDIA's table: names (derived from NVML's memory figures as nvidia-smi
// names them), IDs, counts, placements and engines, and the GPU's 8 memory
// and 7 compute slices.
func TestDiscoverMIGProfileTables(t *testing.T) {
	for _, tc := range []struct {
		product string
		node    func(t *testing.T) *MockNode
		want    []guideProfile
	}{
		{"A100-SXM4-40GB", func(t *testing.T) *MockNode { return mustMockNode(t, "dgx-a100") }, guideA100x40},
		{"A100 80GB PCIe", func(t *testing.T) *MockNode { return mustMockNode(t, "a100-pairs") }, guideA100x80},
		{"H100 80GB HBM3", func(t *testing.T) *MockNode { return mustMockNode(t, "hgx-h100") }, guideH100},
		{"H200", h200Node, guideH200},
	} {
		t.Run(tc.product, func(t *testing.T) {
			node := tc.node(t)
			must(t, node.SetMIG(1, true))
			gpus := mustDiscover(t, node)
			if gpus[0].MIG == nil || gpus[0].MIGEnabled || len(gpus[0].MIG.Profiles) != 0 {
				t.Errorf("GPU 0 (not in MIG mode): MIG %+v; want supported, no profiles read", gpus[0].MIG)
			}
			g := gpus[1]
			if !g.MIGEnabled || g.MIG == nil || g.MIGError != "" {
				t.Fatalf("GPU 1: MIGEnabled %v, MIG %+v, MIGError %q", g.MIGEnabled, g.MIG, g.MIGError)
			}
			m := g.MIG
			if m.MemorySlices != 8 || m.ComputeSlices != 7 || !m.PendingEnabled || len(m.Instances) != 0 {
				t.Errorf("slices %d/%d, pending %v, instances %v; want 8 memory, 7 compute, pending on, none", m.MemorySlices, m.ComputeSlices, m.PendingEnabled, m.Instances)
			}
			if len(m.Profiles) != len(tc.want) {
				t.Fatalf("%d profiles, want %d: %+v", len(m.Profiles), len(tc.want), m.Profiles)
			}
			if !slices.IsSortedFunc(m.Profiles, func(a, b MIGProfile) int { return a.ID - b.ID }) {
				t.Errorf("profiles not in ID order")
			}
			for _, want := range tc.want {
				p, ok := m.Profile(want.id)
				if !ok {
					t.Errorf("no profile %d (%s)", want.id, want.name)
					continue
				}
				var starts []int
				for _, pl := range p.Placements {
					starts = append(starts, pl.Start)
					if pl.Size != want.size {
						t.Errorf("%s: placement %+v, want size %d", p.Name, pl, want.size)
					}
				}
				got := fmt.Sprintf("%s id %d count %d size %d starts %v engines %d/%d/%d/%d", p.Name, p.ID, p.MaxInstances, p.MemorySlices, starts, p.Decoders, p.JPEGs, p.OFAs, p.CopyEngines)
				wantS := fmt.Sprintf("%s id %d count %d size %d starts %v engines %d/%d/%d/%d", want.name, want.id, want.count, want.size, want.starts, want.dec, want.jpeg, want.ofa, want.ces)
				if got != wantS {
					t.Errorf("profile\n got %s\nwant %s", got, wantS)
				}
				if p.MemoryBytes == 0 || p.Multiprocessors == 0 || p.ComputeSlices == 0 || p.Encoders != 0 {
					t.Errorf("%s: memory %d, SMs %d, compute slices %d, encoders %d", p.Name, p.MemoryBytes, p.Multiprocessors, p.ComputeSlices, p.Encoders)
				}
			}
		})
	}
}

// The static instances of the hgx-h100-mig node: GPU 0 split into a 4g.40gb
// and a 3g.40gb, each with its compute instance as a MIG device; GPU 1 in
// MIG mode with none; the others not in MIG mode.
func TestDiscoverMIGInstances(t *testing.T) {
	node := mustMockNode(t, "hgx-h100-mig")
	gpus := mustDiscover(t, node)
	for _, g := range gpus[2:] {
		if g.MIGEnabled || g.MIG == nil || g.MIG.PendingEnabled {
			t.Errorf("GPU %d: MIGEnabled %v, MIG %+v; want MIG supported and off", g.Index, g.MIGEnabled, g.MIG)
		}
	}
	if g := gpus[1]; !g.MIGEnabled || len(g.MIG.Instances) != 0 || len(g.MIG.Profiles) != 7 {
		t.Errorf("GPU 1: MIGEnabled %v, %d instances, %d profiles; want MIG, none, 7", g.MIGEnabled, len(g.MIG.Instances), len(g.MIG.Profiles))
	}
	g := gpus[0]
	if g.MIGError != "" {
		t.Fatalf("MIGError %q", g.MIGError)
	}
	if len(g.MIG.Instances) != 2 {
		t.Fatalf("instances %+v, want 2", g.MIG.Instances)
	}
	uuids := map[string]bool{}
	for i, want := range []struct {
		id      int
		profile string
		start   int
		memMiB  uint64
		sms     int
	}{
		// 4-slice instances are IDs 1 (slices 0-3) and 2 (4-7); the
		// minors are the driver's: 3 + 9×ID, +1 for compute instance 0.
		{1, "4g.40gb", 0, 40448, 64},
		{2, "3g.40gb", 4, 40448, 60},
	} {
		in := g.MIG.Instances[i]
		if in.ID != want.id || in.ProfileName != want.profile || in.Placement != (MIGPlacement{Start: want.start, Size: 4}) || in.AccessMinor != 3+9*want.id {
			t.Errorf("instance %d: %+v, want ID %d %s at %d:4, access minor %d", i, in, want.id, want.profile, want.start, 3+9*want.id)
		}
		if p, _ := g.MIG.Profile(in.ProfileID); p.Name != want.profile {
			t.Errorf("instance %d: profile ID %d is %q", i, in.ProfileID, p.Name)
		}
		if len(in.ComputeInstances) != 1 {
			t.Fatalf("instance %d: compute instances %+v, want 1", i, in.ComputeInstances)
		}
		ci := in.ComputeInstances[0]
		if ci.ID != 0 || !strings.HasPrefix(ci.UUID, "MIG-") || ci.MemoryBytes != want.memMiB<<20 || ci.Multiprocessors != want.sms ||
			ci.AccessMinor != 4+9*want.id || ci.Processes != 0 {
			t.Errorf("instance %d compute instance: %+v", i, ci)
		}
		uuids[ci.UUID] = true
	}
	if len(uuids) != 2 {
		t.Errorf("MIG UUIDs not distinct: %v", uuids)
	}
	// A process on the 3g's MIG device is counted.
	must(t, node.SetMIGProcesses(0, 2, 0, []nvml.ProcessInfo{{Pid: 42, UsedGpuMemory: 1 << 30}}))
	if got := mustDiscover(t, node)[0].MIG.Instances[1].ComputeInstances[0].Processes; got != 1 {
		t.Errorf("processes %d, want 1", got)
	}
}

// The capability minors come from the mig-minors content discovery is
// given, not from a formula: a capability the file does not list is -1, and
// a malformed file is reported.
func TestDiscoverMIGMinorsOption(t *testing.T) {
	node := mustMockNode(t, "hgx-h100-mig")
	d, err := DiscoverNodeWith(node, DiscoverOptions{MIGMinors: []byte("gpu0/gi1/access 500\ngpu0/gi1/ci0/access 501\nnonsense\n")})
	if err != nil {
		t.Fatal(err)
	}
	in := d.GPUs[0].MIG.Instances
	if in[0].AccessMinor != 500 || in[0].ComputeInstances[0].AccessMinor != 501 || in[1].AccessMinor != -1 || in[1].ComputeInstances[0].AccessMinor != -1 {
		t.Errorf("minors %d/%d and %d/%d, want 500/501 and -1/-1", in[0].AccessMinor, in[0].ComputeInstances[0].AccessMinor, in[1].AccessMinor, in[1].ComputeInstances[0].AccessMinor)
	}
	if !strings.Contains(d.MIGMinorsError, "line 3") {
		t.Errorf("MIGMinorsError %q, want line 3 reported", d.MIGMinorsError)
	}
	// A file given by path; discovery reads it only when a GPU is in MIG
	// mode.
	d, err = DiscoverNodeWith(mustMockNode(t, "hgx-h100"), DiscoverOptions{MIGMinorsPath: t.TempDir()})
	if err != nil || d.MIGMinorsError != "" {
		t.Errorf("no GPU in MIG mode: err %v, MIGMinorsError %q; want the file not read", err, d.MIGMinorsError)
	}
}

// An NVML failure of a MIG query does not drop the GPU: it is described
// with what was read, the error is kept, and the GPU is tainted MIGUnknown.
func TestDiscoverMIGError(t *testing.T) {
	node := mustMockNode(t, "hgx-h100-mig")
	must(t, node.FailDiscovery(0, "nvmlDeviceGetGpuInstances", nvml.ERROR_UNKNOWN))
	d, err := DiscoverNode(node)
	if err != nil || len(d.Failed) != 0 || len(d.GPUs) != 8 {
		t.Fatalf("discovery: %d GPUs, failed %v, err %v; want all 8 described", len(d.GPUs), d.Failed, err)
	}
	g := d.GPUs[0]
	if !strings.Contains(g.MIGError, "nvmlDeviceGetGpuInstances") || !strings.Contains(g.MIGError, nvml.ERROR_UNKNOWN.Error()) {
		t.Errorf("MIGError %q, want the call and its error", g.MIGError)
	}
	if len(g.MIG.Profiles) != 7 || len(g.MIG.Instances) != 0 {
		t.Errorf("%d profiles, %d instances; want the profiles read, no instance", len(g.MIG.Profiles), len(g.MIG.Instances))
	}
	conds, list := conditionsOf(t, node, ComputeModePolicy{})
	if conds["0/MIGUnknown"] != "MIGUnknown" || conds["1/MIGUnknown"] != "" {
		t.Errorf("conditions %v, want GPU 0 tainted MIGUnknown", conds)
	}
	for _, c := range list {
		if c.Reason == ReasonMIGUnknown && !strings.Contains(c.Message, "nvidia-smi mig -i 0 -lgi") {
			t.Errorf("message %q", c.Message)
		}
	}

	// A MIG device handle that fails: its compute instance is listed
	// without UUID and with unknown processes, and the error is kept.
	node = mustMockNode(t, "hgx-h100-mig")
	node.Devices[0].GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_UNKNOWN }
	g = mustDiscover(t, node)[0]
	ci := g.MIG.Instances[0].ComputeInstances[0]
	if ci.UUID != "" || ci.Processes != -1 || !strings.Contains(g.MIGError, "nvmlDeviceGetMigDeviceHandleByIndex(0)") || !strings.Contains(g.MIGError, "no MIG device handle") {
		t.Errorf("compute instance %+v, MIGError %q", ci, g.MIGError)
	}
}

func TestMIGProfileName(t *testing.T) {
	const h100 = 81559 << 20
	for _, tc := range []struct {
		index  int
		slices uint32
		memMiB uint64
		total  uint64
		want   string
	}{
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 9984, h100, "1g.10gb"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 9984, h100, "1g.10gb+me"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, 20096, h100, "1g.20gb"},
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 7, 81152, h100, "7g.80gb"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 1, 9984, h100, "1g.10gb-me"},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME, 2, 20096, h100, "2g.20gb+me.all"},
		{nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX, 4, 40448, h100, "4g.40gb+gfx"},
		// A100-SXM4-40GB, the guide's -lgip figures.
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 4864, 40960 << 20, "1g.5gb"},
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 3, 19968, 40960 << 20, "3g.20gb"},
		// No total known: the profile's own memory, rounded up.
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 9984, 0, "1g.10gb"},
	} {
		info := nvml.GpuInstanceProfileInfo{SliceCount: tc.slices, MemorySizeMB: tc.memMiB}
		if got := migProfileName(tc.index, info, tc.total); got != tc.want {
			t.Errorf("migProfileName(%d, %d slices, %d MiB) = %q, want %q", tc.index, tc.slices, tc.memMiB, got, tc.want)
		}
	}
}

// MockMIGTable gives the tables to simulations as discovery describes them.
func TestMockMIGTable(t *testing.T) {
	if got := MockMIGProducts(); !slices.Equal(got, []string{"NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200"}) {
		t.Errorf("MockMIGProducts() = %v", got)
	}
	want, ok := MockMIGTable("NVIDIA H100 80GB HBM3")
	if !ok {
		t.Fatal("no H100 table")
	}
	node := mustMockNode(t, "hgx-h100")
	must(t, node.SetMIG(0, true))
	got := *mustDiscover(t, node)[0].MIG
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("MockMIGTable\n%+v\ndiscovery\n%+v", want, got)
	}
	if _, ok := MockMIGTable("NVIDIA L4"); ok {
		t.Error("a table for the L4")
	}
}
