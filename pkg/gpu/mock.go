package gpu

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Facts every mock GPU shares.
const (
	mockDriverVersion = "580.95.05"
	mockCUDAVersion   = 13000 // CUDA 13.0
	mockNVMLVersion   = "13.580.95.05"
)

// mockProfile describes one mock node. Memory sizes are what NVML reports on the
// real product (nvidia-smi's "Total" memory), not the marketing size.
type mockProfile struct {
	product   string
	arch      nvml.DeviceArchitecture
	ccMajor   int
	ccMinor   int
	memoryMiB uint64
	// reservedMiB is what the driver reserves of memoryMiB (nvidia-smi's
	// memory.reserved, nvmlDeviceGetMemoryInfo_v2's Reserved). NVIDIA
	// publishes no table of it and it varies with the driver; each profile
	// says where its figure comes from.
	reservedMiB uint64
	sms         uint32
	pciDeviceID uint32
	// migOn are the GPUs (NVML indexes) that start in MIG mode; the others
	// start with MIG disabled.
	migOn []int
	// migInstances are the GPU instances GPUs of migOn start with, each
	// with one compute instance of its full size.
	migInstances map[int][]mockStaticInstance
	// buses are the PCI bus numbers of the GPUs in NVML index order; their count
	// is the GPU count.
	buses []uint8
	// roots are the PCIe root complexes of the GPUs in NVML index order, as
	// sysfs names them ("pci0000:15"): the first component of the GPU's path
	// under /sys/devices. A root's bus number is below the bus numbers of the
	// GPUs under it and above those of the GPUs under the previous root, as
	// the firmware numbers them.
	roots []string
	// links is the number of NVLinks per GPU; 0 means a PCIe-only GPU.
	links int
	// switches are the PCI bus numbers of the NVSwitches; link l of every GPU
	// ends at switches[l%len(switches)]. Empty: links go to the pair partner
	// (GPU i^1), as with NVLink bridges.
	switches []uint8
	// fabric, when set, returns GPU i's fabric registration. Nil: the GPU does
	// not support fabric info (pre-Hopper) and NVML says NOT_SUPPORTED.
	fabric func(i int) nvml.GpuFabricInfo
}

// hopperStandalone is what a Hopper GPU outside an NVLink network reports.
func hopperStandalone(int) nvml.GpuFabricInfo {
	return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_NOT_SUPPORTED}
}

// migTable is the MIG profile table of the profile's product; nil for a
// product without MIG.
func (p mockProfile) migTable() *mockMIGTable { return mockMIGTables[p.product] }

