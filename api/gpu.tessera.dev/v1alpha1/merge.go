package v1alpha1

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// ConfigForRequest returns the GpuConfig that applies to one request of an
// allocated claim: decoded, merged, defaulted and validated. It is pure.
//
// configs is the allocation's config list (ResourceClaim
// status.allocation.devices.config). request is the request name of a device
// result (status.allocation.devices.results[].request): "gpus", or "gpus/nvlink"
// when the device was allocated for subrequest "nvlink" of firstAvailable request
// "gpus".
//
// Which entries count: only opaque configs of driver gpu.tessera.dev (others are
// skipped without being read). An entry with no requests applies to every
// request; otherwise it applies when its requests name the request itself or, for
// a subrequest, its parent request ("gpus" applies to "gpus/nvlink").
//
// Precedence: entries from the DeviceClass (source FromClass) first, then entries
// from the claim (FromClaim), each group in list order. A later entry wins field
// by field: one that sets only sharing.computeLimit keeps the isolation an earlier
// one set. Then Default fills what is still unset.
//
// sharing.allowedIsolations, the class's floor, merges differently: only
// FromClass entries may set it (a FromClaim entry that does is an error, see
// ValidateForClaim), and when several do, the result holds the isolations
// every one of them lists, in the order of the first; an entry that leaves
// none in common is an error. ConfigForRequest does not check isolation
// against the list, since the node's --default-isolation may still fill it in:
// the caller does (SharingConfig.Allows), once the isolation is final.
//
// Every applicable entry is decoded with DecodeStrict and validated on its own, so
// an error names the entry that is wrong, by its index in configs, its source and
// its requests, for example
// `config 1 (FromClaim, requests "gpus"): invalid GpuConfig: sharing.isolaton: unknown field`.
// Entries that do not apply to request are not read at all. With no applicable
// entry the result is the defaulted empty config. The result shares no memory
// with configs.
func ConfigForRequest(configs []resourceapi.DeviceAllocationConfiguration, request string) (*GpuConfig, error) {
	var fromClass, fromClaim []int
	for i, config := range configs {
		if config.Opaque == nil || config.Opaque.Driver != GroupName || !AppliesTo(config.Requests, request) {
			continue
		}
		switch config.Source {
		case resourceapi.AllocationConfigSourceClass:
			fromClass = append(fromClass, i)
		case resourceapi.AllocationConfigSourceClaim:
			fromClaim = append(fromClaim, i)
		default:
			return nil, fmt.Errorf("%s: unknown source %q; expected %s or %s", describeEntry(i, config),
				config.Source, resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim)
		}
	}

	merged := &GpuConfig{}
	for _, i := range slices.Concat(fromClass, fromClaim) {
		config, err := decodeEntry(configs[i])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", describeEntry(i, configs[i]), err)
		}
		if configs[i].Source == resourceapi.AllocationConfigSourceClaim {
			if errs := config.ValidateForClaim(); len(errs) > 0 {
				return nil, fmt.Errorf("%s: invalid GpuConfig: %s", describeEntry(i, configs[i]), joinErrors(errs))
			}
		}
		if merged.Sharing != nil && merged.Sharing.AllowedIsolations != nil && config.Sharing != nil && config.Sharing.AllowedIsolations != nil &&
			len(intersect(merged.Sharing.AllowedIsolations, config.Sharing.AllowedIsolations)) == 0 {
			return nil, fmt.Errorf("%s: sharing.allowedIsolations (%s) has no isolation in common with the %s that earlier class configs allow, "+
				"so no share of the class could be prepared", describeEntry(i, configs[i]),
				FormatIsolations(config.Sharing.AllowedIsolations), FormatIsolations(merged.Sharing.AllowedIsolations))
		}
		merged.mergeFrom(config)
	}
	merged.Default()
	if errs := merged.Validate(); len(errs) > 0 {
		// Unreachable while every entry is validated: merging copies valid values.
		return nil, fmt.Errorf("merged GpuConfig for request %q: %s", request, joinErrors(errs))
	}
	return merged, nil
}

