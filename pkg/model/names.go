package model

import (
	"fmt"
	"strconv"
	"strings"
)

// DriverName is the DRA driver name: the prefix of attribute names, the driver in
// allocation results and the API group of the opaque GpuConfig.
const DriverName = "gpu.tessera.dev"

// sharedSuffix marks the device that hands out fractions of a GPU.
const sharedSuffix = "-shared"

// WholeDeviceName is the name of the exclusive device for the GPU with this minor.
func WholeDeviceName(minor int) string { return "gpu-" + strconv.Itoa(minor) }

// SharedDeviceName is the name of the shared device for the GPU with this minor.
func SharedDeviceName(minor int) string { return WholeDeviceName(minor) + sharedSuffix }

// CounterSetName is the name of the counter set that both devices of a GPU consume.
func CounterSetName(minor int) string { return WholeDeviceName(minor) }

// ParseDeviceName is the inverse of WholeDeviceName and SharedDeviceName.
func ParseDeviceName(name string) (minor int, shared bool, err error) {
	rest, ok := strings.CutPrefix(name, "gpu-")
	if !ok {
		return 0, false, fmt.Errorf("device name %q: not a %s device (want gpu-<minor> or gpu-<minor>-shared)", name, DriverName)
	}
	rest, shared = strings.CutSuffix(rest, sharedSuffix)
	minor, err = strconv.Atoi(rest)
	if err != nil || minor < 0 || strconv.Itoa(minor) != rest {
		return 0, false, fmt.Errorf("device name %q: not a %s device (want gpu-<minor> or gpu-<minor>-shared)", name, DriverName)
	}
	return minor, shared, nil
}
