package why

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/internal/cli/clusterview"
	"github.com/tessera-dev/tessera/pkg/locality"
	"github.com/tessera-dev/tessera/pkg/model"
)

// alternative is one way to satisfy a request: the request itself
// (exactly) or one of its firstAvailable subrequests.
type alternative struct {
	name        string // "gpu" or "gpu/nvlink"
	class       string
	selectors   []resourceapi.DeviceSelector
	tolerations []resourceapi.DeviceToleration
	capacity    map[resourceapi.QualifiedName]resource.Quantity
	mode        resourceapi.DeviceAllocationMode
	count       int64
	adminAccess bool
}

// alternatives lists a request's ways to be satisfied, in order.
func alternatives(r resourceapi.DeviceRequest) []alternative {
	if r.Exactly != nil {
		x := r.Exactly
		a := alternative{name: r.Name, class: x.DeviceClassName, selectors: x.Selectors, tolerations: x.Tolerations,
			mode: x.AllocationMode, count: x.Count, adminAccess: ptr.Deref(x.AdminAccess, false)}
		if x.Capacity != nil {
			a.capacity = x.Capacity.Requests
		}
		return []alternative{a.defaulted()}
	}
	var out []alternative
	for _, s := range r.FirstAvailable {
		a := alternative{name: resourceclaim.CreateSubRequestRef(r.Name, s.Name), class: s.DeviceClassName,
			selectors: s.Selectors, tolerations: s.Tolerations, mode: s.AllocationMode, count: s.Count}
		if s.Capacity != nil {
			a.capacity = s.Capacity.Requests
		}
		out = append(out, a.defaulted())
	}
	return out
}

// defaulted applies the API server's defaults (ExactCount, count 1).
func (a alternative) defaulted() alternative {
	if a.mode == "" {
		a.mode = resourceapi.DeviceAllocationModeExactCount
	}
	if a.mode == resourceapi.DeviceAllocationModeExactCount && a.count == 0 {
		a.count = 1
	}
	return a
}

func (a alternative) String() string {
	var b strings.Builder
	if a.mode == resourceapi.DeviceAllocationModeAll {
		fmt.Fprintf(&b, "all of %s", a.class)
	} else {
		fmt.Fprintf(&b, "%d of %s", a.count, a.class)
	}
	for _, name := range slices.Sorted(maps.Keys(a.capacity)) {
		q := a.capacity[name]
		fmt.Fprintf(&b, ", %s %s", name, q.String())
	}
	for _, s := range a.selectors {
		if s.CEL != nil {
			fmt.Fprintf(&b, ", selector %s", s.CEL.Expression)
		}
	}
	if a.adminAccess {
		b.WriteString(", admin access")
	}
	return b.String()
}

// describeRequests is one line per request of c, with its constraints.
func (e *explainer) describeRequests(c *resourceapi.ResourceClaim) []string {
	var out []string
	for _, r := range c.Spec.Devices.Requests {
		alts := alternatives(r)
		if r.Exactly != nil {
			out = append(out, r.Name+": "+alts[0].String())
			continue
		}
		var parts []string
		for _, a := range alts {
			parts = append(parts, a.name+" ("+a.String()+")")
		}
		out = append(out, r.Name+": first available of "+strings.Join(parts, "; "))
	}
	for _, k := range c.Spec.Devices.Constraints {
		if k.MatchAttribute != nil {
			reqs := "all requests"
			if len(k.Requests) > 0 {
				reqs = strings.Join(k.Requests, ", ")
			}
			out = append(out, fmt.Sprintf("constraint: same %s for %s", *k.MatchAttribute, reqs))
		}
	}
	if out == nil {
		out = []string{}
	}
	return out
}

// classesOf names every DeviceClass c's requests use.
func (e *explainer) classesOf(c *resourceapi.ResourceClaim) []string {
	var out []string
	for _, r := range c.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if !slices.Contains(out, a.class) {
				out = append(out, a.class)
			}
		}
	}
	return out
}

