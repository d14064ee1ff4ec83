package locality

import (
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// phase is where a claim's shares stand with the locality rules.
type phase int

const (
	// unallocated: no shares of a Tessera shared device.
	unallocated phase = iota
	// unjudged: shares of devices published without binding conditions
	// (before locality was switched on, or on a node without it). They bind
	// without a verdict; they count as shares on their GPUs.
	unjudged
	// pending: the scheduler waits for the verdict.
	pending
	// accepted: every share has LocalityAccepted True.
	accepted
	// rejected: a share has LocalityRejected True; the scheduler
	// deallocates the claim.
	rejected
	// prepared: no verdict in the status, but the node wrote its own
	// conditions there: the pod is bound and the kubelet plugin, which
	// writes the claim's entries of its node whole, dropped the verdict.
	// The shares are on their GPU whatever the ledger says.
	prepared
)

// claimView is what the controller reads from one ResourceClaim.
type claimView struct {
	phase  phase
	shares []Share
	// configErr is set when a share's GpuConfig does not decode.
	configErr error
}

// viewClaim reads the shares of Tessera shared devices in the claim's
// allocation and the verdicts in its status.
func viewClaim(claim *resourceapi.ResourceClaim) claimView {
	var v claimView
	if claim.Status.Allocation == nil {
		return v
	}
	alloc := claim.Status.Allocation
	judged, withVerdict, acceptedN, rejectedN, foreign := 0, 0, 0, 0, 0
	for _, r := range alloc.Devices.Results {
		if r.Driver != configapi.GroupName {
			continue
		}
		if !isShared(r.Device) {
			continue
		}
		share := Share{
			Claim:     claim.Namespace + "/" + claim.Name,
			UID:       claim.UID,
			Namespace: claim.Namespace,
			GPU:       GPU{Pool: r.Pool, Device: r.Device},
			ShareID:   string(ptr.Deref(r.ShareID, "")),
		}
		var err error
		share.Labels, share.ClusterLabels, err = labelsOf(alloc.Devices.Config, r.Request)
		if err != nil && v.configErr == nil {
			v.configErr = err
		}
		v.shares = append(v.shares, share)
		if !slices.Contains(r.BindingConditions, configapi.LocalityAcceptedCondition) {
			continue
		}
		judged++
		entry := statusEntry(claim.Status.Devices, r)
		if entry == nil {
			continue
		}
		switch {
		case meta.IsStatusConditionTrue(entry.Conditions, configapi.LocalityRejectedCondition):
			rejectedN++
			withVerdict++
		case meta.IsStatusConditionTrue(entry.Conditions, configapi.LocalityAcceptedCondition):
			acceptedN++
			withVerdict++
		case slices.ContainsFunc(entry.Conditions, func(c metav1.Condition) bool { return !ours(c.Type) }):
			foreign++
		}
	}
	switch {
	case len(v.shares) == 0:
		v.phase = unallocated
	case judged == 0:
		v.phase = unjudged
	case rejectedN > 0:
		v.phase = rejected
	case acceptedN == judged:
		v.phase = accepted
	case foreign > 0:
		v.phase = prepared
	default:
		v.phase = pending
	}
	return v
}

// labelsOf reads the locality labels of one request's share from the
// allocation's configs (the class's and the claim's, as the scheduler copied
// them): labels set by DeviceClass configs whose merged locality.scope is
// Cluster, and not changed by the claim's own config, are cluster-wide; every
// other label names a group of the claim's namespace. Reading the scope from
// the allocation rather than from the DeviceClass keeps it as it was when the
// share was placed, and needs no DeviceClass reads. Error: a config does not
// decode or is not valid (a claim's config that sets locality.scope
// included), so the share's labels are unknown.
func labelsOf(configs []resourceapi.DeviceAllocationConfiguration, request string) (namespaced, cluster Labels, err error) {
	merged, err := configapi.ConfigForRequest(configs, request)
	if err != nil || merged.Locality == nil {
		return Labels{}, Labels{}, err
	}
	namespaced = *merged.Locality
	namespaced.Scope = ""
	var fromClass []resourceapi.DeviceAllocationConfiguration
	for _, c := range configs {
		if c.Source == resourceapi.AllocationConfigSourceClass {
			fromClass = append(fromClass, c)
		}
	}
	class, err := configapi.ConfigForRequest(fromClass, request)
	if err != nil {
		// Unreachable: these entries decoded above, with the claim's.
		return Labels{}, Labels{}, err
	}
	if class.Locality == nil || class.Locality.Scope != configapi.LocalityScopeCluster {
		return namespaced, Labels{}, nil
	}
	for _, f := range []struct {
		namespaced, cluster *configapi.LocalityLabel
		class               configapi.LocalityLabel
	}{
		{&namespaced.Affinity, &cluster.Affinity, class.Locality.Affinity},
		{&namespaced.AntiAffinity, &cluster.AntiAffinity, class.Locality.AntiAffinity},
		{&namespaced.Exclusion, &cluster.Exclusion, class.Locality.Exclusion},
	} {
		if f.class != "" && *f.namespaced == f.class {
			*f.cluster, *f.namespaced = f.class, ""
		}
	}
	return namespaced, cluster, nil
}

func ours(conditionType string) bool {
	return conditionType == configapi.LocalityAcceptedCondition || conditionType == configapi.LocalityRejectedCondition
}

// statusEntry is the claim's status.devices entry for an allocation result.
func statusEntry(devices []resourceapi.AllocatedDeviceStatus, r resourceapi.DeviceRequestAllocationResult) *resourceapi.AllocatedDeviceStatus {
	for i := range devices {
		d := &devices[i]
		if d.Driver == r.Driver && d.Pool == r.Pool && d.Device == r.Device &&
			ptr.Deref(d.ShareID, "") == string(ptr.Deref(r.ShareID, "")) {
			return d
		}
	}
	return nil
}

// withVerdict returns the claim's status.devices with the verdict set on
// the entry of every judged share (entries are added where missing), and
// the other entries as they are.
func withVerdict(claim *resourceapi.ResourceClaim, verdict Verdict, now metav1.Time) []resourceapi.AllocatedDeviceStatus {
	devices := make([]resourceapi.AllocatedDeviceStatus, 0, len(claim.Status.Devices)+1)
	for _, d := range claim.Status.Devices {
		devices = append(devices, *d.DeepCopy())
	}
	set, drop := metav1.Condition{
		Type: configapi.LocalityAcceptedCondition, Status: metav1.ConditionTrue, Reason: "Accepted",
		Message: "no locality rule is broken on this GPU", LastTransitionTime: now, ObservedGeneration: claim.Generation,
	}, configapi.LocalityRejectedCondition
	if !verdict.Accepted {
		set = metav1.Condition{
			Type: configapi.LocalityRejectedCondition, Status: metav1.ConditionTrue, Reason: string(verdict.Reason),
			Message: verdict.Message, LastTransitionTime: now, ObservedGeneration: claim.Generation,
		}
		drop = configapi.LocalityAcceptedCondition
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != configapi.GroupName || !slices.Contains(r.BindingConditions, configapi.LocalityAcceptedCondition) {
			continue
		}
		entry := statusEntry(devices, r)
		if entry == nil {
			devices = append(devices, resourceapi.AllocatedDeviceStatus{Driver: r.Driver, Pool: r.Pool, Device: r.Device})
			if r.ShareID != nil {
				devices[len(devices)-1].ShareID = ptr.To(string(*r.ShareID))
			}
			entry = &devices[len(devices)-1]
		}
		meta.RemoveStatusCondition(&entry.Conditions, drop)
		meta.SetStatusCondition(&entry.Conditions, set)
	}
	return devices
}

// Placed returns the claim's shares that are on their GPU for good: accepted,
// prepared by the node, or of a device without binding conditions. Shares
// waiting for a verdict or rejected are not. Error: a share's GpuConfig does
// not decode (its labels are unknown).
func Placed(claim *resourceapi.ResourceClaim) ([]Share, error) {
	v := viewClaim(claim)
	switch v.phase {
	case unjudged, accepted, prepared:
		return v.shares, v.configErr
	}
	return nil, nil
}

// isShared reports whether a device of the driver is a GPU's shared device,
// gpu-<minor>-shared (pkg/model.SharedDeviceName; this package does not
// import pkg/model, which needs NVML, so that the webhook's static binary
// can run the controller).
func isShared(device string) bool {
	minor, ok := strings.CutPrefix(device, "gpu-")
	if !ok {
		return false
	}
	minor, ok = strings.CutSuffix(minor, "-shared")
	n, err := strconv.Atoi(minor)
	return ok && err == nil && n >= 0 && strconv.Itoa(n) == minor
}
