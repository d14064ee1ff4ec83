package gpu

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func discoverProfile(t *testing.T, profile string) []GPU {
	t.Helper()
	lib, err := NewMock(profile)
	if err != nil {
		t.Fatal(err)
	}
	if err := Open(lib); err != nil {
		t.Fatal(err)
	}
	gpus, err := Discover(lib)
	if err != nil {
		t.Fatalf("Discover(%s): %v", profile, err)
	}
	return gpus
}

// domainGroups lists the minors of each NVLink domain, ordered by first minor.
func domainGroups(gpus []GPU) [][]int {
	byDomain := map[string][]int{}
	for _, g := range gpus {
		byDomain[g.NVLinkDomain] = append(byDomain[g.NVLinkDomain], g.Minor)
	}
	var groups [][]int
	for _, minors := range byDomain {
		slices.Sort(minors)
		groups = append(groups, minors)
	}
	slices.SortFunc(groups, func(a, b []int) int { return a[0] - b[0] })
	return groups
}

func TestDiscoverProfiles(t *testing.T) {
	tests := []struct {
		profile string
		count   int
		product string
		memory  uint64
		arch    string
		cc      string
		sms     int
		mig     bool
		domains [][]int
	}{
		{
			profile: "dgx-a100", count: 8, product: "NVIDIA A100-SXM4-40GB", memory: (40960 - 424) << 20,
			arch: "ampere", cc: "8.0", sms: 108,
			domains: [][]int{{0, 1, 2, 3, 4, 5, 6, 7}},
		},
		{
			profile: "hgx-h100", count: 8, product: "NVIDIA H100 80GB HBM3", memory: (81559 - 470) << 20,
			arch: "hopper", cc: "9.0", sms: 132,
			domains: [][]int{{0, 1, 2, 3, 4, 5, 6, 7}},
		},
		{
			profile: "l4x4", count: 4, product: "NVIDIA L4", memory: (23034 - 375) << 20,
			arch: "ada", cc: "8.9", sms: 58,
			domains: [][]int{{0}, {1}, {2}, {3}},
		},
		{
			profile: "a100-pairs", count: 4, product: "NVIDIA A100 80GB PCIe", memory: (81920 - 698) << 20,
			arch: "ampere", cc: "8.0", sms: 108,
			domains: [][]int{{0, 1}, {2, 3}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.profile, func(t *testing.T) {
			gpus := discoverProfile(t, tt.profile)
			if len(gpus) != tt.count {
				t.Fatalf("got %d GPUs, want %d", len(gpus), tt.count)
			}
			uuids := map[string]bool{}
			buses := map[string]bool{}
			for i, g := range gpus {
				name := fmt.Sprintf("GPU %d", i)
				check := func(field string, got, want any) {
					t.Helper()
					if got != want {
						t.Errorf("%s: %s = %v, want %v", name, field, got, want)
					}
				}
				check("Minor", g.Minor, i)
				check("Index", g.Index, i)
				check("ProductName", g.ProductName, tt.product)
				check("MemoryBytes", g.MemoryBytes, tt.memory)
				check("Architecture", g.Architecture, tt.arch)
				check("CUDAComputeCapability", g.CUDAComputeCapability, tt.cc)
				check("MultiprocessorCount", g.MultiprocessorCount, tt.sms)
				check("DriverVersion", g.DriverVersion, "580.95.05")
				check("CUDADriverVersion", g.CUDADriverVersion, "13.0")
				check("MIGEnabled", g.MIGEnabled, tt.mig)
				wantNUMA := 0
				if i >= tt.count/2 {
					wantNUMA = 1
				}
				if g.NUMANode == nil {
					t.Errorf("%s: NUMANode = nil, want %d", name, wantNUMA)
				} else {
					check("NUMANode", *g.NUMANode, wantNUMA)
				}
				if !strings.HasPrefix(g.UUID, "GPU-") || len(g.UUID) != len("GPU-")+36 {
					t.Errorf("%s: UUID %q is not GPU-<uuid>", name, g.UUID)
				}
				if _, err := normalizePCIBusID(g.PCIBusID); err != nil || !strings.HasPrefix(g.PCIBusID, "0000:") || strings.ToLower(g.PCIBusID) != g.PCIBusID {
					t.Errorf("%s: PCIBusID %q is not canonical", name, g.PCIBusID)
				}
				uuids[g.UUID] = true
				buses[g.PCIBusID] = true
			}
			if len(uuids) != tt.count || len(buses) != tt.count {
				t.Errorf("UUIDs or PCI bus ids not distinct: %d UUIDs, %d bus ids", len(uuids), len(buses))
			}
			if got := domainGroups(gpus); !slices.EqualFunc(got, tt.domains, slices.Equal) {
				t.Errorf("NVLink domains %v, want %v", got, tt.domains)
			}
		})
	}
}

// Domain ids (and every other fact) must survive a restart of the plugin, which
// discovers again over a freshly loaded NVML.
func TestDiscoverIsStable(t *testing.T) {
	for _, profile := range Profiles() {
		t.Run(profile, func(t *testing.T) {
			first := discoverProfile(t, profile)
			second := discoverProfile(t, profile)
			if !slices.EqualFunc(first, second, gpuEqual) {
				t.Errorf("two discoveries differ:\n%+v\n%+v", first, second)
			}
		})
	}
}

func gpuEqual(a, b GPU) bool {
	return reflect.DeepEqual(a, b)
}

// NVML may enumerate the same GPUs in another order (another driver, another
// boot); the domains of each GPU must not change, and the result stays sorted
// by minor number.
func TestDiscoverIndependentOfEnumerationOrder(t *testing.T) {
	for _, profile := range Profiles() {
		t.Run(profile, func(t *testing.T) {
			want := discoverProfile(t, profile)

			node, err := NewMockNode(profile)
			if err != nil {
				t.Fatal(err)
			}
			order := slices.Clone(node.Devices)
			slices.Reverse(order)
			order[0], order[len(order)/2] = order[len(order)/2], order[0]
			node.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) { return order[i], nvml.SUCCESS }

			got, err := Discover(node)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("got %d GPUs, want %d", len(got), len(want))
			}
			for i := range want {
				if got[i].UUID != want[i].UUID || got[i].Minor != want[i].Minor || got[i].NVLinkDomain != want[i].NVLinkDomain {
					t.Errorf("position %d: got %s minor %d domain %s, want %s minor %d domain %s",
						i, got[i].UUID, got[i].Minor, got[i].NVLinkDomain, want[i].UUID, want[i].Minor, want[i].NVLinkDomain)
				}
			}
		})
	}
}

