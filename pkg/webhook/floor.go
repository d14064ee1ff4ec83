package webhook

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// DeviceClassLookup returns the DeviceClass called name, which the caller must
// not modify. An error for which apierrors.IsNotFound holds means that there
// is no such class; any other error, that it could not be read.
type DeviceClassLookup func(name string) (*resourceapi.DeviceClass, error)

// DeviceClassMap is a DeviceClassLookup over a fixed set of classes, keyed by
// name: for tests and for callers that read the classes beforehand.
func DeviceClassMap(classes map[string]*resourceapi.DeviceClass) DeviceClassLookup {
	return func(name string) (*resourceapi.DeviceClass, error) {
		if class, ok := classes[name]; ok {
			return class, nil
		}
		return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
	}
}

// classFloor is what checkFloor reads from one DeviceClass: the GpuConfigs of
// driver gpu.tessera.dev in its spec.config, merged as prepare merges them.
type classFloor struct {
	// lookupErr is why the class could not be read.
	lookupErr error
	// invalid describes a config of the class that prepare would refuse for
	// every claim of the class.
	invalid string
	// allowed is the class's sharing.allowedIsolations (what every config
	// that sets it lists); nil when no config sets it.
	allowed []configapi.Isolation
	// isolation is the sharing.isolation the class's configs set (the last
	// one), "" when none does.
	isolation configapi.Isolation
	// computeLimit, memoryLimit and nvlink are what the class's configs set
	// (the last one that sets each), nil or "" when none does: a claim
	// whose own config leaves them unset gets them at prepare.
	computeLimit *int32
	memoryLimit  *resource.Quantity
	nvlink       configapi.NVLinkPolicy
	// allowedAt names the configs that set allowedIsolations, for messages:
	// "spec.config[0]".
	allowedAt []string
}

// readClassFloor decodes the configs of driver gpu.tessera.dev in a class's
// spec.config with the strict decoder and validation prepare uses
// (configapi.ConfigForRequest).
func readClassFloor(class *resourceapi.DeviceClass) *classFloor {
	floor := &classFloor{}
	for i, entry := range class.Spec.Config {
		if entry.Opaque == nil || entry.Opaque.Driver != configapi.GroupName {
			continue
		}
		at := fmt.Sprintf("spec.config[%d]", i)
		raw := entry.Opaque.Parameters.Raw
		if len(raw) == 0 && entry.Opaque.Parameters.Object != nil {
			var err error
			if raw, err = json.Marshal(entry.Opaque.Parameters.Object); err != nil {
				floor.invalid = fmt.Sprintf("%s.opaque.parameters: encode parameters: %v", at, err)
				return floor
			}
		}
		cfg, err := configapi.DecodeStrict(raw)
		if err != nil {
			floor.invalid = fmt.Sprintf("%s.opaque.parameters: %v", at, err)
			return floor
		}
		if errs := cfg.Validate(); len(errs) > 0 {
			floor.invalid = fmt.Sprintf("%s.opaque.parameters: invalid GpuConfig: %v", at, errs.ToAggregate())
			return floor
		}
		if cfg.Topology != nil && cfg.Topology.NVLink != "" {
			floor.nvlink = cfg.Topology.NVLink
		}
		if cfg.Sharing == nil {
			continue
		}
		if cfg.Sharing.Isolation != "" {
			floor.isolation = cfg.Sharing.Isolation
		}
		if cfg.Sharing.ComputeLimit != nil {
			floor.computeLimit = cfg.Sharing.ComputeLimit
		}
		if cfg.Sharing.MemoryLimit != nil {
			floor.memoryLimit = cfg.Sharing.MemoryLimit
		}
		if allowed := cfg.Sharing.AllowedIsolations; allowed != nil {
			floor.allowedAt = append(floor.allowedAt, at)
			if floor.allowed == nil {
				floor.allowed = slices.Clone(allowed)
				continue
			}
			floor.allowed = slices.DeleteFunc(floor.allowed, func(i configapi.Isolation) bool { return !slices.Contains(allowed, i) })
			if len(floor.allowed) == 0 {
				floor.invalid = fmt.Sprintf("%s.opaque.parameters.sharing.allowedIsolations (%s) has no isolation in common with the class's earlier configs",
					at, configapi.FormatIsolations(allowed))
				return floor
			}
		}
	}
	return floor
}

// allows reports whether the class lets a share use isolation.
func (f *classFloor) allows(isolation configapi.Isolation) bool {
	return f.allowed == nil || slices.Contains(f.allowed, isolation)
}

