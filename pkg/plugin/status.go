package plugin

import (
	"context"
	"encoding/json"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
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

// fieldManager owns this node's entries of status.devices; entries of other
// drivers (and other fields) are left alone by server-side apply.
func (p *Plugin) fieldManager() string { return model.DriverName + "/" + p.opts.NodeName }

// writeStatus applies status.devices for the claim's devices of this driver.
// Errors are logged only (see the package documentation).
func (p *Plugin) writeStatus(ctx context.Context, claim *resourceapi.ResourceClaim, pl *plan) {
	if p.opts.Client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, statusWriteTimeout)
	defer cancel()
	now := metav1.NewTime(time.Now())
	status := resourceac.ResourceClaimStatus()
	for _, d := range pl.devices {
		data, err := json.Marshal(DeviceData{UUID: d.gpu.UUID, MemoryLimit: d.memoryLimit, CoresLimit: d.coresLimit, Isolation: string(d.isolation)})
		if err != nil {
			klog.FromContext(ctx).Error(err, "Encoding device status failed", "claim", klog.KObj(claim))
			return
		}
		conditions := []*metav1ac.ConditionApplyConfiguration{
			metav1ac.Condition().WithType(ConditionReady).WithStatus(metav1.ConditionTrue).
				WithReason(ReasonPrepared).WithMessage("prepared on node " + p.opts.NodeName).
				WithObservedGeneration(claim.Generation).WithLastTransitionTime(now),
		}
		if pl.nvlinkWarning != "" {
			conditions = append(conditions, metav1ac.Condition().WithType(ConditionNVLink).WithStatus(metav1.ConditionFalse).
				WithReason(ReasonNVLinkMissing).WithMessage("topology.nvlink is Preferred: "+pl.nvlinkWarning).
				WithObservedGeneration(claim.Generation).WithLastTransitionTime(now))
		}
		entry := resourceac.AllocatedDeviceStatus().
			WithDriver(model.DriverName).WithPool(d.pool).WithDevice(d.device).
			WithConditions(conditions...).
			WithData(runtime.RawExtension{Raw: data})
		if d.shareID != "" {
			entry.WithShareID(string(d.shareID))
		}
		status.WithDevices(entry)
	}
	apply := resourceac.ResourceClaim(claim.Name, claim.Namespace).WithStatus(status)
	_, err := p.opts.Client.ResourceV1().ResourceClaims(claim.Namespace).ApplyStatus(ctx, apply,
		metav1.ApplyOptions{FieldManager: p.fieldManager(), Force: true})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Writing claim status failed; the claim is prepared anyway", "claim", klog.KObj(claim))
	}
}

// maxConditionMessage is the API's limit on a condition message.
const maxConditionMessage = 32768

// writeFailure applies a Ready=False condition with the error to
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
	status := resourceac.ResourceClaimStatus()
	n := 0
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != model.DriverName || r.Pool != p.opts.NodeName {
			continue
		}
		entry := resourceac.AllocatedDeviceStatus().
			WithDriver(model.DriverName).WithPool(r.Pool).WithDevice(r.Device).
			WithConditions(metav1ac.Condition().WithType(ConditionReady).WithStatus(metav1.ConditionFalse).
				WithReason(ReasonPrepareFailed).WithMessage(msg).
				WithObservedGeneration(claim.Generation).WithLastTransitionTime(now))
		if r.ShareID != nil {
			entry.WithShareID(string(*r.ShareID))
		}
		status.WithDevices(entry)
		n++
	}
	if n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, statusWriteTimeout)
	defer cancel()
	apply := resourceac.ResourceClaim(claim.Name, claim.Namespace).WithStatus(status)
	if _, err := p.opts.Client.ResourceV1().ResourceClaims(claim.Namespace).ApplyStatus(ctx, apply,
		metav1.ApplyOptions{FieldManager: p.fieldManager(), Force: true}); err != nil {
		klog.FromContext(ctx).Error(err, "Writing the prepare failure into the claim status failed", "claim", klog.KObj(claim))
	}
}