func TestDiscoverSortsByMinor(t *testing.T) {
	node, err := NewMockNode("l4x4")
	if err != nil {
		t.Fatal(err)
	}
	// The kernel numbered the devices in another order than NVML's PCI order.
	minors := []int{2, 0, 3, 1}
	for i, d := range node.Devices {
		d.GetMinorNumberFunc = func() (int, nvml.Return) { return minors[i], nvml.SUCCESS }
	}
	gpus, err := Discover(node)
	if err != nil {
		t.Fatal(err)
	}
	var gotMinors, gotIndexes []int
	for _, g := range gpus {
		gotMinors = append(gotMinors, g.Minor)
		gotIndexes = append(gotIndexes, g.Index)
	}
	if !slices.Equal(gotMinors, []int{0, 1, 2, 3}) || !slices.Equal(gotIndexes, []int{1, 3, 0, 2}) {
		t.Errorf("minors %v indexes %v, want minors [0 1 2 3] indexes [1 3 0 2]", gotMinors, gotIndexes)
	}
}

// A 16-GPU node in an NVLink network, split by the fabric into two cliques of
// eight although every GPU reaches the same NVSwitches.
func TestDiscoverFabricCliques(t *testing.T) {
	cluster := [16]uint8{0xca, 0xfe, 15: 1}
	p := mockProfiles["hgx-h100"]
	p.buses = nil
	for i := range 16 {
		p.buses = append(p.buses, uint8(0x10+i*8))
	}
	p.fabric = func(i int) nvml.GpuFabricInfo {
		return nvml.GpuFabricInfo{ClusterUuid: cluster, CliqueId: uint32(i / 8), State: nvml.GPU_FABRIC_STATE_COMPLETED}
	}
	node := newMockNode("nvl16", p)
	gpus, err := Discover(node)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}
	if got := domainGroups(gpus); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("domains %v, want %v", got, want)
	}
	// Fabric domains are named after the clique, not the node's members, so
	// another node in the same clique publishes the same id.
	if gpus[0].NVLinkDomain != domainID("fabric:cafe0000-0000-0000-0000-000000000001/0") {
		t.Errorf("clique 0 domain = %s", gpus[0].NVLinkDomain)
	}
}