// mockProfiles are the built-in node profiles, by name.
var mockProfiles = map[string]mockProfile{
	// DGX A100: 8 SXM4 GPUs, 12 NVLinks each, to 6 NVSwitches. Two GPUs
	// (and their two NICs) per PCIe switch, one switch per root complex of
	// the two EPYC sockets: GPUs 0-1 under pci0000:00, 2-3 under pci0000:40,
	// 4-5 under pci0000:80, 6-7 under pci0000:a0.
	"dgx-a100": {
		product: "NVIDIA A100-SXM4-40GB", arch: nvml.DEVICE_ARCH_AMPERE, ccMajor: 8, ccMinor: 0,
		// CUDA's total on an A100-SXM4-40GB is commonly reported as 40536
		// MiB (PaddlePaddle's get_device_properties docstring:
		// total_memory=40536MB, computed in MiB); CUDA's total leaves the
		// reserved memory out: 40960 - 40536.
		memoryMiB: 40960, reservedMiB: 424, sms: 108, pciDeviceID: 0x20B010DE,
		buses: []uint8{0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD},
		roots: pairs("pci0000:00", "pci0000:40", "pci0000:80", "pci0000:a0"),
		links: 12, switches: []uint8{0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9},
	},
	// HGX H100: 8 SXM5 GPUs, 18 NVLinks each, to 4 NVSwitches; no NVLink
	// network. Two GPUs (and their NICs) per PCIe switch, one switch per root
	// complex, two per socket: GPUs 0-1 under pci0000:15, 2-3 under
	// pci0000:4e, 4-5 under pci0000:97, 6-7 under pci0000:cb.
	"hgx-h100": {
		product: "NVIDIA H100 80GB HBM3", arch: nvml.DEVICE_ARCH_HOPPER, ccMajor: 9, ccMinor: 0,
		// PyTorch's get_device_properties on an H100 80GB HBM3 is commonly
		// reported with total_memory=81082MB..81090MB (MiB, by driver
		// version; e.g. 81089 with torch 2.7/CUDA 12.8): CUDA's total, which
		// leaves the reserved memory out, so 81559 - 81089.
		memoryMiB: 81559, reservedMiB: 470, sms: 132, pciDeviceID: 0x233010DE,
		buses: []uint8{0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF},
		roots: pairs("pci0000:15", "pci0000:4e", "pci0000:97", "pci0000:cb"),
		links: 18, switches: []uint8{0x05, 0x06, 0x07, 0x08},
		fabric: hopperStandalone,
	},
	// Four L4 cards, PCIe only, each in a CPU-attached slot of its own root
	// complex: pci0000:16, pci0000:30, pci0000:b0, pci0000:c9.
	"l4x4": {
		product: "NVIDIA L4", arch: nvml.DEVICE_ARCH_ADA, ccMajor: 8, ccMinor: 9,
		// No published figure found for the L4. Assumed: the T4's share
		// (deviceQuery reports 15110 of nvidia-smi's 15360 MiB, 250 MiB
		// reserved, 1.6%) of the L4's 23034 MiB.
		memoryMiB: 23034, reservedMiB: 375, sms: 58, pciDeviceID: 0x27B810DE,
		buses: []uint8{0x17, 0x31, 0xB1, 0xCA},
		roots: []string{"pci0000:16", "pci0000:30", "pci0000:b0", "pci0000:c9"},
	},
	// Four A100 PCIe cards, NVLink-bridged in pairs 0-1 and 2-3 (3 bridges,
	// 12 links), in the slots of the l4x4 node: one root complex per card, so
	// an NVLink pair spans two roots.
	"a100-pairs": {
		product: "NVIDIA A100 80GB PCIe", arch: nvml.DEVICE_ARCH_AMPERE, ccMajor: 8, ccMinor: 0,
		// No figure found for the PCIe card; an A100-SXM4-80GB's CUDA total
		// is reported as 81221.8 MiB (cudaDeviceProp.totalGlobalMem), so
		// 81920 - 81222.
		memoryMiB: 81920, reservedMiB: 698, sms: 108, pciDeviceID: 0x20B510DE,
		buses: []uint8{0x17, 0x31, 0xB1, 0xCA},
		roots: []string{"pci0000:16", "pci0000:30", "pci0000:b0", "pci0000:c9"},
		links: 12,
	},
}

func init() {
	// HGX H100 with MIG: the hgx-h100 node with GPU 0 in MIG mode as a
	// 4g.40gb at memory slices 0-3 and a 3g.40gb at 4-7 (each with one
	// compute instance of its size), GPU 1 in MIG mode without instances,
	// GPUs 2-7 not in MIG mode.
	p := mockProfiles["hgx-h100"]
	p.migOn = []int{0, 1}
	p.migInstances = map[int][]mockStaticInstance{0: {{profile: "4g.40gb", start: 0}, {profile: "3g.40gb", start: 4}}}
	mockProfiles["hgx-h100-mig"] = p

	// HGX H100 for dynamic MIG: every GPU in MIG mode without instances, the
	// node a DaemonSet with kubeletPlugin.dynamicMIG serves on all its GPUs.
	d := mockProfiles["hgx-h100"]
	d.migOn = []int{0, 1, 2, 3, 4, 5, 6, 7}
	mockProfiles["hgx-h100-dynamic-mig"] = d
}

// pairs puts two consecutive GPUs under each root: GPUs 2i and 2i+1 under
// roots[i].
func pairs(roots ...string) []string {
	out := make([]string, 0, 2*len(roots))
	for _, r := range roots {
		out = append(out, r, r)
	}
	return out
}

// Profiles returns the names of the built-in mock node profiles, sorted.
func Profiles() []string {
	return slices.Sorted(maps.Keys(mockProfiles))
}

// MockNode is a mock NVML (nvml.Interface) for one of the built-in node profiles.
// Every call Discover makes is implemented; other calls panic, as go-nvml's mocks
// do. Each mock GPU has a deterministic UUID derived from the profile name and its
// index, a distinct PCI bus id, NUMA node 0 (first half) or 1 (second half),
// driver 580.95.05 and CUDA 13.0, and the PCIe root complex a node of its kind
// has (see PCIeRoot).
//
// The embedded *mock.Interface and the per-GPU Devices are exported so that tests
// and later features (event injection for health) can replace individual calls.
// Replace them before the node is shared between goroutines.
type MockNode struct {
	*mock.Interface
	// Profile is the name the node was built from.
	Profile string
	// Devices are the mock GPUs in NVML index order; DeviceGetHandleByIndex(i)
	// returns Devices[i].
	Devices []*mock.Device

	// roots are the PCIe root complexes by canonical bus id.
	roots map[string]string

	// state backs the test knobs (InjectEvent, SetLost, SetProcesses,
	// FailDiscovery) and the MIG state.
	state *mockState

	// product is the GPUs' product name.
	product string
	// migFile is MockOptions.MIGStateFile; migWriteErr the latest error
	// writing it (under state.mu).
	migFile     string
	migWriteErr error
}

