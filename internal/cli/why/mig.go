package why

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/model"
)

// MIG devices (docs/mig.md). A static MIG device (gpu-N-mig-<GI>-<CI>) is an
// existing compute instance: it fits unless a claim holds it. A dynamic MIG
// device (gpu-N-mig-<profile>-<start>) is a placement: it consumes its GPU's
// counter set gpu-N-counters, one counter per memory slice it covers
// (memory-slice-<i>), its profile's compute slices and engines. When a
// placement does not fit, the explanation names the memory slices it needs
// and who holds each (a claim's MIG device, or an instance no claim holds,
// published as 0), and which totals (compute slices, engines) are short;
// once per GPU it says who uses the totals.

// migSliceCounterPrefix is the prefix of the memory-slice counters
// (model.MemorySliceCounter).
var migSliceCounterPrefix = strings.TrimSuffix(model.MemorySliceCounter(0), "0")

// isMIG reports whether d is a MIG device of this driver.
func (d device) isMIG() bool {
	if d.foreign() {
		return false
	}
	_, err := model.ParseMIGDevice(d.dev.Name)
	return err == nil
}

// migProfile is a MIG device's profile and placement: "3g.40gb at 4", or
// "3g.40gb" without a placement.
func migProfile(d *resourceapi.Device) string {
	s := ""
	if a, ok := d.Attributes[model.AttrProfile]; ok && a.StringValue != nil {
		s = *a.StringValue
	}
	if a, ok := d.Attributes[model.AttrPlacementStart]; ok && a.IntValue != nil {
		if s == "" {
			s = "MIG"
		}
		s += " at " + strconv.FormatInt(*a.IntValue, 10)
	}
	return s
}

// migCounterConsumption is the consumption of d of a MIG counter set (one
// with memory-slice counters), if any.
func migCounterConsumption(d *resourceapi.Device) (resourceapi.DeviceCounterConsumption, bool) {
	for _, cc := range d.ConsumesCounters {
		for name := range cc.Counters {
			if strings.HasPrefix(name, migSliceCounterPrefix) {
				return cc, true
			}
		}
	}
	return resourceapi.DeviceCounterConsumption{}, false
}

// memorySlice is the index of a memory-slice counter, -1 for another counter.
func memorySlice(counter string) int {
	rest, ok := strings.CutPrefix(counter, migSliceCounterPrefix)
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(rest)
	if err != nil {
		return -1
	}
	return i
}

// migCounterUse is who uses a MIG counter set: per counter, the allocated
// placements that consume it, and the set's published values.
type migCounterUse struct {
	set resourceapi.CounterSet
	// users of each counter: the allocated devices and how much each takes.
	users map[string][]migUser
	// full is the most any placement of the GPU takes of each counter (the
	// full-GPU profile's: the GPU's total before instances no claim holds).
	full map[string]int64
}

type migUser struct {
	d      device
	amount int64
}

// migUse reads the use of the MIG counter set name of pool.
func (e *explainer) migUse(pool, name string) (migCounterUse, bool) {
	set, ok := e.counterSet(pool, name)
	if !ok {
		return migCounterUse{}, false
	}
	u := migCounterUse{set: set, users: map[string][]migUser{}, full: map[string]int64{}}
	for _, o := range e.poolDevices(pool) {
		for _, cc := range o.dev.ConsumesCounters {
			if cc.CounterSet != name {
				continue
			}
			for counter, c := range cc.Counters {
				v := c.Value.Value()
				u.full[counter] = max(u.full[counter], v)
				if e.allocated(o.id) {
					u.users[counter] = append(u.users[counter], migUser{o, v})
				}
			}
		}
	}
	return u, true
}

// free is what is left of a counter: its published value less what the
// allocated placements take.
func (u migCounterUse) free(counter string) int64 {
	c := u.set.Counters[counter]
	left := c.Value.Value()
	for _, x := range u.users[counter] {
		left -= x.amount
	}
	return left
}

// foreign is how much of a counter instances no claim holds take: the
// full-GPU profile's amount less the published value.
func (u migCounterUse) foreign(counter string) int64 {
	c := u.set.Counters[counter]
	return max(0, u.full[counter]-c.Value.Value())
}

// counterLabel is how people name a MIG counter: "memory slice 3",
// "compute slices", "decoders".
func counterLabel(counter string) string {
	if i := memorySlice(counter); i >= 0 {
		return "memory slice " + strconv.Itoa(i)
	}
	if l, ok := counterNames[counter]; ok {
		return l + "s"
	}
	return strings.ReplaceAll(counter, "-", " ")
}

// counterNames are the MIG total counters in words, singular.
var counterNames = map[string]string{
	model.CounterComputeSlices: "compute slice",
	model.CounterDecoders:      "decoder",
	model.CounterEncoders:      "encoder",
	model.CounterJPEGs:         "JPEG engine",
	model.CounterOFAs:          "OFA",
	model.CounterCopyEngines:   "copy engine",
}

// amountOf is "1 compute slice", "3 decoders".
func amountOf(n int64, counter string) string {
	l, ok := counterNames[counter]
	if !ok {
		return fmt.Sprintf("%d %s", n, counter)
	}
	if n != 1 {
		l += "s"
	}
	return fmt.Sprintf("%d %s", n, l)
}

