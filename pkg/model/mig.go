package model

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// MIG devices. A GPU in MIG mode publishes only these (never gpu-N,
// gpu-N-shared or gpu-N-lent), in one of two modes (docs/mig.md):
//
//   - static (the default): every GPU instance that exists (with at least
//     one compute instance) is an exclusive device gpu-N-mig-<GI>, and the
//     claim that gets it gets all its compute instances: they share the
//     GPU instance's memory, L2 cache and engines, so handing them to two
//     tenants would break the isolation MIG is for. No counters;
//   - dynamic (WithDynamicMIG): every placement of every GPU-instance
//     profile is a device gpu-N-mig-<profile>-<start>, and all of them
//     consume the GPU's counter set gpu-N-counters: one counter per memory
//     slice, the compute slices and the engines. The scheduler hands out any
//     set of placements whose counters fit, which are exactly the sets the
//     hardware can hold at once (the memory slices of two placements never
//     overlap, their compute slices and engines never exceed the GPU's).
//     Placements that an instance Tessera's claims hold blocks are left out
//     (migBlocked); each MIG-mode GPU's devices sit in slices of their own,
//     so that this changes one slice.

// TypeMIG is the type attribute of MIG devices, static and dynamic.
const TypeMIG = modelnames.TypeMIG

// MIGInUseTaintKey (effect NoSchedule) is on a static MIG device whose
// compute instances run processes that no Tessera claim accounts for
// (another device plugin's pods, an admin's job); its value is
// MIGInUseOutsideTessera. It goes when the instance is idle or a claim
// holds it (WithMIGHeld).
const MIGInUseTaintKey = modelnames.MIGInUseTaintKey

// MIGInUseOutsideTessera is MIGInUseTaintKey's value.
const MIGInUseOutsideTessera = "InUseOutsideTessera"

// Counters of a dynamic-MIG GPU's counter set (MIGCounterSetName), besides
// one per memory slice (MemorySliceCounter).
const (
	// CounterComputeSlices holds the GPU's compute slices (7 on
	// A100/H100/H200). NVML places compute slices itself, so a total is all
	// the scheduler needs.
	CounterComputeSlices = "compute-slices"
	// The engines of the full-GPU profile. The +me profiles take the
	// GPU's only OFA, so two of them never fit together.
	CounterDecoders    = "decoders"
	CounterEncoders    = "encoders"
	CounterJPEGs       = "jpegs"
	CounterOFAs        = "ofas"
	CounterCopyEngines = "copy-engines"
)

// migEngineCounters are the engine counters, with how a profile counts each.
var migEngineCounters = []struct {
	name string
	of   func(gpu.MIGProfile) int
}{
	{CounterDecoders, func(p gpu.MIGProfile) int { return p.Decoders }},
	{CounterEncoders, func(p gpu.MIGProfile) int { return p.Encoders }},
	{CounterJPEGs, func(p gpu.MIGProfile) int { return p.JPEGs }},
	{CounterOFAs, func(p gpu.MIGProfile) int { return p.OFAs }},
	{CounterCopyEngines, func(p gpu.MIGProfile) int { return p.CopyEngines }},
}

// MaxMIGMemorySlices is the most memory slices a dynamic-MIG GPU may have:
// one counter each, plus compute slices and the five engines, within
// ResourceSliceMaxCountersPerCounterSet.
const MaxMIGMemorySlices = resourceapi.ResourceSliceMaxCountersPerCounterSet - 1 - 5

// MemorySliceCounter is the counter of memory slice i of a dynamic-MIG GPU.
func MemorySliceCounter(i int) string { return "memory-slice-" + strconv.Itoa(i) }

// MIGCounterSetName is the counter set of the dynamic-MIG GPU with this
// minor. It is not CounterSetName: its counters are slices and engines, not
// memory and cores.
func MIGCounterSetName(minor int) string { return WholeDeviceName(minor) + "-counters" }

