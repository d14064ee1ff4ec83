package why

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/utils/ptr"
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
