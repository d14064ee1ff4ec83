package fleet

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// GPUModel is one kind of GPU a simulated node carries: what its slices
// publish and how its GPUs are connected.
type GPUModel struct {
	// Name is the catalogue name (Models), used in fleet specs and in jobs'
	// GPU-type constraints ("h100", "v100-16", "G2").
	Name string
	// Product is the productName attribute its devices publish (what a
	// fraction's firstAvailable subrequest and a type constraint select on).
	Product      string
	Architecture string
	// Memory is the memory one GPU publishes, in MiB: what workloads can
	// use (NVML's total less what the driver reserves).
	MemoryMiB int64
	// NVLink says every GPU of a node is in one NVLink domain (SXM boards
	// with NVSwitch or a hybrid cube mesh); false: PCIe cards, each GPU a
	// domain of its own.
	NVLink bool
	// Source says where MemoryMiB comes from, or that it is assumed.
	Source string
}

// MemoryBytes is Memory in bytes.
func (m GPUModel) MemoryBytes() int64 { return m.MemoryMiB << 20 }

// h100 is the GPU of the mock profile hgx-h100 (pkg/gpu), which the
// KubeShare fleet is made of; a test checks the figure against the mock.
var h100 = GPUModel{Name: "h100", Product: "NVIDIA H100 80GB HBM3", Architecture: "hopper", MemoryMiB: 81089, NVLink: true,
	Source: "mock profile hgx-h100: NVML's 81559Mi less 470Mi reserved"}

// Models is the catalogue of GPU models a fleet spec may name. Memory is
// what one GPU publishes; the figures that are not from a mock profile of
// pkg/gpu are assumed, as Source says. openb's G1–G3 are undisclosed
// internal models (cluster-trace-gpu-v2023's README); their sizes are
// placeholders that only matter where a share's memory would fall below the
// smallest share Tessera hands out.
var Models = []GPUModel{
	h100,
	{Name: "a100-80", Product: "NVIDIA A100 80GB PCIe", Architecture: "ampere", MemoryMiB: 81222, NVLink: true,
		Source: "mock profile a100-pairs: 81920Mi less 698Mi"},
	{Name: "a100-40", Product: "NVIDIA A100-SXM4-40GB", Architecture: "ampere", MemoryMiB: 40536, NVLink: true,
		Source: "mock profile dgx-a100: 40960Mi less 424Mi"},
	{Name: "v100-32", Product: "Tesla V100-SXM2-32GB", Architecture: "volta", MemoryMiB: 32510, NVLink: true,
		Source: "assumed: nvidia-smi's total as commonly reported, reserved memory unknown"},
	{Name: "v100-16", Product: "Tesla V100-SXM2-16GB", Architecture: "volta", MemoryMiB: 16160, NVLink: true,
		Source: "assumed: nvidia-smi's total as commonly reported, reserved memory unknown"},
	{Name: "a10", Product: "NVIDIA A10", Architecture: "ampere", MemoryMiB: 22731,
		Source: "assumed: nvidia-smi's 23028Mi less the T4's reserved share (1.3%)"},
	{Name: "t4", Product: "Tesla T4", Architecture: "turing", MemoryMiB: 15110,
		Source: "deviceQuery's 15110 of nvidia-smi's 15360Mi (pkg/gpu's l4x4 profile notes)"},
	{Name: "p100", Product: "Tesla P100-PCIE-16GB", Architecture: "pascal", MemoryMiB: 16280,
		Source: "assumed: nvidia-smi's total as commonly reported, reserved memory unknown"},
	{Name: "G1", Product: "openb G1", Architecture: "unknown", MemoryMiB: 16384, Source: "assumed: undisclosed model (openb G1)"},
	{Name: "G2", Product: "openb G2", Architecture: "unknown", MemoryMiB: 32768, NVLink: true, Source: "assumed: undisclosed model (openb G2)"},
	{Name: "G3", Product: "openb G3", Architecture: "unknown", MemoryMiB: 81920, NVLink: true, Source: "assumed: undisclosed model (openb G3)"},
}

// openbModels maps the model column of openb's node list to the catalogue.
var openbModels = map[string]string{
	"V100M16": "v100-16", "V100M32": "v100-32", "T4": "t4", "P100": "p100", "A10": "a10", "G1": "G1", "G2": "G2", "G3": "G3",
}

// LookupModel finds a catalogue model by name (case-insensitive) or by its
// openb name ("V100M16").
func LookupModel(name string) (GPUModel, bool) {
	if n, ok := openbModels[name]; ok {
		name = n
	}
	for _, m := range Models {
		if strings.EqualFold(m.Name, name) {
			return m, true
		}
	}
	return GPUModel{}, false
}

// NodeSpec is one simulated node.
type NodeSpec struct {
	Model GPUModel
	// GPUs on the node (0: a node without GPUs, for CPU-only pods).
	GPUs int
	// MilliCPU and MemoryMiB are the node's allocatable CPU and memory; 0
	// takes the scheduler model's (Scoring).
	MilliCPU, MemoryMiB int64
}

// Pool is Nodes identical nodes.
type Pool struct {
	NodeSpec
	Nodes int
}

// Fleet is the simulated cluster: its nodes in the order the scheduler
// walks them.
type Fleet struct {
	Nodes []NodeSpec
}

// HGXFleet is n hgx-h100 nodes: the KubeShare benchmark's fleet.
func HGXFleet(n int) Fleet {
	return PoolFleet(Pool{NodeSpec: NodeSpec{Model: h100, GPUs: GPUsPerNode}, Nodes: n})
}