// MIGStaticDeviceName is the device of GPU instance gi on the GPU with this
// minor (static MIG): gpu-3-mig-2.
func MIGStaticDeviceName(minor, gi int) string {
	return fmt.Sprintf("%s%s%d", WholeDeviceName(minor), migInfix, gi)
}

// MIGPlacementDeviceName is the device of the placement of this profile at
// this start on the GPU with this minor (dynamic MIG): gpu-3-mig-1g-10gb-me-6.
func MIGPlacementDeviceName(minor int, profile string, start int) string {
	return fmt.Sprintf("%s%s%s-%d", WholeDeviceName(minor), migInfix, MIGProfileSlug(profile), start)
}

// MIGProfileSlug is a profile name as device names spell it: lower case,
// '.' and '+' turned into '-' ("1g.10gb+me" → "1g-10gb-me"). Two profiles
// that differ only there ("1g.24gb+me", "1g.24gb-me" on RTX PRO 6000) have
// the same slug; Resources refuses such a dynamic-MIG GPU.
func MIGProfileSlug(profile string) string {
	return strings.NewReplacer(".", "-", "+", "-").Replace(strings.ToLower(profile))
}

// WithDynamicMIG publishes the GPUs with these UUIDs, while they are in MIG
// mode, with dynamic MIG: every valid placement of every profile is a
// device, and the GPU's counter set keeps the scheduler to combinations the
// hardware can hold (see the package documentation and docs/mig.md). A GPU
// not named here publishes its existing compute instances (static MIG); a
// named GPU that is not in MIG mode is published as if it were not named.
// Several calls add up.
func WithDynamicMIG(uuids ...string) Option {
	return func(o *options) {
		if o.dynamicMIG == nil {
			o.dynamicMIG = map[string]bool{}
		}
		for _, u := range uuids {
			o.dynamicMIG[u] = true
		}
	}
}

// MIGHold is a GPU instance a Tessera claim holds: its profile and
// placement (IDs are reused by the driver; the pair is what stays).
type MIGHold struct {
	ProfileID int
	Placement gpu.MIGPlacement
}

// WithMIGHeld names, by GPU UUID, the GPU instances that Tessera's claims
// hold, matched by placement and profile.
//
//   - On a dynamic-MIG GPU every other GPU instance is foreign (an
//     admin's, or left behind): its memory slices are published with value
//     0, and its compute slices and engines are taken off the totals, so
//     that no placement over it fits. A held instance's slices stay 1: the
//     claim that holds it already consumes them; the placements it blocks
//     are left out (migBlocked).
//   - On a static-MIG GPU a GPU instance that is not held and whose
//     compute instances run processes is tainted MIGInUseTaintKey: someone
//     outside Tessera uses it.
//
// Without this option no instance is held.
func WithMIGHeld(held map[string][]MIGHold) Option {
	return func(o *options) { o.migHeld = held }
}

// migHeldBy reports whether holds name GPU instance gi.
func migHeldBy(holds []MIGHold, gi gpu.MIGInstance) bool {
	return slices.Contains(holds, MIGHold{ProfileID: gi.ProfileID, Placement: gi.Placement})
}

// migInfix separates the GPU from the MIG part of a MIG device's name.
const migInfix = "-mig-"

// MIGDeviceName is a MIG device name taken apart (ParseMIGDevice).
type MIGDeviceName struct {
	// Minor is the parent GPU's minor.
	Minor int
	// Static is true for gpu-N-mig-<GI> (and the older gpu-N-mig-<GI>-<CI>),
	// false for a placement gpu-N-mig-<profile slug>-<start>.
	Static bool
	// GPUInstance is the GPU instance ID of a static device.
	// ComputeInstance is -1, except in a name of the form releases before
	// one device per GPU instance published (gpu-N-mig-<GI>-<CI>, one
	// device per compute instance), which checkpointed claims and
	// allocations made before an upgrade may still carry: then it is that
	// compute instance's ID.
	GPUInstance, ComputeInstance int
	// ProfileSlug (MIGProfileSlug of the profile) and Start name the
	// placement of a dynamic device.
	ProfileSlug string
	Start       int
}