// device is one published device on the node: of this driver, or of
// another one a request asks for (foreign).
type device struct {
	driver string
	pool   string
	dev    *resourceapi.Device
	id     structured.DeviceID
}

func (d device) foreign() bool { return d.driver != model.DriverName }

// gpuName is the GPU a device belongs to (gpu-N for gpu-N, gpu-N-shared,
// gpu-N-lent and the MIG devices gpu-N-mig-…), or the device's name for a
// device not named that way.
func (d device) gpuName() string {
	minor, _, err := model.ParseDevice(d.dev.Name)
	if err != nil {
		if m, migErr := model.ParseMIGDevice(d.dev.Name); migErr == nil && !d.foreign() {
			return model.WholeDeviceName(m.Minor)
		}
		return d.dev.Name
	}
	return model.WholeDeviceName(minor)
}

func (d device) multi() bool { return ptr.Deref(d.dev.AllowMultipleAllocations, false) }

// nodeDevices are this driver's devices on the node (newest generation of
// each pool), in slice order.
func (e *explainer) nodeDevices(node string) []device {
	var out []device
	for _, s := range e.slices {
		if s.Spec.Driver != model.DriverName || ptr.Deref(s.Spec.NodeName, "") != node ||
			s.Spec.Pool.Generation != e.newest[s.Spec.Driver+"/"+s.Spec.Pool.Name] {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			out = append(out, device{driver: model.DriverName, pool: s.Spec.Pool.Name, dev: d, id: structured.MakeDeviceID(model.DriverName, s.Spec.Pool.Name, d.Name)})
		}
	}
	return out
}

// foreignDevices are the devices of every other driver that the node can
// use (slices of the node, or for all nodes; newest generation of each
// pool), in slice order.
func (e *explainer) foreignDevices(node string) []device {
	var out []device
	for _, s := range e.slices {
		if s.Spec.Driver == model.DriverName || (ptr.Deref(s.Spec.NodeName, "") != node && !ptr.Deref(s.Spec.AllNodes, false)) ||
			s.Spec.Pool.Generation != e.newest[s.Spec.Driver+"/"+s.Spec.Pool.Name] {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			out = append(out, device{driver: s.Spec.Driver, pool: s.Spec.Pool.Name, dev: d, id: structured.MakeDeviceID(s.Spec.Driver, s.Spec.Pool.Name, d.Name)})
		}
	}
	return out
}

// counterSet is a pool's shared counter set by name (newest generation).
func (e *explainer) counterSet(pool, name string) (resourceapi.CounterSet, bool) {
	for _, s := range e.slices {
		if s.Spec.Driver != model.DriverName || s.Spec.Pool.Name != pool || s.Spec.Pool.Generation != e.newest[s.Spec.Driver+"/"+pool] {
			continue
		}
		for _, cs := range s.Spec.SharedCounters {
			if cs.Name == name {
				return cs, true
			}
		}
	}
	return resourceapi.CounterSet{}, false
}

// allocated reports whether any claim holds the device (whole, or a share).
func (e *explainer) allocated(id structured.DeviceID) bool { return len(e.holders[id]) > 0 }

// consumed sums what the shares of a device consume, per capacity.
func (e *explainer) consumed(id structured.DeviceID) map[resourceapi.QualifiedName]int64 {
	out := map[resourceapi.QualifiedName]int64{}
	for _, c := range e.in.Claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.ShareID == nil || ptr.Deref(res.AdminAccess, false) || structured.MakeDeviceID(res.Driver, res.Pool, res.Device) != id {
				continue
			}
			for name, q := range res.ConsumedCapacity {
				out[name] += q.Value()
			}
		}
	}
	return out
}

