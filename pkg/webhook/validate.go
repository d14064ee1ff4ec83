package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ResourceGroup is the API group of the objects this webhook reviews.
const ResourceGroup = "resource.k8s.io"

// Versions lists the versions of resource.k8s.io whose ResourceClaims and
// ResourceClaimTemplates Review understands. The parts it reads (requests with
// their class, allocation mode, count and capacity requests, firstAvailable
// subrequests, constraints and config) are spelled the same in all of them,
// except that v1beta1 puts the fields of requests[].exactly into the request.
var Versions = []string{"v1", "v1beta2", "v1beta1"}

// Review decides one admission request. It is pure when classes is (no I/O,
// no clock) and safe for concurrent use. classes reads the DeviceClasses the
// claim's requests name, for their sharing.allowedIsolations (see
// ValidateDeviceClaimWithClasses); nil reads none.
//
// Before the object is decoded, checkShape scans its bytes and denies a
// list longer than any resource.k8s.io/v1 allows (256), more than 65536
// list elements in all, or nesting deeper than 64: decoding costs memory by
// the elements it creates, not by the body's size.
// Before any check, an object with more requests, firstAvailable
// alternatives, constraints or configs than resource.k8s.io/v1 allows, or
// opaque parameters over its 10 KiB, is denied (see checkLimits): the API
// server never stores such an object, and the checks' cost is bounded by
// these sizes. Review stops as soon as ctx is done (between steps, and
// between requests within a step) and denies the request with a Timeout
// status: the API server has stopped waiting for the answer by then.
//
// It denies the CREATE of a ResourceClaim or ResourceClaimTemplate (any of
// Versions) that ValidateDeviceClaim refuses: an opaque config for driver
// gpu.tessera.dev that does not decode with configapi.DecodeStrict, does not
// pass GpuConfig.Validate or does not merge with configapi.ConfigForRequest
// (the same checks, by the same code, that the kubelet plugin applies when it
// prepares the claim), or a config whose values the claim's own requests make
// impossible at prepare (a computeLimit below the share's cores, a memoryLimit
// above its memory, MPS on more than one GPU, NVLink Required without a
// constraint that keeps the GPUs in one domain), a config that sets
// sharing.allowedIsolations (only a DeviceClass may), or a sharing.isolation
// that the request's DeviceClass does not allow.
//
// The denial's message lists every problem with its field path, for example
//
//	spec.devices.config[0].opaque.parameters: invalid GpuConfig: sharing.isolaton: unknown field
//	spec.devices.config[1].opaque.parameters.sharing.computeLimit: Invalid value: 0: must be between 1 and 100
//
// and its Result carries the same problems as StatusCauses. ValidateDeviceClaim's
// warnings (a share that names no memory, a DeviceClass that could not be read)
// become the response's Warnings, which kubectl prints; they do not deny. Opaque configs of other drivers are not
// read. Every other request (other kinds, other operations, objects without our
// config) is allowed. UPDATEs are allowed because the spec of both kinds is
// immutable: re-checking it could only block metadata updates (finalizers) of a
// claim created before the webhook existed. A request whose object cannot be
// parsed at all is denied with a BadRequest status: the API server produced it,
// so that is a bug worth seeing rather than waving through.
func Review(ctx context.Context, req *admissionv1.AdmissionRequest, classes DeviceClassLookup) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if err := ctx.Err(); err != nil {
		return abandoned(req, err)
	}
	if req.Kind.Group != ResourceGroup || !supportedVersion(req.Kind.Version) {
		return resp
	}
	if req.Kind.Kind == "DeviceClass" {
		// Class specs are mutable: creates and updates are reviewed.
		return reviewDeviceClass(req)
	}
	if req.Operation != admissionv1.Create {
		return resp
	}
	var root *field.Path
	switch req.Kind.Kind {
	case "ResourceClaim":
		root = field.NewPath("spec")
	case "ResourceClaimTemplate":
		root = field.NewPath("spec", "spec")
	default:
		return resp
	}
	// Before the object is decoded: decoding costs memory by the elements
	// it creates, not by the body's bytes (see checkShape).
	if denied := shapeDenial(req); denied != nil {
		return denied
	}
	devices, inline, err := claimDevices(req.Object, req.Kind.Kind == "ResourceClaimTemplate")
	if err != nil {
		return badRequest(req, err)
	}
	errs, warnings, err := validateDeviceClaim(ctx, devices, root.Child("devices"), inline, classes)
	if err != nil {
		return abandoned(req, err)
	}
	resp.Warnings = warnings
	if len(errs) == 0 {
		return resp
	}
	resp.Allowed = false
	resp.Result = denial(req, errs)
	return resp
}

