package isolation

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// TestHAMiCoreClaimDirTmpfs mounts real tmpfs (root only): each claim's
// directory is a tmpfs of its own, size-bounded, nosuid, nodev, noexec, mode
// 1777, so a claim's containers fill their own tmpfs, not the claim root's
// file system; it is mounted again after a reboot cleared it, kept with its
// region across calls, and unmounted and removed at unprepare. A plain
// directory with files in it (a claim prepared by an earlier release) is
// left as it is.
func TestHAMiCoreClaimDirTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	root := filepath.Join(t.TempDir(), "hami-claims")
	h := HAMiCore{ClaimRoot: root, Mounter: HostShm{}, ClaimDirSize: 1 << 20}
	const uid = types.UID("0f5e6a2c-1111-2222-3333-444455556666")
	dir := h.ClaimDir(uid)
	if err := h.CreateClaimDir(uid); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = HostShm{}.Unmount(dir) })
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.TMPFS_MAGIC {
		t.Fatalf("%s: filesystem type %#x, want tmpfs", dir, st.Type)
	}
	for _, f := range []struct {
		name string
		flag int64
	}{{"nosuid", unix.ST_NOSUID}, {"nodev", unix.ST_NODEV}, {"noexec", unix.ST_NOEXEC}} {
		if st.Flags&f.flag == 0 {
			t.Errorf("mounted without %s (flags %#x)", f.name, st.Flags)
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode()&(os.ModeSticky|os.ModePerm) != os.ModeSticky|0o777 {
		t.Errorf("mode %v (%v), want 1777", fi.Mode(), err)
	}
	// A tenant writing more than the bound gets ENOSPC in its own tmpfs.
	if err := os.WriteFile(filepath.Join(dir, "fill"), bytes.Repeat([]byte{1}, 2<<20), 0o600); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing 2 MiB into the claim's 1 MiB directory: %v, want ENOSPC", err)
	}
	_ = os.Remove(filepath.Join(dir, "fill"))

	// The region survives another prepare or a plugin restart's rebuild.
	region := filepath.Join(dir, "cudevshr.cache")
	if err := os.WriteFile(region, []byte("region"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := h.CreateClaimDir(uid); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(region); err != nil {
		t.Errorf("a second CreateClaimDir replaced the tmpfs: %v", err)
	}

	// After a reboot (the tmpfs gone, the directory empty) it is mounted
	// again.
	if err := (HostShm{}).Unmount(dir); err != nil {
		t.Fatal(err)
	}
	if err := h.CreateClaimDir(uid); err != nil {
		t.Fatal(err)
	}
	if mounted, err := isMountPoint(dir); err != nil || !mounted {
		t.Errorf("after the tmpfs went: mounted %v (%v), want mounted again", mounted, err)
	}

	// Unprepare: the tmpfs and the directory go.
	if err := h.RemoveClaimDir(uid); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after RemoveClaimDir: %v, want the directory gone", err)
	}

	// A claim of an earlier release: a plain directory with its region.
	const old = types.UID("0f5e6a2c-1111-2222-3333-777777777777")
	oldDir := h.ClaimDir(old)
	if err := os.MkdirAll(oldDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(oldDir, "cudevshr.cache"), []byte("region"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := h.CreateClaimDir(old); err != nil {
		t.Fatal(err)
	}
	if mounted, _ := isMountPoint(oldDir); mounted {
		_ = HostShm{}.Unmount(oldDir)
		t.Error("a tmpfs was mounted over an earlier release's claim directory in use")
	}
	if err := h.RemoveClaimDir(old); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(oldDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the earlier release's directory after RemoveClaimDir: %v", err)
	}
}