// ParseMIGDevice is the inverse of MIGStaticDeviceName and
// MIGPlacementDeviceName; it also takes the older static names
// gpu-N-mig-<GI>-<CI> apart (see MIGDeviceName). ParseDevice, in contrast,
// refuses MIG device names: callers that take apart whole, shared and lent
// devices do not mistake a MIG device for one of them.
func ParseMIGDevice(name string) (MIGDeviceName, error) {
	fail := func() (MIGDeviceName, error) {
		return MIGDeviceName{}, fmt.Errorf("device name %q: not a MIG device (want gpu-<minor>-mig-<GI> or gpu-<minor>-mig-<profile>-<start>)", name)
	}
	rest, ok := strings.CutPrefix(name, "gpu-")
	if !ok {
		return fail()
	}
	minorText, rest, ok := strings.Cut(rest, migInfix)
	if !ok {
		return fail()
	}
	minor, ok := decimal(minorText)
	if !ok {
		return fail()
	}
	if gi, ok := decimal(rest); ok {
		return MIGDeviceName{Minor: minor, Static: true, GPUInstance: gi, ComputeInstance: -1}, nil
	}
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return fail()
	}
	head, tail := rest[:i], rest[i+1:]
	last, ok := decimal(tail)
	if !ok {
		return fail()
	}
	if gi, ok := decimal(head); ok {
		return MIGDeviceName{Minor: minor, Static: true, GPUInstance: gi, ComputeInstance: last}, nil
	}
	if len(validation.IsDNS1123Label(head)) > 0 {
		return fail()
	}
	return MIGDeviceName{Minor: minor, ProfileSlug: head, Start: last}, nil
}

// decimal parses a non-negative decimal number without sign or leading zeros.
func decimal(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0 && strconv.Itoa(n) == s
}

// migDynamic reports whether a MIG-mode GPU is published with dynamic MIG.
func (o options) migDynamic(g gpu.GPU) bool { return o.dynamicMIG[g.UUID] }

