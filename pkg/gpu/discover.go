package gpu

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Discover lists the GPUs that lib sees, with their facts and NVLink domain,
// sorted by minor number, and fails if any GPU cannot be described. It is
// DiscoverNode for callers that need every GPU or nothing (the CLI, tests);
// the kubelet plugin uses DiscoverNode, so that one broken GPU does not stop
// the node. The error of a broken GPU is its [Failure] (the one with the
// lowest index).
func Discover(lib nvml.Interface) ([]GPU, error) {
	d, err := DiscoverNode(lib)
	if err != nil {
		return nil, err
	}
	if len(d.Failed) > 0 {
		return nil, d.Failed[0]
	}
	return d.GPUs, nil
}

// Discovery is what DiscoverNode found: the GPUs it could describe and the
// ones it could not.
type Discovery struct {
	// GPUs are the fully described GPUs, sorted by minor number.
	GPUs []GPU
	// Failed are the GPUs NVML enumerates but that could not be described,
	// sorted by index.
	Failed []Failure
	// MIGMinorsError says why the MIG capability minors of GPUs in MIG mode
	// are (partly) unknown (AccessMinor -1): the mig-minors file could not be
	// read, or lines of it were malformed. Empty when they were read or no
	// GPU is in MIG mode.
	MIGMinorsError string
}

// DiscoverOptions tune DiscoverNodeWith. The zero value is what DiscoverNode
// does.
type DiscoverOptions struct {
	// MIGMinors, when not nil, is the content of the driver's mig-minors
	// file (see ParseMIGMinors), read instead of the file.
	MIGMinors []byte
	// MIGMinorsPath is the mig-minors file read when MIGMinors is nil and
	// lib does not give the content itself (a MockNode does); empty means
	// MIGMinorsPath. It is read only when a GPU is in MIG mode.
	MIGMinorsPath string
}

// Failure is a GPU that NVML enumerates but that discovery could not
// describe. It is an error: "GPU index <i> (<uuid>): <nvml call>: <return>",
// wrapping the nvml.Return.
type Failure struct {
	// Index is NVML's enumeration index.
	Index int
	// UUID is empty when it could not be read.
	UUID string
	// Minor is -1 when it could not be read.
	Minor int
	// Err names the NVML call that failed and wraps its nvml.Return.
	Err error
	// Partial holds the facts read before the failure when they are enough
	// to publish the GPU: UUID, minor number and memory size. Facts not read
	// are zero (NVLinkDomain is always empty: a GPU that failed is in no
	// domain). Nil when any of the three is unknown.
	Partial *GPU
}

func (f Failure) Error() string {
	if f.UUID != "" {
		return fmt.Sprintf("GPU index %d (%s): %v", f.Index, f.UUID, f.Err)
	}
	return fmt.Sprintf("GPU index %d: %v", f.Index, f.Err)
}

func (f Failure) Unwrap() error { return f.Err }