// checkFloor checks each request against the floor of its DeviceClass: the
// sharing.allowedIsolations of the class's config, which a claim can only
// make stricter. For every request and firstAvailable subrequest that gets
// devices with an isolation backend (not adminAccess, not of the whole-GPU
// class gpu.tessera.dev; a class of another name may select shares, so the
// floor applies to all of its requests), with the class's floor set:
//
//   - a claim config that sets sharing.isolation for it must set one the
//     class allows (error at that config's sharing.isolation);
//   - otherwise the class's own sharing.isolation must be one it allows
//     (error at the request's deviceClassName: the class is broken);
//   - otherwise the node's --default-isolation decides, which admission does
//     not know: a warning says that prepare refuses the claim unless it is
//     allowed.
//
// A class config that prepare would refuse (one that does not decode or
// validate, or configs whose allowedIsolations have nothing in common) is an
// error at the request's deviceClassName. A class that cannot be read does
// not fail the claim: the claim is allowed with a warning that names the
// class and the error, since prepare checks the floor again (the backstop).
// Each class is read once.
func (c *claimChecker) checkFloor(classes DeviceClassLookup) (field.ErrorList, []string) {
	var errs field.ErrorList
	var warnings []string
	warned := map[string]bool{}
	for k := range c.units {
		u := &c.units[k]
		if u.adminAccess || u.class == "" || u.class == modelnames.WholeClassName {
			continue
		}
		if !c.ownConfig && !c.mayGetOurDevices(u) {
			// A claim without configs of this driver, for another
			// driver's devices: nothing of it is this driver's.
			continue
		}
		floor := c.readFloor(classes, u.class)
		classPath := u.path.Child("deviceClassName")
		if floor.lookupErr != nil {
			if !warned[u.class] {
				warned[u.class] = true
				warnings = append(warnings, lookupWarning(classPath, u.class, floor.lookupErr))
			}
			continue
		}
		if floor.invalid != "" {
			errs = append(errs, field.Invalid(classPath, u.class, fmt.Sprintf(
				"the config of DeviceClass %s is invalid: %s; prepare would refuse every claim of the class", u.class, floor.invalid)))
			continue
		}
		if floor.allowed == nil {
			continue
		}
		allowed := configapi.FormatIsolations(floor.allowed)
		switch isolation := c.isolationOf(u); {
		case isolation != "":
			if floor.allows(isolation) {
				continue
			}
			errs = append(errs, field.Invalid(c.paramsPath(u.isolation).Child("sharing", "isolation"), string(isolation), fmt.Sprintf(
				"request %q is of DeviceClass %s, whose config allows only %s (sharing.allowedIsolations); "+
					"a claim may choose only an isolation its class allows, so prepare would refuse the claim",
				u.name, u.class, allowed)))
		case floor.isolation != "":
			if floor.allows(floor.isolation) {
				continue
			}
			errs = append(errs, field.Invalid(classPath, u.class, fmt.Sprintf(
				"the config of DeviceClass %s sets sharing.isolation %s, which its own sharing.allowedIsolations (%s) does not allow, "+
					"so prepare would refuse the claim; set sharing.isolation in the claim's config to one of %s, or have the admin fix the class",
				u.class, floor.isolation, allowed, allowed)))
		default:
			warnings = append(warnings, fmt.Sprintf("%s: DeviceClass %s allows only %s, and neither it nor the claim sets sharing.isolation: "+
				"prepare refuses request %q unless the node's --default-isolation is one of them", classPath, u.class, allowed, u.name))
		}
	}
	return errs, warnings
}

// readFloor reads the configs of DeviceClass name once per claim.
func (c *claimChecker) readFloor(classes DeviceClassLookup, name string) *classFloor {
	if floor, ok := c.floors[name]; ok {
		return floor
	}
	var floor *classFloor
	class, err := classes(name)
	switch {
	case err != nil:
		floor = &classFloor{lookupErr: err}
	case class == nil:
		floor = &classFloor{lookupErr: apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)}
	default:
		floor = readClassFloor(class)
	}
	if c.floors == nil {
		c.floors = map[string]*classFloor{}
	}
	c.floors[name] = floor
	return floor
}

// lookupWarning is the warning for a class that could not be read: the claim
// is allowed, and prepare checks the class's floor.
func lookupWarning(classPath *field.Path, class string, err error) string {
	if apierrors.IsNotFound(err) {
		return fmt.Sprintf("%s: DeviceClass %s not found; its sharing.allowedIsolations is checked when the claim is prepared", classPath, class)
	}
	msg := fmt.Sprintf("%s: DeviceClass %s could not be read (%v); its sharing.allowedIsolations is checked when the claim is prepared", classPath, class, err)
	// The API server truncates longer warnings; keep the end, which says
	// what happens.
	const maxWarning = 256
	if len(msg) > maxWarning {
		suffix := "); its sharing.allowedIsolations is checked when the claim is prepared"
		prefix := fmt.Sprintf("%s: DeviceClass %s could not be read (", classPath, class)
		room := maxWarning - len(prefix) - len(suffix) - len("…")
		detail := err.Error()
		if room > 0 && len(detail) > room {
			detail = strings.ToValidUTF8(detail[:room], "") + "…"
		} else if room <= 0 {
			detail = "…"
		}
		msg = prefix + detail + suffix
	}
	return msg
}
