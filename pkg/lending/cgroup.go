package lending

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Cgroups ends a borrower pod's processes through cgroup v2's cgroup.kill,
// which SIGKILLs every process of a cgroup and of its descendants at once:
// a process that ignores SIGTERM, a preStop hook or a long
// terminationGracePeriodSeconds cannot keep the borrower on its owners' GPU,
// and a container cannot reopen the GPU from a process the kill missed.
// Killing only the GPU processes NVML lists is not enough: under MPS NVML
// lists the server, not its clients, and the container's other processes
// could open the GPU again.
//
// The pod's cgroups are found two ways:
//
//   - by the kubelet's layout, from the pod UID: the systemd driver's
//     kubepods[-<qos>]-pod<uid with _>.slice and the cgroupfs driver's
//     pod<uid>, at any depth up to podCgroupDepth below the root (QoS
//     classes, a custom --cgroup-root); the whole pod is killed;
//   - else from /proc/<pid>/cgroup of the pod's GPU processes (NVML's host
//     PIDs), for kubelets that make no pod cgroups (cgroupsPerQOS: false);
//     the process's container is killed. A path outside the reader's cgroup
//     namespace ("/../…") cannot be resolved and is refused.
//
// The node's cgroup v2 hierarchy is Root itself, or Root/unified on a
// hybrid (v1 controllers + v2) host.
type Cgroups struct {
	// Root is where the host's cgroup filesystem is mounted in the plugin
	// (the chart mounts /sys/fs/cgroup at /host/sys/fs/cgroup).
	Root string
	// ProcRoot is the host's /proc; empty: GPU processes are not used.
	ProcRoot string
}

// podCgroupDepth bounds the walk for a pod's cgroup: kubepods.slice /
// kubepods-burstable.slice / kubepods-burstable-pod<uid>.slice is depth 3;
// a custom kubelet --cgroup-root adds a level or two.
const podCgroupDepth = 5

// unified returns the directory of the node's cgroup v2 hierarchy.
func (c Cgroups) unified() (string, error) {
	for _, dir := range []string{c.Root, filepath.Join(c.Root, "unified")} {
		// cgroup.controllers exists only in cgroup v2 directories.
		if _, err := os.Stat(filepath.Join(dir, "cgroup.controllers")); err == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no cgroup v2 hierarchy at %s or %s/unified (cgroup.kill needs cgroup v2)", c.Root, c.Root)
}

// podCgroupName reports whether a cgroup directory name is the pod's in the
// kubelet's systemd or cgroupfs layout.
func podCgroupName(name string, pod types.UID) bool {
	if pod == "" {
		return false
	}
	if name == "pod"+string(pod) {
		return true
	}
	systemd := "-pod" + strings.ReplaceAll(string(pod), "-", "_") + ".slice"
	return strings.HasPrefix(name, "kubepods") && strings.HasSuffix(name, systemd)
}

// PodDirs returns the pod's cgroup directories under root (the kubelet's
// layouts; usually one).
func PodDirs(root string, pod types.UID) ([]string, error) {
	var out []string
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			if depth > 0 && errors.Is(err, fs.ErrNotExist) {
				return nil // a cgroup removed while walking
			}
			return err
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			path := filepath.Join(dir, e.Name())
			if podCgroupName(e.Name(), pod) {
				out = append(out, path)
				continue
			}
			if depth+1 < podCgroupDepth {
				if err := walk(path, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 0); err != nil {
		return nil, fmt.Errorf("cgroups of pod %s under %s: %w", pod, root, err)
	}
	return out, nil
}

// notAContainer are cgroup names that hold many pods or the host's own
// processes: a PID that maps to one of them (a reused PID, a process of no
// container) must never take its whole group down.
var notAContainer = []string{"kubepods", "kubepods.slice", "besteffort", "burstable", "guaranteed",
	"kubepods-besteffort.slice", "kubepods-burstable.slice", "kubepods-guaranteed.slice",
	"system.slice", "user.slice", "init.scope", "k8s.io", "kubelet.slice", "machine.slice"}

// ProcessDir returns the cgroup v2 directory (under root) of a host PID,
// from <ProcRoot>/<pid>/cgroup.
func (c Cgroups) ProcessDir(root string, pid uint32) (string, error) {
	file := filepath.Join(c.ProcRoot, strconv.FormatUint(uint64(pid), 10), "cgroup")
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("process %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path, ok := strings.CutPrefix(sc.Text(), "0::")
		if !ok {
			continue
		}
		clean := filepath.Clean("/" + path)
		switch {
		case strings.Contains(path, ".."):
			return "", fmt.Errorf("process %d: cgroup %s is outside this plugin's cgroup namespace", pid, path)
		case clean == "/" || slices.Contains(notAContainer, filepath.Base(clean)):
			return "", fmt.Errorf("process %d: cgroup %s is not a container's", pid, path)
		}
		return filepath.Join(root, clean), nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("process %d: %s: %w", pid, file, err)
	}
	return "", fmt.Errorf("process %d: no cgroup v2 entry in %s", pid, file)
}

// Kill writes 1 to dir/cgroup.kill.
func Kill(dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, "cgroup.kill"), os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if _, statErr := os.Stat(dir); statErr == nil {
			return fmt.Errorf("%s has no cgroup.kill (Linux 5.14 or newer has it): %v", dir, err)
		}
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString("1"); err != nil {
		f.Close()
		return fmt.Errorf("kill cgroup %s: %w", dir, err)
	}
	return f.Close()
}

// KillPod kills the pod's cgroups: the pod's own, found by the kubelet's
// layout, else the containers of its GPU processes pids. It returns the
// cgroups it killed; a pod whose cgroups are all gone already is an error
// only when none was found at all.
func (c Cgroups) KillPod(pod types.UID, pids []uint32) ([]string, error) {
	root, err := c.unified()
	if err != nil {
		return nil, err
	}
	dirs, err := PodDirs(root, pod)
	if err != nil {
		return nil, err
	}
	var errs []error
	if len(dirs) == 0 && c.ProcRoot != "" {
		for _, pid := range pids {
			dir, err := c.ProcessDir(root, pid)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !slices.Contains(dirs, dir) {
				dirs = append(dirs, dir)
			}
		}
	}
	if len(dirs) == 0 {
		errs = append([]error{fmt.Errorf("no cgroup of pod %s under %s (kubelet layouts pod<uid> and kubepods-*-pod<uid>.slice) and none from its %d GPU processes", pod, root, len(pids))}, errs...)
		return nil, errors.Join(errs...)
	}
	var killed []string
	for _, dir := range dirs {
		if err := Kill(dir); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // the container ended meanwhile
			}
			errs = append(errs, err)
			continue
		}
		killed = append(killed, dir)
	}
	return killed, errors.Join(errs...)
}
