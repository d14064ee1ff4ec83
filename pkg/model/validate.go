package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// Validate checks DriverResources against the ResourceSlice API limits and the
// pool-wide rules the API server cannot check per object, so that a broken model
// shows up in a unit test or at plugin start instead of as a rejected API write:
//
//   - pool names are DNS subdomains; a slice holds devices or counter sets, not both;
//   - at most ResourceSliceMaxCounterSets counter sets per slice and
//     ResourceSliceMaxCountersPerCounterSet counters per set;
//   - at most ResourceSliceMaxDevices devices per slice, and
//     ResourceSliceMaxDevicesWithAdvancedFeatures when a device consumes counters
//     or carries taints;
//   - device and counter set names are DNS labels, unique in the pool;
//   - per device at most ResourceSliceMaxAttributesAndCapacitiesPerDevice
//     attributes and capacities, qualified names well formed, each attribute with
//     exactly one value, strings and versions at most DeviceAttributeMaxValueLength
//     long, versions semantic;
//   - at most ResourceSliceMaxDeviceCounterConsumptionsPerDevice counter
//     consumptions per device, each naming a counter set and counters of the pool,
//     at most ResourceSliceMaxCountersPerDeviceCounterConsumption counters each;
//   - counter names are DNS labels, counter values and consumptions not negative;
//   - per device at most DeviceTaintsMaxLength taints and
//     ResourceSliceMaxAttributeValuesPerDevice attribute values;
//   - each slice's JSON (the spec fields a Slice carries) at most
//     MaxResourceSliceBytes.
//
// It is not the API server's full validation (list attributes, node selectors,
// taints and request policies are checked only as far as listed). All problems are
// reported, joined, each naming the pool, slice index and device.
func Validate(res resourceslice.DriverResources) error {
	var errs []error
	poolNames := make([]string, 0, len(res.Pools))
	for name := range res.Pools {
		poolNames = append(poolNames, name)
	}
	slices.Sort(poolNames)
	for _, name := range poolNames {
		errs = append(errs, validatePool(name, res.Pools[name])...)
	}
	return errors.Join(errs...)
}

// MaxResourceSliceBytes bounds the JSON of one slice's devices and counter
// sets: a third below etcd's default request limit (1.5 MiB,
// https://etcd.io/docs/v3.6/dev-guide/limit/), leaving room for the
// metadata, pool and driver fields the API server stores with them.
const MaxResourceSliceBytes = 1 << 20

func validatePool(name string, pool resourceslice.Pool) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("pool %q: "+format, append([]any{name}, args...)...))
	}
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		fail("name: %s", msg)
	}

	counterSets := make(map[string]resourceapi.CounterSet)
	for i, slice := range pool.Slices {
		if len(slice.SharedCounters) > 0 && len(slice.Devices) > 0 {
			fail("slice %d: has both devices and sharedCounters", i)
		}
		if n := len(slice.SharedCounters); n > resourceapi.ResourceSliceMaxCounterSets {
			fail("slice %d: %d counter sets, more than %d", i, n, resourceapi.ResourceSliceMaxCounterSets)
		}
		for _, cs := range slice.SharedCounters {
			for _, msg := range validation.IsDNS1123Label(cs.Name) {
				fail("slice %d: counter set %q: name: %s", i, cs.Name, msg)
			}
			if _, dup := counterSets[cs.Name]; dup {
				fail("slice %d: counter set %q: duplicate", i, cs.Name)
			}
			if n := len(cs.Counters); n > resourceapi.ResourceSliceMaxCountersPerCounterSet {
				fail("slice %d: counter set %q: %d counters, more than %d", i, cs.Name, n, resourceapi.ResourceSliceMaxCountersPerCounterSet)
			}
			for _, err := range validateCounters(cs.Counters) {
				fail("slice %d: counter set %q: %w", i, cs.Name, err)
			}
			counterSets[cs.Name] = cs
		}
		if b, err := json.Marshal(slice); err != nil {
			fail("slice %d: %v", i, err)
		} else if len(b) > MaxResourceSliceBytes {
			fail("slice %d: %d bytes of JSON, more than %d", i, len(b), MaxResourceSliceBytes)
		}
	}

	devices := make(map[string]bool)
	for i, slice := range pool.Slices {
		limit := resourceapi.ResourceSliceMaxDevices
		for _, d := range slice.Devices {
			if len(d.ConsumesCounters) > 0 || len(d.Taints) > 0 {
				limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
			}
		}
		if len(slice.Devices) > limit {
			fail("slice %d: %d devices, more than %d", i, len(slice.Devices), limit)
		}
		for _, d := range slice.Devices {
			for _, err := range validateDevice(d, counterSets) {
				fail("slice %d: device %q: %w", i, d.Name, err)
			}
			if devices[d.Name] {
				fail("slice %d: device %q: duplicate", i, d.Name)
			}
			devices[d.Name] = true
		}
	}
	return errs
}

