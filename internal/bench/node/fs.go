package node

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// shmDir is where Linux mounts a tmpfs for everyone.
const shmDir = "/dev/shm"

// volatileTemp makes a fresh directory on a tmpfs, as a node's /run is (the
// plugin's default --cdi-root and --hami-claim-root are there): under
// /dev/shm when it is a tmpfs, else under fallback.
func volatileTemp(fallback string) (string, error) {
	parent := fallback
	if fsType(shmDir) == "tmpfs" {
		parent = shmDir
	}
	return os.MkdirTemp(parent, "tessera-nodebench-run-")
}

// fsType names the type of the filesystem dir is on.
func fsType(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "unknown"
	}
	switch uint32(st.Type) {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return fmt.Sprintf("0x%x", st.Type)
}
