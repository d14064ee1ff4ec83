package clusterview

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/model"
)

// migKey names a published MIG device: pool and device name.
type migKey struct{ pool, device string }

// migPublished is a published MIG device and its GPU, for the claims that
// hold it.
type migPublished struct {
	gpu    *GPU
	dev    *MIGDevice
	static bool
}

// migIndex is every published MIG device, by name and by GPU (in the order
// they are published).
type migIndex struct {
	byKey map[migKey]*migPublished
	byGPU map[*GPU][]*migPublished
}

func newMIGIndex() *migIndex {
	return &migIndex{byKey: map[migKey]*migPublished{}, byGPU: map[*GPU][]*migPublished{}}
}

// addMIGDevice records MIG device d of GPU g (a GPU in MIG mode): the GPU
// becomes ModeMIG, takes its product and parent UUID from the device, its
// taints, and its totals: the sum of its static instances, or the largest
// placement (the full-GPU profile) of a dynamic GPU.
func addMIGDevice(g *GPU, all *migIndex, pool string, name model.MIGDeviceName, d resourceapi.Device) {
	if g.MIG == nil {
		g.MIG = &MIG{Dynamic: !name.Static, Devices: []MIGDevice{}}
	}
	g.Mode = ModeMIG
	if g.UUID == "" {
		g.UUID = stringAttr(d, model.AttrParentUUID)
	}
	if g.ProductName == "" {
		g.ProductName = stringAttr(d, model.AttrProductName)
	}
	dev := &MIGDevice{Device: d.Name, Profile: stringAttr(d, model.AttrProfile), Holders: []Holder{}}
	if name.Static {
		dev.UUID = stringAttr(d, model.AttrUUID)
	}
	if a, ok := d.Attributes[model.AttrPlacementStart]; ok && a.IntValue != nil {
		dev.PlacementStart = int(*a.IntValue)
	}
	if a, ok := d.Attributes[model.AttrPlacementSize]; ok && a.IntValue != nil {
		dev.PlacementSize = int(*a.IntValue)
	}
	if c, ok := d.Capacity[model.Memory]; ok {
		dev.MemoryBytes = c.Value.Value()
	}
	if c, ok := d.Capacity[model.Cores]; ok {
		dev.Cores = c.Value.Value()
	}
	if name.Static {
		g.MemoryBytes += dev.MemoryBytes
		g.Cores += dev.Cores
	} else {
		g.MemoryBytes = max(g.MemoryBytes, dev.MemoryBytes)
		g.Cores = max(g.Cores, dev.Cores)
	}
	for _, t := range d.Taints {
		if t.Key == unhealthyTaint {
			g.Healthy = false
			dev.Unhealthy = t.Value
		}
		if !slices.ContainsFunc(g.Taints, func(x resourceapi.DeviceTaint) bool {
			return x.Key == t.Key && x.Value == t.Value && x.Effect == t.Effect
		}) {
			t.TimeAdded = nil
			g.Taints = append(g.Taints, t)
		}
	}
	p := &migPublished{gpu: g, dev: dev, static: name.Static}
	all.byKey[migKey{pool, d.Name}] = p
	all.byGPU[g] = append(all.byGPU[g], p)
}

// finishMIG lists the MIG devices of g: every static instance, the held
// dynamic placements, in the order they are published, each with its
// holders sorted.
func finishMIG(g *GPU, all *migIndex) {
	if g.MIG == nil {
		return
	}
	for _, p := range all.byGPU[g] {
		if !p.static && len(p.dev.Holders) == 0 {
			continue
		}
		slices.SortFunc(p.dev.Holders, compareHolders)
		g.MIG.Devices = append(g.MIG.Devices, *p.dev)
	}
}