func TestDiscoverOptionalFacts(t *testing.T) {
	t.Run("NUMA not supported", func(t *testing.T) {
		node := mustMockNode(t, "l4x4")
		for _, d := range node.Devices {
			d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		}
		for _, g := range mustDiscover(t, node) {
			if g.NUMANode != nil {
				t.Errorf("GPU %d: NUMANode = %d, want nil", g.Minor, *g.NUMANode)
			}
		}
	})
	t.Run("no NUMA affinity", func(t *testing.T) {
		node := mustMockNode(t, "l4x4")
		node.Devices[0].GetNumaNodeIdFunc = func() (int, nvml.Return) { return 1<<32 - 1, nvml.SUCCESS }
		if g := mustDiscover(t, node)[0]; g.NUMANode != nil {
			t.Errorf("NUMANode = %d, want nil", *g.NUMANode)
		}
	})
	t.Run("old driver without the newer calls", func(t *testing.T) {
		node := mustMockNode(t, "dgx-a100")
		node.ExtensionsFunc = func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(s string) error { return errors.New("undefined symbol " + s) }}
		}
		for _, d := range node.Devices {
			// Calling a symbol the driver lacks would kill the process.
			d.GetNumaNodeIdFunc = nil
			d.GetGpuFabricInfoFunc = nil
			d.GetNvLinkRemoteDeviceTypeFunc = nil
			d.GetMemoryInfo_v2Func = nil
		}
		gpus := mustDiscover(t, node)
		if gpus[0].NUMANode != nil {
			t.Errorf("NUMANode = %d, want nil", *gpus[0].NUMANode)
		}
		// Without v2 the total is all the driver can tell, and the GPU says so.
		if g := gpus[0]; g.MemoryBytes != 40960<<20 || g.MemoryTotalBytes != 40960<<20 || g.MemoryReservedBytes != 0 ||
			!strings.Contains(g.MemoryReservedUnknown, "no nvmlDeviceGetMemoryInfo_v2") {
			t.Errorf("memory %d of %d, %d reserved (%q), want the v1 total and why", g.MemoryBytes, g.MemoryTotalBytes, g.MemoryReservedBytes, g.MemoryReservedUnknown)
		}
		// Without the remote type, the switch is recognised by its bus id.
		if got := domainGroups(gpus); len(got) != 1 {
			t.Errorf("domains %v, want one", got)
		}
	})
	t.Run("SM count not reported for a full GPU", func(t *testing.T) {
		node := mustMockNode(t, "l4x4")
		node.Devices[1].GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{}, nvml.ERROR_NOT_SUPPORTED
		}
		if g := mustDiscover(t, node)[1]; g.MultiprocessorCount != 0 {
			t.Errorf("MultiprocessorCount = %d, want 0", g.MultiprocessorCount)
		}
	})
	t.Run("MIG enabled", func(t *testing.T) {
		node := mustMockNode(t, "dgx-a100")
		node.Devices[3].GetMigModeFunc = func() (int, int, nvml.Return) {
			return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
		}
		for _, g := range mustDiscover(t, node) {
			if g.MIGEnabled != (g.Minor == 3) {
				t.Errorf("GPU %d: MIGEnabled = %v", g.Minor, g.MIGEnabled)
			}
		}
	})
}

func TestDiscoverErrorsNameTheDevice(t *testing.T) {
	node := mustMockNode(t, "a100-pairs")
	node.Devices[2].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	_, err := Discover(node)
	if err == nil {
		t.Fatal("Discover succeeded with a lost GPU")
	}
	want := fmt.Sprintf("GPU index 2 (%s): nvmlDeviceGetMemoryInfo_v2: ", mockUUID("a100-pairs", 2))
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q, want it to start with %q", err, want)
	}
	if !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		t.Errorf("error %q does not wrap ERROR_GPU_IS_LOST", err)
	}

	node = mustMockNode(t, "a100-pairs")
	node.Devices[1].GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	// The compute mode is only read: a GPU that will not tell it is
	// published without it, with the error kept.
	gpus, err := Discover(node)
	want = "nvmlDeviceGetComputeMode: "
	if err != nil || len(gpus) != 4 || gpus[1].ComputeMode != "" || !strings.HasPrefix(gpus[1].ComputeModeError, want) {
		t.Errorf("Discover = %d GPUs, %v; want 4 with GPU 1's compute mode unknown and its error starting %q", len(gpus), err, want)
	}

	node = mustMockNode(t, "l4x4")
	node.Devices[0].GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
	_, err = Discover(node)
	want = "GPU index 0: nvmlDeviceGetUUID: "
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %v, want it to start with %q", err, want)
	}
}

