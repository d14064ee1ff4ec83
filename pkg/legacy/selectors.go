package legacy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The attributes of Tessera's devices that selectors read
// (pkg/model.AttrProductName and AttrUUID, qualified by the driver).
const (
	attrs           = `device.attributes["gpu.tessera.dev"]`
	attrProductName = "productName"
	attrUUID        = "uuid"
)

// podSelectors turns the pod's GPU-selecting annotations into CEL selectors
// that every translated request carries, and lists the annotations it
// consumed (to remove). An annotation it cannot honour, or one that names
// nothing, is an error.
func podSelectors(annotations map[string]string, path *field.Path) (selectors, consumed []string, errs field.ErrorList) {
	for _, key := range []string{HAMiNUMABind, HAMiVGPUMode} {
		if _, ok := annotations[key]; ok {
			errs = append(errs, field.Invalid(path.Key(key), annotations[key], "Tessera has no equivalent of this HAMi annotation: remove it to translate the pod"))
		}
	}
	for _, a := range []struct {
		key    string
		attr   string
		negate bool
		match  func(list []string) string
	}{
		{HAMiUseType, attrProductName, false, typeMatch},
		{HAMiNoUseType, attrProductName, true, typeMatch},
		{HAMiUseUUID, attrUUID, false, uuidMatch},
		{HAMiNoUseUUID, attrUUID, true, uuidMatch},
	} {
		value, ok := annotations[a.key]
		if !ok {
			continue
		}
		list := splitList(value)
		if len(list) == 0 {
			errs = append(errs, field.Invalid(path.Key(a.key), value, "names nothing (HAMi reads an empty list as no constraint): list GPU types or UUIDs separated by commas, or remove the annotation"))
			continue
		}
		consumed = append(consumed, a.key)
		// A device without the attribute matches no positive list and every
		// negative one; the guard keeps CEL from failing the whole claim.
		has := fmt.Sprintf("%q in %s", a.attr, attrs)
		if a.negate {
			selectors = append(selectors, fmt.Sprintf("!(%s) || !(%s)", has, a.match(list)))
		} else {
			selectors = append(selectors, fmt.Sprintf("%s && (%s)", has, a.match(list)))
		}
	}
	return selectors, consumed, errs
}

// splitList is HAMi's reading of a comma-separated annotation: entries
// trimmed, empty ones skipped (CheckType).
func splitList(value string) []string {
	var out []string
	for _, v := range strings.Split(value, ",") {
		if v = strings.TrimSpace(v); v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// typeMatch is HAMi's CheckType on productName: the upper-cased product
// name contains one of the upper-cased types ("A100" matches "NVIDIA A100
// 80GB PCIe"; HAMi's own type strings read like "NVIDIA-NVIDIA A100").
func typeMatch(types []string) string {
	terms := make([]string, len(types))
	for i, t := range types {
		terms[i] = fmt.Sprintf("%s.%s.upperAscii().contains(%s)", attrs, attrProductName, strconv.Quote(strings.ToUpper(t)))
	}
	return strings.Join(terms, " || ")
}

// uuidMatch is HAMi's CheckUUID: the GPU's UUID is one of the list.
func uuidMatch(uuids []string) string {
	quoted := make([]string, len(uuids))
	for i, u := range uuids {
		quoted[i] = strconv.Quote(u)
	}
	return fmt.Sprintf("%s.%s in [%s]", attrs, attrUUID, strings.Join(quoted, ", "))
}

func sortStrings(lists ...[]string) {
	for _, l := range lists {
		slices.Sort(l)
	}
}
