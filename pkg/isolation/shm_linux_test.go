package isolation

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestHostShm mounts a real tmpfs (root only): size-bounded, nosuid, nodev,
// noexec, mode 1777; mounting again keeps it (and what is in it); unmounting
// twice is fine.
func TestHostShm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := filepath.Join(t.TempDir(), "shm")
	var m HostShm
	if err := m.Mount(dir, 1<<20); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = m.Unmount(dir) })
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		t.Errorf("filesystem type %#x, want tmpfs", fs.Type)
	}
	for _, f := range []struct {
		name string
		flag int64
	}{{"nosuid", unix.ST_NOSUID}, {"nodev", unix.ST_NODEV}, {"noexec", unix.ST_NOEXEC}} {
		if fs.Flags&f.flag == 0 {
			t.Errorf("mounted without %s (flags %#x)", f.name, fs.Flags)
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode()&(os.ModeSticky|os.ModePerm) != os.ModeSticky|0o777 {
		t.Errorf("mode %v (%v), want 1777", fi.Mode(), err)
	}
	// More than the size: the writer gets ENOSPC, not the node's disk.
	err := os.WriteFile(filepath.Join(dir, "big"), bytes.Repeat([]byte{1}, 2<<20), 0o600)
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing 2 MiB into a 1 MiB tmpfs: %v, want ENOSPC", err)
	}
	if err := os.Remove(filepath.Join(dir, "big")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "small"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(dir, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "small")); err != nil {
		t.Errorf("a second mount replaced the tmpfs: %v", err)
	}
	for range 2 {
		if err := m.Unmount(dir); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "small")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after unmount the file is still there: %v", err)
	}
}