// slicesRange is "memory slices 4-7" or "memory slice 6".
func slicesRange(idx []int) string {
	if len(idx) == 0 {
		return "no memory slice"
	}
	slices.Sort(idx)
	if len(idx) == 1 {
		return "memory slice " + strconv.Itoa(idx[0])
	}
	contiguous := idx[len(idx)-1]-idx[0] == len(idx)-1
	if contiguous {
		return fmt.Sprintf("memory slices %d-%d", idx[0], idx[len(idx)-1])
	}
	var parts []string
	for _, i := range idx {
		parts = append(parts, strconv.Itoa(i))
	}
	return "memory slices " + strings.Join(parts, ", ")
}

// slicesByHolder groups memory slices by who holds them, the holders in the
// order they first come.
type slicesByHolder struct {
	holders []string
	slices  map[string][]int
}

// add counts memory slice i as held by holder.
func (s *slicesByHolder) add(holder string, i int) {
	if s.slices == nil {
		s.slices = map[string][]int{}
	}
	if _, seen := s.slices[holder]; !seen {
		s.holders = append(s.holders, holder)
	}
	s.slices[holder] = append(s.slices[holder], i)
}

// migSlices is the memory slices a placement covers: "memory slices 4-7".
func migSlices(cc resourceapi.DeviceCounterConsumption) string {
	var mem []int
	for name := range cc.Counters {
		if i := memorySlice(name); i >= 0 {
			mem = append(mem, i)
		}
	}
	return slicesRange(mem)
}

