package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/model"
)

// Condition types and reasons written into status.devices[].conditions.
const (
	ConditionReady        = "Ready"
	ConditionNVLink       = "NVLinkConnected"
	ReasonPrepared        = "Prepared"
	ReasonPrepareFailed   = "PrepareFailed"
	ReasonNVLinkConnected = "SameNVLinkDomain"
	ReasonNVLinkMissing   = "DifferentNVLinkDomains"
	statusWriteTimeout    = 10 * time.Second
)

// applied is what the isolation backend of a claim got for one device and
// what it added to the device's CDI edits: the facts its attestation is made
// of. editsFor fills it in for every device it computes edits for.
type applied struct {
	// gpu is the device's GPU as the backend got it. For a share under an
	// enforcing backend, two shares of one GPU in one claim are one GPU with
	// their limits summed (see editsFor); under Advisory each share device
	// advertises its own limits.
	gpu isolation.GPU
	// isolation is the backend (shares only).
	isolation configapi.Isolation
	// edits are the backend's edits, on share devices only.
	edits cdispec.ContainerEdits
	// mps is the daemon the container is pointed at (MPS only).
	mps *isolation.Daemon
}

// appliedTo records what BackendEdits got in in for the device g and what it
// returned (backend).
func appliedTo(in isolation.Claim, g isolation.GPU, backend cdispec.ContainerEdits) applied {
	a := applied{gpu: g}
	if !g.Shared {
		return a
	}
	a.isolation, a.edits = in.Isolation, backend
	if in.Isolation != configapi.IsolationAdvisory && in.Isolation != "" {
		if i := slices.IndexFunc(in.GPUs, func(x isolation.GPU) bool { return x.UUID == g.UUID }); i >= 0 {
			a.gpu = in.GPUs[i]
		}
	}
	if in.Isolation == configapi.IsolationMPS {
		d := in.MPS
		a.mps = &d
	}
	return a
}

// attestation is the GpuAttestation of the planned device d, whose edits
// were computed as a says, on this node. all are the claim's planned devices:
// a share under an enforcing backend is attested with what all shares of its
// GPU in the claim hold, as its backend applies their summed limits.
func (p *Plugin) attestation(d plannedDevice, a applied, all []plannedDevice) *configapi.GpuAttestation {
	att := &configapi.GpuAttestation{Node: p.opts.NodeName, UUID: d.gpu.UUID, AdminAccess: d.adminAccess}
	if d.mig != nil {
		att.UUID = d.mig.UUID
	}
	if !a.gpu.Shared {
		return att
	}
	att.Isolation = a.isolation
	att.MemoryLimit, att.CoresLimit = a.gpu.MemoryLimit, a.gpu.CoresLimit
	att.Memory, att.Cores = d.consumedMemory, d.consumedCores
	if a.isolation != configapi.IsolationAdvisory {
		att.Memory, att.Cores = 0, 0
		for _, o := range all {
			if o.gpu.UUID == d.gpu.UUID && o.shared && !o.adminAccess {
				att.Memory += o.consumedMemory
				att.Cores += o.consumedCores
			}
		}
		att.Cores = min(att.Cores, configapi.MaxCores)
	}
	enforced := configapi.Enforces(a.isolation)
	att.Enforced = &enforced
	b := &configapi.BackendAttestation{Env: slices.Clone(a.edits.Env)}
	for _, h := range a.edits.Hooks {
		if h != nil {
			b.Hooks = append(b.Hooks, configapi.AttestedHook{HookName: h.HookName, Path: h.Path, Args: slices.Clone(h.Args)})
		}
	}
	for _, m := range a.edits.Mounts {
		if m != nil {
			b.Mounts = append(b.Mounts, configapi.AttestedMount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: slices.Contains(m.Options, "ro")})
		}
	}
	if a.mps != nil {
		b.MPSDaemon = &configapi.MPSDaemonAttestation{GPU: a.mps.UUID, PipeDirectory: a.mps.PipeDir}
	}
	att.Backend = b
	return att
}

// encodeAttestation encodes att for status.devices[].data. An attestation
// whose backend edits do not fit the API's 10 KiB is written without them
// (the limits and the backend still are), rather than not at all.
func encodeAttestation(att *configapi.GpuAttestation) ([]byte, error) {
	raw, err := att.Encode()
	if err != nil && att.Backend != nil && len(att.Backend.Env)+len(att.Backend.Hooks)+len(att.Backend.Mounts) > 0 {
		trimmed := *att
		trimmed.Backend = &configapi.BackendAttestation{MPSDaemon: att.Backend.MPSDaemon}
		if raw, err2 := trimmed.Encode(); err2 == nil {
			return raw, nil
		}
	}
	return raw, err
}