// abandoned is the answer to a request whose review stopped because its
// context ended (err).
func abandoned(req *admissionv1.AdmissionRequest, err error) *admissionv1.AdmissionResponse {
	return failure(req, 504, metav1.StatusReasonTimeout, "review abandoned: "+err.Error())
}

// badRequest is the answer to a request whose object cannot be read (err).
func badRequest(req *admissionv1.AdmissionRequest, err error) *admissionv1.AdmissionResponse {
	return failure(req, 400, metav1.StatusReasonBadRequest, "cannot read the object: "+err.Error())
}

// failure refuses req with code and reason; the message names the object.
func failure(req *admissionv1.AdmissionRequest, code int32, reason metav1.StatusReason, message string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{
		UID:     req.UID,
		Allowed: false,
		Result: &metav1.Status{
			Status:  metav1.StatusFailure,
			Code:    code,
			Reason:  reason,
			Message: fmt.Sprintf("%s %s: %s", req.Kind.Kind, objectName(req), message),
		},
	}
}

func supportedVersion(version string) bool {
	for _, v := range Versions {
		if v == version {
			return true
		}
	}
	return false
}

func objectName(req *admissionv1.AdmissionRequest) string {
	if req.Namespace == "" {
		return req.Name
	}
	return req.Namespace + "/" + req.Name
}

