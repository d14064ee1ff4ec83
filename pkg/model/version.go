package model

import (
	"strconv"
	"strings"
)

// semver normalises a dotted numeric version as NVML reports it into the semantic
// version (major.minor.patch, semver 2.0) that a VersionValue attribute must hold:
//
//   - missing components become 0: "9.0" → "9.0.0", "13" → "13.0.0";
//   - leading zeros are dropped, which semver forbids: "580.95.05" → "580.95.5".
//
// Version comparisons in CEL (semver(...)) therefore order driver versions the way
// NVIDIA numbers them. ok is false for anything that is not one to three
// dot-separated decimal numbers (empty, "N/A", "12.4-rc1", "1.2.3.4"); the caller
// then leaves the attribute out instead of publishing a wrong one.
func semver(v string) (normalised string, ok bool) {
	parts := strings.Split(v, ".")
	if len(parts) == 0 || len(parts) > 3 {
		return "", false
	}
	nums := [3]uint64{}
	for i, p := range parts {
		if p == "" || strings.TrimLeft(p, "0123456789") != "" {
			return "", false
		}
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return "", false
		}
		nums[i] = n
	}
	return strconv.FormatUint(nums[0], 10) + "." + strconv.FormatUint(nums[1], 10) + "." + strconv.FormatUint(nums[2], 10), true
}