// checkMIG rejects MIG facts that cannot become valid API objects. A
// MIG-mode GPU without MIG facts (g.MIG nil) is valid: it publishes nothing.
func checkMIG(g gpu.GPU, dynamic bool) error {
	m := g.MIG
	if m == nil {
		return nil
	}
	if !dynamic {
		for _, gi := range m.Instances {
			if gi.ID < 0 {
				return fmt.Errorf("GPU %s: MIG GPU instance with negative ID %d", g.UUID, gi.ID)
			}
			for _, ci := range gi.ComputeInstances {
				switch {
				case ci.ID < 0:
					return fmt.Errorf("GPU %s: MIG GPU instance %d: compute instance with negative ID %d", g.UUID, gi.ID, ci.ID)
				case len(ci.UUID) > resourceapi.DeviceAttributeMaxValueLength:
					return fmt.Errorf("GPU %s: MIG GPU instance %d compute instance %d: UUID %q is longer than %d characters", g.UUID, gi.ID, ci.ID, ci.UUID, resourceapi.DeviceAttributeMaxValueLength)
				case ci.MemoryBytes > math.MaxInt64:
					return fmt.Errorf("GPU %s: MIG GPU instance %d compute instance %d: memory size %d bytes does not fit a quantity", g.UUID, gi.ID, ci.ID, ci.MemoryBytes)
				}
			}
			if len(gi.ProfileName) > resourceapi.DeviceAttributeMaxValueLength {
				return fmt.Errorf("GPU %s: MIG GPU instance %d: profile %q is longer than %d characters", g.UUID, gi.ID, gi.ProfileName, resourceapi.DeviceAttributeMaxValueLength)
			}
		}
		return nil
	}
	if len(m.Profiles) == 0 {
		return nil // nothing to place
	}
	switch {
	case m.MemorySlices < 1 || m.MemorySlices > MaxMIGMemorySlices:
		return fmt.Errorf("GPU %s: %d MIG memory slices, want 1 to %d for dynamic MIG", g.UUID, m.MemorySlices, MaxMIGMemorySlices)
	case m.ComputeSlices < 1:
		return fmt.Errorf("GPU %s: %d MIG compute slices, want at least 1 for dynamic MIG", g.UUID, m.ComputeSlices)
	}
	slugs := map[string]string{}
	for _, p := range m.Profiles {
		name := fmt.Sprintf("GPU %s: MIG profile %q", g.UUID, p.Name)
		slug := MIGProfileSlug(p.Name)
		switch {
		case len(p.Name) > resourceapi.DeviceAttributeMaxValueLength:
			return fmt.Errorf("%s: longer than %d characters", name, resourceapi.DeviceAttributeMaxValueLength)
		case p.ComputeSlices < 1 || p.ComputeSlices > m.ComputeSlices:
			return fmt.Errorf("%s: %d compute slices, want 1 to %d", name, p.ComputeSlices, m.ComputeSlices)
		case p.MemoryBytes == 0 || p.MemoryBytes > math.MaxInt64:
			return fmt.Errorf("%s: memory size %d bytes, want 1 to %d", name, p.MemoryBytes, int64(math.MaxInt64))
		case slugs[slug] != "":
			return fmt.Errorf("%s: its devices would have the names of profile %q's (%s)", name, slugs[slug], MIGPlacementDeviceName(g.Minor, p.Name, 0))
		}
		slugs[slug] = p.Name
		for _, e := range migEngineCounters {
			if e.of(p) < 0 {
				return fmt.Errorf("%s: negative %s", name, e.name)
			}
		}
		for _, pl := range p.Placements {
			if pl.Start < 0 || pl.Size < 1 || pl.Start+pl.Size > m.MemorySlices {
				return fmt.Errorf("%s: placement %d:%d outside the GPU's %d memory slices", name, pl.Start, pl.Size, m.MemorySlices)
			}
			if d := MIGPlacementDeviceName(g.Minor, p.Name, pl.Start); len(validation.IsDNS1123Label(d)) > 0 {
				return fmt.Errorf("%s: device name %q is not a DNS label", name, d)
			}
		}
	}
	return nil
}

// fullProfile is the profile that takes the whole GPU (all compute and memory
// slices): its engines are the GPU's. ok is false when there is none.
func fullProfile(m *gpu.MIG) (gpu.MIGProfile, bool) {
	for _, p := range m.Profiles {
		if p.ComputeSlices == m.ComputeSlices && p.MemorySlices == m.MemorySlices {
			return p, true
		}
	}
	return gpu.MIGProfile{}, false
}

// migCounterSet is the counter set of a dynamic-MIG GPU: memory slices of
// value 1, compute slices and engines at the full-GPU profile's counts
// (engines the GPU does not have are left out), less whatever the foreign
// GPU instances (not in held) take.
func migCounterSet(g gpu.GPU, held []MIGHold) resourceapi.CounterSet {
	m := g.MIG
	values := make(map[string]int64, m.MemorySlices+1+len(migEngineCounters))
	for i := range m.MemorySlices {
		values[MemorySliceCounter(i)] = 1
	}
	values[CounterComputeSlices] = int64(m.ComputeSlices)
	if full, ok := fullProfile(m); ok {
		for _, e := range migEngineCounters {
			if n := e.of(full); n > 0 {
				values[e.name] = int64(n)
			}
		}
	}
	for _, gi := range m.Instances {
		if migHeldBy(held, gi) {
			continue
		}
		for i := gi.Placement.Start; i < gi.Placement.Start+gi.Placement.Size; i++ {
			if _, ok := values[MemorySliceCounter(i)]; ok {
				values[MemorySliceCounter(i)] = 0
			}
		}
		p, ok := migProfileByID(m, gi.ProfileID)
		if !ok {
			continue
		}
		values[CounterComputeSlices] = max(0, values[CounterComputeSlices]-int64(p.ComputeSlices))
		for _, e := range migEngineCounters {
			if v, ok := values[e.name]; ok {
				values[e.name] = max(0, v-int64(e.of(p)))
			}
		}
	}
	counters := make(map[string]resourceapi.Counter, len(values))
	for name, v := range values {
		counters[name] = resourceapi.Counter{Value: *resource.NewQuantity(v, resource.DecimalSI)}
	}
	return resourceapi.CounterSet{Name: MIGCounterSetName(g.Minor), Counters: counters}
}