// wireClaim is spec.devices of a ResourceClaim (spec.spec.devices of a
// template), reduced to what Review reads. v1 and v1beta2 spell an exact
// request as requests[].exactly; v1beta1 puts its fields into the request.
type wireClaim struct {
	Requests []struct {
		Name           string           `json:"name"`
		Exactly        *wireExact       `json:"exactly"`
		FirstAvailable []wireSubRequest `json:"firstAvailable"`
		// v1beta1: the fields of exactly, in the request.
		wireExact
	} `json:"requests"`
	Constraints []struct {
		Requests       []string `json:"requests"`
		MatchAttribute *string  `json:"matchAttribute"`
	} `json:"constraints"`
	Config []struct {
		Requests []string `json:"requests"`
		Opaque   *struct {
			Driver     string          `json:"driver"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"opaque"`
	} `json:"config"`
}

type wireExact struct {
	DeviceClassName string                           `json:"deviceClassName"`
	AllocationMode  resourceapi.DeviceAllocationMode `json:"allocationMode"`
	Count           int64                            `json:"count"`
	AdminAccess     *bool                            `json:"adminAccess"`
	Tolerations     []resourceapi.DeviceToleration   `json:"tolerations"`
	Capacity        *struct {
		Requests map[resourceapi.QualifiedName]resource.Quantity `json:"requests"`
	} `json:"capacity"`
}

type wireSubRequest struct {
	Name string `json:"name"`
	wireExact
}

func (w wireExact) capacity() *resourceapi.CapacityRequirements {
	if w.Capacity == nil {
		return nil
	}
	return &resourceapi.CapacityRequirements{Requests: w.Capacity.Requests}
}

// claimDevices reads spec.devices (spec.spec.devices of a template) into the
// resource.k8s.io/v1 types, with only the fields ValidateDeviceClaim reads.
// inline says that the object spells exact requests as v1beta1 does.
func claimDevices(object runtime.RawExtension, template bool) (devices *resourceapi.DeviceClaim, inline bool, err error) {
	if len(object.Raw) == 0 {
		return nil, false, fmt.Errorf("the request has no object")
	}
	var claim struct {
		Spec struct {
			Devices wireClaim `json:"devices"`
		} `json:"spec"`
	}
	raw := object.Raw
	if template {
		var tmpl struct {
			Spec json.RawMessage `json:"spec"`
		}
		if err := json.Unmarshal(object.Raw, &tmpl); err != nil {
			return nil, false, err
		}
		raw = tmpl.Spec
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &claim); err != nil {
			return nil, false, err
		}
	}
	wire := &claim.Spec.Devices
	devices = &resourceapi.DeviceClaim{}
	for _, r := range wire.Requests {
		req := resourceapi.DeviceRequest{Name: r.Name}
		exact := r.Exactly
		if exact == nil && len(r.FirstAvailable) == 0 && r.DeviceClassName != "" {
			exact, inline = &r.wireExact, true
		}
		if exact != nil {
			req.Exactly = &resourceapi.ExactDeviceRequest{
				DeviceClassName: exact.DeviceClassName,
				AllocationMode:  exact.AllocationMode,
				Count:           exact.Count,
				AdminAccess:     exact.AdminAccess,
				Tolerations:     exact.Tolerations,
				Capacity:        exact.capacity(),
			}
		}
		for _, sub := range r.FirstAvailable {
			req.FirstAvailable = append(req.FirstAvailable, resourceapi.DeviceSubRequest{
				Name:            sub.Name,
				DeviceClassName: sub.DeviceClassName,
				AllocationMode:  sub.AllocationMode,
				Count:           sub.Count,
				Tolerations:     sub.Tolerations,
				Capacity:        sub.capacity(),
			})
		}
		devices.Requests = append(devices.Requests, req)
	}
	for _, c := range wire.Constraints {
		constraint := resourceapi.DeviceConstraint{Requests: c.Requests}
		if c.MatchAttribute != nil {
			attribute := resourceapi.FullyQualifiedName(*c.MatchAttribute)
			constraint.MatchAttribute = &attribute
		}
		devices.Constraints = append(devices.Constraints, constraint)
	}
	for _, c := range wire.Config {
		config := resourceapi.DeviceClaimConfiguration{Requests: c.Requests}
		if c.Opaque != nil {
			config.Opaque = &resourceapi.OpaqueDeviceConfiguration{
				Driver:     c.Opaque.Driver,
				Parameters: runtime.RawExtension{Raw: c.Opaque.Parameters},
			}
		}
		devices.Config = append(devices.Config, config)
	}
	return devices, inline, nil
}

// denial renders the problems as an Invalid status, like the API server's own
// validation: API clients read the message, which the API server prefixes with
// `admission webhook "…" denied the request: `; kubectl prints
// `The ResourceClaim "x" is invalid: ` and one "field: problem" per cause.
func denial(req *admissionv1.AdmissionRequest, errs field.ErrorList) *metav1.Status {
	lines := make([]string, 0, len(errs))
	causes := make([]metav1.StatusCause, 0, len(errs))
	for _, e := range errs {
		msg := describe(e)
		lines = append(lines, msg)
		causes = append(causes, metav1.StatusCause{
			Type:    metav1.CauseType(e.Type),
			Message: strings.TrimPrefix(msg, e.Field+": "),
			Field:   e.Field,
		})
	}
	return &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    422,
		Reason:  metav1.StatusReasonInvalid,
		Message: strings.Join(lines, "; "),
		Details: &metav1.StatusDetails{
			Name:   req.Name,
			Group:  req.Kind.Group,
			Kind:   req.Kind.Kind,
			Causes: causes,
		},
	}
}

// describe is field.Error's message, without the empty "Invalid value" of
// problems that are a sentence of their own (a config that does not decode).
func describe(e *field.Error) string {
	if e.Type == field.ErrorTypeInvalid && e.BadValue == "" {
		return e.Field + ": " + e.Detail
	}
	return e.Error()
}
