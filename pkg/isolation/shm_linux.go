package isolation

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// HostShm mounts each MPS daemon's shared memory as a tmpfs of its own, from
// the kubelet plugin (privileged on real nodes). The plugin's view of the MPS
// root must propagate to the host (mountPropagation: Bidirectional), so that
// the container runtime binds the tmpfs, not the directory under it, into
// the daemon's pod and its clients.
type HostShm struct{}

var _ ShmMounter = HostShm{}

// shmFlags keep device nodes, set-user-ID programs and executables off a
// directory every client of a domain can write.
const shmFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

// Mount implements [ShmMounter].
func (HostShm) Mount(dir string, size int64) error {
	if size <= 0 {
		return fmt.Errorf("tmpfs %s: size %d, want > 0", dir, size)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mounted, err := isMountPoint(dir)
	if err != nil {
		return err
	}
	if mounted {
		return nil
	}
	// mode=1777: the MPS server and its clients run as the clients' uid,
	// whatever it is; the sticky bit keeps one uid from removing another's
	// segments (root in a container can, which is why a domain, not a uid,
	// is the unit of isolation).
	data := "size=" + strconv.FormatInt(size, 10) + ",mode=1777"
	if err := unix.Mount("tessera-mps-shm", dir, "tmpfs", shmFlags, data); err != nil {
		return fmt.Errorf("mount tmpfs (%s) on %s: %w", data, dir, err)
	}
	return nil
}

// Unmount implements [ShmMounter].
func (HostShm) Unmount(dir string) error {
	mounted, err := isMountPoint(dir)
	if errors.Is(err, os.ErrNotExist) || err == nil && !mounted {
		return nil
	}
	if err != nil {
		return err
	}
	if err := unix.Unmount(dir, 0); err != nil {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}
