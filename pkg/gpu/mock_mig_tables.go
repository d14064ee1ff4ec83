package gpu

import (
	"maps"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// GPU-instance profile tables of the mock MIG GPUs.
//
// Names, instance counts, memory and SM fractions, media engines and copy
// engines: NVIDIA Multi-Instance GPU User Guide (r580), "Supported MIG
// Profiles", tables "GPU Instance Profiles on A100", "... on H100", "... on
// H200". Possible placements: the guide's `nvidia-smi mig -lgipp` output
// ("Getting Started with MIG": profile 19 and 20 {0..6}:1, 15 {0,2,4,6}:2,
// 14 {0,2,4}:2, 9 {0,4}:4, 5 {0}:4, 0 {0}:8), which published transcripts of
// A100, H100 SXM and H100 NVL nodes repeat unchanged. Profile IDs, memory
// (nvidia-smi's GiB × 1024 = NVML's MiB) and SM counts: the
// `nvidia-smi mig -lgip` output of each product as quoted below. A figure
// marked "assumed" was not found in any source.
//
// These are the mock's facts, not measurements: a real GPU's
// nvmlDeviceGetGpuInstanceProfileInfo is what discovery publishes.

// mockMIGProfile is one row of a profile table.
type mockMIGProfile struct {
	index  int    // NVML_GPU_INSTANCE_PROFILE_* it is queried with
	id     uint32 // profile ID (nvidia-smi mig -lgip)
	name   string
	slices uint32 // compute slices
	memMiB uint64
	sms    uint32
	ce     uint32
	dec    uint32
	enc    uint32
	jpeg   uint32
	ofa    uint32
	max    uint32 // instances at most
	size   uint32 // memory slices of every placement
	starts []uint32
}

// mockMIGTable is the MIG geometry of one product.
type mockMIGTable struct {
	product      string
	memorySlices uint32
	profiles     []mockMIGProfile
}

var (
	oneSliceStarts = []uint32{0, 1, 2, 3, 4, 5, 6}
	twoSliceStarts = []uint32{0, 2, 4, 6}
	twoGStarts     = []uint32{0, 2, 4}
	fourStarts     = []uint32{0, 4}
	firstOnly      = []uint32{0}
)

// eightSliceGeometry is the geometry of the products here, all of eight
// memory slices: profile, ID, compute slices, instances and placements of
// the seven GPU-instance profiles, largest first. A product's table adds
// names, memory, SMs and engines in this order (eightSliceTable).
var eightSliceGeometry = [7]mockMIGProfile{
	{index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, id: 0, slices: 7, max: 1, size: 8, starts: firstOnly},
	{index: nvml.GPU_INSTANCE_PROFILE_4_SLICE, id: 5, slices: 4, max: 1, size: 4, starts: firstOnly},
	{index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, id: 9, slices: 3, max: 2, size: 4, starts: fourStarts},
	{index: nvml.GPU_INSTANCE_PROFILE_2_SLICE, id: 14, slices: 2, max: 3, size: 2, starts: twoGStarts},
	{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, id: 15, slices: 1, max: 4, size: 2, starts: twoSliceStarts},
	{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, id: 19, slices: 1, max: 7, size: 1, starts: oneSliceStarts},
	{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, id: 20, slices: 1, max: 1, size: 1, starts: oneSliceStarts},
}

// mockEngines are a profile's copy engines, decoders, JPEG decoders and OFAs.
type mockEngines struct{ ce, dec, jpeg, ofa uint32 }

// The engines of the seven profiles in eightSliceGeometry's order: the A100s
// share one set, the H100 and H200 another.
var (
	mockAmpereEngines = [7]mockEngines{{7, 5, 1, 1}, {4, 2, 0, 0}, {3, 2, 0, 0}, {2, 1, 0, 0}, {1, 1, 0, 0}, {1, 0, 0, 0}, {1, 1, 1, 1}}
	mockHopperEngines = [7]mockEngines{{8, 7, 7, 1}, {4, 4, 4, 0}, {3, 3, 3, 0}, {2, 2, 2, 0}, {1, 1, 1, 0}, {1, 1, 1, 0}, {1, 1, 1, 1}}
)

// mockFigures are a profile's name, memory (MiB) and SMs.
type mockFigures struct {
	name   string
	memMiB uint64
	sms    uint32
}

// eightSliceTable is the table of a product with eightSliceGeometry: the
// engines and figures of its profiles in that order.
func eightSliceTable(product string, engines [7]mockEngines, figures [7]mockFigures) *mockMIGTable {
	t := &mockMIGTable{product: product, memorySlices: 8}
	for i, p := range eightSliceGeometry {
		e, f := engines[i], figures[i]
		p.name, p.memMiB, p.sms = f.name, f.memMiB, f.sms
		p.ce, p.dec, p.jpeg, p.ofa = e.ce, e.dec, e.jpeg, e.ofa
		t.profiles = append(t.profiles, p)
	}
	return t
}

// mockMIGTables are the profile tables by product name.
var mockMIGTables = map[string]*mockMIGTable{
	// A100-SXM4-40GB: IDs, memory, SMs and engines from the guide's
	// `nvidia-smi mig -lgip` example (an A100-SXM4-40GB): 1g.5gb 4.75 GiB 14
	// SMs, 1g.10gb 9.62 GiB 14, 2g.10gb 9.62 GiB 28, 3g.20gb 19.50 GiB 42,
	// 4g.20gb 19.50 GiB 56, 7g.40gb 39.25 GiB 98; the MiB figures are those
	// of go-nvml's dgxa100 mock (4864, 9856).
	"NVIDIA A100-SXM4-40GB": eightSliceTable("NVIDIA A100-SXM4-40GB", mockAmpereEngines,
		[7]mockFigures{{"7g.40gb", 40192, 98}, {"4g.20gb", 19968, 56}, {"3g.20gb", 19968, 42}, {"2g.10gb", 9856, 28}, {"1g.10gb", 9856, 14}, {"1g.5gb", 4864, 14}, {"1g.5gb+me", 4864, 14}}),
	// A100 80GB: a published `nvidia-smi mig -lgip` of an A100 80GB PCIe
	// (driver 515.86.01): 1g.10gb 9.50 GiB 14 SMs, 2g.20gb 19.50 GiB 28,
	// 3g.40gb 39.25 GiB 42, 4g.40gb 39.25 GiB 56, 7g.80gb 79.00 GiB 98, with
	// the A100-40GB's engines. That driver did not list 1g.20gb (profile
	// 15), which the guide names for the 80GB product: its figures are
	// assumed to be those of the 40GB product's 1g.10gb scaled to 80GB (the
	// memory of 2g.20gb, 14 SMs, 1 decoder).
	"NVIDIA A100 80GB PCIe": eightSliceTable("NVIDIA A100 80GB PCIe", mockAmpereEngines,
		[7]mockFigures{{"7g.80gb", 80896, 98}, {"4g.40gb", 40192, 56}, {"3g.40gb", 40192, 42}, {"2g.20gb", 19968, 28}, {"1g.20gb", 19968, 14}, {"1g.10gb", 9728, 14}, {"1g.10gb+me", 9728, 14}}),
	// H100 80GB HBM3: published `nvidia-smi mig -lgip` output of H100 80GB
	// HBM3 nodes: 1g.10gb 9.75 GiB 16 SMs, 1g.20gb 19.62 GiB 26, 2g.20gb
	// 19.62 GiB 32, 3g.40gb 39.50 GiB 60, 4g.40gb 39.50 GiB 64, 7g.80gb
	// 79.25 GiB 132 (another driver reports 39.38 and 79.12 GiB).
	"NVIDIA H100 80GB HBM3": eightSliceTable("NVIDIA H100 80GB HBM3", mockHopperEngines,
		[7]mockFigures{{"7g.80gb", 81152, 132}, {"4g.40gb", 40448, 64}, {"3g.40gb", 40448, 60}, {"2g.20gb", 20096, 32}, {"1g.20gb", 20096, 26}, {"1g.10gb", 9984, 16}, {"1g.10gb+me", 9984, 16}}),
	// H200 141GB: names, counts and engines from the guide; the profile IDs
	// are assumed to be the H100's (the guide lists none for the H200).
	// Memory and SMs of 1g.18gb (16.00 GiB, 16 SMs), 2g.35gb (32.50 GiB, 32)
	// and 7g.141gb (140.00 GiB, 132) from an `nvidia-smi mig -lgip` fixture
	// in a public test suite; 1g.35gb (the memory of 2g.35gb, 26 SMs),
	// 3g.71gb and 4g.71gb (69.75 GiB, 60 and 64 SMs) are assumed from the
	// H100's proportions.
	"NVIDIA H200": eightSliceTable("NVIDIA H200", mockHopperEngines,
		[7]mockFigures{{"7g.141gb", 143360, 132}, {"4g.71gb", 71424, 64}, {"3g.71gb", 71424, 60}, {"2g.35gb", 33280, 32}, {"1g.35gb", 33280, 26}, {"1g.18gb", 16384, 16}, {"1g.18gb+me", 16384, 16}}),
}

// mockH200MemoryMiB is the total an H200 (SXM) reports: nvidia-smi's
// "143771MiB" in published transcripts. No built-in node profile has H200s;
// the table is used by tests and MockMIGTable.
const mockH200MemoryMiB = 143771

// byID is the table's profile with this ID.
func (t *mockMIGTable) byID(id uint32) (*mockMIGProfile, bool) {
	for i := range t.profiles {
		if t.profiles[i].id == id {
			return &t.profiles[i], true
		}
	}
	return nil, false
}

// byIndex is the table's profile queried with this NVML_GPU_INSTANCE_PROFILE_*.
func (t *mockMIGTable) byIndex(index int) (*mockMIGProfile, bool) {
	for i := range t.profiles {
		if t.profiles[i].index == index {
			return &t.profiles[i], true
		}
	}
	return nil, false
}

// byName is the table's profile with this name ("3g.40gb").
func (t *mockMIGTable) byName(name string) (*mockMIGProfile, bool) {
	for i := range t.profiles {
		if t.profiles[i].name == name {
			return &t.profiles[i], true
		}
	}
	return nil, false
}

// full is the full-GPU profile: the one with the most compute slices.
func (t *mockMIGTable) full() *mockMIGProfile {
	best := &t.profiles[0]
	for i := range t.profiles {
		if t.profiles[i].slices > best.slices {
			best = &t.profiles[i]
		}
	}
	return best
}

func (p *mockMIGProfile) info() nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id: p.id, SliceCount: p.slices, InstanceCount: p.max, MultiprocessorCount: p.sms,
		CopyEngineCount: p.ce, DecoderCount: p.dec, EncoderCount: p.enc, JpegCount: p.jpeg, OfaCount: p.ofa,
		MemorySizeMB: p.memMiB,
	}
}

