package model

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// DriverName is the DRA driver name: the prefix of attribute names, the driver in
// allocation results and the API group of the opaque GpuConfig.
const DriverName = modelnames.DriverName

// sharedSuffix marks the device that hands out fractions of a GPU, lentSuffix
// the device that lends an idle GPU's spare capacity to borrowers.
const (
	sharedSuffix = "-shared"
	lentSuffix   = "-lent"
)

// WholeDeviceName is the name of the exclusive device for the GPU with this minor.
func WholeDeviceName(minor int) string { return "gpu-" + strconv.Itoa(minor) }

// SharedDeviceName is the name of the shared device for the GPU with this minor.
func SharedDeviceName(minor int) string { return WholeDeviceName(minor) + sharedSuffix }

// LentDeviceName is the name of the lending device for the GPU with this minor.
func LentDeviceName(minor int) string { return WholeDeviceName(minor) + lentSuffix }

// CounterSetName is the name of the counter set that both devices of a GPU consume.
func CounterSetName(minor int) string { return WholeDeviceName(minor) }

// DeviceKind tells the devices of one GPU apart.
type DeviceKind int

const (
	// KindWhole is gpu-N, the exclusive whole GPU.
	KindWhole DeviceKind = iota
	// KindShared is gpu-N-shared, fractions of the GPU.
	KindShared
	// KindLent is gpu-N-lent, spare capacity of a held, idle GPU lent to
	// preemptible borrowers. It consumes none of the GPU's counters.
	KindLent
)

// ParseDevice is the inverse of WholeDeviceName, SharedDeviceName and
// LentDeviceName.
func ParseDevice(name string) (minor int, kind DeviceKind, err error) {
	rest, ok := strings.CutPrefix(name, "gpu-")
	if ok {
		kind = KindWhole
		if r, shared := strings.CutSuffix(rest, sharedSuffix); shared {
			rest, kind = r, KindShared
		} else if r, lent := strings.CutSuffix(rest, lentSuffix); lent {
			rest, kind = r, KindLent
		}
		minor, err = strconv.Atoi(rest)
		ok = err == nil && minor >= 0 && strconv.Itoa(minor) == rest
	}
	if !ok {
		return 0, 0, fmt.Errorf("device name %q: not a %s device (want gpu-<minor>, gpu-<minor>-shared or gpu-<minor>-lent)", name, DriverName)
	}
	return minor, kind, nil
}

// ParseDeviceName is the inverse of WholeDeviceName and SharedDeviceName: the
// devices that hold part of a GPU's counters. A lent device (gpu-N-lent) is
// an error here: it holds none of its GPU (see ParseDevice).
func ParseDeviceName(name string) (minor int, shared bool, err error) {
	minor, kind, err := ParseDevice(name)
	if err == nil && kind == KindLent {
		err = fmt.Errorf("device name %q: a lending device, which holds none of its GPU", name)
	}
	if err != nil {
		return 0, false, err
	}
	return minor, kind == KindShared, nil
}
