package isolation

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func testMIG() MIGDevice {
	return MIGDevice{UUID: "MIG-1111", ParentUUID: "GPU-1", Minor: 3, GPUInstance: 1, ComputeInstance: 0, Profile: "4g.40gb",
		GPUInstanceMinor: 408, ComputeInstanceMinor: 409}
}

// The environment of a MIG device names the device (after its GPU, GPU
// instance and compute instance), never the GPU.
func TestMIGDeviceEdits(t *testing.T) {
	edits, err := MIGDeviceEdits(testMIG(), false)
	if err != nil {
		t.Fatal(err)
	}
	want := cdispec.ContainerEdits{Env: []string{
		"NVIDIA_VISIBLE_DEVICES=void",
		"CUDA_DEVICE_ORDER=PCI_BUS_ID",
		"TESSERA_MIG_3_1_0=MIG-1111",
		"TESSERA_MIG_3_1_0_PROFILE=4g.40gb",
		"TESSERA_MIG_3_1_0_CAPS=/dev/nvidia-caps/nvidia-cap408,/dev/nvidia-caps/nvidia-cap409",
	}}
	if diff := cmp.Diff(want, edits); diff != "" {
		t.Errorf("edits (-want +got):\n%s", diff)
	}
	legacy, err := MIGDeviceEdits(testMIG(), true)
	if err != nil || len(legacy.Mounts) != 1 || legacy.Mounts[0].HostPath != "/dev/null" || legacy.Mounts[0].ContainerPath != "/var/run/nvidia-container-devices/MIG-1111" {
		t.Errorf("legacy edits %+v, %v", legacy, err)
	}
	// Two MIG devices of one GPU share no variable.
	other := testMIG()
	other.UUID, other.GPUInstance, other.GPUInstanceMinor, other.ComputeInstanceMinor = "MIG-2222", 2, 417, 418
	o, _ := MIGDeviceEdits(other, false)
	for _, kv := range o.Env {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "TESSERA_") && slices.ContainsFunc(edits.Env, func(e string) bool { return strings.HasPrefix(e, name+"=") }) {
			t.Errorf("both devices set %s", name)
		}
	}
	for name, m := range map[string]MIGDevice{
		"GPU UUID":      {UUID: "GPU-1", GPUInstanceMinor: 1, ComputeInstanceMinor: 2},
		"minors absent": {UUID: "MIG-1"},
	} {
		if _, err := MIGDeviceEdits(m, false); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if got := MIGVisibleDevices([]string{"MIG-a", "MIG-b"}); got != "CUDA_VISIBLE_DEVICES=MIG-a,MIG-b" {
		t.Errorf("MIGVisibleDevices = %q", got)
	}
}

