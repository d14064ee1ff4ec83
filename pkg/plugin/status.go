package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/model"
)

// DeviceData is the driver-specific data of one prepared device in the
// claim's status.devices[].data.
type DeviceData struct {
	UUID string `json:"uuid"`
	// MemoryLimit (bytes) and CoresLimit (percent) are the enforced or
	// advertised limits of a share; 0 for a whole GPU.
	MemoryLimit int64 `json:"memoryLimit,omitempty"`
	CoresLimit  int64 `json:"coresLimit,omitempty"`
	// Isolation is the backend of a share; empty for a whole GPU.
	Isolation string `json:"isolation,omitempty"`
}

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

// writeStatus writes status.devices for the claim's devices of this driver.
// Errors are logged only (see the package documentation).
func (p *Plugin) writeStatus(ctx context.Context, claim *resourceapi.ResourceClaim, pl *plan) {
	if p.opts.Client == nil {
		return
	}
	now := metav1.NewTime(time.Now())
	var entries []resourceapi.AllocatedDeviceStatus
	for _, d := range pl.devices {
		data, err := json.Marshal(DeviceData{UUID: d.gpu.UUID, MemoryLimit: d.memoryLimit, CoresLimit: d.coresLimit, Isolation: string(d.isolation)})
		if err != nil {
			klog.FromContext(ctx).Error(err, "Encoding device status failed", "claim", klog.KObj(claim))
			return
		}
		conditions := []metav1.Condition{{
			Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonPrepared,
			Message: "prepared on node " + p.opts.NodeName, ObservedGeneration: claim.Generation, LastTransitionTime: now,
		}}
		if pl.nvlinkWarning != "" {
			conditions = append(conditions, metav1.Condition{
				Type: ConditionNVLink, Status: metav1.ConditionFalse, Reason: ReasonNVLinkMissing,
				Message: "topology.nvlink is Preferred: " + pl.nvlinkWarning, ObservedGeneration: claim.Generation, LastTransitionTime: now,
			})
		}
		entry := resourceapi.AllocatedDeviceStatus{
			Driver: model.DriverName, Pool: d.pool, Device: d.device,
			Conditions: conditions, Data: &runtime.RawExtension{Raw: data},
		}
		if d.shareID != "" {
			id := string(d.shareID)
			entry.ShareID = &id
		}
		entries = append(entries, entry)
	}
	if err := p.patchDevices(ctx, claim, entries); err != nil {
		klog.FromContext(ctx).Error(err, "Writing claim status failed; the claim is prepared anyway", "claim", klog.KObj(claim))
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
	if err := p.patchDevices(ctx, claim, entries); err != nil {
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