// explainClaim looks at every request of c on every device of the node and
// adds what fails: to n.Reasons what concerns the node, to gpuReasons what
// concerns one GPU. A request for another driver's devices (a NIC beside a
// GPU) is looked at on that driver's devices of the node, for what the
// allocator checks of any device: the class, the selectors, taints and
// whether another claim holds it; that driver's own rules are not known here.
//
// It returns how many of the reasons it added only inform (another driver's
// devices that fit) rather than say what fails.
func (e *explainer) explainClaim(ctx context.Context, node string, c *resourceapi.ResourceClaim, nameClaim bool, n *Node, gpuReasons map[string][]string) (informing int) {
	devices := e.nodeDevices(node)
	var foreign []device
	foreignRead := false
	// fittingBy are the fitting devices of each request (of all its
	// alternatives), for the constraints across requests.
	fittingBy := map[string][]device{}
	mismatches := migMismatches{}
	// migShort are the MIG counter sets (by pool and name) of placements
	// whose counters do not fit, keyed by GPU: their use is said once.
	migShort := map[string][2]string{}
	defer func() {
		mismatches.flush(gpuReasons)
		for _, gpu := range slices.SortedFunc(maps.Keys(migShort), compareDeviceNames) {
			usage := e.migUsage(migShort[gpu][0], migShort[gpu][1])
			if usage != "" && !slices.Contains(gpuReasons[gpu], usage) {
				gpuReasons[gpu] = append(gpuReasons[gpu], usage)
			}
		}
	}()
	for _, r := range c.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			label := fmt.Sprintf("request %q", a.name)
			if nameClaim {
				label = fmt.Sprintf("claim %s request %q", c.Name, a.name)
			}
			class, ok := e.classes[a.class]
			if !ok {
				continue // a note of the report already says so
			}
			var candidates, fitting []device
			for _, d := range devices {
				match, err := e.classMatches(ctx, class, d)
				if err != nil {
					gpuReasons[d.gpuName()] = append(gpuReasons[d.gpuName()], fmt.Sprintf("%s: %s: DeviceClass %s: %v", label, d.dev.Name, class.Name, err))
					continue
				}
				if !match {
					continue
				}
				candidates = append(candidates, d)
				reasons := e.deviceReasons(ctx, d, a)
				if len(reasons) == 0 {
					fitting = append(fitting, d)
					continue
				}
				if d.isMIG() {
					// A MIG device the request's selectors reject (another
					// profile) is named once per GPU, without what else
					// keeps it: a dynamic GPU publishes about 25.
					if falseSelectors := selectorsFalse(reasons); len(falseSelectors) > 0 {
						mismatches.add(d.gpuName(), label, d, falseSelectors)
						continue
					}
					if cc, ok := migCounterConsumption(d.dev); ok {
						if _, short := e.migCounterReasons(d); short || e.allocated(d.id) {
							migShort[d.gpuName()] = [2]string{d.pool, cc.CounterSet}
						}
					}
				}
				for _, why := range reasons {
					gpuReasons[d.gpuName()] = append(gpuReasons[d.gpuName()], fmt.Sprintf("%s: %s: %s", label, d.dev.Name, why))
				}
			}
			if len(candidates) == 0 {
				if !foreignRead {
					foreign, foreignRead = e.foreignDevices(node), true
				}
				candidates, fitting = e.explainForeign(ctx, label, class, a, foreign, n)
				fittingBy[r.Name] = append(fittingBy[r.Name], fitting...)
				if len(fitting) > 0 {
					informing++
				}
				continue
			}
			fittingBy[r.Name] = append(fittingBy[r.Name], fitting...)
			need := a.count
			if a.mode == resourceapi.DeviceAllocationModeAll {
				need = int64(len(candidates))
			}
			shareable := slices.ContainsFunc(fitting, device.multi)
			if len(fitting) > 0 && int64(len(fitting)) < need && !shareable {
				n.Reasons = append(n.Reasons, fmt.Sprintf("%s: needs %d devices, %d fit (%s)", label, need, len(fitting), names(fitting)))
			}
			for _, k := range c.Spec.Devices.Constraints {
				if k.MatchAttribute == nil || !constraintApplies(k, r.Name, a.name) || len(fitting) == 0 {
					continue
				}
				if why := matchAttributeShort(*k.MatchAttribute, fitting, need, shareable); why != "" {
					n.Reasons = append(n.Reasons, label+": "+why)
				}
			}
		}
	}
	for _, k := range c.Spec.Devices.Constraints {
		if k.MatchAttribute == nil {
			continue
		}
		if why := noCommonValue(*k.MatchAttribute, constrainedRequests(c, k), fittingBy); why != "" {
			label := "constraint"
			if nameClaim {
				label = "claim " + c.Name + " constraint"
			}
			n.Reasons = append(n.Reasons, label+": "+why)
		}
	}
	return informing
}

