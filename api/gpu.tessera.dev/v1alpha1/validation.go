package v1alpha1

import (
	"math"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Bounds of the values Validate accepts.
const (
	// MinComputeLimit and MaxComputeLimit bound sharing.computeLimit, in percent.
	MinComputeLimit = 1
	MaxComputeLimit = 100
	// MinMemoryLimitBytes is the smallest sharing.memoryLimit (1Mi), the
	// granularity in which shares are allocated.
	MinMemoryLimitBytes = 1 << 20
)

var (
	minMemoryLimit = resource.NewQuantity(MinMemoryLimitBytes, resource.BinarySI)
	maxInt64Bytes  = resource.NewQuantity(math.MaxInt64, resource.BinarySI)
)

// Validate checks the values of one config as written; it needs no allocation and
// does not modify c. Unset (nil or empty) fields are valid: they mean "not set
// here" and are filled by merging and defaulting. It checks:
//
//   - apiVersion and kind, when set, are gpu.tessera.dev/v1alpha1 and GpuConfig;
//   - sharing.isolation is empty or one of Advisory, MPS, HAMiCore, DriverMemory (case-sensitive);
//   - sharing.computeLimit is between 1 and 100;
//   - sharing.memoryLimit is greater than zero, at least 1Mi, a whole number of
//     bytes, and below 8Ei (fits in an int64);
//   - sharing.allowedIsolations, when set, names at least one isolation, each
//     one of Advisory, MPS, HAMiCore, DriverMemory and none twice;
//   - topology.nvlink is empty or one of Required, Preferred, Ignore;
//   - locality.affinity, locality.antiAffinity and locality.exclusion are
//     empty or valid label values (at most 63 characters: letters, digits,
//     '-', '_' and '.', beginning and ending with a letter or digit);
//   - locality.scope is empty or one of Namespace, Cluster.
//
// Validate accepts sharing.allowedIsolations and locality.scope, which only a
// DeviceClass config may set: ValidateForClaim refuses them in a claim's config.
//
// Limits that depend on the allocation (computeLimit at least the allocated cores,
// memoryLimit at most the allocated memory) are checked by ShareLimits.
//
// Each error carries the field path, for example
// "sharing.computeLimit: Invalid value: 0: must be between 1 and 100". A nil
// receiver is valid. The result is nil when c is valid; ToAggregate turns it into
// an error.
func (c *GpuConfig) Validate() field.ErrorList {
	if c == nil {
		return nil
	}
	errs := notSupported(field.NewPath("apiVersion"), c.APIVersion, []string{SchemeGroupVersion.String()})
	errs = append(errs, notSupported(field.NewPath("kind"), c.Kind, []string{GpuConfigKind})...)
	errs = append(errs, c.Sharing.validate(field.NewPath("sharing"))...)
	errs = append(errs, c.Topology.validate(field.NewPath("topology"))...)
	errs = append(errs, c.Locality.validate(field.NewPath("locality"))...)
	return errs
}

func (l *LocalityConfig) validate(path *field.Path) field.ErrorList {
	if l == nil {
		return nil
	}
	var errs field.ErrorList
	for _, f := range []struct {
		name  string
		value LocalityLabel
	}{
		{"affinity", l.Affinity}, {"antiAffinity", l.AntiAffinity}, {"exclusion", l.Exclusion},
	} {
		if f.value == "" {
			continue
		}
		for _, msg := range validation.IsValidLabelValue(string(f.value)) {
			errs = append(errs, field.Invalid(path.Child(f.name), f.value, msg))
		}
	}
	return append(errs, notSupported(path.Child("scope"), l.Scope, SupportedLocalityScopes)...)
}

func (s *SharingConfig) validate(path *field.Path) field.ErrorList {
	if s == nil {
		return nil
	}
	errs := notSupported(path.Child("isolation"), s.Isolation, SupportedIsolations)
	if s.ComputeLimit != nil && (*s.ComputeLimit < MinComputeLimit || *s.ComputeLimit > MaxComputeLimit) {
		errs = append(errs, field.Invalid(path.Child("computeLimit"), *s.ComputeLimit, "must be between 1 and 100"))
	}
	if s.MemoryLimit != nil {
		errs = append(errs, validateMemoryLimit(path.Child("memoryLimit"), *s.MemoryLimit)...)
	}
	if s.AllowedIsolations != nil {
		allowedPath := path.Child("allowedIsolations")
		if len(s.AllowedIsolations) == 0 {
			errs = append(errs, field.Required(allowedPath, "must name at least one isolation; leave the field out to allow every isolation"))
		}
		for i, isolation := range s.AllowedIsolations {
			switch {
			case !slices.Contains(SupportedIsolations, isolation):
				errs = append(errs, field.NotSupported(allowedPath.Index(i), isolation, SupportedIsolations))
			case slices.Contains(s.AllowedIsolations[:i], isolation):
				errs = append(errs, field.Duplicate(allowedPath.Index(i), isolation))
			}
		}
	}
	return errs
}

// ValidateForClaim checks what only a DeviceClass config may set, for a config
// written into a ResourceClaim or ResourceClaimTemplate (or its allocation
// entry of source FromClaim): sharing.allowedIsolations is the class's floor,
// and a claim cannot widen it; locality.scope decides whether a group reaches
// other namespaces, and a claim that could make its own labels cluster-wide
// could join, attract or repel other tenants' shares. It complements
// Validate, which checks values and accepts the fields. A nil receiver is
// valid; the result is nil when c may stand in a claim, for example
// "sharing.allowedIsolations: Forbidden: only a DeviceClass config may set it; …".
func (c *GpuConfig) ValidateForClaim() field.ErrorList {
	if c == nil {
		return nil
	}
	var errs field.ErrorList
	if c.Sharing != nil && c.Sharing.AllowedIsolations != nil {
		errs = append(errs, field.Forbidden(field.NewPath("sharing", "allowedIsolations"),
			"only a DeviceClass config may set it; a claim chooses sharing.isolation among the isolations its class allows"))
	}
	if c.Locality != nil && c.Locality.Scope != "" {
		errs = append(errs, field.Forbidden(field.NewPath("locality", "scope"),
			"only a DeviceClass config may set it; a claim's locality labels name groups of its own namespace"))
	}
	return errs
}

// Allows reports whether a share may use isolation under this sharing
// config's sharing.allowedIsolations: always when the list is not set (nil
// receiver included), otherwise when the list names it.
func (s *SharingConfig) Allows(isolation Isolation) bool {
	if s == nil || s.AllowedIsolations == nil {
		return true
	}
	return slices.Contains(s.AllowedIsolations, isolation)
}

// FormatIsolations renders a list of isolations as error messages name them:
// "MPS, HAMiCore".
func FormatIsolations(isolations []Isolation) string {
	names := make([]string, len(isolations))
	for i, isolation := range isolations {
		names[i] = string(isolation)
	}
	return strings.Join(names, ", ")
}

func validateMemoryLimit(path *field.Path, q resource.Quantity) field.ErrorList {
	detail := ""
	switch {
	case q.Sign() <= 0:
		detail = "must be greater than zero"
	case q.AsDec().Scale() < -18:
		// At least 1e19, more than an int64 holds. Checked before Cmp, whose cost
		// grows with the exponent: "1e999999999" would take minutes.
		detail = "must be less than 8Ei"
	case q.Cmp(*minMemoryLimit) < 0:
		detail = "must be at least 1Mi"
	case q.Cmp(*maxInt64Bytes) > 0:
		detail = "must be less than 8Ei"
	default:
		// Value rounds up to whole bytes; the value is known to fit in an int64.
		if resource.NewQuantity(q.Value(), resource.BinarySI).Cmp(q) != 0 {
			detail = "must be a whole number of bytes"
		}
	}
	if detail == "" {
		return nil
	}
	return field.ErrorList{field.Invalid(path, q.String(), detail)}
}

func (t *TopologyConfig) validate(path *field.Path) field.ErrorList {
	if t == nil {
		return nil
	}
	return notSupported(path.Child("nvlink"), t.NVLink, SupportedNVLinkPolicies)
}

// notSupported is the error for a value that is set (not "") and is not one
// of supported; nil otherwise.
func notSupported[T ~string](path *field.Path, value T, supported []T) field.ErrorList {
	if value == "" || slices.Contains(supported, value) {
		return nil
	}
	return field.ErrorList{field.NotSupported(path, value, supported)}
}

// joinErrors renders field errors on one line, separated by "; ", without the
// brackets of field.ErrorList.ToAggregate.
func joinErrors(errs field.ErrorList) string {
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}
