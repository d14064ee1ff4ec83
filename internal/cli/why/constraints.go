package why

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

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
