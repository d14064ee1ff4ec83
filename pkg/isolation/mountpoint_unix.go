//go:build unix

package isolation

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// isMountPoint reports whether dir is the root of a mount: its device
// differs from its parent's, or (a bind of the same filesystem) it is its
// parent's inode.
func isMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	if err := unix.Lstat(filepath.Dir(filepath.Clean(dir)), &parent); err != nil {
		return false, &os.PathError{Op: "lstat", Path: filepath.Dir(dir), Err: err}
	}
	return st.Dev != parent.Dev || st.Ino == parent.Ino, nil
}
