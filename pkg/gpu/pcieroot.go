package gpu

import (
	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// SysfsPCIeRoots finds a GPU's PCIe root complex ("pci0000:00") in sysfs, for the
// standard resource.kubernetes.io/pcieRoot attribute that lets claims align GPUs
// with NICs under the same root. It implements model.PCIeRoots.
//
// Only real nodes have it: mock GPUs' bus ids exist in no sysfs, and the lookup
// reports "unknown" for them, so the attribute is simply not published.
type SysfsPCIeRoots struct {
	// Sysfs is where sysfs is mounted; empty means the host's /sys.
	Sysfs string
}

// PCIeRoot returns the root complex of the PCI device with this bus id, and
// false when sysfs does not say (no such device, not a PCI path).
func (s SysfsPCIeRoots) PCIeRoot(pciBusID string) (string, bool) {
	var mods []deviceattribute.MachineModifier
	if s.Sysfs != "" {
		mods = append(mods, deviceattribute.WithFSFromRoot(s.Sysfs))
	}
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(pciBusID, mods...)
	if err != nil || attr.Value.StringValue == nil {
		return "", false
	}
	return *attr.Value.StringValue, true
}
