package gpucheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// NSExec is what "tessera-gpu-probe nsexec" does in the mount namespace it
// was started in (and, without root, the user namespace that comes with
// it): it makes the mounts, chroots into Root when set, and executes Args
// with exactly Env. The check uses it for what a container runtime or the
// MPS daemon pod would do and the GPU machine has no runtime for:
//
//   - the container fallback without root ([NSExecCommand] with userns):
//     the CDI spec's mounts and device nodes in a tiny root filesystem, the
//     same kernel mechanism rootless runtimes use (unshare -rm);
//   - an MPS control daemon whose /dev/shm is its domain's shared-memory
//     directory, as the daemon pod has it (root only).
type NSExec struct {
	// Root is the root filesystem to chroot into after the mounts; empty
	// stays in the current root. Mount destinations are under it.
	Root   string    `json:"root,omitempty"`
	Mounts []NSMount `json:"mounts"`
	Args   []string  `json:"args"`
	Env    []string  `json:"env"`
	Dir    string    `json:"dir,omitempty"`
}

// NSMount is one mount of [NSExec].
type NSMount struct {
	// Type is "bind" (recursive; a file or a directory, device nodes
	// included), "tmpfs" or "devpts" (a new instance).
	Type        string `json:"type"`
	Source      string `json:"source,omitempty"`
	Destination string `json:"destination"`
	ReadOnly    bool   `json:"readOnly,omitempty"`
	// Data is the tmpfs's options (size=…, mode=…).
	Data string `json:"data,omitempty"`
}

// WriteNSExec writes cfg as the file nsexec reads.
func WriteNSExec(path string, cfg NSExec) error {
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// NSExecCommand is "self nsexec --config path" in a new mount namespace;
// with userns also in a new user namespace that maps this process's uid and
// gid to root, which is what lets a user who is not root mount (unshare
// -rm does the same).
func NSExecCommand(self, path string, userns bool) *exec.Cmd {
	cmd := exec.Command(self, "nsexec", "--config", path)
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	if userns {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
	cmd.SysProcAttr = attr
	return cmd
}

// RunNSExec is the nsexec process: it reads the config at path, mounts,
// chroots and executes. It returns only on failure.
func RunNSExec(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var cfg NSExec
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("nsexec %s: %w", path, err)
	}
	if len(cfg.Args) == 0 {
		return errors.New("nsexec: nothing to execute")
	}
	// Nothing mounted here may propagate back to the parent namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("nsexec: make / private: %w", err)
	}
	for _, m := range cfg.Mounts {
		if err := nsMount(cfg.Root, m); err != nil {
			return err
		}
	}
	if cfg.Root != "" {
		if err := unix.Chroot(cfg.Root); err != nil {
			return fmt.Errorf("nsexec: chroot %s: %w", cfg.Root, err)
		}
		if err := unix.Chdir("/"); err != nil {
			return err
		}
	}
	if cfg.Dir != "" {
		if err := unix.Chdir(cfg.Dir); err != nil {
			return fmt.Errorf("nsexec: chdir %s: %w", cfg.Dir, err)
		}
	}
	bin := cfg.Args[0]
	if !strings.Contains(bin, "/") {
		for _, kv := range cfg.Env {
			if dirs, ok := strings.CutPrefix(kv, "PATH="); ok {
				for _, d := range filepath.SplitList(dirs) {
					if st, err := os.Stat(filepath.Join(d, bin)); err == nil && !st.IsDir() {
						bin = filepath.Join(d, bin)
						break
					}
				}
			}
		}
	}
	return fmt.Errorf("nsexec: exec %s: %w", bin, unix.Exec(bin, cfg.Args, cfg.Env))
}

// ReportNSExecError writes RunNSExec's error as a probe's error message on
// w (the protocol the check reads), with ErrCodeNamespace when the kernel
// refused it for want of privilege (EPERM: root without CAP_SYS_ADMIN in
// the namespace), so that the check can try a user namespace or skip.
func ReportNSExecError(w io.Writer, err error) {
	if err == nil {
		return
	}
	m := probeMessage{Event: "error", Error: err.Error()}
	if errors.Is(err, unix.EPERM) {
		m.Code = ErrCodeNamespace
	}
	_ = json.NewEncoder(w).Encode(m)
}

// nsMount makes one mount, creating its mount point (a directory, or an
// empty file for a file or a device node).
func nsMount(root string, m NSMount) error {
	target := filepath.Join(root, m.Destination)
	switch m.Type {
	case "tmpfs":
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("nsexec: %w", err)
		}
		if err := unix.Mount("tmpfs", target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, m.Data); err != nil {
			return fmt.Errorf("nsexec: mount tmpfs at %s (%s): %w", m.Destination, m.Data, err)
		}
		return nil
	case "devpts":
		// A private instance (newinstance), which a user namespace may
		// mount.
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("nsexec: %w", err)
		}
		if err := unix.Mount("devpts", target, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
			return fmt.Errorf("nsexec: mount devpts at %s: %w", m.Destination, err)
		}
		return nil
	case "bind":
	default:
		return fmt.Errorf("nsexec: mount type %q at %s: want bind, tmpfs or devpts", m.Type, m.Destination)
	}
	st, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("nsexec: bind %s at %s: %w", m.Source, m.Destination, err)
	}
	if st.IsDir() {
		err = os.MkdirAll(target, 0o755)
	} else if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("nsexec: mount point %s: %w", m.Destination, err)
	}
	if err := unix.Mount(m.Source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("nsexec: bind %s at %s: %w", m.Source, m.Destination, err)
	}
	if !m.ReadOnly {
		return nil
	}
	// A read-only remount must keep the flags the source mount has
	// (nosuid, nodev, noexec, atime): in a user namespace they are locked,
	// and dropping one is refused.
	var sfs unix.Statfs_t
	if err := unix.Statfs(target, &sfs); err != nil {
		return fmt.Errorf("nsexec: statfs %s: %w", m.Destination, err)
	}
	const keep = unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOEXEC | unix.ST_NOATIME | unix.ST_NODIRATIME | unix.ST_RELATIME
	flags := uintptr(unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY) | uintptr(sfs.Flags)&keep
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("nsexec: make %s read-only: %w", m.Destination, err)
	}
	return nil
}

// usernsUnavailable explains why this process could not create a user
// namespace (err from starting it), naming the knob that says no.
func usernsUnavailable(err error) string {
	var why []string
	for _, f := range []struct{ path, bad string }{
		{"/proc/sys/user/max_user_namespaces", "0"},
		{"/proc/sys/kernel/unprivileged_userns_clone", "0"},
		{"/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"},
	} {
		if data, rerr := os.ReadFile(f.path); rerr == nil && strings.TrimSpace(string(data)) == f.bad {
			why = append(why, fmt.Sprintf("%s is %s", f.path, f.bad))
		}
	}
	if len(why) == 0 {
		why = append(why, "no sysctl forbids it: a seccomp filter (a container's), a chroot (the kernel refuses user namespaces to a chrooted process), or a sandbox that does not implement them")
	}
	return fmt.Sprintf("cannot create a user and mount namespace (%v): %s", err, strings.Join(why, "; "))
}