func migProfileByID(m *gpu.MIG, id int) (gpu.MIGProfile, bool) {
	for _, p := range m.Profiles {
		if p.ID == id {
			return p, true
		}
	}
	return gpu.MIGProfile{}, false
}

// migPlacementOrder is the order of a dynamic-MIG GPU's devices, which is the
// allocator's preference (it takes the first device in slice order that
// fits):
//
//   - profiles from small to large (compute slices, then memory slices,
//     then media-extension profiles after plain ones), so a request that
//     names no profile ("memory >= 15Gi") gets the smallest that fits;
//   - each profile's placements from the highest start down. The large
//     profiles can start only low (H100: 4g.40gb at 0 only, 3g.40gb at 0 or
//     4, 7g.80gb at 0), so small instances fill the top of the GPU first and
//     leave the bottom whole for them as long as they can: seven 1g.10gb
//     take slices 6, 5, …, 0; a 4g.40gb still fits after three of them; a
//     3g.40gb takes 4 before 0, keeping 0-3 for a 4g.40gb.
//
// No fixed order keeps every combination placeable in every arrival order
// (the scheduler never moves an instance); docs/mig.md lists the ones this
// order loses, and NVIDIA's own nvidia-smi has the same limit.
func migPlacementOrder(m *gpu.MIG) []gpu.MIGProfile {
	profiles := slices.Clone(m.Profiles)
	slices.SortStableFunc(profiles, func(a, b gpu.MIGProfile) int {
		return cmp.Or(
			cmp.Compare(a.ComputeSlices, b.ComputeSlices),
			cmp.Compare(a.MemorySlices, b.MemorySlices),
			cmp.Compare(mediaExtended(a), mediaExtended(b)),
			cmp.Compare(a.Name, b.Name),
		)
	})
	for i := range profiles {
		placements := slices.Clone(profiles[i].Placements)
		slices.SortFunc(placements, func(a, b gpu.MIGPlacement) int { return cmp.Compare(b.Start, a.Start) })
		profiles[i].Placements = placements
	}
	return profiles
}

// mediaExtended is 1 for a profile with a suffix ("+me"), 0 for a plain one.
func mediaExtended(p gpu.MIGProfile) int {
	if strings.Contains(p.Name, "+") {
		return 1
	}
	return 0
}

// migPlacementDevices are the devices of a dynamic-MIG GPU, in
// migPlacementOrder, less the placements that a held GPU instance blocks
// (migBlocked), when the GPU has a full-GPU profile to keep.
func migPlacementDevices(g gpu.GPU, o options) []resourceapi.Device {
	m := g.MIG
	var devices []resourceapi.Device
	engines := map[string]bool{}
	full, hasFull := fullProfile(m)
	hasFull = hasFull && len(full.Placements) > 0
	if hasFull {
		for _, e := range migEngineCounters {
			engines[e.name] = e.of(full) > 0
		}
	}
	for _, p := range migPlacementOrder(m) {
		for _, pl := range p.Placements {
			if hasFull && p.ID != full.ID && migBlocked(m, o.migHeld[g.UUID], p.ID, pl) {
				continue
			}
			consumed := make(map[string]resourceapi.Counter, pl.Size+1+len(migEngineCounters))
			for i := pl.Start; i < pl.Start+pl.Size; i++ {
				consumed[MemorySliceCounter(i)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
			}
			consumed[CounterComputeSlices] = resourceapi.Counter{Value: *resource.NewQuantity(int64(p.ComputeSlices), resource.DecimalSI)}
			for _, e := range migEngineCounters {
				if n := e.of(p); n > 0 && engines[e.name] {
					consumed[e.name] = resourceapi.Counter{Value: *resource.NewQuantity(int64(n), resource.DecimalSI)}
				}
			}
			attrs := migAttributes(g, o, p.Name, pl, p.Multiprocessors)
			devices = append(devices, resourceapi.Device{
				Name:             MIGPlacementDeviceName(g.Minor, p.Name, pl.Start),
				Attributes:       attrs,
				Capacity:         migCapacity(m, p.MemoryBytes, p.ComputeSlices),
				ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: MIGCounterSetName(g.Minor), Counters: consumed}},
				Taints:           taintsOf(g, o),
			})
		}
	}
	return devices
}

