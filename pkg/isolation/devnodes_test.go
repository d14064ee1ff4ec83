package isolation

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// TestHostDevNodesLayouts: where each node is found on the hosts a real
// node has (the driver on the host, a containerized driver whose root has
// all, some or none of the nodes, nvidia-uvm not loaded yet), and the host
// path the runtime gets for it. Symlinks to /dev/null stand in for the
// NVIDIA nodes: a character device the test can point at without a GPU or
// CAP_MKNOD.
func TestHostDevNodesLayouts(t *testing.T) {
	var null unix.Stat_t
	if err := unix.Stat("/dev/null", &null); err != nil || null.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Skipf("no character device /dev/null here (%v)", err)
	}
	all := []string{"nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
	type layout struct {
		driverDev []string // nodes under <driver root>/dev (nil: no dev directory)
		hostDev   []string // nodes on the host's /dev
		// regular are names that exist under <driver root>/dev as regular
		// files, not devices.
		regular []string
		// hostDriverRoot is HostDriverRoot; "" means /run/nvidia/driver.
		hostDriverRoot string
	}
	for name, tc := range map[string]struct {
		layout layout
		want   []string // host paths, in order
		err    []string // substrings of the error
	}{
		"containerized driver with every node in its root": {
			layout: layout{driverDev: all, hostDev: all},
			want:   []string{"/run/nvidia/driver/dev/nvidia1", "/run/nvidia/driver/dev/nvidiactl", "/run/nvidia/driver/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm-tools"},
		},
		"uvm nodes only on the host's /dev (GPU Operator)": {
			layout: layout{driverDev: []string{"nvidia1", "nvidiactl"}, hostDev: all},
			want:   []string{"/run/nvidia/driver/dev/nvidia1", "/run/nvidia/driver/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"},
		},
		"driver root without a dev directory": {
			layout: layout{hostDev: all},
			want:   []string{"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"},
		},
		"nvidia-uvm-tools nowhere: optional": {
			layout: layout{driverDev: []string{"nvidia1", "nvidiactl"}, hostDev: []string{"nvidia1", "nvidiactl", "nvidia-uvm"}},
			want:   []string{"/run/nvidia/driver/dev/nvidia1", "/run/nvidia/driver/dev/nvidiactl", "/dev/nvidia-uvm"},
		},
		"driver on the host, uvm-tools missing": {
			layout: layout{driverDev: []string{"nvidia1", "nvidiactl", "nvidia-uvm"}, hostDriverRoot: "/"},
			want:   []string{"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"},
		},
		"nvidia-uvm nowhere (module not loaded)": {
			layout: layout{driverDev: []string{"nvidia1", "nvidiactl"}, hostDev: []string{"nvidia1", "nvidiactl"}},
			err:    []string{"device node nvidia-uvm: not found", "DRIVER/dev/nvidia-uvm and HOSTDEV/nvidia-uvm", "nvidia-modprobe -u"},
		},
		"driver on the host, nvidia-uvm missing: one place looked at": {
			layout: layout{driverDev: []string{"nvidia1", "nvidiactl"}, hostDriverRoot: "/"},
			err:    []string{"device node nvidia-uvm: not found (looked at DRIVER/dev/nvidia-uvm)"},
		},
		"the GPU's node nowhere": {
			layout: layout{driverDev: []string{"nvidiactl", "nvidia-uvm"}},
			err:    []string{"device node nvidia1: not found", "DRIVER/dev/nvidia1 and HOSTDEV/nvidia1"},
		},
		"a regular file in the driver root is not skipped over": {
			layout: layout{driverDev: []string{"nvidia1", "nvidiactl"}, regular: []string{"nvidia-uvm"}, hostDev: all},
			err:    []string{"DRIVER/dev/nvidia-uvm: not a character device"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			driver, hostDev := t.TempDir(), t.TempDir()
			if tc.layout.driverDev != nil || tc.layout.regular != nil {
				if err := os.Mkdir(filepath.Join(driver, "dev"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, n := range tc.layout.driverDev {
				if err := os.Symlink("/dev/null", filepath.Join(driver, "dev", n)); err != nil {
					t.Fatal(err)
				}
			}
			for _, n := range tc.layout.regular {
				mustWrite(t, filepath.Join(driver, "dev", n), "", 0o644)
			}
			for _, n := range tc.layout.hostDev {
				if err := os.Symlink("/dev/null", filepath.Join(hostDev, n)); err != nil {
					t.Fatal(err)
				}
			}
			hostRoot := tc.layout.hostDriverRoot
			if hostRoot == "" {
				hostRoot = "/run/nvidia/driver"
			}
			nodes, err := HostDevNodes{DriverRoot: driver, HostDriverRoot: hostRoot, HostDev: hostDev}.Nodes(1)
			if tc.err != nil {
				if err == nil {
					t.Fatalf("Nodes = %d nodes, want an error", len(nodes))
				}
				msg := strings.NewReplacer(driver, "DRIVER", hostDev, "HOSTDEV").Replace(err.Error())
				for _, want := range tc.err {
					if !strings.Contains(msg, want) {
						t.Errorf("error %q does not say %q", msg, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range nodes {
				got = append(got, n.HostPath)
				if n.Type != "c" || n.Major != int64(unix.Major(uint64(null.Rdev))) || n.Minor != int64(unix.Minor(uint64(null.Rdev))) {
					t.Errorf("node %s: %s %d:%d, want the numbers of the device read", n.Path, n.Type, n.Major, n.Minor)
				}
				if n.Path != "/dev/"+filepath.Base(n.HostPath) {
					t.Errorf("node %s has host path %s: the container path must be /dev/<name>", n.Path, n.HostPath)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("host paths (-want +got):\n%s", diff)
			}
		})
	}
}
