package model

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// MIG profile tables, written by hand from NVIDIA's documentation (not from
// Tessera's mock NVML, which did not have them yet):
//
//   - profiles, their engines (NVDEC/JPEG/OFA), copy engines and instance
//     counts: NVIDIA Multi-Instance GPU User Guide (r580), "Supported MIG
//     Profiles", Table 6 (A100; the A100-SXM4-80GB has the same profiles with
//     the memory doubled in their names), Table 7 (H100 80GB), Table 8 (H200
//     141GB): https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html
//   - placements: `nvidia-smi mig -lgipp` as the same guide prints it for an
//     A100 ("Getting Started with MIG": 19 {0..6}:1, 20 {0..6}:1,
//     15 {0,2,4,6}:2, 14 {0,2,4}:2, 9 {0,4}:4, 5 {0}:4, 0 {0}:8), and the
//     same output quoted for H100 (Colfax Research, "Sharing NVIDIA GPUs at
//     the System Level", H100 NVL). H200: assumed the same (same GH100 die,
//     Table 8 lists the same instance counts), not seen printed;
//   - profile IDs, memory (GiB as nvidia-smi mig -lgip rounds it) and SM
//     counts: `nvidia-smi mig -lgip` output quoted for A100 40GB, A100 80GB and
//     H100 80GB in public write-ups (e.g. jbarrow.ai/field_notes/nvidia-mig for
//     H100 80GB). H200 memory and SMs: assumed (the profile name's GB, the
//     H100's SMs); nothing in the allocator tests depends on them.
//
// The tests take their expectations from the guide's combinations, never
// from these tables or the model's counters.

// migRow is one row of a profile table.
type migRow struct {
	index, id     int
	name          string
	compute, size int // compute slices; memory slices of every placement
	memoryMiB     uint64
	sms           int
	ce, dec, jpeg int
	ofa           int
	max           int
	starts        []int
}

func (r migRow) profile() gpu.MIGProfile {
	p := gpu.MIGProfile{
		Index: r.index, ID: r.id, Name: r.name,
		ComputeSlices: r.compute, MemorySlices: r.size,
		MemoryBytes: r.memoryMiB << 20, Multiprocessors: r.sms,
		CopyEngines: r.ce, Decoders: r.dec, JPEGs: r.jpeg, OFAs: r.ofa,
		MaxInstances: r.max,
	}
	for _, s := range r.starts {
		p.Placements = append(p.Placements, gpu.MIGPlacement{Start: s, Size: r.size})
	}
	return p
}

var (
	all1g  = []int{0, 1, 2, 3, 4, 5, 6}
	even1g = []int{0, 2, 4, 6}
)

// migTable is one GPU model's MIG facts.
type migTable struct {
	product string
	// total is the full GPU's memory (MiB) as NVML reports it (published
	// only for the whole GPU, which a MIG-mode GPU does not publish).
	totalMiB uint64
	// small, double, two, three, four, seven and me name the profiles in
	// the guide's terms, so a test reads the same for every table.
	small, me, double, two, three, four, seven string
	rows                                       []migRow
}

