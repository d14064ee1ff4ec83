package health

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

// MIG devices (docs/mig.md). On a GPU in MIG mode the driver attributes an
// XID to the GPU instance and compute instance it occurred in (NVML's event
// data, gpu.EventMIGInstance). Such an event marks only that MIG device
// unhealthy, not the whole GPU: the other instances are isolated from it in
// hardware. Its status is kept under its own key ("<GPU UUID>/mig-gi<G>…")
// beside the GPUs' and recovers the same way; Tracker.Taints (the whole
// GPUs', by UUID, for model.WithTaints) leaves it out, and MIGTaints maps it
// to the devices the GPU publishes:
//
//   - static MIG: the GPU instance's device gpu-N-mig-<GI> (the device is
//     the whole GPU instance, whichever compute instance the event names);
//   - dynamic MIG: every placement device (gpu-N-mig-<profile>-<start>, of
//     every profile) that covers one of the memory slices of the faulty GPU
//     instance, from the placement the watcher read when the event came, so
//     the taint stays on those slices after the instance is destroyed and
//     its ID reused: an instance made there later, of any profile, uses the
//     same memory.
//
// An event the policy counts as fatal (the GPU needs a reset: a reset
// destroys every instance) marks the whole GPU even when it names an
// instance. Events without instance IDs mark the whole GPU, as before.

// MIGScope names the MIG device an event concerns.
type MIGScope struct {
	// GPUInstance is the GPU instance ID.
	GPUInstance int
	// ComputeInstance is the compute instance ID, -1 for every compute
	// instance of the GPU instance.
	ComputeInstance int
	// ProfileID and Placement are the GPU instance's when the event came;
	// ProfileID is -1 when they could not be read.
	ProfileID int
	Placement gpu.MIGPlacement
}

// key is the scope's part of a tracker key: "mig-gi2", "mig-gi2-ci0",
// "mig-gi2-ci0-p9-s4-n4".
func (s MIGScope) key() string {
	k := "mig-gi" + strconv.Itoa(s.GPUInstance)
	if s.ComputeInstance >= 0 {
		k += "-ci" + strconv.Itoa(s.ComputeInstance)
	}
	if s.ProfileID >= 0 {
		k += fmt.Sprintf("-p%d-s%d-n%d", s.ProfileID, s.Placement.Start, s.Placement.Size)
	}
	return k
}

// String is "GPU instance 2, compute instance 0".
func (s MIGScope) String() string {
	out := "GPU instance " + strconv.Itoa(s.GPUInstance)
	if s.ComputeInstance >= 0 {
		out += ", compute instance " + strconv.Itoa(s.ComputeInstance)
	}
	return out
}

// keySeparator separates a GPU's UUID from the MIG scope in tracker keys;
// GPU UUIDs ("GPU-…") have none.
const keySeparator = "/"

// statusKey is where the tracker and its store keep a status: the GPU's
// UUID, or "<UUID>/<scope key>" for a MIG device.
func statusKey(uuid string, scope *MIGScope) string {
	if scope == nil {
		return uuid
	}
	return uuid + keySeparator + scope.key()
}

// parseStatusKey is the inverse of statusKey. A key that is not a MIG key
// is a GPU's UUID.
func parseStatusKey(key string) (uuid string, scope *MIGScope, err error) {
	uuid, rest, ok := strings.Cut(key, keySeparator)
	if !ok {
		return key, nil, nil
	}
	bad := fmt.Errorf("MIG health key %q: want <GPU UUID>/mig-gi<N>[-ci<N>][-p<N>-s<N>-n<N>]", key)
	rest, ok = strings.CutPrefix(rest, "mig-")
	if !ok || uuid == "" {
		return "", nil, bad
	}
	s := &MIGScope{ComputeInstance: -1, ProfileID: -1}
	fields := strings.Split(rest, "-")
	seen := map[byte]bool{}
	for _, f := range fields {
		var name string
		switch {
		case strings.HasPrefix(f, "gi"):
			name, f = "g", f[2:]
		case strings.HasPrefix(f, "ci"):
			name, f = "c", f[2:]
		case f != "" && strings.ContainsRune("psn", rune(f[0])):
			name, f = f[:1], f[1:]
		default:
			return "", nil, bad
		}
		n, convErr := strconv.Atoi(f)
		if convErr != nil || n < 0 || seen[name[0]] {
			return "", nil, bad
		}
		seen[name[0]] = true
		switch name {
		case "g":
			s.GPUInstance = n
		case "c":
			s.ComputeInstance = n
		case "p":
			s.ProfileID = n
		case "s":
			s.Placement.Start = n
		case "n":
			s.Placement.Size = n
		}
	}
	if !seen['g'] || seen['p'] != seen['s'] || seen['s'] != seen['n'] {
		return "", nil, bad
	}
	return uuid, s, nil
}