// migBlocked reports whether a GPU instance of m that Tessera's claims hold
// (held) overlaps placement pl of profile profileID without being that very
// instance. Such a placement can never be allocated while the instance
// exists: the claim that holds the instance consumes its memory slices
// through its own device, which stays published. Leaving it out keeps the
// scheduler from evaluating the selectors of devices whose counters refuse
// them anyway (a full GPU would otherwise cost it its ~25 placements per
// pod, results/scale.md).
//
// Foreign instances (no claim holds them) prune nothing: one can appear
// between a claim's allocation and its prepare, over the claim's
// placement, and the allocator counts an allocated device's counters only
// while the device is published. Their slices are published at 0 instead
// (migCounterSet). Nor is the full-GPU profile's placement ever left out
// (migPlacementDevices): it carries the GPU's totals, from which tessera
// why reads what the GPU has.
func migBlocked(m *gpu.MIG, held []MIGHold, profileID int, pl gpu.MIGPlacement) bool {
	for _, gi := range m.Instances {
		if !gi.Placement.Overlaps(pl) || !migHeldBy(held, gi) {
			continue
		}
		if gi.ProfileID != profileID || gi.Placement != pl {
			return true
		}
	}
	return false
}

// migStaticDevices are the devices of a static-MIG GPU: one per GPU
// instance with compute instances, small to large (compute slices, then
// memory), then by GPU instance ID, so a request that names no profile gets
// the smallest that fits. The device is the whole GPU instance with the
// compute instances it has: all its memory, and the compute slices and
// SMs of those compute instances (a GPU instance whose only compute
// instance takes part of it, 1c.3g.40gb, has that part); uuid is published
// when it has exactly one compute instance (a split one has several MIG
// UUIDs).
func migStaticDevices(g gpu.GPU, o options) []resourceapi.Device {
	m := g.MIG
	type static struct {
		gi              gpu.MIGInstance
		profile         gpu.MIGProfile
		computeSlices   int
		multiprocessors int
		memory          uint64
		busy            bool
	}
	var all []static
	for _, gi := range m.Instances {
		if len(gi.ComputeInstances) == 0 {
			continue // nothing a container could be given
		}
		p, known := migProfileByID(m, gi.ProfileID)
		if !known {
			p = gpu.MIGProfile{Name: gi.ProfileName}
		}
		if gi.ProfileName != "" {
			p.Name = gi.ProfileName
		}
		s := static{gi: gi, profile: p, memory: p.MemoryBytes}
		for _, ci := range gi.ComputeInstances {
			// The compute instances share the GPU instance's memory; each
			// reports all of it.
			s.memory = max(s.memory, ci.MemoryBytes)
			s.busy = s.busy || ci.Processes > 0
			// A compute instance with fewer SMs than its GPU instance
			// (1c.3g.40gb) has that share of its compute slices.
			slicesOf := p.ComputeSlices
			if ci.Multiprocessors > 0 && p.Multiprocessors > 0 && ci.Multiprocessors < p.Multiprocessors {
				slicesOf = p.ComputeSlices * ci.Multiprocessors / p.Multiprocessors
			}
			s.computeSlices += slicesOf
			s.multiprocessors += max(ci.Multiprocessors, 0)
		}
		s.computeSlices = min(s.computeSlices, p.ComputeSlices)
		if s.multiprocessors <= 0 || p.Multiprocessors > 0 && s.multiprocessors > p.Multiprocessors {
			s.multiprocessors = p.Multiprocessors
		}
		all = append(all, s)
	}
	slices.SortFunc(all, func(a, b static) int {
		return cmp.Or(
			cmp.Compare(a.computeSlices, b.computeSlices),
			cmp.Compare(a.memory, b.memory),
			cmp.Compare(a.gi.ID, b.gi.ID),
		)
	})
	devices := make([]resourceapi.Device, 0, len(all))
	for _, s := range all {
		attrs := migAttributes(g, o, s.profile.Name, s.gi.Placement, s.multiprocessors)
		if cis := s.gi.ComputeInstances; len(cis) == 1 && cis[0].UUID != "" {
			attrs[AttrUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(cis[0].UUID)}
		}
		attrs[AttrComputeInstances] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(len(s.gi.ComputeInstances)))}
		taints := taintsOf(g, o)
		if s.busy && !migHeldBy(o.migHeld[g.UUID], s.gi) {
			taints = append(taints, resourceapi.DeviceTaint{Key: MIGInUseTaintKey, Value: MIGInUseOutsideTessera, Effect: resourceapi.DeviceTaintEffectNoSchedule})
		}
		devices = append(devices, resourceapi.Device{
			Name:       MIGStaticDeviceName(g.Minor, s.gi.ID),
			Attributes: attrs,
			Capacity:   migCapacity(m, s.memory, s.computeSlices),
			Taints:     taints,
		})
	}
	return devices
}

