package fleet

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

// MIG is dynamic MIG (issue 23, docs/mig.md): every GPU of the fleet is in
// MIG mode and published the way the kubelet plugin publishes a GPU named
// in dynamicMIG — every placement of every GPU-instance profile a device,
// all consuming the GPU's counter set (one counter per memory slice,
// compute slices, engines) — so the real allocator enforces NVIDIA's
// placement rules. Each job asks for one MIG device of the smallest plain
// profile whose memory and compute both cover its request (migProfileFor).
// A job asking for whole GPUs (Job.GPUs > 0) is refused: a CUDA process uses
// one MIG device and MIG devices have no peer-to-peer, so such a job needs a
// GPU out of MIG mode, which this model's fleet does not have (Run returns
// an error; MIGBench reports the row as skipped).
const MIG Kind = "mig"

// MIGBySlices is MIG with jobs rounded up by slices instead of bytes: the
// smallest plain profile whose memory slices / 8 and compute slices / 7
// cover the job's memory and cores fractions, as `tessera claim-template
// --mig --fraction` (pkg/fraction) rounds a fraction the user names. It
// gives a job up to 2% less memory than it asked for (an H100's 1g.10gb has
// 9984 MiB, an eighth of 81089 MiB is 10136 MiB).
const MIGBySlices Kind = "mig-slices"

// migModel is the dynamic-MIG device model. Its fleet has one GPU model,
// whose MIG table is the mock's (gpu.MockMIGTable: NVIDIA's MIG user guide,
// with the figures it lacks assumed; see that table's comments).
type migModel struct {
	table gpu.MIG
	// profiles are the table's plain (not "+me") profiles from small to
	// large, the order a job is rounded up along.
	profiles []gpu.MIGProfile
	// memory is what the fleet's GPU publishes out of MIG mode, in bytes:
	// the unit a job's Memory fraction is of.
	memory int64
	// bySlices rounds by slices (MIGBySlices), not by bytes.
	bySlices bool
}

func newMIGModel(f Fleet) (*migModel, error) {
	m, ok := f.Homogeneous()
	if !ok {
		return nil, errors.New("dynamic MIG: needs a fleet of one GPU model")
	}
	return newMIGModelFor(m.Product, m.MemoryBytes())
}

// newMIGModelFor is the model of GPUs of this product publishing memory
// bytes out of MIG mode.
func newMIGModelFor(product string, memory int64) (*migModel, error) {
	t, ok := gpu.MockMIGTable(product)
	if !ok {
		return nil, fmt.Errorf("dynamic MIG: no MIG profile table for %s (known: %s)", product, strings.Join(gpu.MockMIGProducts(), ", "))
	}
	mm := &migModel{table: t, memory: memory}
	for _, p := range t.Profiles {
		if !strings.Contains(p.Name, "+") {
			mm.profiles = append(mm.profiles, p)
		}
	}
	// The order pkg/model publishes placements in and pkg/fraction rounds
	// along: compute slices, then memory slices.
	slices.SortStableFunc(mm.profiles, func(a, b gpu.MIGProfile) int {
		return cmp.Or(cmp.Compare(a.ComputeSlices, b.ComputeSlices), cmp.Compare(a.MemorySlices, b.MemorySlices))
	})
	return mm, nil
}

// MIGProfileFor is the profile a job of these memory and cores fractions
// gets on a GPU of this product that publishes memoryBytes out of MIG mode
// (see migModel.profileFor).
func MIGProfileFor(product string, memoryBytes int64, memory, cores float64) (gpu.MIGProfile, error) {
	m, err := newMIGModelFor(product, memoryBytes)
	if err != nil {
		return gpu.MIGProfile{}, err
	}
	return m.profileFor(memory, cores)
}

// profileFor is the smallest plain profile whose memory covers memory × the
// GPU's memory in bytes and whose compute slices cover cores of the GPU's
// compute slices. "+me" profiles are never chosen (they take the GPU's only
// OFA and media engines), as pkg/fraction's MIG fractions choose.
//
// Memory is compared in bytes, not in memory slices: an H100's 1g.10gb has
// 9984 MiB, less than an eighth (10136 MiB) of the 81089 MiB the GPU
// publishes out of MIG mode, so a job asking an eighth gets a 1g.20gb.
//
// With bySlices the memory test is memory slices / the GPU's >= memory
// instead (MIGBySlices).
func (m *migModel) profileFor(memory, cores float64) (gpu.MIGProfile, error) {
	need := int64(math.Ceil(memory * float64(m.memory)))
	for _, p := range m.profiles {
		mem := int64(p.MemoryBytes) >= need
		if m.bySlices {
			mem = float64(p.MemorySlices)/float64(m.table.MemorySlices) >= memory-1e-9
		}
		if mem && float64(p.ComputeSlices)/float64(m.table.ComputeSlices) >= cores-1e-9 {
			return p, nil
		}
	}
	return gpu.MIGProfile{}, fmt.Errorf("memory %.3f, cores %.3f of a GPU: no MIG profile covers it", memory, cores)
}

