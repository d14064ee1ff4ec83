package webhook

import (
	"fmt"
	"regexp"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// MIG devices (docs/mig.md) are isolated in hardware: their memory, cache
// and SMs are the instance's own. A claim for one may run MPS inside it, but
// the share backends that limit a slice of a whole GPU (HAMiCore,
// DriverMemory) do not apply, and MIG devices are never lent: a GPU in MIG
// mode publishes no lent device. The kubelet plugin refuses both at prepare;
// checkMIG says so when the claim is written.

// migRefusedIsolations are the isolations prepare refuses on a MIG device,
// and why.
var migRefusedIsolations = map[configapi.Isolation]string{
	configapi.IsolationHAMiCore:     "HAMi-core limits a process's share of a whole GPU by intercepting CUDA; a MIG device's memory and SMs are already its own",
	configapi.IsolationDriverMemory: "the driver's memory limit caps a share of a whole GPU; a MIG device's memory is already its own",
}

// migTypeSelector matches a CEL comparison of this driver's type attribute
// with "mig", either way round: device.attributes["gpu.tessera.dev"].type ==
// "mig" (the class pkg/model installs), ["type"] in place of .type, single
// quotes.
var migTypeSelector = func() *regexp.Regexp {
	attr := `attributes\s*\[\s*["']` + regexp.QuoteMeta(modelnames.DriverName) + `["']\s*\]\s*(?:\.\s*type|\[\s*["']type["']\s*\])`
	mig := `["']mig["']`
	return regexp.MustCompile(attr + `\s*==\s*` + mig + `|` + mig + `\s*==\s*device\s*\.\s*` + attr)
}()

// selectsMIG reports whether a DeviceClass selects MIG devices: one of its
// CEL selectors compares the type attribute with "mig". A selector that
// reaches MIG devices some other way (type in ["mig", …]) is not recognised;
// prepare still refuses what checkMIG would have.
func selectsMIG(class *resourceapi.DeviceClass) bool {
	if class == nil {
		return false
	}
	if class.Name == modelnames.MIGClassName {
		return true
	}
	for _, s := range class.Spec.Selectors {
		if s.CEL != nil && migTypeSelector.MatchString(s.CEL.Expression) {
			return true
		}
	}
	return false
}

// markMIG marks the units whose class is not one of Tessera's own but
// selects MIG devices (selectsMIG). A class that cannot be read is not
// marked; checkFloor warns about it.
func (c *claimChecker) markMIG(classes DeviceClassLookup) {
	for k := range c.units {
		u := &c.units[k]
		switch u.class {
		case "", modelnames.WholeClassName, modelnames.SharedClassName, modelnames.LentClassName, modelnames.MIGClassName:
			continue
		}
		if class, err := classes(u.class); err == nil && selectsMIG(class) {
			u.mig = true
		}
	}
}

// checkMIG refuses, for each request or subrequest that gets a MIG device
// (except with adminAccess, which gets no backend), a sharing.isolation of
// HAMiCore or DriverMemory and lending.lendWhenIdle true from the claim's
// config: prepare would refuse both. MPS and Advisory are allowed.
func (c *claimChecker) checkMIG() field.ErrorList {
	var errs field.ErrorList
	reported := map[string]bool{}
	report := func(path *field.Path, value any, detail string) {
		if reported[path.String()] {
			return
		}
		reported[path.String()] = true
		errs = append(errs, field.Invalid(path, value, detail))
	}
	for k := range c.units {
		u := &c.units[k]
		if !u.mig || u.adminAccess {
			continue
		}
		scope := fmt.Sprintf("request %q is of DeviceClass %s and gets a MIG device", u.name, u.class)
		narrow := fmt.Sprintf("; drop it, or name only other requests in %s", c.path.Child("config").Index(u.isolation).Child("requests"))
		if isolation := c.isolationOf(u); migRefusedIsolations[isolation] != "" {
			report(c.paramsPath(u.isolation).Child("sharing", "isolation"), string(isolation), fmt.Sprintf(
				"%s, which MIG isolates in hardware: %s isolation does not apply to MIG devices (%s; MPS inside a MIG device is allowed), "+
					"so prepare would refuse the claim%s",
				scope, isolation, migRefusedIsolations[isolation], narrow))
		}
		if u.lending >= 0 && *c.decoded[u.lending].Lending.LendWhenIdle {
			narrow := fmt.Sprintf("; drop it, or name only other requests in %s", c.path.Child("config").Index(u.lending).Child("requests"))
			report(c.paramsPath(u.lending).Child("lending", "lendWhenIdle"), true, fmt.Sprintf(
				"%s; MIG devices are not lendable (a GPU in MIG mode publishes no lent device)%s", scope, narrow))
		}
	}
	return errs
}

// migAdminWarnings warns about each request for MIG devices with
// adminAccess: the scheduler may allocate it a dynamic MIG placement (a
// device of a GPU published with --dynamic-mig), which is no instance yet,
// and prepare refuses admin access to it. Whether a node publishes dynamic
// placements is not known here.
func (c *claimChecker) migAdminWarnings() []string {
	var warnings []string
	for k := range c.units {
		u := &c.units[k]
		if !u.mig || !u.adminAccess {
			continue
		}
		warnings = append(warnings, fmt.Sprintf("%s: admin access to MIG devices: if the scheduler picks a dynamic MIG placement (no instance yet), "+
			"prepare refuses request %q; admin access observes existing instances", u.path.Child("adminAccess"), u.name))
	}
	return warnings
}

// migClassConfigErrors refuses, in the configs of a DeviceClass that
// selects MIG devices, what prepare would refuse for every claim of the
// class: a sharing.isolation of HAMiCore or DriverMemory, lendWhenIdle true.
// path is the config entry's opaque.parameters.
func migClassConfigErrors(className string, path *field.Path, cfg *configapi.GpuConfig) field.ErrorList {
	var errs field.ErrorList
	if s := cfg.Sharing; s != nil && migRefusedIsolations[s.Isolation] != "" {
		errs = append(errs, field.Invalid(path.Child("sharing", "isolation"), string(s.Isolation), fmt.Sprintf(
			"DeviceClass %s selects MIG devices, which MIG isolates in hardware: %s isolation does not apply to them (%s; MPS is allowed), "+
				"so prepare would refuse every claim of the class", className, s.Isolation, migRefusedIsolations[s.Isolation])))
	}
	if l := cfg.Lending; l != nil && l.LendWhenIdle != nil && *l.LendWhenIdle {
		errs = append(errs, field.Invalid(path.Child("lending", "lendWhenIdle"), true, fmt.Sprintf(
			"DeviceClass %s selects MIG devices, which are not lendable (a GPU in MIG mode publishes no lent device)", className)))
	}
	return errs
}

// memoize reads each class once per claim: markMIG and checkFloor ask for the
// same names, and a failed read is logged by the Handler's lookup.
func memoize(classes DeviceClassLookup) DeviceClassLookup {
	type read struct {
		class *resourceapi.DeviceClass
		err   error
	}
	seen := map[string]read{}
	return func(name string) (*resourceapi.DeviceClass, error) {
		if r, ok := seen[name]; ok {
			return r.class, r.err
		}
		class, err := classes(name)
		seen[name] = read{class, err}
		return class, err
	}
}
