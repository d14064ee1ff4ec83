package isolation

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// nvidiaMajor is the character device major of /dev/nvidia<N> and
// /dev/nvidiactl, fixed by the NVIDIA kernel driver.
const nvidiaMajor = 195

// DevNodes describes the host's NVIDIA device nodes so that a container gets
// them without the NVIDIA container toolkit. The real one is [HostDevNodes];
// [StaticDevNodes] is a fake for tests.
type DevNodes interface {
	// Nodes returns the device nodes a container needs for the GPU with this
	// minor: /dev/nvidia<minor>, /dev/nvidiactl, /dev/nvidia-uvm and, when
	// the host has it, /dev/nvidia-uvm-tools, fully specified (type, major,
	// minor) so that the runtime does not have to look them up.
	Nodes(minor int) ([]*cdispec.DeviceNode, error)
	// CapabilityNodes returns the capability nodes
	// /dev/nvidia-caps/nvidia-cap<minor> of a MIG device, fully specified.
	// A real node creates a node the host lacks (a GPU instance created
	// after the driver made its nodes has none yet).
	CapabilityNodes(caps []MIGCapability) ([]*cdispec.DeviceNode, error)
}

// HostDevNodes reads the nodes under DriverRoot/dev (DriverRoot "/" for a
// driver installed on the host, e.g. /run/nvidia/driver for a containerized
// one) and, for a node that is not there, under the host's /dev.
//
// The fallback follows NVIDIA's own components: the toolkit's --dev-root
// defaults to the driver root, and NVIDIA's device plugin and DRA driver use
// the driver root as the device root only when it has a dev directory, "/"
// otherwise. A containerized driver (the GPU Operator's) may leave some or
// all nodes on the host's /dev, and nvidia-uvm and nvidia-uvm-tools appear
// only once the nvidia-uvm module is loaded (nvidia-modprobe -u, or the
// first CUDA program on the node). Both places hold the same kernel
// driver's nodes, so the numbers read are the same either way; looking per
// node covers a driver root whose dev directory has only some of them.
//
// nvidia-uvm-tools serves only profilers and debuggers (CUPTI, cuda-gdb):
// the toolkit's CDI generation skips control nodes it does not find, and
// Nodes skips this one. Every other node
// is required: without /dev/nvidia-uvm CUDA finds no device.
type HostDevNodes struct {
	// DriverRoot is the driver's root as the plugin sees it (the chart
	// mounts the host's driver root at /driver-root); the nodes are read
	// there first.
	DriverRoot string
	// HostDriverRoot is the same directory on the host, where the container
	// runtime looks: the nodes' hostPath is under it, never under the
	// plugin's mount. Empty: DriverRoot (the plugin runs on the host).
	HostDriverRoot string
	// HostDev is the host's /dev as the plugin sees it (the chart mounts
	// it at /dev), where a node missing under the driver root is looked
	// for; its hostPath is /dev/<name>. Empty: /dev.
	HostDev string
	// ProcRoot is where /proc is read ("" means /proc): the major of
	// nvidia-caps in <ProcRoot>/devices and the driver's capability files
	// under <ProcRoot>/driver/nvidia/capabilities. Both are the kernel's
	// whatever the PID namespace.
	ProcRoot string

	// mknod, chmod, chown: the system calls that create a missing
	// capability node (tests replace them).
	mknod func(path string, mode uint32, dev int) error
	chmod func(path string, mode os.FileMode) error
	chown func(path string, uid, gid int) error
}

// place is one directory a node may be in: where the plugin reads it and
// where the runtime finds it.
type place struct{ read, host string }

// Nodes implements [DevNodes]. A required node that is in neither place is
// an error naming the node and every path looked at: a container without it
// would fail in a confusing way later.
func (h HostDevNodes) Nodes(minor int) ([]*cdispec.DeviceNode, error) {
	places := h.places()
	var out []*cdispec.DeviceNode
	for _, name := range nodeNames(minor) {
		node, looked, err := findNode(name, places)
		if err != nil {
			return nil, err
		}
		if node == nil {
			if name == uvmToolsNode {
				continue
			}
			return nil, fmt.Errorf("device node %s: not found (looked at %s)%s", name, strings.Join(looked, " and "), missingNodeHint(name))
		}
		out = append(out, node)
	}
	return out, nil
}