func (p *mockMIGProfile) placements() []nvml.GpuInstancePlacement {
	out := make([]nvml.GpuInstancePlacement, 0, len(p.starts))
	for _, s := range p.starts {
		out = append(out, nvml.GpuInstancePlacement{Start: s, Size: p.size})
	}
	return out
}

// MockMIGProducts are the products the mock has MIG profile tables for,
// sorted.
func MockMIGProducts() []string {
	return slices.Sorted(maps.Keys(mockMIGTables))
}

// MockMIGTable is the mock's MIG geometry of a product (see
// MockMIGProducts): profiles with their placements and the slice counts, as
// discovery would describe a GPU of that product in MIG mode with no
// instance. It is the mock's table (NVIDIA's MIG user guide, with the
// figures it lacks assumed; see the table comments), for simulations and
// tests; a node's own discovery is what the plugin publishes.
func MockMIGTable(product string) (MIG, bool) {
	t, ok := mockMIGTables[product]
	if !ok {
		return MIG{}, false
	}
	m := MIG{PendingEnabled: true, MemorySlices: int(t.memorySlices), ComputeSlices: int(t.full().slices)}
	for _, p := range t.profiles {
		mp := MIGProfile{
			Index: p.index, ID: int(p.id), Name: p.name, ComputeSlices: int(p.slices), MemorySlices: int(p.size),
			MemoryBytes: p.memMiB << 20, Multiprocessors: int(p.sms), CopyEngines: int(p.ce), Decoders: int(p.dec),
			Encoders: int(p.enc), JPEGs: int(p.jpeg), OFAs: int(p.ofa), MaxInstances: int(p.max),
		}
		for _, s := range p.starts {
			mp.Placements = append(mp.Placements, MIGPlacement{Start: int(s), Size: int(p.size)})
		}
		m.Profiles = append(m.Profiles, mp)
	}
	slices.SortFunc(m.Profiles, func(a, b MIGProfile) int { return a.ID - b.ID })
	return m, true
}
