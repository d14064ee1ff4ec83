package model

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// The MIG profile tables of these tests are the mock NVML's
// (gpu.MockMIGTable: A100-SXM4-40GB, A100 80GB PCIe, H100 80GB HBM3, H200),
// which pkg/gpu/mock_mig_tables.go transcribes from NVIDIA's Multi-Instance
// GPU User Guide (r580): profiles, engines and instance counts from
// "Supported MIG Profiles", placements from `nvidia-smi mig -lgipp` in
// "Getting Started with MIG" (1g at 0-6, the 1g of double memory at
// 0/2/4/6, 2g at 0/2/4, 3g at 0/4 over 4 slices, 4g at 0, 7g at 0 over 8).
// Before that file existed these tests ran on tables written here by hand
// from the same guide; the two transcriptions agreed on profile IDs, compute
// and memory slices, placements, engines and instance counts, and differed
// only in some memory sizes (A100 40GB by 128 MiB; H200, assumed in both).
//
// The tests take their expectations from the guide's combinations, never
// from these tables or the model's counters.

// migTable is one product's MIG facts, with its profiles named by the role
// they play in the guide's combinations.
type migTable struct {
	product string
	mig     gpu.MIG
	// small, me, double, two, three, four and seven name the profiles in
	// the guide's terms ("1g", "1g+me", "1g2", "2g", "3g", "4g", "7g"),
	// so a test reads the same for every product.
	small, me, double, two, three, four, seven string
}

// migTables are the mock's tables by product name.
var migTables = func() map[string]migTable {
	out := map[string]migTable{}
	for _, product := range gpu.MockMIGProducts() {
		m, ok := gpu.MockMIGTable(product)
		if !ok {
			panic("no MIG table for " + product)
		}
		tb := migTable{product: product, mig: m}
		for _, p := range m.Profiles {
			var role *string
			switch {
			case p.ComputeSlices == 1 && strings.Contains(p.Name, "+"):
				role = &tb.me
			case p.ComputeSlices == 1 && p.MemorySlices == 1:
				role = &tb.small
			case p.ComputeSlices == 1 && p.MemorySlices == 2:
				role = &tb.double
			case p.ComputeSlices == 2:
				role = &tb.two
			case p.ComputeSlices == 3:
				role = &tb.three
			case p.ComputeSlices == 4:
				role = &tb.four
			case p.ComputeSlices == 7:
				role = &tb.seven
			default:
				panic(fmt.Sprintf("%s: profile %s plays no role", product, p.Name))
			}
			if *role != "" {
				panic(fmt.Sprintf("%s: profiles %s and %s play one role", product, *role, p.Name))
			}
			*role = p.Name
		}
		for _, r := range []string{tb.small, tb.me, tb.double, tb.two, tb.three, tb.four, tb.seven} {
			if r == "" {
				panic(fmt.Sprintf("%s: a role has no profile: %+v", product, tb))
			}
		}
		out[product] = tb
	}
	return out
}()

// h100 is the product most tests use.
const h100 = "NVIDIA H100 80GB HBM3"

// migFacts is the MIG state of a GPU of this product in MIG mode, with
// these GPU instances.
func (tb migTable) migFacts(instances ...gpu.MIGInstance) *gpu.MIG {
	m := tb.mig
	m.Profiles = slices.Clone(m.Profiles)
	for i := range m.Profiles {
		m.Profiles[i].Placements = slices.Clone(m.Profiles[i].Placements)
	}
	m.Instances = instances
	return &m
}

// profile is the profile with this name.
func (tb migTable) profile(name string) gpu.MIGProfile {
	for _, p := range tb.mig.Profiles {
		if p.Name == name {
			return p
		}
	}
	panic("no profile " + name)
}

// instance is a GPU instance of profile name at start, with one compute
// instance (ID 0) spanning it, UUID MIG-<minor>-…-<gi>.
func (tb migTable) instance(minor, gi int, name string, start int) gpu.MIGInstance {
	p := tb.profile(name)
	return gpu.MIGInstance{
		ID: gi, ProfileID: p.ID, ProfileName: name,
		Placement:   gpu.MIGPlacement{Start: start, Size: p.MemorySlices},
		AccessMinor: -1,
		ComputeInstances: []gpu.MIGComputeInstance{{
			ID: 0, UUID: fmt.Sprintf("MIG-%08d-0000-0000-0000-%012d", minor, gi),
			MemoryBytes: p.MemoryBytes, Multiprocessors: p.Multiprocessors, AccessMinor: -1, Processes: 0,
		}},
	}
}

// migGPUs are n GPUs of this product in MIG mode (fixtureGPUs otherwise),
// each with the instances instances(minor) returns (nil: none).
func (tb migTable) migGPUs(n int, instances func(minor int) []gpu.MIGInstance) []gpu.GPU {
	gpus := fixtureGPUs(n, 80, oneDomain)
	for i := range gpus {
		gpus[i].ProductName = tb.product
		gpus[i].MIGEnabled = true
		var in []gpu.MIGInstance
		if instances != nil {
			in = instances(i)
		}
		gpus[i].MIG = tb.migFacts(in...)
	}
	return gpus
}