// writeStatus writes status.devices for the claim's devices of this driver:
// per device a Ready=True condition whose message says what enforces the
// share's limits, and its GpuAttestation as data, computed from the plan
// and the edits written (devs, in the plan's device order). Errors are
// logged only (see the package documentation).
func (p *Plugin) writeStatus(ctx context.Context, claim *resourceapi.ResourceClaim, pl *plan, devs []specDevice) {
	if p.opts.Client == nil {
		return
	}
	logger := klog.FromContext(ctx)
	now := metav1.NewTime(time.Now())
	var entries []resourceapi.AllocatedDeviceStatus
	for i, d := range pl.devices {
		message := "prepared on node " + p.opts.NodeName
		var data *runtime.RawExtension
		if i < len(devs) {
			att := p.attestation(d, devs[i].applied, pl.devices)
			raw, err := encodeAttestation(att)
			if err != nil {
				// A bug, not a state of the node: the claim is prepared as
				// planned; its status says so without the data.
				logger.Error(err, "Encoding the device's attestation failed", "claim", klog.KObj(claim), "device", d.device)
			} else {
				data = &runtime.RawExtension{Raw: raw}
				message += ": " + att.String()
			}
		}
		conditions := []metav1.Condition{{
			Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonPrepared,
			Message: message, ObservedGeneration: claim.Generation, LastTransitionTime: now,
		}}
		if pl.nvlinkWarning != "" {
			conditions = append(conditions, metav1.Condition{
				Type: ConditionNVLink, Status: metav1.ConditionFalse, Reason: ReasonNVLinkMissing,
				Message: "topology.nvlink is Preferred: " + pl.nvlinkWarning, ObservedGeneration: claim.Generation, LastTransitionTime: now,
			})
		}
		entry := resourceapi.AllocatedDeviceStatus{
			Driver: model.DriverName, Pool: d.pool, Device: d.device,
			Conditions: conditions, Data: data,
		}
		if d.shareID != "" {
			id := string(d.shareID)
			entry.ShareID = &id
		}
		entries = append(entries, entry)
	}
	err := p.patchDevices(ctx, claim, entries)
	p.opts.Metrics.ObserveStatusWrite(err)
	if err != nil {
		logger.Error(err, "Writing claim status failed; the claim is prepared anyway", "claim", klog.KObj(claim))
	}
}

// maxConditionMessage is the API's limit on a condition message.
const maxConditionMessage = 32768

// writeFailure writes a Ready=False condition with the error into
// status.devices for the claim's devices on this node, so that
// `kubectl describe resourceclaim` says why the pod cannot start. Errors are
// logged only.
func (p *Plugin) writeFailure(ctx context.Context, claim *resourceapi.ResourceClaim, failure error) {
	if p.opts.Client == nil || claim.Status.Allocation == nil {
		return
	}
	msg := failure.Error()
	if len(msg) > maxConditionMessage {
		msg = msg[:maxConditionMessage]
	}
	now := metav1.NewTime(time.Now())
	var entries []resourceapi.AllocatedDeviceStatus
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != model.DriverName || r.Pool != p.opts.NodeName {
			continue
		}
		entry := resourceapi.AllocatedDeviceStatus{
			Driver: model.DriverName, Pool: r.Pool, Device: r.Device,
			Conditions: []metav1.Condition{{
				Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonPrepareFailed,
				Message: msg, ObservedGeneration: claim.Generation, LastTransitionTime: now,
			}},
		}
		if r.ShareID != nil {
			id := string(*r.ShareID)
			entry.ShareID = &id
		}
		entries = append(entries, entry)
	}
	if len(entries) == 0 {
		return
	}
	err := p.patchDevices(ctx, claim, entries)
	p.opts.Metrics.ObserveStatusWrite(err)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Writing the prepare failure into the claim status failed", "claim", klog.KObj(claim))
	}
}

// patchDevices replaces this node's entries of the claim's status.devices
// with entries, keeping every other driver's and node's, with a JSON merge
// patch of status.devices guarded by the claim's resourceVersion (a conflict
// re-reads the claim and tries again).
//
// Not server-side apply: applying status makes the API server re-encode the
// claim's status.allocation, whose opaque config parameters may then differ
// byte for byte from what is stored (key order), and it refuses the change
// of an allocation ("field cannot be modified once set"); a merge patch
// leaves status.allocation alone.
func (p *Plugin) patchDevices(ctx context.Context, claim *resourceapi.ResourceClaim, entries []resourceapi.AllocatedDeviceStatus) error {
	ctx, cancel := context.WithTimeout(ctx, statusWriteTimeout)
	defer cancel()
	claims := p.opts.Client.ResourceV1().ResourceClaims(claim.Namespace)
	current := claim
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if current == nil {
			fresh, err := claims.Get(ctx, claim.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if fresh.UID != claim.UID {
				return fmt.Errorf("claim was deleted and created again (uid now %s)", fresh.UID)
			}
			current = fresh
		}
		devices := make([]resourceapi.AllocatedDeviceStatus, 0, len(current.Status.Devices)+len(entries))
		for _, d := range current.Status.Devices {
			if d.Driver != model.DriverName || d.Pool != p.opts.NodeName {
				devices = append(devices, d)
			}
		}
		devices = append(devices, entries...)
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": current.ResourceVersion, "uid": claim.UID},
			"status":   map[string]any{"devices": devices},
		})
		if err != nil {
			return err
		}
		_, err = claims.Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: p.fieldManager()}, "status")
		current = nil
		return err
	})
}

// fieldManager names this node's plugin as the writer of its status entries.
func (p *Plugin) fieldManager() string { return model.DriverName + "/" + p.opts.NodeName }