// NewMock returns the mock NVML of a built-in profile (see Profiles). It is
// NewMockNode for callers that only need the interface.
func NewMock(profile string) (nvml.Interface, error) {
	node, err := NewMockNode(profile)
	if err != nil {
		return nil, err
	}
	return node, nil
}

// NewMockNode builds a fresh mock node for a built-in profile. Nodes share no
// state: two nodes of the same profile report the same facts.
func NewMockNode(profile string) (*MockNode, error) {
	return NewMockNodeWith(profile, MockOptions{})
}

// NewMockNodeWith is NewMockNode with options (see MockOptions): a node
// whose MIG state file exists starts from that state; a file that cannot be
// read or does not fit the profile is an error.
func NewMockNodeWith(profile string, opts MockOptions) (*MockNode, error) {
	p, ok := mockProfiles[profile]
	if !ok {
		return nil, fmt.Errorf("unknown mock profile %q (valid: %s)", profile, strings.Join(Profiles(), ", "))
	}
	node := newMockNode(profile, p)
	if err := node.initMIG(p, opts); err != nil {
		return nil, err
	}
	return node, nil
}

// PCIeRoot returns the PCIe root complex of the mock GPU with this bus id
// (any spelling NVML or sysfs uses), as a real node's sysfs would give it, and
// false for a bus id of no GPU of the node. The profiles' topologies are those
// of the real machines: two GPUs per PCIe switch and root complex on the
// SXM boards (dgx-a100, hgx-h100), one card per root on the PCIe nodes (l4x4,
// a100-pairs). NVML has no call for it; discovery asks the node directly (see
// DiscoverNode), and it implements model.PCIeRoots.
func (n *MockNode) PCIeRoot(pciBusID string) (string, bool) {
	want, err := normalizePCIBusID(pciBusID)
	if err != nil {
		return "", false
	}
	root, ok := n.roots[want]
	return root, ok
}

// mockSymbols are the optional NVML symbols the mock claims to export.
var mockSymbols = []string{
	"nvmlDeviceGetMemoryInfo_v2",
	"nvmlDeviceGetNumaNodeId",
	"nvmlDeviceGetGpuFabricInfo",
	"nvmlDeviceGetNvLinkRemoteDeviceType",
}