func validateDevice(d resourceapi.Device, counterSets map[string]resourceapi.CounterSet) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, msg := range validation.IsDNS1123Label(d.Name) {
		fail("name: %s", msg)
	}
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		fail("%d attributes and capacities, more than %d", n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
	}
	for _, name := range sortedKeys(d.Attributes) {
		if err := validateQualifiedName(name); err != nil {
			fail("attribute %q: %w", name, err)
		}
		if err := validateAttribute(d.Attributes[name]); err != nil {
			fail("attribute %q: %w", name, err)
		}
	}
	for _, name := range sortedKeys(d.Capacity) {
		if err := validateQualifiedName(name); err != nil {
			fail("capacity %q: %w", name, err)
		}
	}
	if n := attributeValues(d.Attributes); n > resourceapi.ResourceSliceMaxAttributeValuesPerDevice {
		fail("%d attribute values, more than %d", n, resourceapi.ResourceSliceMaxAttributeValuesPerDevice)
	}
	if n := len(d.Taints); n > resourceapi.DeviceTaintsMaxLength {
		fail("%d taints, more than %d", n, resourceapi.DeviceTaintsMaxLength)
	}
	if n := len(d.ConsumesCounters); n > resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
		fail("%d counter consumptions, more than %d", n, resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice)
	}
	for _, c := range d.ConsumesCounters {
		if n := len(c.Counters); n > resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption {
			fail("consumes %d counters of counter set %q, more than %d", n, c.CounterSet, resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption)
		}
		for _, err := range validateCounters(c.Counters) {
			fail("consumes counter set %q: %w", c.CounterSet, err)
		}
		cs, ok := counterSets[c.CounterSet]
		if !ok {
			fail("consumes counter set %q, which the pool does not have", c.CounterSet)
			continue
		}
		for _, counter := range sortedKeys(c.Counters) {
			if _, ok := cs.Counters[counter]; !ok {
				fail("consumes counter %q, which counter set %q does not have", counter, c.CounterSet)
			}
		}
	}
	return errs
}

// validateCounters checks counter names (DNS labels) and values (not negative).
func validateCounters(counters map[string]resourceapi.Counter) []error {
	var errs []error
	for _, name := range sortedKeys(counters) {
		for _, msg := range validation.IsDNS1123Label(name) {
			errs = append(errs, fmt.Errorf("counter %q: name: %s", name, msg))
		}
		if v := counters[name].Value; v.Sign() < 0 {
			errs = append(errs, fmt.Errorf("counter %q: negative value %s", name, v.String()))
		}
	}
	return errs
}

// attributeValues counts a device's attribute values, each element of a list
// attribute as one (the API's ResourceSliceMaxAttributeValuesPerDevice).
func attributeValues(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) int {
	n := 0
	for _, a := range attrs {
		switch {
		case a.IntValues != nil:
			n += len(a.IntValues)
		case a.BoolValues != nil:
			n += len(a.BoolValues)
		case a.StringValues != nil:
			n += len(a.StringValues)
		case a.VersionValues != nil:
			n += len(a.VersionValues)
		default:
			n++
		}
	}
	return n
}

// cIdentifier is the ID part of a qualified name.
var cIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// semVer is a semantic version 2.0 (major.minor.patch, optional pre-release and build).
var semVer = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

func validateQualifiedName(name resourceapi.QualifiedName) error {
	domain, id, qualified := strings.Cut(string(name), "/")
	if !qualified {
		id, domain = domain, ""
	}
	if qualified {
		if len(domain) > resourceapi.DeviceMaxDomainLength {
			return fmt.Errorf("domain longer than %d characters", resourceapi.DeviceMaxDomainLength)
		}
		if msgs := validation.IsDNS1123Subdomain(domain); len(msgs) > 0 {
			return fmt.Errorf("domain: %s", strings.Join(msgs, "; "))
		}
	}
	if len(id) > resourceapi.DeviceMaxIDLength || !cIdentifier.MatchString(id) {
		return fmt.Errorf("not a C identifier of at most %d characters", resourceapi.DeviceMaxIDLength)
	}
	return nil
}

func validateAttribute(a resourceapi.DeviceAttribute) error {
	set := 0
	for _, isSet := range []bool{a.IntValue != nil, a.BoolValue != nil, a.StringValue != nil, a.VersionValue != nil,
		a.IntValues != nil, a.BoolValues != nil, a.StringValues != nil, a.VersionValues != nil} {
		if isSet {
			set++
		}
	}
	if set != 1 {
		return fmt.Errorf("%d values set, want exactly 1", set)
	}
	switch {
	case a.StringValue != nil && len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength:
		return fmt.Errorf("string longer than %d characters", resourceapi.DeviceAttributeMaxValueLength)
	case a.VersionValue != nil && len(*a.VersionValue) > resourceapi.DeviceAttributeMaxValueLength:
		return fmt.Errorf("version longer than %d characters", resourceapi.DeviceAttributeMaxValueLength)
	case a.VersionValue != nil && !semVer.MatchString(*a.VersionValue):
		return fmt.Errorf("version %q is not a semantic version", *a.VersionValue)
	}
	return nil
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
