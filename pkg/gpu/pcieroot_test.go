package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
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

// TestSysfsPCIeRootsLogsOnce: a bus id whose root is unknown is logged once
// by a NewSysfsPCIeRoots, however often the model asks.
func TestSysfsPCIeRootsLogsOnce(t *testing.T) {
	var lines []string
	logger := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	roots := NewSysfsPCIeRoots(logger)
	roots.Sysfs = t.TempDir()
	for range 3 {
		if root, ok := roots.PCIeRoot("0000:1b:00.0"); ok {
			t.Fatalf("PCIeRoot = %q, true in an empty sysfs", root)
		}
	}
	roots.PCIeRoot("0000:43:00.0")
	if len(lines) != 2 || !strings.Contains(lines[0], "0000:1b:00.0") || !strings.Contains(lines[1], "0000:43:00.0") {
		t.Errorf("logged %q, want one line for each of 0000:1b:00.0 and 0000:43:00.0", lines)
	}
}

// TestMockPCIeRoots: every GPU of every profile has a root, given by the
// profile; the SXM boards put two GPUs under each root, the PCIe nodes one
// card per root; a root's bus number is at most that of its GPUs and above
// those of the GPUs of the roots before it.
func TestMockPCIeRoots(t *testing.T) {
	want := map[string][]string{
		"dgx-a100":             {"pci0000:00", "pci0000:00", "pci0000:40", "pci0000:40", "pci0000:80", "pci0000:80", "pci0000:a0", "pci0000:a0"},
		"hgx-h100":             {"pci0000:15", "pci0000:15", "pci0000:4e", "pci0000:4e", "pci0000:97", "pci0000:97", "pci0000:cb", "pci0000:cb"},
		"hgx-h100-mig":         {"pci0000:15", "pci0000:15", "pci0000:4e", "pci0000:4e", "pci0000:97", "pci0000:97", "pci0000:cb", "pci0000:cb"},
		"hgx-h100-dynamic-mig": {"pci0000:15", "pci0000:15", "pci0000:4e", "pci0000:4e", "pci0000:97", "pci0000:97", "pci0000:cb", "pci0000:cb"},
		"l4x4":                 {"pci0000:16", "pci0000:30", "pci0000:b0", "pci0000:c9"},
		"a100-pairs":           {"pci0000:16", "pci0000:30", "pci0000:b0", "pci0000:c9"},
	}
	for _, profile := range Profiles() {
		t.Run(profile, func(t *testing.T) {
			node, err := NewMockNode(profile)
			if err != nil {
				t.Fatal(err)
			}
			gpus := discoverProfile(t, profile)
			var got []string
			prevRoot, prevBus := -1, -1
			for _, g := range gpus {
				got = append(got, g.PCIeRoot)
				var rootBus, bus int
				if _, err := fmt.Sscanf(g.PCIeRoot, "pci0000:%x", &rootBus); err != nil {
					t.Errorf("GPU %d: root %q is not pci0000:BB", g.Minor, g.PCIeRoot)
				}
				if _, err := fmt.Sscanf(g.PCIBusID, "0000:%x:", &bus); err != nil {
					t.Fatal(err)
				}
				if rootBus > bus || (rootBus != prevRoot && rootBus <= prevBus) {
					t.Errorf("GPU %d on bus %02x under root bus %02x: not below its GPU, or not above the previous root's GPUs (bus %02x)", g.Minor, bus, rootBus, prevBus)
				}
				prevRoot, prevBus = rootBus, bus
				// The node answers in NVML's spelling too.
				if root, ok := node.PCIeRoot(strings.ToUpper("0000" + g.PCIBusID)); !ok || root != g.PCIeRoot {
					t.Errorf("GPU %d: PCIeRoot(NVML spelling) = %q, %v; want %q", g.Minor, root, ok, g.PCIeRoot)
				}
			}
			if !slices.Equal(got, want[profile]) {
				t.Errorf("roots %v, want %v", got, want[profile])
			}
			if root, ok := node.PCIeRoot("0000:02:00.0"); ok {
				t.Errorf("PCIeRoot of a bus id of no GPU = %q, true", root)
			}
		})
	}
}
