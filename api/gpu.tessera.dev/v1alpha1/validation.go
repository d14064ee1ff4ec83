package v1alpha1

import (
	"math"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
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
//   - sharing.isolation is empty or one of Advisory, MPS, HAMiCore (case-sensitive);
//   - sharing.computeLimit is between 1 and 100;
//   - sharing.memoryLimit is greater than zero, at least 1Mi, a whole number of
//     bytes, and below 8Ei (fits in an int64);
//   - topology.nvlink is empty or one of Required, Preferred, Ignore.
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
	var errs field.ErrorList
	if c.APIVersion != "" && c.APIVersion != SchemeGroupVersion.String() {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), c.APIVersion, []string{SchemeGroupVersion.String()}))
	}
	if c.Kind != "" && c.Kind != GpuConfigKind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), c.Kind, []string{GpuConfigKind}))
	}
	errs = append(errs, c.Sharing.validate(field.NewPath("sharing"))...)
	errs = append(errs, c.Topology.validate(field.NewPath("topology"))...)
	return errs
}

func (s *SharingConfig) validate(path *field.Path) field.ErrorList {
	if s == nil {
		return nil
	}
	var errs field.ErrorList
	if s.Isolation != "" && !slices.Contains(SupportedIsolations, s.Isolation) {
		errs = append(errs, field.NotSupported(path.Child("isolation"), s.Isolation, SupportedIsolations))
	}
	if s.ComputeLimit != nil && (*s.ComputeLimit < MinComputeLimit || *s.ComputeLimit > MaxComputeLimit) {
		errs = append(errs, field.Invalid(path.Child("computeLimit"), *s.ComputeLimit, "must be between 1 and 100"))
	}
	if s.MemoryLimit != nil {
		errs = append(errs, validateMemoryLimit(path.Child("memoryLimit"), *s.MemoryLimit)...)
	}
	return errs
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
	var errs field.ErrorList
	if t.NVLink != "" && !slices.Contains(SupportedNVLinkPolicies, t.NVLink) {
		errs = append(errs, field.NotSupported(path.Child("nvlink"), t.NVLink, SupportedNVLinkPolicies))
	}
	return errs
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