func newMockNode(name string, p mockProfile) *MockNode {
	n := len(p.buses)
	node := &MockNode{Interface: &mock.Interface{}, Profile: name, Devices: make([]*mock.Device, n), roots: map[string]string{}, product: p.product}
	for i := range n {
		node.Devices[i] = newMockDevice(name, p, i)
		if i < len(p.roots) {
			bus, _ := normalizePCIBusID(nvmlBusID(p.buses[i]))
			node.roots[bus] = p.roots[i]
		}
	}

	extensions := &mock.ExtendedInterface{
		LookupSymbolFunc: func(symbol string) error {
			if slices.Contains(mockSymbols, symbol) {
				return nil
			}
			return fmt.Errorf("symbol %q not found in mock NVML", symbol)
		},
	}
	m := node.Interface
	m.InitFunc = func() nvml.Return { return nvml.SUCCESS }
	m.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
	m.ExtensionsFunc = func() nvml.ExtendedInterface { return extensions }
	m.ErrorStringFunc = func(ret nvml.Return) string { return ret.Error() }
	m.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return mockDriverVersion, nvml.SUCCESS }
	m.SystemGetNVMLVersionFunc = func() (string, nvml.Return) { return mockNVMLVersion, nvml.SUCCESS }
	m.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return mockCUDAVersion, nvml.SUCCESS }
	m.SystemGetCudaDriverVersion_v2Func = m.SystemGetCudaDriverVersionFunc
	m.DeviceGetCountFunc = func() (int, nvml.Return) { return len(node.Devices), nvml.SUCCESS }
	m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= len(node.Devices) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return node.Devices[i], nvml.SUCCESS
	}
	m.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		for i, d := range node.Devices {
			if uuid == mockUUID(name, i) {
				return d, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	m.DeviceGetHandleByPciBusIdFunc = func(busID string) (nvml.Device, nvml.Return) {
		want, err := normalizePCIBusID(busID)
		if err != nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		for i, d := range node.Devices {
			if got, _ := normalizePCIBusID(nvmlBusID(p.buses[i])); got == want {
				return d, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	node.installEvents()
	node.installMIG(p)
	node.installConditions()
	node.installDiscoveryFailures()
	return node
}

func newMockDevice(name string, p mockProfile, i int) *mock.Device {
	n := len(p.buses)
	uuid := mockUUID(name, i)
	numa := 0
	if i >= n/2 {
		numa = 1
	}
	pci := pciInfo(p.buses[i])
	pci.PciDeviceId = p.pciDeviceID

	d := &mock.Device{}
	d.GetUUIDFunc = func() (string, nvml.Return) { return uuid, nvml.SUCCESS }
	d.GetMinorNumberFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
	d.GetIndexFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
	d.GetNameFunc = func() (string, nvml.Return) { return p.product, nvml.SUCCESS }
	d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return nvml.BRAND_NVIDIA, nvml.SUCCESS }
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return p.arch, nvml.SUCCESS }
	d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return p.ccMajor, p.ccMinor, nvml.SUCCESS }
	// v1 counts the reserved memory as used, as the driver does.
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{Total: p.memoryMiB << 20, Used: p.reservedMiB << 20, Free: (p.memoryMiB - p.reservedMiB) << 20}, nvml.SUCCESS
	}
	// v2 answers what v1 answers (so a lost GPU, an injected failure of
	// nvmlDeviceGetMemoryInfo or a test's replacement of it applies to both)
	// with the reserved memory split out of v1's used memory, as the driver
	// does.
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		m, ret := d.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return nvml.Memory_v2{}, ret
		}
		reserved := min(p.reservedMiB<<20, m.Used)
		return nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: m.Total, Reserved: reserved, Free: m.Free, Used: m.Used - reserved}, nvml.SUCCESS
	}
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{MultiprocessorCount: p.sms, MemorySizeMB: p.memoryMiB}, nvml.SUCCESS
	}
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pci, nvml.SUCCESS }
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return numa, nvml.SUCCESS }
	// Mock GPUs are in the Default compute mode, as a GPU is unless an
	// admin changed it.
	d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return nvml.COMPUTEMODE_DEFAULT, nvml.SUCCESS }

	// remote returns the far end of link l: a PCI bus number and what sits there.
	remote := func(l int) (uint8, nvml.IntNvLinkDeviceType) {
		if len(p.switches) > 0 {
			return p.switches[l%len(p.switches)], nvml.NVLINK_DEVICE_TYPE_SWITCH
		}
		return p.buses[i^1], nvml.NVLINK_DEVICE_TYPE_GPU
	}
	linkRet := func(l int) nvml.Return {
		switch {
		case p.links == 0:
			return nvml.ERROR_NOT_SUPPORTED
		case l < 0 || l >= p.links:
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
		if ret := linkRet(l); ret != nvml.SUCCESS {
			return nvml.FEATURE_DISABLED, ret
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		if ret := linkRet(l); ret != nvml.SUCCESS {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, ret
		}
		_, kind := remote(l)
		return kind, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
		if ret := linkRet(l); ret != nvml.SUCCESS {
			return nvml.PciInfo{}, ret
		}
		bus, _ := remote(l)
		return pciInfo(bus), nvml.SUCCESS
	}
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		if p.fabric == nil {
			return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return p.fabric(i), nvml.SUCCESS
	}
	return d
}

// mockUUID is GPU i's UUID on a mock node of the named profile: a name-based
// (version 5 style) UUID, so it never changes between runs.
func mockUUID(profile string, i int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "tessera-mock/%s/%d", profile, i))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x50
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// nvmlBusID is how NVML spells a domain-0 bus id: 8-digit domain, upper case.
func nvmlBusID(bus uint8) string {
	return fmt.Sprintf("%08X:%02X:00.0", 0, bus)
}

func pciInfo(bus uint8) nvml.PciInfo {
	pci := nvml.PciInfo{Bus: uint32(bus)}
	copy(pci.BusId[:], nvmlBusID(bus))
	copy(pci.BusIdLegacy[:], fmt.Sprintf("%04X:%02X:00.0", 0, bus))
	return pci
}