// migCapacity is a MIG device's memory (bytes) and cores: 100 × its compute
// slices / the GPU's, rounded down (1g of 7: 14). Either is left out when
// not known.
func migCapacity(m *gpu.MIG, memory uint64, computeSlices int) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	if memory > 0 && memory <= math.MaxInt64 {
		capacity[Memory] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(memory), resource.BinarySI)}
	}
	if m.ComputeSlices > 0 && computeSlices > 0 {
		cores := int64(CoresPerGPU * computeSlices / m.ComputeSlices)
		capacity[Cores] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(cores, resource.DecimalSI)}
	}
	return capacity
}

// migAttributes are the attributes of a MIG device of GPU g: the GPU's own
// (index and minor are the parent's; no nvlinkDomain: MIG devices have no
// peer-to-peer), the parent, the profile and the placement. uuid is added by
// the caller where the MIG device exists (static).
func migAttributes(g gpu.GPU, o options, profile string, pl gpu.MIGPlacement, multiprocessors int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := attributes(g, TypeMIG, o)
	delete(attrs, AttrUUID)
	delete(attrs, AttrNVLinkDomain)
	delete(attrs, AttrComputeMode)
	delete(attrs, AttrDriverMemoryLimits)
	attrs[AttrParentUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.UUID)}
	attrs[AttrParentMinor] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.Minor))}
	if profile != "" {
		attrs[AttrProfile] = resourceapi.DeviceAttribute{StringValue: ptr.To(profile)}
	}
	if pl.Size > 0 {
		attrs[AttrPlacementStart] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(pl.Start))}
		attrs[AttrPlacementSize] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(pl.Size))}
	}
	if multiprocessors > 0 {
		attrs[AttrMultiprocessors] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(multiprocessors))}
	}
	return attrs
}

// migDevices are the devices of a MIG-mode GPU: its placements when it is
// published with dynamic MIG, else its compute instances.
func migDevices(g gpu.GPU, o options) []resourceapi.Device {
	switch {
	case g.MIG == nil:
		return nil
	case o.migDynamic(g):
		return migPlacementDevices(g, o)
	default:
		return migStaticDevices(g, o)
	}
}

// migHasCounters reports whether a MIG-mode GPU publishes a counter set:
// only a dynamic one with profiles to place.
func migHasCounters(g gpu.GPU, o options) bool {
	return g.MIG != nil && o.migDynamic(g) && len(g.MIG.Profiles) > 0
}
