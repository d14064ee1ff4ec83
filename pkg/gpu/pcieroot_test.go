package gpu

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSysfsPCIeRoots(t *testing.T) {
	sysfs := t.TempDir()
	devices := filepath.Join(sysfs, "bus", "pci", "devices")
	if err := os.MkdirAll(devices, 0o755); err != nil {
		t.Fatal(err)
	}
	// /sys/bus/pci/devices/<id> links into /sys/devices/<root>/<bridges…>/<id>.
	link := filepath.Join("..", "..", "..", "devices", "pci0000:16", "0000:16:02.0", "0000:18:00.0")
	if err := os.Symlink(link, filepath.Join(devices, "0000:18:00.0")); err != nil {
		t.Fatal(err)
	}
	roots := SysfsPCIeRoots{Sysfs: sysfs}
	if root, ok := roots.PCIeRoot("0000:18:00.0"); !ok || root != "pci0000:16" {
		t.Errorf("PCIeRoot(0000:18:00.0) = %q, %v; want pci0000:16, true", root, ok)
	}
	for _, id := range []string{"0000:99:00.0", "not-a-bus-id", ""} {
		if root, ok := roots.PCIeRoot(id); ok {
			t.Errorf("PCIeRoot(%q) = %q, true; want unknown", id, root)
		}
	}
}