var migTables = map[string]migTable{
	"H100 80GB": {
		product: "NVIDIA H100 80GB HBM3", totalMiB: 81559,
		small: "1g.10gb", me: "1g.10gb+me", double: "1g.20gb", two: "2g.20gb", three: "3g.40gb", four: "4g.40gb", seven: "7g.80gb",
		rows: []migRow{
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.10gb", 1, 1, 9984, 16, 1, 1, 1, 0, 7, all1g},
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 9984, 16, 1, 1, 1, 1, 1, all1g},
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 2, 20096, 26, 1, 1, 1, 0, 4, even1g},
			{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.20gb", 2, 2, 20096, 32, 2, 2, 2, 0, 3, []int{0, 2, 4}},
			{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.40gb", 3, 4, 40448, 60, 3, 3, 3, 0, 2, []int{0, 4}},
			{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.40gb", 4, 4, 40448, 64, 4, 4, 4, 0, 1, []int{0}},
			{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.80gb", 7, 8, 81152, 132, 8, 7, 7, 1, 1, []int{0}},
		},
	},
	"A100 40GB": {
		product: "NVIDIA A100-SXM4-40GB", totalMiB: 40960,
		small: "1g.5gb", me: "1g.5gb+me", double: "1g.10gb", two: "2g.10gb", three: "3g.20gb", four: "4g.20gb", seven: "7g.40gb",
		rows: []migRow{
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.5gb", 1, 1, 4864, 14, 1, 0, 0, 0, 7, all1g},
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.5gb+me", 1, 1, 4864, 14, 1, 1, 1, 1, 1, all1g},
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.10gb", 1, 2, 9984, 14, 1, 1, 0, 0, 4, even1g},
			{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.10gb", 2, 2, 9984, 28, 2, 1, 0, 0, 3, []int{0, 2, 4}},
			{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.20gb", 3, 4, 20096, 42, 3, 2, 0, 0, 2, []int{0, 4}},
			{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.20gb", 4, 4, 20096, 56, 4, 2, 0, 0, 1, []int{0}},
			{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.40gb", 7, 8, 40320, 98, 7, 5, 1, 1, 1, []int{0}},
		},
	},
	"A100 80GB": {
		product: "NVIDIA A100-SXM4-80GB", totalMiB: 81920,
		small: "1g.10gb", me: "1g.10gb+me", double: "1g.20gb", two: "2g.20gb", three: "3g.40gb", four: "4g.40gb", seven: "7g.80gb",
		rows: []migRow{
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.10gb", 1, 1, 9728, 14, 1, 0, 0, 0, 7, all1g},
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 9728, 14, 1, 1, 1, 1, 1, all1g},
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 2, 19968, 14, 1, 1, 0, 0, 4, even1g},
			{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.20gb", 2, 2, 19968, 28, 2, 1, 0, 0, 3, []int{0, 2, 4}},
			{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.40gb", 3, 4, 40192, 42, 3, 2, 0, 0, 2, []int{0, 4}},
			{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.40gb", 4, 4, 40192, 56, 4, 2, 0, 0, 1, []int{0}},
			{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.80gb", 7, 8, 80896, 98, 7, 5, 1, 1, 1, []int{0}},
		},
	},
	"H200 141GB": {
		product: "NVIDIA H200", totalMiB: 143771,
		small: "1g.18gb", me: "1g.18gb+me", double: "1g.35gb", two: "2g.35gb", three: "3g.71gb", four: "4g.71gb", seven: "7g.141gb",
		rows: []migRow{
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.18gb", 1, 1, 18 << 10, 16, 1, 1, 1, 0, 7, all1g},
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.18gb+me", 1, 1, 18 << 10, 16, 1, 1, 1, 1, 1, all1g},
			{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.35gb", 1, 2, 35 << 10, 26, 1, 1, 1, 0, 4, even1g},
			{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.35gb", 2, 2, 35 << 10, 32, 2, 2, 2, 0, 3, []int{0, 2, 4}},
			{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.71gb", 3, 4, 71 << 10, 60, 3, 3, 3, 0, 2, []int{0, 4}},
			{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.71gb", 4, 4, 71 << 10, 64, 4, 4, 4, 0, 1, []int{0}},
			{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.141gb", 7, 8, 141 << 10, 132, 8, 7, 7, 1, 1, []int{0}},
		},
	},
}

// migFacts is the MIG state of a GPU of this table in MIG mode, with these
// GPU instances.
func (tb migTable) migFacts(instances ...gpu.MIGInstance) *gpu.MIG {
	m := &gpu.MIG{PendingEnabled: true, MemorySlices: 8, ComputeSlices: 7, Instances: instances}
	for _, r := range tb.rows {
		m.Profiles = append(m.Profiles, r.profile())
	}
	return m
}

// profileRow is the row of the profile with this name.
func (tb migTable) profileRow(name string) migRow {
	for _, r := range tb.rows {
		if r.name == name {
			return r
		}
	}
	panic("no profile " + name)
}

// instance is a GPU instance of profile name at start, with one compute
// instance (ID 0) spanning it, UUID MIG-<minor>-<gi>.
func (tb migTable) instance(minor, gi int, name string, start int) gpu.MIGInstance {
	r := tb.profileRow(name)
	return gpu.MIGInstance{
		ID: gi, ProfileID: r.id, ProfileName: name,
		Placement:   gpu.MIGPlacement{Start: start, Size: r.size},
		AccessMinor: -1,
		ComputeInstances: []gpu.MIGComputeInstance{{
			ID: 0, UUID: fmt.Sprintf("MIG-%08d-0000-0000-0000-%012d", minor, gi),
			MemoryBytes: r.memoryMiB << 20, Multiprocessors: r.sms, AccessMinor: -1, Processes: 0,
		}},
	}
}

// migGPUs are n GPUs of this table in MIG mode (fixtureGPUs otherwise), each
// with the instances instances(minor) returns (nil: none).
func (tb migTable) migGPUs(n int, instances func(minor int) []gpu.MIGInstance) []gpu.GPU {
	gpus := fixtureGPUs(n, 80, oneDomain)
	for i := range gpus {
		gpus[i].ProductName = tb.product
		gpus[i].MemoryBytes = tb.totalMiB << 20
		gpus[i].MIGEnabled = true
		var in []gpu.MIGInstance
		if instances != nil {
			in = instances(i)
		}
		gpus[i].MIG = tb.migFacts(in...)
	}
	return gpus
}
