package isolation

import (
	"fmt"
	"path/filepath"
	"strconv"

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
	// minor: /dev/nvidia<minor>, /dev/nvidiactl, /dev/nvidia-uvm and
	// /dev/nvidia-uvm-tools, fully specified (type, major, minor) so that
	// the runtime does not have to look them up.
	Nodes(minor int) ([]*cdispec.DeviceNode, error)
}

// HostDevNodes reads the nodes under DriverRoot/dev (DriverRoot "/" for a
// driver installed on the host, e.g. /run/nvidia/driver for a containerized
// one).
type HostDevNodes struct {
	// DriverRoot is the driver's root as the plugin sees it (the chart
	// mounts the host's driver root at /driver-root); the nodes are read
	// there.
	DriverRoot string
	// HostDriverRoot is the same directory on the host, where the container
	// runtime looks: the nodes' hostPath is under it, never under the
	// plugin's mount. Empty: DriverRoot (the plugin runs on the host).
	HostDriverRoot string
}

// Nodes implements [DevNodes]. A missing node is an error naming it: a
// container without its GPU node would fail in a confusing way later.
func (h HostDevNodes) Nodes(minor int) ([]*cdispec.DeviceNode, error) {
	hostRoot := h.HostDriverRoot
	if hostRoot == "" {
		hostRoot = h.DriverRoot
	}
	var out []*cdispec.DeviceNode
	for _, name := range nodeNames(minor) {
		host := filepath.Join(h.DriverRoot, "dev", name)
		var st unix.Stat_t
		if err := unix.Stat(host, &st); err != nil {
			return nil, fmt.Errorf("device node %s: %w", host, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return nil, fmt.Errorf("device node %s: not a character device", host)
		}
		rdev := uint64(st.Rdev) //nolint:unconvert // uint32 on some platforms
		out = append(out, &cdispec.DeviceNode{
			Path:     "/dev/" + name,
			HostPath: filepath.Join(hostRoot, "dev", name),
			Type:     "c",
			Major:    int64(unix.Major(rdev)),
			Minor:    int64(unix.Minor(rdev)),
		})
	}
	return out, nil
}

// StaticDevNodes is a fake [DevNodes] with the fixed numbers of a typical
// node: /dev/nvidia<N> is 195:N, /dev/nvidiactl 195:255, nvidia-uvm UVMMajor:0
// and nvidia-uvm-tools UVMMajor:1.
type StaticDevNodes struct {
	UVMMajor int64
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

func nodeNames(minor int) []string {
	return []string{"nvidia" + strconv.Itoa(minor), "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
}