// explainForeign looks at a request whose class selects no device of this
// driver on the devices of the others, and returns the candidates (the
// class selects them) and the fitting ones. It adds one reason to the node:
// that the request is another driver's and what fits of it, or why nothing
// does, device by device.
func (e *explainer) explainForeign(ctx context.Context, label string, class *resourceapi.DeviceClass, a alternative, foreign []device, n *Node) (candidates, fitting []device) {
	var refusals []string
	drivers := map[string]bool{}
	for _, d := range foreign {
		match, err := e.classMatches(ctx, class, d)
		if err != nil || !match {
			continue
		}
		candidates = append(candidates, d)
		drivers[d.driver] = true
		reasons := e.foreignReasons(ctx, d, a)
		if len(reasons) == 0 {
			fitting = append(fitting, d)
			continue
		}
		refusals = append(refusals, d.dev.Name+": "+strings.Join(reasons, "; "))
	}
	if len(candidates) == 0 {
		n.Reasons = append(n.Reasons, fmt.Sprintf("%s: no device of class %s on this node", label, a.class))
		return nil, nil
	}
	what := fmt.Sprintf("%s: devices of driver %s (class %s; tessera why checks another driver's devices for class, selectors, taints and holders only)",
		label, strings.Join(slices.Sorted(maps.Keys(drivers)), ", "), a.class)
	if len(fitting) == 0 {
		n.Reasons = append(n.Reasons, fmt.Sprintf("%s: none of %d fits: %s", what, len(candidates), strings.Join(refusals, "; ")))
		return candidates, nil
	}
	n.Reasons = append(n.Reasons, fmt.Sprintf("%s: %d of %d fit (%s)", what, len(fitting), len(candidates), names(fitting)))
	return candidates, fitting
}

// foreignReasons is what keeps alternative a off another driver's device d,
// as far as the allocator's generic checks go.
func (e *explainer) foreignReasons(ctx context.Context, d device, a alternative) []string {
	out := e.selectorAndTaintReasons(ctx, d, a)
	if !a.adminAccess && !d.multi() && e.allocated(d.id) {
		var claims []string
		for _, h := range e.holders[d.id] {
			claims = append(claims, h.claim)
		}
		out = append(out, "held by "+strings.Join(claims, ", "))
	}
	return out
}

// constrainedRequests are the names of the requests a constraint covers
// (all of the claim's when it names none).
func constrainedRequests(c *resourceapi.ResourceClaim, k resourceapi.DeviceConstraint) []string {
	var out []string
	for _, r := range c.Spec.Devices.Requests {
		if len(k.Requests) == 0 || slices.Contains(k.Requests, r.Name) || slices.ContainsFunc(k.Requests, func(s string) bool {
			return strings.HasPrefix(s, r.Name+"/")
		}) {
			out = append(out, r.Name)
		}
	}
	return out
}