func TestMIGCapabilities(t *testing.T) {
	want := []MIGCapability{{Minor: 408, Proc: "gpu3/mig/gi1/access"}, {Minor: 409, Proc: "gpu3/mig/gi1/ci0/access"}}
	if got := MIGCapabilities(testMIG()); !slices.Equal(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// A GPU instance an admin split into two compute instances is one device:
// the container gets both, each with its variables and capability node, and
// the GPU instance's node once.
func TestMIGSplitGPUInstance(t *testing.T) {
	m := testMIG()
	m.Others = []MIGComputeInstance{{ID: 1, UUID: "MIG-1112", Minor: 410}}
	edits, err := MIGDeviceEdits(m, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"NVIDIA_VISIBLE_DEVICES=void",
		"CUDA_DEVICE_ORDER=PCI_BUS_ID",
		"TESSERA_MIG_3_1_0=MIG-1111",
		"TESSERA_MIG_3_1_0_PROFILE=4g.40gb",
		"TESSERA_MIG_3_1_0_CAPS=/dev/nvidia-caps/nvidia-cap408,/dev/nvidia-caps/nvidia-cap409",
		"TESSERA_MIG_3_1_1=MIG-1112",
		"TESSERA_MIG_3_1_1_PROFILE=4g.40gb",
		"TESSERA_MIG_3_1_1_CAPS=/dev/nvidia-caps/nvidia-cap408,/dev/nvidia-caps/nvidia-cap410",
	}
	if diff := cmp.Diff(want, edits.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	if len(edits.Mounts) != 2 || edits.Mounts[1].ContainerPath != "/var/run/nvidia-container-devices/MIG-1112" {
		t.Errorf("legacy mounts %+v, want one per MIG UUID", edits.Mounts)
	}
	caps := []MIGCapability{{Minor: 408, Proc: "gpu3/mig/gi1/access"}, {Minor: 409, Proc: "gpu3/mig/gi1/ci0/access"}, {Minor: 410, Proc: "gpu3/mig/gi1/ci1/access"}}
	if got := MIGCapabilities(m); !slices.Equal(got, caps) {
		t.Errorf("capabilities %+v, want %+v", got, caps)
	}
	if got := m.UUIDs(); !slices.Equal(got, []string{"MIG-1111", "MIG-1112"}) {
		t.Errorf("UUIDs %v", got)
	}
	m.Others[0].Minor = 0
	if _, err := MIGDeviceEdits(m, false); err == nil || !strings.Contains(err.Error(), "MIG-1112") {
		t.Errorf("second compute instance without a capability minor: %v", err)
	}
}

// capHost is a host for CapabilityNodes: /proc files and a /dev. The
// capability nodes are symlinks to /dev/null (a character device, minor 3
// on Linux) that the faked mknod makes: the test needs neither CAP_MKNOD nor
// a GPU, and never changes the host's /dev.
type capHost struct {
	proc, dev, root string
	mknods          []string
	chmods          []string
	chowns          []string
}

func newCapHost(t *testing.T, capFile string) *capHost {
	t.Helper()
	var null unix.Stat_t
	if err := unix.Stat("/dev/null", &null); err != nil || null.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Minor(uint64(null.Rdev)) != 3 { //nolint:unconvert
		t.Skipf("no character device /dev/null with minor 3 here (%v)", err)
	}
	h := &capHost{proc: t.TempDir(), dev: t.TempDir(), root: t.TempDir()}
	if err := os.Symlink(h.dev, filepath.Join(h.root, "dev")); err != nil {
		t.Fatal(err)
	}
	write := func(path, content string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(h.proc, "devices"), "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n  8 sd\n")
	if capFile != "" {
		write(filepath.Join(h.proc, "driver/nvidia/capabilities/gpu0/mig/gi0/access"), capFile)
	}
	return h
}

// nodes reads as the chart's plugin does with driverRoot "/": the host's
// /dev under the driver root (read) and at /dev (where nodes are made).
func (h *capHost) nodes() HostDevNodes {
	return HostDevNodes{
		DriverRoot: h.root, HostDriverRoot: "/", HostDev: h.dev, ProcRoot: h.proc,
		mknod: func(path string, mode uint32, dev int) error {
			h.mknods = append(h.mknods, formatMknod(path, mode, dev))
			return os.Symlink("/dev/null", path)
		},
		chmod: func(path string, mode os.FileMode) error {
			h.chmods = append(h.chmods, filepath.Base(path)+" "+mode.String())
			return nil
		},
		chown: func(path string, uid, gid int) error {
			h.chowns = append(h.chowns, filepath.Base(path)+" "+itoa(int64(uid))+":"+itoa(int64(gid)))
			return nil
		},
	}
}

func formatMknod(path string, mode uint32, dev int) string {
	return filepath.Base(path) + " " + itoa(int64(mode&unix.S_IFMT)) + " " + itoa(int64(mode&0o7777)) + " " +
		itoa(int64(unix.Major(uint64(dev)))) + ":" + itoa(int64(unix.Minor(uint64(dev))))
}

// A capability node the host lacks is made as nvidia-modprobe -f makes it:
// the major of nvidia-caps, the driver file's mode and owner; a node that
// exists is taken as it is.
func TestCapabilityNodesMade(t *testing.T) {
	h := newCapHost(t, "DeviceFileMinor: 3\nDeviceFileMode: 292\nDeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileModify: 1\n")
	got, err := h.nodes().CapabilityNodes([]MIGCapability{{Minor: 3, Proc: "gpu0/mig/gi0/access"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Path != "/dev/nvidia-caps/nvidia-cap3" || got[0].HostPath != "/dev/nvidia-caps/nvidia-cap3" || got[0].Minor != 3 || got[0].Type != "c" {
		t.Errorf("nodes %+v", got)
	}
	wantMknod := []string{"nvidia-cap3 " + itoa(unix.S_IFCHR) + " 292 508:3"}
	if !slices.Equal(h.mknods, wantMknod) || !slices.Equal(h.chmods, []string{"nvidia-cap3 -r--r--r--"}) ||
		!slices.Equal(h.chowns, []string{"nvidia-caps 0:0", "nvidia-cap3 0:0"}) {
		t.Errorf("mknod %q chmod %q chown %q", h.mknods, h.chmods, h.chowns)
	}
	// Found the second time: nothing made.
	h.mknods = nil
	if _, err := h.nodes().CapabilityNodes([]MIGCapability{{Minor: 3, Proc: "gpu0/mig/gi0/access"}}); err != nil || len(h.mknods) != 0 {
		t.Errorf("second call: %v, mknod %q", err, h.mknods)
	}
}

// What keeps a node from being made is an error that says what to do.
func TestCapabilityNodesRefused(t *testing.T) {
	for name, tc := range map[string]struct {
		capFile string
		minor   int
		want    string
	}{
		"driver wants no nodes made":     {capFile: "DeviceFileMinor: 3\nDeviceFileModify: 0\n", minor: 3, want: "nvidia-modprobe -f /proc/driver/nvidia/capabilities/gpu0/mig/gi0/access"},
		"driver and mig-minors disagree": {capFile: "DeviceFileMinor: 4\n", minor: 3, want: "disagree"},
		"no capability file":             {minor: 3, want: "no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			h := newCapHost(t, tc.capFile)
			_, err := h.nodes().CapabilityNodes([]MIGCapability{{Minor: tc.minor, Proc: "gpu0/mig/gi0/access"}})
			if err == nil || !strings.Contains(err.Error(), tc.want) || len(h.mknods) != 0 {
				t.Errorf("err %v (want %q), mknod %q", err, tc.want, h.mknods)
			}
		})
	}
}

func TestCharMajor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "devices")
	if err := os.WriteFile(path, []byte("Character devices:\n195 nvidia\n\nBlock devices:\n508 nvidia-caps\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := charMajor(path, "nvidia-caps"); err == nil {
		t.Error("a block device's major taken for a character device's")
	}
	if m, err := charMajor(path, "nvidia"); err != nil || m != 195 {
		t.Errorf("nvidia: %d, %v", m, err)
	}
}
