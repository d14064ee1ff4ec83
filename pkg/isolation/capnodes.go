package isolation

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Capability nodes of MIG devices.
//
// The driver names every capability it can create in
// /proc/driver/nvidia-caps/mig-minors, but makes no device node for a GPU or
// compute instance: nvidia-modprobe -f <capability file> does, and NVIDIA's
// tools run it as they need a node. A GPU instance the plugin has just
// created therefore usually has no node on the host yet. CapabilityNodes
// makes it as nvidia-modprobe does (nvidia-modprobe-utils.c,
// nvidia_cap_mknod and mknod_helper, NVIDIA/nvidia-modprobe 610.43.03):
//
//   - the minor, mode, owner and whether nodes may be made come from the
//     driver's file /proc/driver/nvidia/capabilities/<capability>
//     ("DeviceFileMinor: 30", "DeviceFileMode: 292", "DeviceFileUID: 0",
//     "DeviceFileGID: 0", "DeviceFileModify: 1"); a mode the file does not
//     give is 0666, uid and gid 0;
//   - the major is that of "nvidia-caps" in /proc/devices (the driver
//     registers it dynamically);
//   - /dev/nvidia-caps is made 0755 root:root if missing, the node
//     /dev/nvidia-caps/nvidia-cap<minor> with mknod(S_IFCHR|mode), then
//     chmod and chown (mknod's mode is cut by the umask);
//   - with DeviceFileModify 0 the driver's owner does not want nodes made:
//     nothing is made, and the error says so.

// capabilitiesDir is the driver's capability files under /proc.
const capabilitiesDir = "driver/nvidia/capabilities"

// defaultCapMode is nvidia-modprobe's NV_DEVICE_FILE_MODE: rw for all.
const defaultCapMode = 0o666

// CapabilityNodes implements [DevNodes]: each node is looked for under the
// driver root, then on the host's /dev, and made on the host's /dev (see
// above) when it is in neither.
func (h HostDevNodes) CapabilityNodes(caps []MIGCapability) ([]*cdispec.DeviceNode, error) {
	places := h.places()
	var out []*cdispec.DeviceNode
	for _, c := range caps {
		name := capsDir + "/nvidia-cap" + strconv.Itoa(c.Minor)
		node, _, err := findNode(name, places)
		if err != nil {
			return nil, err
		}
		if node == nil {
			if node, err = h.makeCapabilityNode(c); err != nil {
				return nil, err
			}
		}
		if node.Minor != int64(c.Minor) {
			return nil, fmt.Errorf("capability node %s has minor %d, mig-minors says %d", node.HostPath, node.Minor, c.Minor)
		}
		out = append(out, node)
	}
	return out, nil
}

// capFile is what the driver's capability file says about its node.
type capFile struct {
	minor    int
	mode     uint32
	uid, gid int
	modify   bool
}

func (h HostDevNodes) procRoot() string {
	if h.ProcRoot == "" {
		return "/proc"
	}
	return h.ProcRoot
}

