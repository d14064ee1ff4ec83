package why

import (
	"cmp"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// ruleTaints records which DeviceTaintRule added which taint to a device:
// per device of a patched slice, the rules of the taints appended after the
// ones its driver published, in the same order.
type ruleTaints map[*resourceapi.Device][]*resourceapi.DeviceTaintRule

// applyTaintRules is slice as kube-scheduler's allocator sees it: the taint
// of every DeviceTaintRule whose selector picks a device appended to that
// device's taints. The selection is the one of the scheduler's ResourceSlice
// tracker, Tracker.applyPatches in
// k8s.io/dynamic-resource-allocation/resourceslice/tracker (v0.37.2; it is not
// exported): a rule without a selector picks nothing; a set driver, pool or
// device must equal the slice's driver, its pool's name or the device's name;
// an unset one matches any. The slice is copied when a rule picks one of its
// devices and returned as is otherwise; the rules of the appended taints go to
// by.
func applyTaintRules(slice *resourceapi.ResourceSlice, rules []*resourceapi.DeviceTaintRule, by ruleTaints) *resourceapi.ResourceSlice {
	patched := slice
	for _, rule := range rules {
		sel := rule.Spec.DeviceSelector
		if sel == nil ||
			(sel.Driver != nil && *sel.Driver != slice.Spec.Driver) ||
			(sel.Pool != nil && *sel.Pool != slice.Spec.Pool.Name) {
			continue
		}
		for i := range slice.Spec.Devices {
			if sel.Device != nil && *sel.Device != slice.Spec.Devices[i].Name {
				continue
			}
			if patched == slice {
				patched = slice.DeepCopy()
			}
			d := &patched.Spec.Devices[i]
			d.Taints = append(d.Taints, rule.Spec.Taint)
			by[d] = append(by[d], rule)
		}
	}
	return patched
}

// sortedRules are pointers to rules, by name (the tracker takes them in its
// informer's order, which only changes the order of a device's taints).
func sortedRules(rules []resourceapi.DeviceTaintRule) []*resourceapi.DeviceTaintRule {
	out := make([]*resourceapi.DeviceTaintRule, len(rules))
	for i := range rules {
		out[i] = &rules[i]
	}
	slices.SortFunc(out, func(a, b *resourceapi.DeviceTaintRule) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// taintRule is the DeviceTaintRule that added d's taint number i, or nil for
// a taint the driver published.
func (r ruleTaints) taintRule(d *resourceapi.Device, i int) *resourceapi.DeviceTaintRule {
	added := r[d]
	first := len(d.Taints) - len(added)
	if i < first || i >= len(d.Taints) {
		return nil
	}
	return added[i-first]
}
