package why

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

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
