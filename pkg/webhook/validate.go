package webhook

import (
	"encoding/json"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// ResourceGroup is the API group of the objects this webhook reviews.
const ResourceGroup = "resource.k8s.io"

// Versions lists the versions of resource.k8s.io whose ResourceClaims and
// ResourceClaimTemplates Review understands. The parts it reads
// (spec.devices.requests[].name, .firstAvailable[].name and spec.devices.config)
// are spelled the same in all of them.
var Versions = []string{"v1", "v1beta2", "v1beta1"}

// Review decides one admission request. It is pure: no I/O, no clock, safe for
// concurrent use.
//
// It denies the CREATE of a ResourceClaim or ResourceClaimTemplate (any
// of Versions) when an opaque config for driver gpu.tessera.dev in it does not
// decode with configapi.DecodeStrict, does not pass GpuConfig.Validate, or does
// not merge with configapi.ConfigForRequest for one of the claim's requests: the
// same checks, by the same code, that the kubelet plugin applies when it
// prepares the claim, moved to the moment the user writes the object.
//
// The denial's message lists every problem with its field path, for example
//
//	spec.devices.config[0].opaque.parameters: invalid GpuConfig: sharing.isolaton: unknown field
//	spec.devices.config[1].opaque.parameters.sharing.computeLimit: Invalid value: 0: must be between 1 and 100
//
// and its Result carries the same problems as StatusCauses. Opaque configs of
// other drivers are not read. Every other request (other kinds, other
// operations, objects without our config) is allowed. UPDATEs are allowed
// because the spec of both kinds is immutable: re-checking it could only block
// metadata updates (finalizers) of a claim created before the webhook existed. A request whose object
// cannot be parsed at all is denied with a BadRequest status: the API server
// produced it, so that is a bug worth seeing rather than waving through.
func Review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation != admissionv1.Create {
		return resp
	}
	if req.Kind.Group != ResourceGroup || !supportedVersion(req.Kind.Version) {
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
	devices, err := claimDevices(req.Object, req.Kind.Kind == "ResourceClaimTemplate")
	if err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{
			Status:  metav1.StatusFailure,
			Code:    400,
			Reason:  metav1.StatusReasonBadRequest,
			Message: fmt.Sprintf("%s %s: cannot read the object: %v", req.Kind.Kind, objectName(req), err),
		}
		return resp
	}
	errs := validateDevices(devices, root.Child("devices"))
	if len(errs) == 0 {
		return resp
	}
	resp.Allowed = false
	resp.Result = denial(req, errs)
	return resp
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

// deviceClaim is spec.devices of a ResourceClaim (spec.spec.devices of a
// template), reduced to what Review reads; the same in v1, v1beta2 and v1beta1.
type deviceClaim struct {
	Requests []struct {
		Name           string `json:"name"`
		FirstAvailable []struct {
			Name string `json:"name"`
		} `json:"firstAvailable"`
	} `json:"requests"`
	Config []struct {
		Requests []string `json:"requests"`
		Opaque   *struct {
			Driver     string          `json:"driver"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"opaque"`
	} `json:"config"`
}

func claimDevices(object runtime.RawExtension, template bool) (*deviceClaim, error) {
	if len(object.Raw) == 0 {
		return nil, fmt.Errorf("the request has no object")
	}
	var claim struct {
		Spec struct {
			Devices deviceClaim `json:"devices"`
		} `json:"spec"`
	}
	if template {
		var tmpl struct {
			Spec json.RawMessage `json:"spec"`
		}
		if err := json.Unmarshal(object.Raw, &tmpl); err != nil {
			return nil, err
		}
		if len(tmpl.Spec) == 0 {
			return &deviceClaim{}, nil
		}
		if err := json.Unmarshal(tmpl.Spec, &claim); err != nil {
			return nil, err
		}
		return &claim.Spec.Devices, nil
	}
	if err := json.Unmarshal(object.Raw, &claim); err != nil {
		return nil, err
	}
	return &claim.Spec.Devices, nil
}

// validateDevices checks every config entry of our driver on its own, then, when
// all of them are valid, merges them for every request as the plugin will.
func validateDevices(devices *deviceClaim, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	var ours []resourceapi.DeviceAllocationConfiguration
	for i, entry := range devices.Config {
		if entry.Opaque == nil || entry.Opaque.Driver != configapi.GroupName {
			continue
		}
		paramsPath := path.Child("config").Index(i).Child("opaque", "parameters")
		cfg, err := configapi.DecodeStrict(entry.Opaque.Parameters)
		if err != nil {
			errs = append(errs, field.Invalid(paramsPath, "", err.Error()))
			continue
		}
		for _, e := range cfg.Validate() {
			rooted := *e
			rooted.Field = paramsPath.String() + "." + e.Field
			errs = append(errs, &rooted)
		}
		ours = append(ours, resourceapi.DeviceAllocationConfiguration{
			Source:   resourceapi.AllocationConfigSourceClaim,
			Requests: entry.Requests,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver:     entry.Opaque.Driver,
				Parameters: runtime.RawExtension{Raw: entry.Opaque.Parameters},
			}},
		})
	}
	if len(errs) > 0 || len(ours) == 0 {
		return errs
	}
	for _, request := range requestNames(devices) {
		if _, err := configapi.ConfigForRequest(ours, request); err != nil {
			errs = append(errs, field.Invalid(path.Child("config"), "", fmt.Sprintf("request %q: %v", request, err)))
		}
	}
	return errs
}

// requestNames lists the request names a device result can carry: each
// request, and "parent/sub" for each firstAvailable subrequest.
func requestNames(devices *deviceClaim) []string {
	var names []string
	for _, r := range devices.Requests {
		if len(r.FirstAvailable) == 0 {
			names = append(names, r.Name)
			continue
		}
		for _, sub := range r.FirstAvailable {
			names = append(names, r.Name+"/"+sub.Name)
		}
	}
	return names
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