func TestNormalizePCIBusID(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "00000000:07:00.0", want: "0000:07:00.0"},
		{in: "00000000:BD:00.0", want: "0000:bd:00.0"},
		{in: "0000:0F:00.0", want: "0000:0f:00.0"},
		{in: "00000001:C3:1F.7", want: "0001:c3:1f.7"},
		{in: "00010000:01:00.0", want: "10000:01:00.0"}, // VMD domains need 5 digits, as in sysfs
		{in: "07:00.0", want: "0000:07:00.0"},
		{in: "", wantErr: true},
		{in: "0000:07:00", wantErr: true},
		{in: "0000:107:00.0", wantErr: true},
		{in: "0000:07:20.0", wantErr: true},
		{in: "0000:07:00.8", wantErr: true},
		{in: "zz:07:00.0", wantErr: true},
		{in: "0:0:0:0.0", wantErr: true},
	}
	for _, tt := range tests {
		got, err := normalizePCIBusID(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("normalizePCIBusID(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestArchitectureAndVersions(t *testing.T) {
	arches := map[nvml.DeviceArchitecture]string{
		nvml.DEVICE_ARCH_KEPLER: "kepler", nvml.DEVICE_ARCH_MAXWELL: "maxwell", nvml.DEVICE_ARCH_PASCAL: "pascal",
		nvml.DEVICE_ARCH_VOLTA: "volta", nvml.DEVICE_ARCH_TURING: "turing", nvml.DEVICE_ARCH_AMPERE: "ampere",
		nvml.DEVICE_ARCH_ADA: "ada", nvml.DEVICE_ARCH_HOPPER: "hopper", nvml.DEVICE_ARCH_BLACKWELL: "blackwell",
		nvml.DEVICE_ARCH_UNKNOWN: "unknown", 42: "unknown",
	}
	for arch, want := range arches {
		if got := architectureName(arch); got != want {
			t.Errorf("architectureName(%d) = %q, want %q", arch, got, want)
		}
	}
	for v, want := range map[int]string{12040: "12.4", 13000: "13.0", 11080: "11.8", 12090: "12.9"} {
		if got := cudaDriverVersion(v); got != want {
			t.Errorf("cudaDriverVersion(%d) = %q, want %q", v, got, want)
		}
	}
}

func mustMockNode(t *testing.T, profile string) *MockNode {
	t.Helper()
	node, err := NewMockNode(profile)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

func mustDiscover(t *testing.T, lib nvml.Interface) []GPU {
	t.Helper()
	gpus, err := Discover(lib)
	if err != nil {
		t.Fatal(err)
	}
	return gpus
}

// One GPU that NVML cannot describe does not stop discovery of the others:
// DiscoverNode returns them, reports the broken one with what could be read,
// and the others' NVLink domains leave it out.
func TestDiscoverNodeReportsBrokenGPUs(t *testing.T) {
	want := discoverProfile(t, "a100-pairs") // pairs 0-1 and 2-3
	for _, tc := range []struct {
		call        string
		wantUUID    bool
		wantPartial bool
	}{
		{call: "nvmlDeviceGetUUID"},
		{call: "nvmlDeviceGetMemoryInfo", wantUUID: true},
		{call: "nvmlDeviceGetPciInfo", wantUUID: true, wantPartial: true},
	} {
		t.Run(tc.call, func(t *testing.T) {
			node := mustMockNode(t, "a100-pairs")
			if err := node.FailDiscovery(2, tc.call, nvml.ERROR_UNKNOWN); err != nil {
				t.Fatal(err)
			}
			d, err := DiscoverNode(node)
			if err != nil {
				t.Fatalf("DiscoverNode failed as a whole: %v", err)
			}
			var minors []int
			for _, g := range d.GPUs {
				minors = append(minors, g.Minor)
			}
			if !slices.Equal(minors, []int{0, 1, 3}) {
				t.Fatalf("described GPUs %v, want [0 1 3]", minors)
			}
			if !reflect.DeepEqual(d.GPUs[:2], want[:2]) {
				t.Errorf("GPUs 0 and 1 differ from a healthy discovery:\n%+v\n%+v", d.GPUs[:2], want[:2])
			}
			// GPU 3 lost its NVLink partner: a domain of its own.
			if d.GPUs[2].NVLinkDomain == want[3].NVLinkDomain || d.GPUs[2].NVLinkDomain == "" {
				t.Errorf("GPU 3 domain %q, want a new one (was %q with GPU 2)", d.GPUs[2].NVLinkDomain, want[3].NVLinkDomain)
			}
			if len(d.Failed) != 1 {
				t.Fatalf("failed %v, want GPU index 2", d.Failed)
			}
			f := d.Failed[0]
			if f.Index != 2 || !errors.Is(f, nvml.ERROR_UNKNOWN) || !strings.Contains(f.Error(), tc.call) {
				t.Errorf("failure %+v (%v): want index 2, ERROR_UNKNOWN from %s", f, f, tc.call)
			}
			if got := f.UUID != ""; got != tc.wantUUID {
				t.Errorf("UUID %q known = %v, want %v", f.UUID, got, tc.wantUUID)
			}
			if tc.wantUUID && (f.UUID != want[2].UUID || f.Minor != 2) {
				t.Errorf("UUID %q minor %d, want %s minor 2", f.UUID, f.Minor, want[2].UUID)
			}
			if !tc.wantUUID && f.Minor != -1 {
				t.Errorf("minor %d, want -1 (unknown)", f.Minor)
			}
			if got := f.Partial != nil; got != tc.wantPartial {
				t.Fatalf("partial facts %+v, want them: %v", f.Partial, tc.wantPartial)
			}
			if f.Partial != nil {
				p := *f.Partial
				if p.UUID != want[2].UUID || p.Minor != 2 || p.MemoryBytes != want[2].MemoryBytes || p.ProductName != want[2].ProductName ||
					p.DriverVersion != want[2].DriverVersion || p.PCIBusID != "" || p.NVLinkDomain != "" {
					t.Errorf("partial facts %+v", p)
				}
			}

			// The strict form fails with the broken GPU's error.
			if _, err := Discover(node); err == nil || !strings.HasPrefix(err.Error(), "GPU index 2") {
				t.Errorf("Discover: %v, want the failure of GPU index 2", err)
			}
			// And the GPU comes back.
			if err := node.FailDiscovery(2, tc.call, nvml.SUCCESS); err != nil {
				t.Fatal(err)
			}
			if d, err := DiscoverNode(node); err != nil || len(d.Failed) != 0 || len(d.GPUs) != 4 {
				t.Errorf("after the fault cleared: %d GPUs, failed %v, err %v", len(d.GPUs), d.Failed, err)
			}
		})
	}
}

// A GPU whose handle cannot be had is reported by index alone; a node
// without GPUs is no error.
func TestDiscoverNodeHandleFailureAndNoGPUs(t *testing.T) {
	node := mustMockNode(t, "l4x4")
	handle := node.DeviceGetHandleByIndexFunc
	node.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 0 {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return handle(i)
	}
	d, err := DiscoverNode(node)
	if err != nil || len(d.GPUs) != 3 || len(d.Failed) != 1 {
		t.Fatalf("%d GPUs, failed %v, err %v", len(d.GPUs), d.Failed, err)
	}
	if f := d.Failed[0]; f.Index != 0 || f.UUID != "" || f.Minor != -1 || f.Partial != nil || !errors.Is(f, nvml.ERROR_GPU_IS_LOST) {
		t.Errorf("failure %+v", f)
	}

	node = mustMockNode(t, "l4x4")
	node.Devices = nil
	d, err = DiscoverNode(node)
	if err != nil || len(d.GPUs) != 0 || len(d.Failed) != 0 {
		t.Errorf("no GPUs: %+v, %v", d, err)
	}

	node = mustMockNode(t, "l4x4")
	node.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	if _, err := DiscoverNode(node); !errors.Is(err, nvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), "nvmlDeviceGetCount") {
		t.Errorf("count failure: %v", err)
	}
}