// makeCapabilityNode makes the missing node of c on the host's /dev.
func (h HostDevNodes) makeCapabilityNode(c MIGCapability) (*cdispec.DeviceNode, error) {
	if c.Proc == "" || strings.Contains(c.Proc, "..") {
		return nil, fmt.Errorf("capability node nvidia-cap%d: no driver capability file to make it from", c.Minor)
	}
	procFile := filepath.Join(h.procRoot(), capabilitiesDir, c.Proc)
	f, err := readCapFile(procFile)
	if err != nil {
		return nil, fmt.Errorf("capability node nvidia-cap%d: %w", c.Minor, err)
	}
	switch {
	case f.minor != c.Minor:
		return nil, fmt.Errorf("capability node nvidia-cap%d: %s says DeviceFileMinor %d: the driver and mig-minors disagree", c.Minor, procFile, f.minor)
	case !f.modify:
		return nil, fmt.Errorf("capability node nvidia-cap%d is missing and %s says DeviceFileModify: 0 (the driver's owner makes the nodes): run nvidia-modprobe -f %s on the node",
			c.Minor, procFile, filepath.Join("/proc", capabilitiesDir, c.Proc))
	}
	major, err := charMajor(filepath.Join(h.procRoot(), "devices"), capsDir)
	if err != nil {
		return nil, fmt.Errorf("capability node nvidia-cap%d: %w", c.Minor, err)
	}
	dir := filepath.Join(h.hostDev(), capsDir)
	if err := os.Mkdir(dir, 0o755); err == nil {
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, err
		}
		if err := h.doChown(dir, 0, 0); err != nil {
			return nil, fmt.Errorf("capability node directory %s: %w", dir, err)
		}
	} else if !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("capability node directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, "nvidia-cap"+strconv.Itoa(c.Minor))
	mknod := h.mknod
	if mknod == nil {
		mknod = unix.Mknod
	}
	made := true
	if err := mknod(path, unix.S_IFCHR|f.mode, int(unix.Mkdev(uint32(major), uint32(c.Minor)))); err != nil {
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("capability node %s: mknod: %w", path, err)
		}
		made = false // made meanwhile (another plugin instance, nvidia-modprobe)
	}
	if made {
		chmod := h.chmod
		if chmod == nil {
			chmod = os.Chmod
		}
		if err := chmod(path, os.FileMode(f.mode)); err != nil {
			_ = os.Remove(path)
			return nil, fmt.Errorf("capability node %s: %w", path, err)
		}
		if err := h.doChown(path, f.uid, f.gid); err != nil {
			_ = os.Remove(path)
			return nil, fmt.Errorf("capability node %s: %w", path, err)
		}
	}
	node, _, err := findNode(capsDir+"/nvidia-cap"+strconv.Itoa(c.Minor), []place{{read: h.hostDev(), host: "/dev"}})
	if err != nil {
		return nil, err
	}
	if node == nil {
		return nil, fmt.Errorf("capability node %s: not there after mknod", path)
	}
	return node, nil
}

func (h HostDevNodes) doChown(path string, uid, gid int) error {
	if h.chown != nil {
		return h.chown(path, uid, gid)
	}
	return os.Chown(path, uid, gid)
}

// readCapFile parses a driver capability file: "Name: value" lines with
// decimal values.
func readCapFile(path string) (capFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return capFile{}, err
	}
	f := capFile{minor: -1, mode: defaultCapMode, modify: true}
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		name, value, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(value), 10, 32)
		if err != nil {
			continue
		}
		switch strings.TrimSpace(name) {
		case "DeviceFileMinor":
			f.minor = int(v)
		case "DeviceFileMode":
			f.mode = uint32(v) & 0o777
		case "DeviceFileUID":
			f.uid = int(v)
		case "DeviceFileGID":
			f.gid = int(v)
		case "DeviceFileModify", "ModifyDeviceFiles":
			f.modify = v == 1
		}
	}
	if f.minor < 0 {
		return capFile{}, fmt.Errorf("%s has no DeviceFileMinor", path)
	}
	return f, nil
}

// charMajor is the major of the character device driver name in a
// /proc/devices file.
func charMajor(path, name string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	inChar := false
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		switch {
		case line == "Character devices:":
			inChar = true
			continue
		case line == "" || strings.HasSuffix(line, "devices:"):
			inChar = false
			continue
		}
		fields := strings.Fields(line)
		if inChar && len(fields) == 2 && fields[1] == name {
			major, err := strconv.Atoi(fields[0])
			if err != nil {
				return 0, fmt.Errorf("%s: %q: %w", path, line, err)
			}
			return major, nil
		}
	}
	return 0, fmt.Errorf("%s lists no character device %q: is the NVIDIA driver loaded with MIG support?", path, name)
}