// DiscoverNode lists the GPUs that lib sees, with their facts and NVLink
// domain, sorted by minor number. The caller has initialised lib (see Open)
// and shuts it down; DiscoverNode only reads.
//
// A GPU that fails is reported in Failed and left out of GPUs and of the
// NVLink domains; the others are described as if it were not there. Only a
// failure that concerns the whole node (driver version, device count) is an
// error. A node without GPUs gives an empty Discovery and no error.
//
// Facts a driver or GPU does not support are left at their zero value instead of
// failing discovery: NUMANode stays nil, MultiprocessorCount 0, MIGEnabled false
// and MIG nil, ComputeMode and Fabric empty, and a GPU without NVLink forms its
// own domain. A GPU in MIG mode is described with its MIG profiles, their
// placements, its GPU and compute instances and their capability minors (see
// MIG); an NVML failure of those queries does not fail the GPU either: what
// was read is kept and the failure is in MIGError.
// An NVML failure of the NVLink or fabric queries (nvmlDeviceGetNvLink*,
// nvmlDeviceGetGpuFabricInfo) does not fail the GPU either: it is described
// in an NVLink domain of its own with the error in NVLinkError, since a GPU
// whose links cannot be read may still compute (see Conditions for what
// callers make of that, of Fabric and of ComputeMode). Calls that newer drivers added
// (nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetNumaNodeId, nvmlDeviceGetGpuFabricInfo,
// nvmlDeviceGetNvLinkRemoteDeviceType) are made only when the loaded library
// exports them, because go-nvml binds symbols lazily and calling a missing one
// kills the process. Any other NVML failure fails the GPU; its Failure names
// the GPU (index, and UUID once known) and the NVML call, and wraps the
// nvml.Return so callers can use errors.Is(err, nvml.ERROR_GPU_IS_LOST).
//
// Calls made: SystemGetDriverVersion, SystemGetCudaDriverVersion, DeviceGetCount,
// DeviceGetHandleByIndex, Extensions().LookupSymbol, and on each device GetUUID,
// GetMinorNumber, GetIndex, GetName, GetArchitecture, GetCudaComputeCapability,
// GetMemoryInfo_v2 (GetMemoryInfo where v2 is missing or refused),
// GetAttributes, GetPciInfo, GetNumaNodeId, GetMigMode, GetComputeMode,
// GetNvLinkState, GetNvLinkRemoteDeviceType, GetNvLinkRemotePciInfo and
// GetGpuFabricInfo; on a GPU in MIG mode also GetGpuInstanceProfileInfo
// (GetGpuInstanceProfileInfoV where the library exports it),
// GetGpuInstancePossiblePlacements, GetGpuInstances, GetMaxMigDeviceCount,
// GetMigDeviceHandleByIndex, on each GPU instance GetInfo,
// GetComputeInstanceProfileInfo and GetComputeInstances, on each compute
// instance GetInfo, and on each MIG device GetGpuInstanceId,
// GetComputeInstanceId, GetUUID, GetMemoryInfo, GetAttributes and
// GetComputeRunningProcesses. A mock must implement all of them (see
// NewMockNode).
// A lib that also has a PCIeRoot(pciBusID) (string, bool) method (MockNode)
// gives each GPU its PCIeRoot; over the real NVML it stays empty.
func DiscoverNode(lib nvml.Interface) (Discovery, error) {
	return DiscoverNodeWith(lib, DiscoverOptions{})
}

// DiscoverNodeWith is DiscoverNode with options: where the MIG capability
// minors come from.
func DiscoverNodeWith(lib nvml.Interface, opts DiscoverOptions) (Discovery, error) {
	driver, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return Discovery{}, nvmlError("nvmlSystemGetDriverVersion", ret)
	}
	cudaVersion, ret := lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return Discovery{}, nvmlError("nvmlSystemGetCudaDriverVersion", ret)
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Discovery{}, nvmlError("nvmlDeviceGetCount", ret)
	}
	sym := lookupSymbols(lib)
	roots, _ := lib.(pcieRootSource)
	minors := newMIGMinorsLoader(lib, opts)

	var d Discovery
	gpus := make([]GPU, 0, count)
	links := make([]NVLinkPeers, 0, count)
	for i := range count {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			d.Failed = append(d.Failed, Failure{Index: i, Minor: -1, Err: nvmlError("nvmlDeviceGetHandleByIndex", ret)})
			continue
		}
		g, err := describe(dev, sym, minors)
		if roots != nil && g.PCIBusID != "" {
			g.PCIeRoot, _ = roots.PCIeRoot(g.PCIBusID)
		}
		g.DriverVersion = driver
		g.CUDADriverVersion = cudaDriverVersion(cudaVersion)
		if err != nil {
			d.Failed = append(d.Failed, failure(i, g, err))
			continue
		}
		// An NVLink or fabric query that fails says nothing about whether
		// the GPU computes: it is published in a domain of its own
		// (NVLinkError says why) rather than dropped.
		peers, linkErr := probeNVLink(dev, sym, g.UUID, g.PCIBusID)
		fabric, fabricErr := probeFabric(dev, sym)
		g.Fabric, g.FabricError = fabric.state, fabric.err
		if err := errors.Join(linkErr, fabricErr); err != nil {
			g.NVLinkError = strings.ReplaceAll(err.Error(), "\n", "; ")
			peers = NVLinkPeers{UUID: g.UUID, PCIBusID: g.PCIBusID, Unknown: true}
		} else {
			peers.Fabric = fabric.key
		}
		gpus = append(gpus, g)
		links = append(links, peers)
	}

	domains := NVLinkDomains(links)
	for i := range gpus {
		gpus[i].NVLinkDomain = domains[gpus[i].UUID]
	}
	slices.SortStableFunc(gpus, func(a, b GPU) int { return cmp.Compare(a.Minor, b.Minor) })
	d.GPUs = gpus
	if minors.err != nil {
		d.MIGMinorsError = strings.ReplaceAll(minors.err.Error(), "\n", "; ")
	}
	return d, nil
}