// rank is p's place in m.profiles.
func (m *migModel) rank(name string) int {
	return slices.IndexFunc(m.profiles, func(p gpu.MIGProfile) bool { return p.Name == name })
}

func (m *migModel) kind() Kind {
	if m.bySlices {
		return MIGBySlices
	}
	return MIG
}

// migGPUs are s's GPUs in MIG mode with no instance, with m's table.
func (m *migModel) migGPUs(s NodeSpec) ([]gpu.GPU, []string, error) {
	gpus, err := gpusOf(s)
	if err != nil {
		return nil, nil, err
	}
	out := make([]gpu.GPU, len(gpus))
	uuids := make([]string, len(gpus))
	for i, g := range gpus {
		t := m.table
		g.MIGEnabled, g.MIG = true, &t
		out[i], uuids[i] = g, g.UUID
	}
	return out, uuids, nil
}

// slices is what the kubelet plugin publishes for a node of spec s whose
// GPUs are all in MIG mode, with no instance, and named in dynamicMIG:
// publishedSlices with model.WithDynamicMIG, as tesseraSlices publishes shares.
func (m *migModel) slices(node string, s NodeSpec) ([]*resourceapi.ResourceSlice, error) {
	gpus, uuids, err := m.migGPUs(s)
	if err != nil {
		return nil, err
	}
	return publishedSlices(node, gpus, model.WithDynamicMIG(uuids...))
}

func (*migModel) classes() []*resourceapi.DeviceClass { return tesseraClasses() }

// claim is one device of mig.gpu.tessera.dev with a selector on the profile,
// as `tessera claim-template --mig <profile>` writes it.
func (m *migModel) claim(j *Job) (*resourceapi.ResourceClaim, error) {
	switch {
	case j.CPUOnly:
		return nil, nil
	case j.GPUs > 0:
		return nil, fmt.Errorf("dynamic MIG: job %d asks for %d whole GPUs, which a fleet in MIG mode does not have (refused)", j.ID, j.GPUs)
	}
	p, err := m.profileFor(j.Memory, j.Cores)
	if err != nil {
		return nil, err
	}
	c := claimFor(j, model.MIGClassName, 1, nil)
	req := c.Spec.Devices.Requests[0].Exactly
	req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: fraction.MIGProfileSelector(p.Name)}})
	return c, nil
}

// sizeKey is the profile's rank. Along m.profiles (1g.10gb, 1g.20gb,
// 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb on H100) a profile fits on a GPU only
// if every smaller one does: each takes at least the compute slices and
// engines of the one before, and its placements are a subset of the one
// before's or cover one of them (a 3g at 0 or 4 covers a 2g at 0 or 4, a
// 4g at 0 a 3g at 0). TestMIGSizeKeyIsSafe checks the runs agree with
// AlwaysAsk.
func (m *migModel) sizeKey(j *Job) size {
	p, err := m.profileFor(j.Memory, j.Cores)
	r := float64(m.rank(p.Name))
	if err != nil || j.GPUs > 0 {
		r = math.Inf(1)
	}
	return size{class: classKey("mig", j), count: 1, mem: r, cores: r}
}

// use is the placement's memory slices (slots), its share of the GPU's
// memory by memory slices, and its cores as the plugin publishes them (100 ×
// compute slices / 7, rounded down), so checkGPU's slot, memory and cores
// checks hold MIG's rules independently of the allocator's counters.
func (m *migModel) use(r *resourceapi.DeviceRequestAllocationResult, s NodeSpec) (int, gpuUse, error) {
	d, err := model.ParseMIGDevice(r.Device)
	if err != nil || d.Static {
		return 0, gpuUse{}, fmt.Errorf("device %q: not a dynamic MIG device", r.Device)
	}
	i := slices.IndexFunc(m.table.Profiles, func(p gpu.MIGProfile) bool { return model.MIGProfileSlug(p.Name) == d.ProfileSlug })
	if i < 0 {
		return 0, gpuUse{}, fmt.Errorf("device %q: profile %q not in the table", r.Device, d.ProfileSlug)
	}
	p := m.table.Profiles[i]
	if !slices.Contains(p.Placements, gpu.MIGPlacement{Start: d.Start, Size: p.MemorySlices}) {
		return 0, gpuUse{}, fmt.Errorf("device %q: %s has no placement at %d", r.Device, p.Name, d.Start)
	}
	slots := uint8((1<<p.MemorySlices - 1) << d.Start)
	return d.Minor, gpuUse{
		memory: s.Model.MemoryBytes() * int64(p.MemorySlices) / int64(m.table.MemorySlices),
		cores:  int64(model.CoresPerGPU * p.ComputeSlices / m.table.ComputeSlices),
		slots:  slots,
	}, nil
}
