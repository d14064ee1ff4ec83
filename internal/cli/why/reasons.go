package why

import (
	"context"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/tessera-dev/tessera/pkg/locality"
	"github.com/tessera-dev/tessera/pkg/model"
)

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

func hasBlockingTaint(d *resourceapi.Device) bool {
	return slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool {
		return t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute
	})
}