// pcieRootSource is an NVML that also knows the PCIe topology: the mock
// nodes. The real NVML has no call for it; sysfs has (SysfsPCIeRoots).
type pcieRootSource interface {
	PCIeRoot(pciBusID string) (string, bool)
}

// failure reports GPU index i, of which g was read before err.
func failure(i int, g GPU, err error) Failure {
	f := Failure{Index: i, UUID: g.UUID, Minor: g.Minor, Err: err}
	if g.UUID != "" && g.Minor >= 0 && g.MemoryBytes > 0 {
		g.NVLinkDomain = ""
		f.Partial = &g
	}
	return f
}

// describe reads the per-device facts. On error the returned GPU carries the
// facts read before the failure: UUID empty and Minor -1 when not read.
func describe(dev nvml.Device, sym symbols, minors *migMinorsLoader) (GPU, error) {
	g := GPU{Minor: -1}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return g, nvmlError("nvmlDeviceGetUUID", ret)
	}
	g.UUID = uuid
	minor, ret := dev.GetMinorNumber()
	if ret != nvml.SUCCESS || minor < 0 {
		if ret == nvml.SUCCESS {
			return g, fmt.Errorf("nvmlDeviceGetMinorNumber: negative minor number %d", minor)
		}
		return g, nvmlError("nvmlDeviceGetMinorNumber", ret)
	}
	g.Minor = minor
	if g.Index, ret = dev.GetIndex(); ret != nvml.SUCCESS {
		return g, nvmlError("nvmlDeviceGetIndex", ret)
	}
	if g.ProductName, ret = dev.GetName(); ret != nvml.SUCCESS {
		return g, nvmlError("nvmlDeviceGetName", ret)
	}

	arch, ret := dev.GetArchitecture()
	switch {
	case ret == nvml.SUCCESS:
		g.Architecture = architectureName(arch)
	case absent(ret):
		g.Architecture = architectureName(nvml.DEVICE_ARCH_UNKNOWN)
	default:
		return g, nvmlError("nvmlDeviceGetArchitecture", ret)
	}

	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return g, nvmlError("nvmlDeviceGetCudaComputeCapability", ret)
	}
	g.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)

	if err := readMemory(dev, sym, &g); err != nil {
		return g, err
	}

	// nvmlDeviceGetAttributes is documented for MIG device handles; drivers that
	// refuse it for a full GPU leave the SM count unknown rather than failing.
	attrs, ret := dev.GetAttributes()
	switch {
	case ret == nvml.SUCCESS:
		g.MultiprocessorCount = int(attrs.MultiprocessorCount)
	case !absent(ret):
		return g, nvmlError("nvmlDeviceGetAttributes", ret)
	}

	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return g, nvmlError("nvmlDeviceGetPciInfo", ret)
	}
	busID, err := pciBusID(pci)
	if err != nil {
		return g, fmt.Errorf("nvmlDeviceGetPciInfo: %w", err)
	}
	g.PCIBusID = busID

	if sym.numaNode {
		node, ret := dev.GetNumaNodeId()
		switch {
		case ret == nvml.SUCCESS:
			// The driver reports "no NUMA affinity" as (uint32)-1.
			if node >= 0 && node < 1<<16 {
				g.NUMANode = &node
			}
		case !absent(ret):
			return g, nvmlError("nvmlDeviceGetNumaNodeId", ret)
		}
	}

	current, pending, ret := dev.GetMigMode()
	switch {
	case ret == nvml.SUCCESS:
		g.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
		g.MIG = &MIG{PendingEnabled: pending == nvml.DEVICE_MIG_ENABLE}
	case !absent(ret):
		return g, nvmlError("nvmlDeviceGetMigMode", ret)
	}

	// Read only: the compute mode belongs to the admin (nvidia-smi -c) or
	// to whatever manages the GPU; Conditions compares it with the mode
	// Tessera expects.
	mode, ret := dev.GetComputeMode()
	switch {
	case ret == nvml.SUCCESS:
		g.ComputeMode = computeModeName(mode)
	case !absent(ret):
		// Unknown, not fatal: a GPU is not dropped over a fact Tessera
		// only reads (vGPU and sandboxes may refuse the query).
		g.ComputeModeError = nvmlError("nvmlDeviceGetComputeMode", ret).Error()
	}

	// Last, so that a GPU whose MIG queries fail is described with every
	// other fact (see ReasonMIGUnknown).
	if g.MIGEnabled {
		describeMIG(dev, &g, sym, minors)
	}
	return g, nil
}

