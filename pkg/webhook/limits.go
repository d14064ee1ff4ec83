package webhook

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The webhook can be called by anyone who reaches its port, not only by the
// API server, and the mutating path runs before the API server validates the
// object. So a review first holds the claim to the list sizes that
// resource.k8s.io/v1 itself allows (k8s.io/api/resource/v1; v1beta1 and
// v1beta2 have the same), and refuses anything larger before a config is
// decoded or a pair of requests compared. An object the API server would
// store always passes; what passes costs at most a fixed amount of work
// (about 32 requests × 8 alternatives × 32 configs or constraints), however
// the body was made.
const (
	maxRequests       = resourceapi.DeviceRequestsMaxSize
	maxSubRequests    = resourceapi.FirstAvailableDeviceRequestMaxSize
	maxConstraints    = resourceapi.DeviceConstraintsMaxSize
	maxConfigs        = resourceapi.DeviceConfigMaxSize
	maxRequestRefs    = resourceapi.DeviceRequestsMaxSize // config[].requests, constraints[].requests
	maxParameterBytes = resourceapi.OpaqueParametersMaxLength
)

// checkLimits refuses a DeviceClaim (at path) with more requests,
// firstAvailable alternatives, constraints, configs or request references
// than resource.k8s.io/v1 allows, or an opaque config whose parameters are
// longer than the API's limit. Each error names the field and the limit.
func checkLimits(devices *resourceapi.DeviceClaim, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	tooMany := func(p *field.Path, n, limit int) {
		if n > limit {
			errs = append(errs, field.TooMany(p, n, limit))
		}
	}
	tooMany(path.Child("requests"), len(devices.Requests), maxRequests)
	tooMany(path.Child("constraints"), len(devices.Constraints), maxConstraints)
	tooMany(path.Child("config"), len(devices.Config), maxConfigs)
	if len(errs) > 0 {
		// Do not walk lists that are already too long.
		return errs
	}
	for i, r := range devices.Requests {
		tooMany(path.Child("requests").Index(i).Child("firstAvailable"), len(r.FirstAvailable), maxSubRequests)
	}
	for i, c := range devices.Constraints {
		tooMany(path.Child("constraints").Index(i).Child("requests"), len(c.Requests), maxRequestRefs)
	}
	for i, c := range devices.Config {
		p := path.Child("config").Index(i)
		tooMany(p.Child("requests"), len(c.Requests), maxRequestRefs)
		if c.Opaque != nil {
			errs = append(errs, checkParameters(p.Child("opaque", "parameters"), len(c.Opaque.Parameters.Raw))...)
		}
	}
	return errs
}

// checkParameters refuses opaque parameters longer than the API allows.
func checkParameters(path *field.Path, n int) field.ErrorList {
	if n > maxParameterBytes {
		return field.ErrorList{field.TooLong(path, fmt.Sprintf("%d bytes", n), maxParameterBytes)}
	}
	return nil
}
