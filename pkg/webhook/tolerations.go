package webhook

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// checkTolerations refuses a request's toleration of a taint that only
// Tessera sets (modelnames.ToleratedInternalTaint): gpu.tessera.dev/not-lent
// keeps borrowers off a GPU its owner does not lend, and
// gpu.tessera.dev/mig-in-use keeps claims off a MIG instance that runs
// processes no claim accounts for; a claim that tolerates them would be
// allocated exactly what they guard. A toleration that names either key is
// refused in any request; one that tolerates every key (no key, operator
// Exists, effect NoSchedule or none) is refused in requests that may get
// this driver's devices (Tessera's classes, a class that selects MIG
// devices, or, with the classes, a class whose selectors name the driver).
// Requests with adminAccess are not checked: admin access reserves nothing.
// Prepare refuses the same tolerations in an allocation.
func (c *claimChecker) checkTolerations() field.ErrorList {
	var errs field.ErrorList
	for k := range c.units {
		u := &c.units[k]
		if u.adminAccess {
			continue
		}
		for i, t := range u.tolerations {
			key := modelnames.ToleratedInternalTaint(t)
			if key == "" || (t.Key == "" && !c.mayGetOurDevices(u)) {
				continue
			}
			what := "tolerates the taint " + key
			if t.Key == "" {
				what += " (a toleration without a key and with operator Exists tolerates every taint)"
			}
			errs = append(errs, field.Forbidden(u.path.Child("tolerations").Index(i), fmt.Sprintf(
				"request %q %s, which only %s sets: %s; tolerate the taints you mean by their keys instead",
				u.name, what, modelnames.DriverName, internalTaintReason[key])))
		}
	}
	return errs
}

// internalTaintReason says what each of Tessera's own taints guards.
var internalTaintReason = map[string]string{
	modelnames.NotLentTaintKey:  "it keeps borrowers off a GPU whose owner does not lend it now",
	modelnames.MIGInUseTaintKey: "it keeps claims off a MIG instance that runs processes no claim accounts for",
}

// mayGetOurDevices reports whether u's class may select devices of this
// driver: one of Tessera's classes, a class that selects MIG devices, or a
// class whose CEL selectors name the driver.
func (c *claimChecker) mayGetOurDevices(u *unit) bool {
	switch {
	case u.ours(), u.mig, u.class == modelnames.MIGClassName:
		return true
	case c.classes == nil:
		return false
	}
	class, err := c.classes(u.class)
	if err != nil || class == nil {
		return false
	}
	for _, s := range class.Spec.Selectors {
		if s.CEL != nil && strings.Contains(s.CEL.Expression, modelnames.DriverName) {
			return true
		}
	}
	return false
}
