package why

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// claimVerdict is what explainClaim finds for one claim on one node.
type claimVerdict struct {
	// reasons concern the node, in the order found.
	reasons []string
	// informing counts the reasons that only inform (another driver's
	// devices that fit) rather than say what fails.
	informing int
	// gpuReasons concern one GPU, by GPU name, in the order found.
	gpuReasons map[string][]string
	// migUsage is, per GPU, the use of the MIG counters of placements
	// that do not fit: said once per GPU for all claims.
	migUsage map[string]string
}

// mergeInto adds the verdict to the node's reasons and to gpuReasons, and
// returns how many of the reasons it added only inform.
func (v claimVerdict) mergeInto(n *Node, gpuReasons map[string][]string) (informing int) {
	n.Reasons = append(n.Reasons, v.reasons...)
	for gpu, reasons := range v.gpuReasons {
		gpuReasons[gpu] = append(gpuReasons[gpu], reasons...)
	}
	for _, gpu := range slices.SortedFunc(maps.Keys(v.migUsage), compareDeviceNames) {
		if usage := v.migUsage[gpu]; !slices.Contains(gpuReasons[gpu], usage) {
			gpuReasons[gpu] = append(gpuReasons[gpu], usage)
		}
	}
	return v.informing
}

// explainClaim looks at every request of c on every device of the node and
// returns what fails: in reasons what concerns the node, in gpuReasons what
// concerns one GPU. A request for another driver's devices (a NIC beside a
// GPU) is looked at on that driver's devices of the node, for what the
// allocator checks of any device: the class, the selectors, taints and
// whether another claim holds it; that driver's own rules are not known here.
func (e *explainer) explainClaim(ctx context.Context, node string, c *resourceapi.ResourceClaim, nameClaim bool) claimVerdict {
	v := claimVerdict{gpuReasons: map[string][]string{}, migUsage: map[string]string{}}
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
					v.gpuReasons[d.gpuName()] = append(v.gpuReasons[d.gpuName()], fmt.Sprintf("%s: %s: DeviceClass %s: %v", label, d.dev.Name, class.Name, err))
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
					v.gpuReasons[d.gpuName()] = append(v.gpuReasons[d.gpuName()], fmt.Sprintf("%s: %s: %s", label, d.dev.Name, why))
				}
			}
			if len(candidates) == 0 {
				if !foreignRead {
					foreign, foreignRead = e.foreignDevices(node), true
				}
				var reason string
				_, fitting, reason = e.explainForeign(ctx, label, class, a, foreign)
				v.reasons = append(v.reasons, reason)
				fittingBy[r.Name] = append(fittingBy[r.Name], fitting...)
				if len(fitting) > 0 {
					v.informing++
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
				v.reasons = append(v.reasons, fmt.Sprintf("%s: needs %d devices, %d fit (%s)", label, need, len(fitting), names(fitting)))
			}
			for _, k := range c.Spec.Devices.Constraints {
				if k.MatchAttribute == nil || !constraintApplies(k, r.Name, a.name) || len(fitting) == 0 {
					continue
				}
				if why := matchAttributeShort(*k.MatchAttribute, fitting, need, shareable); why != "" {
					v.reasons = append(v.reasons, label+": "+why)
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
			v.reasons = append(v.reasons, label+": "+why)
		}
	}
	mismatches.flush(v.gpuReasons)
	for gpu, set := range migShort {
		if usage := e.migUsage(set[0], set[1]); usage != "" {
			v.migUsage[gpu] = usage
		}
	}
	return v
}

// explainForeign looks at a request whose class selects no device of this
// driver on the devices of the others, and returns the candidates (the
// class selects them), the fitting ones, and one reason for the node: that
// the request is another driver's and what fits of it, or why nothing
// does, device by device.
func (e *explainer) explainForeign(ctx context.Context, label string, class *resourceapi.DeviceClass, a alternative, foreign []device) (candidates, fitting []device, reason string) {
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
		return nil, nil, fmt.Sprintf("%s: no device of class %s on this node", label, a.class)
	}
	what := fmt.Sprintf("%s: devices of driver %s (class %s; tessera why checks another driver's devices for class, selectors, taints and holders only)",
		label, strings.Join(slices.Sorted(maps.Keys(drivers)), ", "), a.class)
	if len(fitting) == 0 {
		return candidates, nil, fmt.Sprintf("%s: none of %d fits: %s", what, len(candidates), strings.Join(refusals, "; "))
	}
	return candidates, fitting, fmt.Sprintf("%s: %d of %d fit (%s)", what, len(fitting), len(candidates), names(fitting))
}