// noCommonValue says why a matchAttribute constraint over several requests
// cannot hold although each request has fitting devices: no value of attr
// is had by a fitting device of every request (a GPU and a NIC under
// different PCIe roots). "" when one is, or when a request has no fitting
// device (its own reason says so).
func noCommonValue(attr resourceapi.FullyQualifiedName, requests []string, fittingBy map[string][]device) string {
	if len(requests) < 2 {
		return ""
	}
	var common map[string]bool
	var parts []string
	for _, r := range requests {
		fitting := fittingBy[r]
		if len(fitting) == 0 {
			return ""
		}
		values := map[string]bool{}
		for _, d := range fitting {
			if v, ok := attribute(d, attr); ok {
				values[v] = true
			}
		}
		part := fmt.Sprintf("%s: %s", r, strings.Join(slices.Sorted(maps.Keys(values)), ", "))
		if len(values) == 0 {
			part = r + ": no fitting device has it"
		}
		parts = append(parts, part)
		if common == nil {
			common = values
			continue
		}
		for v := range common {
			if !values[v] {
				delete(common, v)
			}
		}
	}
	if len(common) > 0 {
		return ""
	}
	return fmt.Sprintf("matchAttribute %s across %s: no value is shared by fitting devices of every request (%s)",
		attr, strings.Join(requests, ", "), strings.Join(parts, "; "))
}

// names lists the devices' names, gpu-2 before gpu-10.
func names(ds []device) string {
	var out []string
	for _, d := range ds {
		out = append(out, d.dev.Name)
	}
	slices.SortFunc(out, compareDeviceNames)
	return strings.Join(out, ", ")
}

func constraintApplies(k resourceapi.DeviceConstraint, request, alternative string) bool {
	return len(k.Requests) == 0 || slices.Contains(k.Requests, request) || slices.Contains(k.Requests, alternative)
}

// matchAttributeShort says why no value of attr is shared by need fitting
// devices (an NVLink domain too small), or "" when one is.
func matchAttributeShort(attr resourceapi.FullyQualifiedName, fitting []device, need int64, shareable bool) string {
	groups := map[string][]device{}
	var without []string
	for _, d := range fitting {
		v, ok := attribute(d, attr)
		if !ok {
			without = append(without, d.dev.Name)
			continue
		}
		groups[v] = append(groups[v], d)
	}
	best, bestValue := 0, ""
	for _, v := range slices.Sorted(maps.Keys(groups)) {
		if len(groups[v]) > best {
			best, bestValue = len(groups[v]), v
		}
	}
	if int64(best) >= need || (best > 0 && shareable) {
		return ""
	}
	msg := fmt.Sprintf("matchAttribute %s: needs %d devices with one value, ", attr, need)
	if best == 0 {
		msg += "no fitting device has the attribute"
	} else {
		msg += fmt.Sprintf("the largest group of fitting devices is %d (%s=%s: %s)", best, attr, bestValue, names(groups[bestValue]))
	}
	if len(without) > 0 {
		msg += fmt.Sprintf("; without the attribute: %s", strings.Join(without, ", "))
	}
	return msg
}

// attribute is the string form of a device's attribute named by its fully
// qualified name (a driver's own attributes may be stored unqualified).
func attribute(dv device, name resourceapi.FullyQualifiedName) (string, bool) {
	d := dv.dev
	a, ok := d.Attributes[resourceapi.QualifiedName(name)]
	if !ok {
		if local, found := strings.CutPrefix(string(name), dv.driver+"/"); found {
			a, ok = d.Attributes[resourceapi.QualifiedName(local)]
		}
	}
	if !ok {
		return "", false
	}
	switch {
	case a.StringValue != nil:
		return *a.StringValue, true
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10), true
	case a.BoolValue != nil:
		return strconv.FormatBool(*a.BoolValue), true
	case a.VersionValue != nil:
		return *a.VersionValue, true
	}
	return "", false
}

// celDevice is the device as CEL selectors see it.
func celDevice(d device) cel.Device {
	return cel.Device{Driver: d.driver, AllowMultipleAllocations: d.dev.AllowMultipleAllocations,
		Attributes: d.dev.Attributes, Capacity: d.dev.Capacity}
}

