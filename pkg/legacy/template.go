package legacy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/model/modelnames"
	"github.com/tessera-dev/tessera/pkg/webhook"
)

// requestName is the request of every template (claimtemplate.RequestName).
const requestName = "gpu"

// Labels on every template Translate makes.
const (
	// LabelTranslated marks a ResourceClaimTemplate made from legacy
	// resources; its value is "true".
	LabelTranslated = modelnames.DriverName + "/legacy-translation"
	// LabelManagedBy is the standard label, with the value "tessera".
	LabelManagedBy = "app.kubernetes.io/managed-by"
)

// TemplatePrefix starts the name of every template Translate makes.
const TemplatePrefix = "tessera-legacy-"

// TemplateName is the name of the template with this spec:
// "tessera-legacy-" and 16 hex digits of the SHA-256 of the spec's JSON
// (encoding/json writes struct fields in order and map keys sorted, so equal
// specs have equal names in every process and version of Go).
func TemplateName(spec *resourceapi.ResourceClaimTemplateSpec) (string, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(raw)
	return TemplatePrefix + hex.EncodeToString(sum[:8]), nil
}

// template is the ResourceClaimTemplate for s, selectors on every request,
// named by its content, without a namespace.
func (s *shape) template(selectors []string, models []fraction.Model, path *field.Path) (*resourceapi.ResourceClaimTemplate, *field.Error) {
	var spec resourceapi.ResourceClaimTemplateSpec
	switch {
	case s.whole || s.memory != nil:
		// Whole GPUs, or shares of a fixed memory: what claimtemplate.Build
		// makes for --gpus, --memory and --cores (a test holds the two
		// equal), several shares on distinct GPUs.
		spec = s.exact(selectors)
	case s.cores == nil || *s.cores == s.percent:
		// A percentage of whichever GPU the share lands on, cores the same
		// percentage: the fraction annotation, which the admission webhook
		// expands per GPU model when the claim is created (docs/fractions.md).
		spec = s.fractionAnnotated(selectors)
	case len(models) > 0:
		// A percentage of memory with another share of cores: expanded now,
		// for the models given, each alternative's cores replaced.
		var err *field.Error
		if spec, err = s.fractionExpanded(selectors, models, path); err != nil {
			return nil, err
		}
	default:
		return nil, field.Invalid(s.corePath, *s.cores, fmt.Sprintf(
			"%d%% of compute with %d%% of memory: Tessera's fraction of whichever GPU a share lands on gives the same part of both; "+
				"with the cluster's GPU models (tessera convert --profile, or the webhook's) the shares are sized per model instead", *s.cores, s.percent))
	}
	if errs, _ := webhook.ValidateDeviceClaim(&spec.Spec.Devices, field.NewPath("spec", "spec", "devices")); len(errs) > 0 {
		return nil, field.InternalError(path, fmt.Errorf("the template for %s fails the admission webhook's check: %w", s.describe(), errs.ToAggregate()))
	}
	name, err := TemplateName(&spec)
	if err != nil {
		return nil, field.InternalError(path, err)
	}
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			LabelTranslated: "true",
			LabelManagedBy:  "tessera",
		}},
		Spec: spec,
	}, nil
}

// exact is one request for s.gpus devices: whole GPUs, or shares of
// s.memory and s.cores on distinct GPUs.
func (s *shape) exact(selectors []string) resourceapi.ResourceClaimTemplateSpec {
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: modelnames.WholeClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: s.gpus}
	if !s.whole {
		req.DeviceClassName = modelnames.SharedClassName
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{modelnames.Memory: *s.memory}}
		if s.cores != nil && *s.cores != 0 {
			req.Capacity.Requests[modelnames.Cores] = *resource.NewQuantity(*s.cores, resource.DecimalSI)
		}
	}
	devices := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: requestName, Exactly: req}}}
	if !s.whole && s.gpus > 1 {
		// Two shares of one GPU are one bigger share, not two GPUs.
		devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{requestName}, DistinctAttribute: ptrTo(modelnames.UUIDAttribute)}}
	}
	addSelectors(&devices, selectors)
	return resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: devices}}
}

