package gpu

import (
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

// mockMIGTables are the profile tables by product name.
var mockMIGTables = map[string]*mockMIGTable{
	// A100-SXM4-40GB: IDs, memory, SMs and engines from the guide's
	// `nvidia-smi mig -lgip` example (an A100-SXM4-40GB): 1g.5gb 4.75 GiB 14
	// SMs, 1g.10gb 9.62 GiB 14, 2g.10gb 9.62 GiB 28, 3g.20gb 19.50 GiB 42,
	// 4g.20gb 19.50 GiB 56, 7g.40gb 39.25 GiB 98; the MiB figures are those
	// of go-nvml's dgxa100 mock (4864, 9856).
	"NVIDIA A100-SXM4-40GB": {
		product: "NVIDIA A100-SXM4-40GB", memorySlices: 8,
		profiles: []mockMIGProfile{
			{index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, id: 0, name: "7g.40gb", slices: 7, memMiB: 40192, sms: 98, ce: 7, dec: 5, jpeg: 1, ofa: 1, max: 1, size: 8, starts: firstOnly},
			{index: nvml.GPU_INSTANCE_PROFILE_4_SLICE, id: 5, name: "4g.20gb", slices: 4, memMiB: 19968, sms: 56, ce: 4, dec: 2, max: 1, size: 4, starts: firstOnly},
			{index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, id: 9, name: "3g.20gb", slices: 3, memMiB: 19968, sms: 42, ce: 3, dec: 2, max: 2, size: 4, starts: fourStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_2_SLICE, id: 14, name: "2g.10gb", slices: 2, memMiB: 9856, sms: 28, ce: 2, dec: 1, max: 3, size: 2, starts: twoGStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, id: 15, name: "1g.10gb", slices: 1, memMiB: 9856, sms: 14, ce: 1, dec: 1, max: 4, size: 2, starts: twoSliceStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, id: 19, name: "1g.5gb", slices: 1, memMiB: 4864, sms: 14, ce: 1, max: 7, size: 1, starts: oneSliceStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, id: 20, name: "1g.5gb+me", slices: 1, memMiB: 4864, sms: 14, ce: 1, dec: 1, jpeg: 1, ofa: 1, max: 1, size: 1, starts: oneSliceStarts},
		},
	},
	// A100 80GB: a published `nvidia-smi mig -lgip` of an A100 80GB PCIe
	// (driver 515.86.01): 1g.10gb 9.50 GiB 14 SMs, 2g.20gb 19.50 GiB 28,
	// 3g.40gb 39.25 GiB 42, 4g.40gb 39.25 GiB 56, 7g.80gb 79.00 GiB 98, with
	// the A100-40GB's engines. That driver did not list 1g.20gb (profile
	// 15), which the guide names for the 80GB product: its figures are
	// assumed to be those of the 40GB product's 1g.10gb scaled to 80GB (the
	// memory of 2g.20gb, 14 SMs, 1 decoder).
	"NVIDIA A100 80GB PCIe": {
		product: "NVIDIA A100 80GB PCIe", memorySlices: 8,
		profiles: []mockMIGProfile{
			{index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, id: 0, name: "7g.80gb", slices: 7, memMiB: 80896, sms: 98, ce: 7, dec: 5, jpeg: 1, ofa: 1, max: 1, size: 8, starts: firstOnly},
			{index: nvml.GPU_INSTANCE_PROFILE_4_SLICE, id: 5, name: "4g.40gb", slices: 4, memMiB: 40192, sms: 56, ce: 4, dec: 2, max: 1, size: 4, starts: firstOnly},
			{index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, id: 9, name: "3g.40gb", slices: 3, memMiB: 40192, sms: 42, ce: 3, dec: 2, max: 2, size: 4, starts: fourStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_2_SLICE, id: 14, name: "2g.20gb", slices: 2, memMiB: 19968, sms: 28, ce: 2, dec: 1, max: 3, size: 2, starts: twoGStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, id: 15, name: "1g.20gb", slices: 1, memMiB: 19968, sms: 14, ce: 1, dec: 1, max: 4, size: 2, starts: twoSliceStarts}, // assumed
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, id: 19, name: "1g.10gb", slices: 1, memMiB: 9728, sms: 14, ce: 1, max: 7, size: 1, starts: oneSliceStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, id: 20, name: "1g.10gb+me", slices: 1, memMiB: 9728, sms: 14, ce: 1, dec: 1, jpeg: 1, ofa: 1, max: 1, size: 1, starts: oneSliceStarts},
		},
	},
	// H100 80GB HBM3: published `nvidia-smi mig -lgip` output of H100 80GB
	// HBM3 nodes: 1g.10gb 9.75 GiB 16 SMs, 1g.20gb 19.62 GiB 26, 2g.20gb
	// 19.62 GiB 32, 3g.40gb 39.50 GiB 60, 4g.40gb 39.50 GiB 64, 7g.80gb
	// 79.25 GiB 132 (another driver reports 39.38 and 79.12 GiB).
	"NVIDIA H100 80GB HBM3": {
		product: "NVIDIA H100 80GB HBM3", memorySlices: 8,
		profiles: []mockMIGProfile{
			{index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, id: 0, name: "7g.80gb", slices: 7, memMiB: 81152, sms: 132, ce: 8, dec: 7, jpeg: 7, ofa: 1, max: 1, size: 8, starts: firstOnly},
			{index: nvml.GPU_INSTANCE_PROFILE_4_SLICE, id: 5, name: "4g.40gb", slices: 4, memMiB: 40448, sms: 64, ce: 4, dec: 4, jpeg: 4, max: 1, size: 4, starts: firstOnly},
			{index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, id: 9, name: "3g.40gb", slices: 3, memMiB: 40448, sms: 60, ce: 3, dec: 3, jpeg: 3, max: 2, size: 4, starts: fourStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_2_SLICE, id: 14, name: "2g.20gb", slices: 2, memMiB: 20096, sms: 32, ce: 2, dec: 2, jpeg: 2, max: 3, size: 2, starts: twoGStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, id: 15, name: "1g.20gb", slices: 1, memMiB: 20096, sms: 26, ce: 1, dec: 1, jpeg: 1, max: 4, size: 2, starts: twoSliceStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, id: 19, name: "1g.10gb", slices: 1, memMiB: 9984, sms: 16, ce: 1, dec: 1, jpeg: 1, max: 7, size: 1, starts: oneSliceStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, id: 20, name: "1g.10gb+me", slices: 1, memMiB: 9984, sms: 16, ce: 1, dec: 1, jpeg: 1, ofa: 1, max: 1, size: 1, starts: oneSliceStarts},
		},
	},
	// H200 141GB: names, counts and engines from the guide; the profile IDs
	// are assumed to be the H100's (the guide lists none for the H200).
	// Memory and SMs of 1g.18gb (16.00 GiB, 16 SMs), 2g.35gb (32.50 GiB, 32)
	// and 7g.141gb (140.00 GiB, 132) from an `nvidia-smi mig -lgip` fixture
	// in a public test suite; 1g.35gb (the memory of 2g.35gb, 26 SMs),
	// 3g.71gb and 4g.71gb (69.75 GiB, 60 and 64 SMs) are assumed from the
	// H100's proportions.
	"NVIDIA H200": {
		product: "NVIDIA H200", memorySlices: 8,
		profiles: []mockMIGProfile{
			{index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, id: 0, name: "7g.141gb", slices: 7, memMiB: 143360, sms: 132, ce: 8, dec: 7, jpeg: 7, ofa: 1, max: 1, size: 8, starts: firstOnly},
			{index: nvml.GPU_INSTANCE_PROFILE_4_SLICE, id: 5, name: "4g.71gb", slices: 4, memMiB: 71424, sms: 64, ce: 4, dec: 4, jpeg: 4, max: 1, size: 4, starts: firstOnly},
			{index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, id: 9, name: "3g.71gb", slices: 3, memMiB: 71424, sms: 60, ce: 3, dec: 3, jpeg: 3, max: 2, size: 4, starts: fourStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_2_SLICE, id: 14, name: "2g.35gb", slices: 2, memMiB: 33280, sms: 32, ce: 2, dec: 2, jpeg: 2, max: 3, size: 2, starts: twoGStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, id: 15, name: "1g.35gb", slices: 1, memMiB: 33280, sms: 26, ce: 1, dec: 1, jpeg: 1, max: 4, size: 2, starts: twoSliceStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, id: 19, name: "1g.18gb", slices: 1, memMiB: 16384, sms: 16, ce: 1, dec: 1, jpeg: 1, max: 7, size: 1, starts: oneSliceStarts},
			{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, id: 20, name: "1g.18gb+me", slices: 1, memMiB: 16384, sms: 16, ce: 1, dec: 1, jpeg: 1, ofa: 1, max: 1, size: 1, starts: oneSliceStarts},
		},
	},
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
	out := make([]string, 0, len(mockMIGTables))
	for name := range mockMIGTables {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
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