// selectorMatches evaluates one CEL selector on a device with the
// allocator's CEL library.
func (e *explainer) selectorMatches(ctx context.Context, expr string, d device) (bool, error) {
	res := e.cel.GetOrCompile(expr)
	if res.Error != nil {
		return false, fmt.Errorf("selector %s: %w", expr, res.Error)
	}
	ok, _, err := res.DeviceMatches(ctx, celDevice(d))
	if err != nil {
		return false, fmt.Errorf("selector %s: %w", expr, err)
	}
	return ok, nil
}

func (e *explainer) classMatches(ctx context.Context, class *resourceapi.DeviceClass, d device) (bool, error) {
	for _, s := range class.Spec.Selectors {
		if s.CEL == nil {
			continue
		}
		ok, err := e.selectorMatches(ctx, s.CEL.Expression, d)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// selectorAndTaintReasons are a's selectors that are false for d (or fail)
// and d's taints that a does not tolerate.
func (e *explainer) selectorAndTaintReasons(ctx context.Context, d device, a alternative) []string {
	var out []string
	for _, s := range a.selectors {
		if s.CEL == nil {
			continue
		}
		ok, err := e.selectorMatches(ctx, s.CEL.Expression, d)
		switch {
		case err != nil:
			out = append(out, err.Error())
		case !ok:
			out = append(out, fmt.Sprintf("selector %s is false", s.CEL.Expression))
		}
	}
	out = append(out, e.taintReasons(d, a)...)
	return out
}

// deviceReasons is what keeps alternative a off device d (nil when
// nothing does).
func (e *explainer) deviceReasons(ctx context.Context, d device, a alternative) []string {
	out := e.selectorAndTaintReasons(ctx, d, a)
	if a.adminAccess {
		return out // admin access ignores what others hold
	}
	if d.multi() {
		out = append(out, e.capacityReasons(d, a)...)
	} else {
		if e.allocated(d.id) {
			if cc, ok := migCounterConsumption(d.dev); ok {
				// A placement held: name the memory slices its instance covers.
				out = append(out, fmt.Sprintf("held by %s (MIG device %s, %s)", e.claimsOf(d), d.dev.Name, migSlices(cc)))
			} else {
				out = append(out, "held by "+e.holderList(d.id))
			}
		}
		for name, want := range a.capacity {
			if c, ok := d.dev.Capacity[name]; ok && want.Cmp(c.Value) > 0 {
				out = append(out, fmt.Sprintf("asks %s %s, the device has %s", name, quantity(name, want.Value()), quantity(name, c.Value.Value())))
			}
		}
	}
	if !e.allocated(d.id) {
		// A shared device with shares has its counters charged already; a
		// device held whole is reported above. A MIG placement's counters
		// are memory slices, compute slices and engines.
		if _, ok := migCounterConsumption(d.dev); ok {
			if why, short := e.migCounterReasons(d); short {
				out = append(out, why)
			}
		} else {
			out = append(out, e.counterReasons(d)...)
		}
	}
	return out
}

// capacityReasons compares what a share asks, after the device's request
// policy, with what the device's shares leave.
func (e *explainer) capacityReasons(d device, a alternative) []string {
	var out []string
	used := e.consumed(d.id)
	for _, name := range slices.Sorted(maps.Keys(d.dev.Capacity)) {
		c := d.dev.Capacity[name]
		var asked *resource.Quantity
		if q, ok := a.capacity[name]; ok {
			asked = &q
		}
		want, policyErr := consumedCapacity(asked, c)
		if policyErr != "" {
			out = append(out, fmt.Sprintf("%s: %s", name, policyErr))
			continue
		}
		total := c.Value.Value()
		free := total - used[name]
		if want > total {
			out = append(out, fmt.Sprintf("%s: asks %s, more than the whole GPU (%s)", name, quantity(name, want), quantity(name, total)))
			continue
		}
		if want > free {
			msg := fmt.Sprintf("%s short by %s: asks %s, %s free of %s", name, quantity(name, want-free), quantity(name, want), quantity(name, free), quantity(name, total))
			if e.allocated(d.id) {
				msg += "; held by " + e.holderList(d.id)
			}
			out = append(out, msg)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(a.capacity)) {
		if _, ok := d.dev.Capacity[name]; !ok {
			out = append(out, fmt.Sprintf("asks capacity %s, which the device does not have", name))
		}
	}
	return out
}

// consumedCapacity is what a request consumes of a capacity (the
// allocator's rule: the default or the full value when not asked, else
// rounded up to min + k*step), or why the request policy refuses it.
func consumedCapacity(asked *resource.Quantity, c resourceapi.DeviceCapacity) (int64, string) {
	p := c.RequestPolicy
	if asked == nil {
		if p != nil && p.Default != nil {
			return p.Default.Value(), ""
		}
		return c.Value.Value(), ""
	}
	v := asked.Value()
	if p == nil {
		return v, ""
	}
	if r := p.ValidRange; r != nil && r.Min != nil {
		lo := r.Min.Value()
		if v < lo {
			v = lo
		}
		if r.Step != nil && r.Step.Value() > 0 {
			step := r.Step.Value()
			v = lo + (v-lo+step-1)/step*step
		}
		if r.Max != nil && v > r.Max.Value() {
			return 0, fmt.Sprintf("asks %s, above the maximum %s of one share", asked.String(), r.Max.String())
		}
		return v, ""
	}
	if len(p.ValidValues) > 0 {
		for _, vv := range p.ValidValues {
			if vv.Value() >= v {
				return vv.Value(), ""
			}
		}
		return 0, fmt.Sprintf("asks %s, above every valid value", asked.String())
	}
	return v, ""
}

// counterReasons says which allocated devices use up the counters d needs.
func (e *explainer) counterReasons(d device) []string {
	var out []string
	for _, cc := range d.dev.ConsumesCounters {
		set, ok := e.counterSet(d.pool, cc.CounterSet)
		if !ok {
			out = append(out, fmt.Sprintf("counter set %s is not published", cc.CounterSet))
			continue
		}
		used := map[string]int64{}
		var users []device
		for _, o := range e.poolDevices(d.pool) {
			if o.dev.Name == d.dev.Name || !e.allocated(o.id) {
				continue
			}
			for _, occ := range o.dev.ConsumesCounters {
				if occ.CounterSet != cc.CounterSet {
					continue
				}
				users = append(users, o)
				for name, c := range occ.Counters {
					used[name] += c.Value.Value()
				}
			}
		}
		var short []string
		for _, name := range slices.Sorted(maps.Keys(cc.Counters)) {
			needC, haveC := cc.Counters[name], set.Counters[name]
			if need, have := needC.Value.Value(), haveC.Value.Value()-used[name]; need > have {
				short = append(short, name)
			}
		}
		if len(short) == 0 {
			continue
		}
		var holders []string
		shares := false
		for _, u := range users {
			holders = append(holders, e.holderList(u.id))
			shares = shares || u.multi()
		}
		what := "held whole by "
		if shares {
			what = "whole GPU blocked by shares: "
		}
		out = append(out, fmt.Sprintf("%s%s (counter set %s: %s)", what, strings.Join(holders, ", "), cc.CounterSet, strings.Join(short, ", ")))
	}
	return out
}

// poolDevices are all devices of a pool (newest generation).
func (e *explainer) poolDevices(pool string) []device {
	var out []device
	for _, s := range e.slices {
		if s.Spec.Driver != model.DriverName || s.Spec.Pool.Name != pool || s.Spec.Pool.Generation != e.newest[s.Spec.Driver+"/"+pool] {
			continue
		}
		for i := range s.Spec.Devices {
			out = append(out, device{driver: model.DriverName, pool: pool, dev: &s.Spec.Devices[i], id: structured.MakeDeviceID(model.DriverName, pool, s.Spec.Devices[i].Name)})
		}
	}
	return out
}

func (e *explainer) holderList(id structured.DeviceID) string {
	var out []string
	for _, h := range e.holders[id] {
		out = append(out, h.String())
	}
	return strings.Join(out, ", ")
}

// taintReasons names the taints of d that keep alternative a off it, as the
// allocator decides (NoSchedule and NoExecute unless tolerated): "tainted
// KEY=VALUE:EFFECT", with "by DeviceTaintRule NAME" for a taint a rule added.
func (e *explainer) taintReasons(d device, a alternative) []string {
	var out []string
	for i, t := range d.dev.Taints {
		if t.Effect != resourceapi.DeviceTaintEffectNoSchedule && t.Effect != resourceapi.DeviceTaintEffectNoExecute {
			continue
		}
		if slices.ContainsFunc(a.tolerations, func(tol resourceapi.DeviceToleration) bool { return resourceclaim.ToleratesTaint(tol, t) }) {
			continue
		}
		why := "tainted " + taintString(t)
		if rule := e.byRule.taintRule(d.dev, i); rule != nil {
			why = "tainted by DeviceTaintRule " + rule.Name + ": " + taintString(t)
		}
		out = append(out, why)
	}
	return out
}

func taintString(t resourceapi.DeviceTaint) string {
	s := t.Key
	if t.Value != "" {
		s += "=" + t.Value
	}
	s += ":" + string(t.Effect)
	switch t.Key {
	case "gpu.tessera.dev/unhealthy":
		s += " (the GPU is unhealthy)"
	case model.NotLentTaintKey:
		s += " (the GPU is not lent now)"
	case model.ReclaimTaintKey:
		s += " (the owner takes the GPU back)"
	case locality.FenceTaintKey:
		s += " (a locality fence: the locality controller steers shares away from this GPU after rejecting one here)"
	}
	return s
}

// quantity formats an amount of a capacity: bytes for memory, a plain
// number otherwise.
func quantity(name resourceapi.QualifiedName, v int64) string {
	if name == model.Memory {
		return bytes(v)
	}
	return strconv.FormatInt(v, 10)
}

func bytes(v int64) string { return clusterview.Bytes(v) }

// fitsNow is the largest share and the free whole GPUs of a node, as a
// claim without tolerations would find them.
func (e *explainer) fitsNow(node string) FitsNow {
	var f FitsNow
	for _, d := range e.nodeDevices(node) {
		minor, kind, err := model.ParseDevice(d.dev.Name)
		if err != nil || kind == model.KindLent || hasBlockingTaint(d.dev) {
			continue
		}
		if len(e.counterReasons(d)) > 0 && !(d.multi() && e.allocated(d.id)) {
			continue
		}
		if kind == model.KindWhole {
			if !e.allocated(d.id) {
				f.WholeGPUs++
			}
			continue
		}
		used := e.consumed(d.id)
		s := Share{GPU: model.WholeDeviceName(minor)}
		if c, ok := d.dev.Capacity[model.Memory]; ok {
			s.MemoryBytes = c.Value.Value() - used[model.Memory]
		}
		if c, ok := d.dev.Capacity[model.Cores]; ok {
			s.Cores = c.Value.Value() - used[model.Cores]
		}
		if s.MemoryBytes <= 0 {
			continue
		}
		if l := f.LargestShare; l == nil || s.MemoryBytes > l.MemoryBytes || (s.MemoryBytes == l.MemoryBytes && s.Cores > l.Cores) {
			f.LargestShare = &s
		}
	}
	f.MIG = e.migFitsNow(node)
	return f
}

func hasBlockingTaint(d *resourceapi.Device) bool {
	return slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool {
		return t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute
	})
}