// symbols records which optional NVML entry points the loaded library exports.
type symbols struct {
	memoryInfoV2     bool
	numaNode         bool
	fabricInfo       bool
	nvlinkRemoteType bool
	profileInfoV     bool
}

func lookupSymbols(lib nvml.Interface) symbols {
	ext := lib.Extensions()
	has := func(name string) bool { return ext != nil && ext.LookupSymbol(name) == nil }
	return symbols{
		memoryInfoV2:     has("nvmlDeviceGetMemoryInfo_v2"),
		numaNode:         has("nvmlDeviceGetNumaNodeId"),
		fabricInfo:       has("nvmlDeviceGetGpuFabricInfo"),
		nvlinkRemoteType: has("nvmlDeviceGetNvLinkRemoteDeviceType"),
		profileInfoV:     has("nvmlDeviceGetGpuInstanceProfileInfoV"),
	}
}

// absent reports whether ret means "this GPU or driver does not have that", as
// opposed to a failure: NOT_SUPPORTED, and INVALID_ARGUMENT which NVML returns for
// a link index beyond the GPU's link count.
func absent(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT
}

// nvmlError names the NVML call and wraps its Return (an error).
func nvmlError(call string, ret nvml.Return) error {
	return fmt.Errorf("%s: %w", call, ret)
}

// architectureName maps NVML's architecture enum to the lower-case name published
// as the architecture attribute.
func architectureName(arch nvml.DeviceArchitecture) string {
	switch arch {
	case nvml.DEVICE_ARCH_KEPLER:
		return "kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "volta"
	case nvml.DEVICE_ARCH_TURING:
		return "turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "ada"
	case nvml.DEVICE_ARCH_HOPPER:
		return "hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "blackwell"
	default:
		return "unknown"
	}
}

// cudaDriverVersion turns NVML's 1000*major + 10*minor (12040) into "12.4".
func cudaDriverVersion(v int) string {
	return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
}

// pciBusID returns the canonical bus id of a PciInfo, from its BusId string.
func pciBusID(pci nvml.PciInfo) (string, error) {
	n := 0
	for n < len(pci.BusId) && pci.BusId[n] != 0 {
		n++
	}
	return normalizePCIBusID(string(pci.BusId[:n]))
}

// normalizePCIBusID turns NVML's "00000000:07:00.0" (8-digit upper-case domain)
// into the sysfs form "0000:07:00.0": lower case, domain with 4 digits (more only
// when the domain needs them, as sysfs does), 2-digit bus and device, 1-digit
// function. A missing domain ("07:00.0") means domain 0.
func normalizePCIBusID(id string) (string, error) {
	parts := strings.Split(strings.TrimSpace(id), ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return "", fmt.Errorf("malformed PCI bus id %q", id)
	}
	devFn := strings.Split(parts[2], ".")
	if len(devFn) != 2 {
		return "", fmt.Errorf("malformed PCI bus id %q", id)
	}
	fields := []struct {
		s    string
		bits int
	}{{parts[0], 32}, {parts[1], 8}, {devFn[0], 5}, {devFn[1], 3}}
	var v [4]uint64
	for i, f := range fields {
		n, err := strconv.ParseUint(f.s, 16, f.bits)
		if err != nil || f.s == "" {
			return "", fmt.Errorf("malformed PCI bus id %q", id)
		}
		v[i] = n
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", v[0], v[1], v[2], v[3]), nil
}