// places are where nodes are looked for: under the driver root, then the
// host's /dev.
func (h HostDevNodes) places() []place {
	hostRoot := h.HostDriverRoot
	if hostRoot == "" {
		hostRoot = h.DriverRoot
	}
	places := []place{{read: filepath.Join(h.DriverRoot, "dev"), host: filepath.Join(hostRoot, "dev")}}
	// With the driver on the host (DriverRoot "/") both are the host's
	// /dev: look once.
	if fallback := (place{read: filepath.Clean(h.hostDev()), host: "/dev"}); fallback.host != places[0].host {
		places = append(places, fallback)
	}
	return places
}

func (h HostDevNodes) hostDev() string {
	if h.HostDev == "" {
		return "/dev"
	}
	return h.HostDev
}

// findNode returns the first character device called name in places, or nil
// and the paths looked at. A path that exists but is not a character device,
// or cannot be read, is an error: it is not a node a container can use, and
// looking further would hide a broken host.
func findNode(name string, places []place) (*cdispec.DeviceNode, []string, error) {
	var looked []string
	for _, p := range places {
		path := filepath.Join(p.read, name)
		looked = append(looked, path)
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, looked, fmt.Errorf("device node %s: %w", path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return nil, looked, fmt.Errorf("device node %s: not a character device", path)
		}
		rdev := uint64(st.Rdev) //nolint:unconvert // uint32 on some platforms
		return &cdispec.DeviceNode{
			Path:     "/dev/" + name,
			HostPath: filepath.Join(p.host, name),
			Type:     "c",
			Major:    int64(unix.Major(rdev)),
			Minor:    int64(unix.Minor(rdev)),
		}, looked, nil
	}
	return nil, looked, nil
}

func missingNodeHint(name string) string {
	switch name {
	case uvmNode:
		return "; the nvidia-uvm module is not loaded yet: run nvidia-modprobe -u -c=0 on the node (or nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules), or any CUDA program once"
	case "nvidiactl":
		return "; is the NVIDIA driver loaded (nvidia-smi), and does --driver-root name its root?"
	}
	return "; is the GPU still on the bus (nvidia-smi), and does --driver-root name the driver's root?"
}

// StaticDevNodes is a fake [DevNodes] with the fixed numbers of a typical
// node: /dev/nvidia<N> is 195:N, /dev/nvidiactl 195:255, nvidia-uvm UVMMajor:0
// and nvidia-uvm-tools UVMMajor:1, /dev/nvidia-caps/nvidia-cap<N>
// CapsMajor:N (508 when zero).
type StaticDevNodes struct {
	UVMMajor  int64
	CapsMajor int64
}

// CapabilityNodes implements [DevNodes].
func (s StaticDevNodes) CapabilityNodes(caps []MIGCapability) ([]*cdispec.DeviceNode, error) {
	major := s.CapsMajor
	if major == 0 {
		major = 508
	}
	var out []*cdispec.DeviceNode
	for _, c := range caps {
		out = append(out, &cdispec.DeviceNode{Path: MIGCapabilityPath(c.Minor), Type: "c", Major: major, Minor: int64(c.Minor)})
	}
	return out, nil
}

// Nodes implements [DevNodes].
func (s StaticDevNodes) Nodes(minor int) ([]*cdispec.DeviceNode, error) {
	numbers := [][2]int64{{nvidiaMajor, int64(minor)}, {nvidiaMajor, 255}, {s.UVMMajor, 0}, {s.UVMMajor, 1}}
	var out []*cdispec.DeviceNode
	for i, name := range nodeNames(minor) {
		out = append(out, &cdispec.DeviceNode{
			Path:  "/dev/" + name,
			Type:  "c",
			Major: numbers[i][0],
			Minor: numbers[i][1],
		})
	}
	return out, nil
}

const (
	uvmNode      = "nvidia-uvm"
	uvmToolsNode = "nvidia-uvm-tools"
)

func nodeNames(minor int) []string {
	return []string{"nvidia" + strconv.Itoa(minor), "nvidiactl", uvmNode, uvmToolsNode}
}