// migNeeds is what a placement consumes, for people: "memory slices 4-7, 3
// compute slices, 3 decoders, 3 jpegs, 3 copy engines".
func migNeeds(cc resourceapi.DeviceCounterConsumption) string {
	var mem []int
	var others []string
	for _, name := range slices.SortedFunc(maps.Keys(cc.Counters), compareCounters) {
		if i := memorySlice(name); i >= 0 {
			mem = append(mem, i)
			continue
		}
		c := cc.Counters[name]
		others = append(others, amountOf(c.Value.Value(), name))
	}
	return strings.Join(append([]string{slicesRange(mem)}, others...), ", ")
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// claimsOf names the claims that hold a device.
func (e *explainer) claimsOf(d device) string {
	var claims []string
	for _, h := range e.holders[d.id] {
		claims = append(claims, h.claim)
	}
	return strings.Join(claims, ", ")
}

// migCounterReasons says why placement d's counters do not fit: the memory
// slices it needs and who holds each that is taken, and the totals that are
// short. short is false when every counter fits.
func (e *explainer) migCounterReasons(d device) (reason string, short bool) {
	cc, ok := migCounterConsumption(d.dev)
	if !ok {
		return "", false
	}
	u, ok := e.migUse(d.pool, cc.CounterSet)
	if !ok {
		return fmt.Sprintf("counter set %s is not published", cc.CounterSet), true
	}
	// Taken memory slices grouped by who takes them, in slice order.
	var taken slicesByHolder
	var totals []string
	for _, name := range slices.SortedFunc(maps.Keys(cc.Counters), compareCounters) {
		c := cc.Counters[name]
		need, free := c.Value.Value(), u.free(name)
		if need <= free {
			continue
		}
		if i := memorySlice(name); i >= 0 {
			var who []string
			for _, x := range u.users[name] {
				who = append(who, fmt.Sprintf("held by %s (%s)", e.claimsOf(x.d), x.d.dev.Name))
			}
			if u.foreign(name) > 0 {
				who = append(who, "used by a MIG instance no claim holds (made by an admin, or left behind)")
			}
			taken.add(strings.Join(who, " and "), i)
			continue
		}
		totals = append(totals, fmt.Sprintf("needs %s, %d free", amountOf(need, name), max(free, 0)))
	}
	var parts []string
	for _, who := range taken.holders {
		parts = append(parts, slicesRange(taken.slices[who])+" "+who)
	}
	parts = append(parts, totals...)
	if len(parts) == 0 {
		return "", false
	}
	return fmt.Sprintf("%s needs %s: %s", migProfile(d.dev), migNeeds(cc), strings.Join(parts, "; ")), true
}

// migUsage is, for the GPU of counter set name, who uses its totals
// (compute slices, engines) and its memory slices: said once per GPU.
func (e *explainer) migUsage(pool, name string) string {
	u, ok := e.migUse(pool, name)
	if !ok {
		return ""
	}
	var mem []int
	var engines []string
	var memBy slicesByHolder
	var parts []string
	for _, counter := range slices.SortedFunc(maps.Keys(u.set.Counters), compareCounters) {
		used := u.full[counter] - u.free(counter)
		if i := memorySlice(counter); i >= 0 {
			if used <= 0 {
				continue
			}
			mem = append(mem, i)
			var by []string
			for _, x := range u.users[counter] {
				by = append(by, e.claimsOf(x.d))
			}
			if u.foreign(counter) > 0 {
				by = append(by, "instances no claim holds")
			}
			memBy.add(strings.Join(by, ", "), i)
			continue
		}
		if used <= 0 {
			continue
		}
		if counter != model.CounterComputeSlices {
			// The engines' users are the compute slices' users.
			engines = append(engines, fmt.Sprintf("%s %d of %d", counterLabel(counter), used, u.full[counter]))
			continue
		}
		var by []string
		for _, x := range u.users[counter] {
			by = append(by, fmt.Sprintf("%s %d", e.claimsOf(x.d), x.amount))
		}
		if f := u.foreign(counter); f > 0 {
			by = append(by, fmt.Sprintf("instances no claim holds %d", f))
		}
		parts = append(parts, fmt.Sprintf("%s %d of %d used (%s)", counterLabel(counter), used, u.full[counter], strings.Join(by, ", ")))
	}
	if len(engines) > 0 {
		parts = append(parts, strings.Join(engines, ", ")+" used")
	}
	if len(parts) == 0 && len(mem) == 0 {
		return ""
	}
	used := "no memory slice used"
	if len(mem) > 0 {
		var by []string
		for _, who := range memBy.holders {
			by = append(by, strings.TrimPrefix(strings.TrimPrefix(slicesRange(memBy.slices[who]), "memory slices "), "memory slice ")+" "+who)
		}
		used = fmt.Sprintf("%s used (%s)", slicesRange(mem), strings.Join(by, ", "))
	}
	return fmt.Sprintf("MIG counters of %s: %s", name, strings.Join(append([]string{used}, parts...), "; "))
}

// compareCounters orders memory slices by index, then compute slices, then
// the engines by name.
func compareCounters(a, b string) int {
	ia, ib := memorySlice(a), memorySlice(b)
	switch {
	case ia >= 0 && ib >= 0:
		return cmp.Compare(ia, ib)
	case ia >= 0:
		return -1
	case ib >= 0:
		return 1
	}
	return cmp.Or(cmp.Compare(boolInt(a != model.CounterComputeSlices), boolInt(b != model.CounterComputeSlices)), cmp.Compare(a, b))
}

// selectorsFalse are the reasons that say a selector is false.
func selectorsFalse(reasons []string) []string {
	var out []string
	for _, r := range reasons {
		if strings.HasPrefix(r, "selector ") && strings.HasSuffix(r, " is false") {
			out = append(out, r)
		}
	}
	return out
}

// migMismatches gathers, per GPU and request, the MIG devices whose only
// reason is a false selector (another profile), so that the explanation
// names them once: a dynamic GPU publishes about 25 placements.
type migMismatches map[string]map[string]*migMismatch

type migMismatch struct {
	reasons  []string
	profiles []string
	devices  int
}

func (m migMismatches) add(gpu, label string, d device, reasons []string) {
	if m[gpu] == nil {
		m[gpu] = map[string]*migMismatch{}
	}
	x := m[gpu][label]
	if x == nil {
		x = &migMismatch{}
		m[gpu][label] = x
	}
	x.devices++
	for _, r := range reasons {
		if !slices.Contains(x.reasons, r) {
			x.reasons = append(x.reasons, r)
		}
	}
	p := ""
	if a, ok := d.dev.Attributes[model.AttrProfile]; ok && a.StringValue != nil {
		p = *a.StringValue
	}
	if p != "" && !slices.Contains(x.profiles, p) {
		x.profiles = append(x.profiles, p)
	}
}

// flush adds one reason per GPU and request to gpuReasons.
func (m migMismatches) flush(gpuReasons map[string][]string) {
	for gpu, byLabel := range m {
		for _, label := range slices.Sorted(maps.Keys(byLabel)) {
			x := byLabel[label]
			what := fmt.Sprintf("%d MIG devices", x.devices)
			if x.devices == 1 {
				what = "1 MIG device"
			}
			if len(x.profiles) > 0 {
				what += " (" + strings.Join(x.profiles, ", ") + ")"
			}
			gpuReasons[gpu] = append(gpuReasons[gpu], fmt.Sprintf("%s: %s: %s", label, what, strings.Join(x.reasons, "; ")))
		}
	}
}

// migFitsNow lists, per GPU of the node, the MIG profiles a new claim
// without tolerations could get now: free static instances, and placements
// whose counters fit.
func (e *explainer) migFitsNow(node string) []MIGFit {
	byGPU := map[string][]string{}
	for _, d := range e.nodeDevices(node) {
		if !d.isMIG() || hasBlockingTaint(d.dev) || e.allocated(d.id) {
			continue
		}
		if _, short := e.migCounterReasons(d); short {
			continue
		}
		p := "MIG"
		if a, ok := d.dev.Attributes[model.AttrProfile]; ok && a.StringValue != nil {
			p = *a.StringValue
		}
		g := d.gpuName()
		if !slices.Contains(byGPU[g], p) {
			byGPU[g] = append(byGPU[g], p)
		}
	}
	var out []MIGFit
	for _, g := range slices.SortedFunc(maps.Keys(byGPU), compareDeviceNames) {
		out = append(out, MIGFit{GPU: g, Profiles: byGPU[g]})
	}
	return out
}