func ptrTo[T any](v T) *T { return &v }

// requestNames names the requests of n shares: "gpu" for one, "gpu-0".. for more.
func requestNames(n int64) []string {
	if n == 1 {
		return []string{requestName}
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", requestName, i)
	}
	return names
}

// distinct is the constraint that puts the named requests on distinct GPUs
// (the GPU's uuid attribute, pkg/model.AttrUUID).
func distinct(requests []string) []resourceapi.DeviceConstraint {
	if len(requests) < 2 {
		return nil
	}
	return []resourceapi.DeviceConstraint{{Requests: requests, DistinctAttribute: ptrTo(modelnames.UUIDAttribute)}}
}

// fractionAnnotated is one request per share for one shared device without
// capacity, with the fraction.Annotation that the mutating webhook expands.
func (s *shape) fractionAnnotated(selectors []string) resourceapi.ResourceClaimTemplateSpec {
	f := fraction.Fraction{Num: s.percent, Den: 100}
	f = reduce(f)
	names := requestNames(s.gpus)
	var devices resourceapi.DeviceClaim
	for _, n := range names {
		devices.Requests = append(devices.Requests, resourceapi.DeviceRequest{Name: n, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: modelnames.SharedClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		}})
	}
	devices.Constraints = distinct(names)
	addSelectors(&devices, selectors)
	return resourceapi.ResourceClaimTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{fraction.Annotation: f.String()}},
		Spec:       resourceapi.ResourceClaimSpec{Devices: devices},
	}
}

// fractionExpanded is one firstAvailable request per share, one alternative
// per model (fraction.Request), each with the share's cores instead of the
// fraction's (a GPU has pkg/model.CoresPerGPU, 100, cores on every model).
func (s *shape) fractionExpanded(selectors []string, models []fraction.Model, path *field.Path) (resourceapi.ResourceClaimTemplateSpec, *field.Error) {
	f := reduce(fraction.Fraction{Num: s.percent, Den: 100})
	names := requestNames(s.gpus)
	var devices resourceapi.DeviceClaim
	for _, n := range names {
		req, err := fraction.Request(n, f, models)
		if err != nil {
			return resourceapi.ResourceClaimTemplateSpec{}, field.Invalid(path, s.describe(), err.Error())
		}
		for j := range req.FirstAvailable {
			caps := req.FirstAvailable[j].Capacity.Requests
			if *s.cores == 0 {
				delete(caps, modelnames.Cores)
			} else {
				caps[modelnames.Cores] = *resource.NewQuantity(*s.cores, resource.DecimalSI)
			}
		}
		devices.Requests = append(devices.Requests, req)
	}
	devices.Constraints = distinct(names)
	addSelectors(&devices, selectors)
	return resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: devices}}, nil
}

// addSelectors appends the CEL selectors to every request and alternative.
func addSelectors(devices *resourceapi.DeviceClaim, selectors []string) {
	for _, expr := range selectors {
		sel := resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}
		for i := range devices.Requests {
			r := &devices.Requests[i]
			if r.Exactly != nil {
				r.Exactly.Selectors = append(r.Exactly.Selectors, sel)
			}
			for j := range r.FirstAvailable {
				r.FirstAvailable[j].Selectors = append(r.FirstAvailable[j].Selectors, sel)
			}
		}
	}
}

func reduce(f fraction.Fraction) fraction.Fraction {
	a, b := f.Num, f.Den
	for b != 0 {
		a, b = b, a%b
	}
	return fraction.Fraction{Num: f.Num / a, Den: f.Den / a}
}

// describe is the shape in words, for errors.
func (s *shape) describe() string {
	switch {
	case s.whole:
		return fmt.Sprintf("%d whole GPU(s)", s.gpus)
	case s.memory != nil:
		return fmt.Sprintf("%d share(s) of %s", s.gpus, s.memory.String())
	default:
		return fmt.Sprintf("%d share(s) of %d%% of memory", s.gpus, s.percent)
	}
}
