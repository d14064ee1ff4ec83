package gpu

import (
	"errors"
	"sync"

	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"
)

// SysfsPCIeRoots finds a GPU's PCIe root complex ("pci0000:00") in sysfs, for the
// standard resource.kubernetes.io/pcieRoot attribute that lets claims align GPUs
// with NICs under the same root. It implements model.PCIeRoots.
//
// Only real nodes have it: mock GPUs' bus ids exist in no sysfs (mock nodes know
// their roots from the profile, see MockNode.PCIeRoot). A GPU whose root sysfs
// does not give is published without the attribute; nothing fails.
//
// The zero value is usable and silent; NewSysfsPCIeRoots makes one that logs
// each bus id it cannot resolve, once.
type SysfsPCIeRoots struct {
	// Sysfs is where sysfs is mounted; empty means the host's /sys.
	Sysfs string
	// Logger gets the bus ids whose root is unknown, with the reason.
	Logger klog.Logger
	// logged are the bus ids already logged (nil: log every time).
	logged *sync.Map
}

// NewSysfsPCIeRoots returns a SysfsPCIeRoots over the host's /sys that logs to
// logger, once per bus id, each GPU it publishes without a pcieRoot.
func NewSysfsPCIeRoots(logger klog.Logger) SysfsPCIeRoots {
	return SysfsPCIeRoots{Logger: logger, logged: &sync.Map{}}
}

// PCIeRoot returns the root complex of the PCI device with this bus id, and
// false when sysfs does not say (no such device, not a PCI path). It is
// upstream's deviceattribute.GetPCIeRootAttributeByPCIBusID: the first
// component of the device's path under /sys/devices.
func (s SysfsPCIeRoots) PCIeRoot(pciBusID string) (string, bool) {
	var mods []deviceattribute.MachineModifier
	if s.Sysfs != "" {
		mods = append(mods, deviceattribute.WithFSFromRoot(s.Sysfs))
	}
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(pciBusID, mods...)
	if err == nil && attr.Value.StringValue == nil {
		err = errNoStringValue
	}
	if err != nil {
		if s.logged == nil {
			s.Logger.Info(unknownRoot, "pciBusID", pciBusID, "err", err)
		} else if _, seen := s.logged.LoadOrStore(pciBusID, true); !seen {
			s.Logger.Info(unknownRoot, "pciBusID", pciBusID, "err", err)
		}
		return "", false
	}
	return *attr.Value.StringValue, true
}

const unknownRoot = "PCIe root of GPU unknown, publishing it without resource.kubernetes.io/pcieRoot"

var errNoStringValue = errors.New("the pcieRoot attribute has no string value")