// PoolFleet lays the pools' nodes out pool after pool.
func PoolFleet(pools ...Pool) Fleet {
	var f Fleet
	for _, p := range pools {
		for range p.Nodes {
			f.Nodes = append(f.Nodes, p.NodeSpec)
		}
	}
	return f
}

// GPUs is the number of GPUs in the fleet.
func (f Fleet) GPUs() int {
	n := 0
	for _, s := range f.Nodes {
		n += s.GPUs
	}
	return n
}

// GPUModels are the distinct models of the fleet, in catalogue order.
func (f Fleet) GPUModels() []GPUModel {
	var out []GPUModel
	for _, m := range Models {
		for _, s := range f.Nodes {
			if s.GPUs > 0 && s.Model.Name == m.Name {
				out = append(out, m)
				break
			}
		}
	}
	return out
}

// Homogeneous is the fleet's one GPU model, if it has exactly one.
func (f Fleet) Homogeneous() (GPUModel, bool) {
	ms := f.GPUModels()
	if len(ms) != 1 {
		return GPUModel{}, false
	}
	return ms[0], true
}

// String is the fleet in ParseFleet's syntax, consecutive equal nodes merged.
func (f Fleet) String() string {
	var parts []string
	for i := 0; i < len(f.Nodes); {
		j := i
		for j < len(f.Nodes) && f.Nodes[j] == f.Nodes[i] {
			j++
		}
		s := f.Nodes[i]
		name := s.Model.Name
		if s.GPUs == 0 {
			name = "none"
		}
		part := fmt.Sprintf("%s:%dx%d", name, j-i, s.GPUs)
		if s.MilliCPU > 0 || s.MemoryMiB > 0 {
			part += fmt.Sprintf("/%dm/%dMi", s.MilliCPU, s.MemoryMiB)
		}
		parts = append(parts, part)
		i = j
	}
	return strings.Join(parts, ",")
}

// FleetSyntax documents ParseFleet.
const FleetSyntax = `MODEL:NODES[xGPUS],... (GPUS per node, default 8), for example h100:16 or v100-16:4x8,t4:8x4; models: h100, a100-80, a100-40, v100-32, v100-16, a10, t4, p100, G1, G2, G3`

// ParseFleet reads a fleet spec (FleetSyntax).
func ParseFleet(spec string) (Fleet, error) {
	var pools []Pool
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, size, ok := strings.Cut(part, ":")
		if !ok {
			return Fleet{}, fmt.Errorf("fleet %q: %q: want MODEL:NODES[xGPUS]", spec, part)
		}
		m, ok := LookupModel(strings.TrimSpace(name))
		if !ok {
			return Fleet{}, fmt.Errorf("fleet %q: unknown GPU model %q (%s)", spec, name, FleetSyntax)
		}
		nodes, gpus, hasGPUs := strings.Cut(size, "x")
		n, err := strconv.Atoi(strings.TrimSpace(nodes))
		if err != nil || n < 1 {
			return Fleet{}, fmt.Errorf("fleet %q: %q: the node count must be a positive integer", spec, part)
		}
		g := GPUsPerNode
		if hasGPUs {
			if g, err = strconv.Atoi(strings.TrimSpace(gpus)); err != nil || g < 1 || g > 16 {
				return Fleet{}, fmt.Errorf("fleet %q: %q: GPUs per node must be 1..16", spec, part)
			}
		}
		pools = append(pools, Pool{NodeSpec: NodeSpec{Model: m, GPUs: g}, Nodes: n})
	}
	if len(pools) == 0 {
		return Fleet{}, fmt.Errorf("fleet %q: no pools (%s)", spec, FleetSyntax)
	}
	return PoolFleet(pools...), nil
}

// gpusOf is what discovery reports for a node of spec s. An 8-GPU h100
// node is the mock profile hgx-h100 discovered through pkg/gpu (what the
// kubelet plugin publishes for it); other nodes are built from the model's
// facts: one NVLink domain per node for NVLink models, one per GPU else.
func gpusOf(s NodeSpec) ([]gpu.GPU, error) {
	if s.Model.Name == h100.Name && s.GPUs == GPUsPerNode {
		return hgxGPUs()
	}
	return syntheticGPUs(s), nil
}

var syntheticCache sync.Map // NodeSpec -> []gpu.GPU

func syntheticGPUs(s NodeSpec) []gpu.GPU {
	key := NodeSpec{Model: s.Model, GPUs: s.GPUs}
	if v, ok := syntheticCache.Load(key); ok {
		return v.([]gpu.GPU)
	}
	out := make([]gpu.GPU, s.GPUs)
	for i := range out {
		domain := fmt.Sprintf("sim-%s-pcie-%d", s.Model.Name, i)
		if s.Model.NVLink {
			domain = fmt.Sprintf("sim-%s-nvlink", s.Model.Name)
		}
		out[i] = gpu.GPU{
			UUID:         fmt.Sprintf("GPU-sim-%s-%d", strings.ToLower(s.Model.Name), i),
			Minor:        i,
			Index:        i,
			ProductName:  s.Model.Product,
			Architecture: s.Model.Architecture,
			MemoryBytes:  uint64(s.Model.MemoryBytes()),
			NVLinkDomain: domain,
		}
	}
	syntheticCache.Store(key, out)
	return out
}

// allowed says whether a job restricted to models may run on model m.
func allowed(models []string, m GPUModel) bool {
	return len(models) == 0 || slices.ContainsFunc(models, func(n string) bool {
		x, ok := LookupModel(n)
		return ok && x.Name == m.Name
	})
}