// fatal reports whether the policy counts e as fatal: a fatal XID, a
// double-bit ECC error, a lost GPU.
func (p Policy) fatal(e Event) bool {
	switch e.Kind {
	case KindDoubleBitECC, KindGPULost:
		return true
	case KindXID:
		return slices.Contains(p.FatalXIDs, e.XID)
	}
	return false
}

// MIGStatuses are the unhealthy MIG devices of the GPU with this UUID.
func (t *Tracker) MIGStatuses(uuid string) []Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Status
	for _, s := range t.gpus {
		if s.UUID == uuid && s.MIG != nil {
			out = append(out, *s)
		}
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(statusKey(a.UUID, a.MIG), statusKey(b.UUID, b.MIG)) })
	return out
}

// MIGDevices are the devices g publishes that scope names (see the package
// documentation of MIG above), sorted; dynamic says whether g is published
// with dynamic MIG. None when g is not in MIG mode or the instance is gone
// (a static instance destroyed, or replaced by one at another placement).
func MIGDevices(g gpu.GPU, dynamic bool, scope MIGScope) []string {
	if !g.MIGEnabled || g.MIG == nil {
		return nil
	}
	current, found := migInstance(g.MIG, scope.GPUInstance)
	if dynamic {
		placement := scope.Placement
		if scope.ProfileID < 0 {
			if !found {
				return nil
			}
			placement = current.Placement
		}
		if placement.Size <= 0 {
			return nil
		}
		var out []string
		for _, p := range g.MIG.Profiles {
			for _, pl := range p.Placements {
				if pl.Overlaps(placement) {
					out = append(out, model.MIGPlacementDeviceName(g.Minor, p.Name, pl.Start))
				}
			}
		}
		slices.Sort(out)
		return out
	}
	if !found || len(current.ComputeInstances) == 0 || (scope.ProfileID >= 0 && (current.ProfileID != scope.ProfileID || current.Placement != scope.Placement)) {
		return nil
	}
	return []string{model.MIGStaticDeviceName(g.Minor, current.ID)}
}

func migInstance(m *gpu.MIG, id int) (gpu.MIGInstance, bool) {
	for _, gi := range m.Instances {
		if gi.ID == id {
			return gi, true
		}
	}
	return gpu.MIGInstance{}, false
}

// MIGDeviceStatuses are the unhealthy MIG devices of gpus by device name,
// each with the strongest status that names it; dynamic says which GPUs are
// published with dynamic MIG (nil: none). The kubelet plugin's health report
// marks these devices unhealthy, and MIGTaints taints them.
func (t *Tracker) MIGDeviceStatuses(gpus []gpu.GPU, dynamic func(gpu.GPU) bool) map[string]Status {
	out := map[string]Status{}
	for _, g := range gpus {
		if !g.MIGEnabled {
			continue
		}
		dyn := dynamic != nil && dynamic(g)
		for _, s := range t.MIGStatuses(g.UUID) {
			for _, d := range MIGDevices(g, dyn, *s.MIG) {
				if have, ok := out[d]; !ok || stronger(s.Effect, have.Effect) {
					out[d] = s
				}
			}
		}
	}
	return out
}

// MIGTaints are the device taints of the unhealthy MIG devices of gpus, by
// device name (see MIGDeviceStatuses), for TaintDevices.
func (t *Tracker) MIGTaints(gpus []gpu.GPU, dynamic func(gpu.GPU) bool) map[string][]resourceapi.DeviceTaint {
	out := map[string][]resourceapi.DeviceTaint{}
	for d, s := range t.MIGDeviceStatuses(gpus, dynamic) {
		out[d] = []resourceapi.DeviceTaint{*s.Taint()}
	}
	return out
}

// TaintDevices adds taints to the devices of res they name (device names
// are unique within a node's pool), after model.Resources built it: the MIG
// device taints of MIGTaints, which model.WithTaints (by GPU) cannot carry.
// A taint the device has already (same key, value and effect) is not added
// twice. Device taint lists are copied before they change: model shares one
// list among the devices of a GPU.
func TaintDevices(res *resourceslice.DriverResources, taints map[string][]resourceapi.DeviceTaint) {
	if len(taints) == 0 {
		return
	}
	for name, pool := range res.Pools {
		for i := range pool.Slices {
			for j := range pool.Slices[i].Devices {
				d := &pool.Slices[i].Devices[j]
				add := taints[d.Name]
				if len(add) == 0 {
					continue
				}
				merged := slices.Clone(d.Taints)
				for _, t := range add {
					if !slices.ContainsFunc(merged, func(x resourceapi.DeviceTaint) bool {
						return x.Key == t.Key && x.Value == t.Value && x.Effect == t.Effect
					}) {
						merged = append(merged, t)
					}
				}
				d.Taints = merged
			}
		}
		res.Pools[name] = pool
	}
}
