package checkpoint

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// openBoot opens path with Open, for boot "boot".
func openBoot(t *testing.T, path string) *File {
	t.Helper()
	f, _, err := Open(context.Background(), path, "boot")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Two plugin instances share the checkpoint during a rolling update. Their calls
// are serialized, and each refreshes before it changes anything, so no instance
// writes back a stale copy over the other's entries.
func TestRefreshSeesTheOtherInstance(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	old := openBoot(t, path)
	surge := openBoot(t, path)

	if changed, err := surge.Refresh(); err != nil || changed {
		t.Fatalf("Refresh with nothing new = %v, %v; want false, nil", changed, err)
	}
	// The old instance finishes a prepare after the new one opened the file.
	if err := old.Put(testClaim("a", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	if changed, err := surge.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh after the other instance wrote = %v, %v; want true, nil", changed, err)
	}
	if _, ok := surge.Get("a"); !ok {
		t.Fatal("the new instance does not see claim a after Refresh")
	}
	if err := surge.Put(testClaim("b", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}

	// A third process reads the file: both claims are there.
	reader := openBoot(t, path)
	if got := uidList(reader.List()); got != "a,b" {
		t.Errorf("file holds claims %s, want a,b", got)
	}
	if changed, err := old.Refresh(); err != nil || !changed {
		t.Fatalf("old.Refresh = %v, %v; want true, nil", changed, err)
	}
	if got := uidList(old.List()); got != "a,b" {
		t.Errorf("old instance holds %s after Refresh, want a,b", got)
	}
}

func TestRefreshKeepsStateWhenTheFileIsUnreadable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	f := openBoot(t, path)
	if err := f.Put(testClaim("a", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := f.Refresh()
	if err == nil || !strings.Contains(err.Error(), "another writer left it unreadable") {
		t.Fatalf("Refresh of a garbled file: err = %v, want 'another writer left it unreadable'", err)
	}
	if _, ok := f.Get("a"); !ok {
		t.Error("Refresh dropped claim a after failing")
	}

	// A vanished file is written again from memory.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Refresh(); err != nil || changed {
		t.Fatalf("Refresh of a vanished file = %v, %v; want false, nil", changed, err)
	}
	again := openBoot(t, path)
	if got := uidList(again.List()); got != "a" {
		t.Errorf("rewritten file holds %q, want a", got)
	}
}

func uidList(claims []Claim) string {
	var s []string
	for _, c := range claims {
		s = append(s, string(c.UID))
	}
	return strings.Join(s, ",")
}

// readCountingFS is the real filesystem counting reads of whole files.
type readCountingFS struct {
	osFS
	reads atomic.Int64
}

func (c *readCountingFS) ReadFile(name string) ([]byte, error) {
	c.reads.Add(1)
	return c.osFS.ReadFile(name)
}

// While the file is the one this instance renamed into place, Refresh costs a
// stat and reads nothing; a change in place (another size, or another
// modification time) or another instance's write makes it read the file.
func TestRefreshReadsOnlyWhenTheFileChanged(t *testing.T) {
	fsys := &readCountingFS{}
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	f, _ := mustOpen(t, path, "boot", fsys)
	if err := f.Put(testClaim("a", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	before := fsys.reads.Load()
	for range 10 {
		if changed, err := f.Refresh(); err != nil || changed {
			t.Fatalf("Refresh of its own file = %v, %v; want false, nil", changed, err)
		}
	}
	if n := fsys.reads.Load() - before; n != 0 {
		t.Errorf("Refresh of its own unchanged file read it %d times, want 0", n)
	}

	// The same content rewritten in place with another modification time:
	// Refresh reads it, and finds nothing new.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	before = fsys.reads.Load()
	if changed, err := f.Refresh(); err != nil || changed {
		t.Fatalf("Refresh after an in-place rewrite of the same content = %v, %v; want false, nil", changed, err)
	}
	if fsys.reads.Load() == before {
		t.Error("Refresh did not read a file changed in place")
	}

	// Another instance's write is seen.
	other, _ := mustOpen(t, path, "boot", osFS{})
	if err := other.Put(testClaim("b", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh after another instance wrote = %v, %v; want true, nil", changed, err)
	}
	if got := uidList(f.List()); got != "a,b" {
		t.Errorf("after Refresh the instance holds %s, want a,b", got)
	}
	// Having read it, the instance reads again until it writes itself.
	before = fsys.reads.Load()
	if _, err := f.Refresh(); err != nil {
		t.Fatal(err)
	}
	if fsys.reads.Load() == before {
		t.Error("Refresh of a file this instance did not write skipped the read")
	}
}

// Each write pins the file it renamed into place and releases the previous
// one: writing does not accumulate open files.
func TestWritesDoNotLeakPinnedFiles(t *testing.T) {
	f, _ := mustOpen(t, filepath.Join(t.TempDir(), "checkpoint.json"), "boot", osFS{})
	open := func() int {
		entries, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skipf("no /proc/self/fd: %v", err)
		}
		return len(entries)
	}
	if err := f.Put(testClaim("a", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	before := open()
	for i := range 50 {
		if err := f.Put(testClaim(fmt.Sprintf("c%d", i), PrepareCompleted)); err != nil {
			t.Fatal(err)
		}
	}
	if after := open(); after > before+2 {
		t.Errorf("open files went from %d to %d over 50 writes", before, after)
	}
}

// openFilesUnder lists the targets of this process's open files that are in
// dir, with " (deleted)" for an unlinked one.
func openFilesUnder(t *testing.T, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	var out []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(target, dir+string(filepath.Separator)) {
			out = append(out, target)
		}
	}
	return out
}

// The file a write renamed into place stays open (its inode number cannot be
// reused while Refresh compares it) until the next write or a read replaces
// it; a write that fails keeps nothing open.
func TestPinnedFileLifetime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	fsys := newFaultFS()
	f, _ := mustOpen(t, path, "boot", fsys)
	if err := f.Put(testClaim("a", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	if got := openFilesUnder(t, dir); !slices.Equal(got, []string{path}) {
		t.Errorf("after a write the open files under the directory are %q, want only %s", got, path)
	}

	// Another instance replaces the file (and pins its own): this instance's
	// pin holds the unlinked old one until Refresh reads the new content and
	// lets it go.
	other, _ := mustOpen(t, path, "boot", osFS{})
	if err := other.Put(testClaim("b", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh = %v, %v; want true, nil", changed, err)
	}
	if got := openFilesUnder(t, dir); !slices.Equal(got, []string{path}) {
		t.Errorf("after Refresh read another instance's file, open files under the directory: %q, want only the other instance's %s", got, path)
	}

	// A write whose rename fails leaves nothing open.
	fsys.set(opRename, syscall.EIO)
	if err := f.Put(testClaim("c", PrepareCompleted)); err == nil {
		t.Fatal("Put with a failing rename succeeded")
	}
	if got := openFilesUnder(t, dir); !slices.Equal(got, []string{path}) {
		t.Errorf("after a failed write, open files under the directory: %q, want only the other instance's %s", got, path)
	}
}