// AppliesTo reports whether a config entry (or a constraint) that lists
// requests applies to request, the request name of a device result: it does
// when requests is empty (every request), names request itself, or, for a
// subrequest "gpus/nvlink", names its parent "gpus". This is how
// ResourceClaim spec.devices.config[].requests and
// spec.devices.constraints[].requests refer to requests.
func AppliesTo(requests []string, request string) bool {
	if len(requests) == 0 {
		return true
	}
	if slices.Contains(requests, request) {
		return true
	}
	parent, _, isSubrequest := strings.Cut(request, "/")
	return isSubrequest && slices.Contains(requests, parent)
}

func decodeEntry(config resourceapi.DeviceAllocationConfiguration) (*GpuConfig, error) {
	raw := config.Opaque.Parameters.Raw
	if len(raw) == 0 && config.Opaque.Parameters.Object != nil {
		// Set by Go callers that build an allocation in memory; the API server
		// always delivers Raw.
		var err error
		if raw, err = json.Marshal(config.Opaque.Parameters.Object); err != nil {
			return nil, fmt.Errorf("encode parameters: %w", err)
		}
	}
	decoded, err := DecodeStrict(raw)
	if err != nil {
		return nil, err
	}
	if errs := decoded.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("invalid GpuConfig: %s", joinErrors(errs))
	}
	return decoded, nil
}

// describeEntry names an entry of the allocation's config list for error messages.
func describeEntry(index int, config resourceapi.DeviceAllocationConfiguration) string {
	if len(config.Requests) == 0 {
		return fmt.Sprintf("config %d (%s, all requests)", index, config.Source)
	}
	quoted := make([]string, len(config.Requests))
	for i, r := range config.Requests {
		quoted[i] = fmt.Sprintf("%q", r)
	}
	return fmt.Sprintf("config %d (%s, requests %s)", index, config.Source, strings.Join(quoted, ", "))
}

// mergeFrom copies every field that src sets onto c; fields src leaves unset keep
// their value in c. Nothing of src is aliased.
func (c *GpuConfig) mergeFrom(src *GpuConfig) {
	if src.Sharing != nil {
		if c.Sharing == nil {
			c.Sharing = &SharingConfig{}
		}
		if src.Sharing.Isolation != "" {
			c.Sharing.Isolation = src.Sharing.Isolation
		}
		if src.Sharing.ComputeLimit != nil {
			limit := *src.Sharing.ComputeLimit
			c.Sharing.ComputeLimit = &limit
		}
		if src.Sharing.MemoryLimit != nil {
			limit := src.Sharing.MemoryLimit.DeepCopy()
			c.Sharing.MemoryLimit = &limit
		}
		if src.Sharing.AllowedIsolations != nil {
			// Every list must allow the isolation: keep what all of them name.
			if c.Sharing.AllowedIsolations == nil {
				c.Sharing.AllowedIsolations = slices.Clone(src.Sharing.AllowedIsolations)
			} else {
				c.Sharing.AllowedIsolations = intersect(c.Sharing.AllowedIsolations, src.Sharing.AllowedIsolations)
			}
		}
	}
	if src.Lending != nil && src.Lending.LendWhenIdle != nil {
		lend := *src.Lending.LendWhenIdle
		c.Lending = &LendingConfig{LendWhenIdle: &lend}
	}
	if src.Locality != nil {
		if c.Locality == nil {
			c.Locality = &LocalityConfig{}
		}
		for _, f := range []struct {
			dst *LocalityLabel
			src LocalityLabel
		}{
			{&c.Locality.Affinity, src.Locality.Affinity},
			{&c.Locality.AntiAffinity, src.Locality.AntiAffinity},
			{&c.Locality.Exclusion, src.Locality.Exclusion},
		} {
			if f.src != "" {
				*f.dst = f.src
			}
		}
		if src.Locality.Scope != "" {
			c.Locality.Scope = src.Locality.Scope
		}
	}
	if src.Topology != nil {
		if c.Topology == nil {
			c.Topology = &TopologyConfig{}
		}
		if src.Topology.NVLink != "" {
			c.Topology.NVLink = src.Topology.NVLink
		}
	}
}

// intersect returns the isolations of a that b also names, in a's order, in a
// new slice.
func intersect(a, b []Isolation) []Isolation {
	out := []Isolation{}
	for _, isolation := range a {
		if slices.Contains(b, isolation) {
			out = append(out, isolation)
		}
	}
	return out
}
