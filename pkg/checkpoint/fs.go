package checkpoint

import (
	"errors"
	"io"
	"os"
	"syscall"
)

// fileSystem is the filesystem seam of [File]: osFS on a node, a
// fault-injecting wrapper in tests (a full disk cannot be produced on demand).
type fileSystem interface {
	ReadFile(name string) ([]byte, error)
	Stat(name string) (os.FileInfo, error)
	// Open opens name for reading, as os.Open does.
	Open(name string) (statFile, error)
	// CreateTemp creates a new file in dir, as os.CreateTemp does (mode 0600).
	CreateTemp(dir, pattern string) (tempFile, error)
	Rename(oldpath, newpath string) error
	Remove(name string) error
	MkdirAll(path string, perm os.FileMode) error
	// ReadDirNames lists the names of the entries of dir.
	ReadDirNames(dir string) ([]string, error)
	// SyncDir makes the directory entries of dir (creations, renames) durable.
	SyncDir(dir string) error
}

// tempFile is the part of *os.File a write needs.
type tempFile interface {
	io.Writer
	Name() string
	Sync() error
	Close() error
}

// statFile is the part of *os.File that keeps a file's inode in use.
type statFile interface {
	Stat() (os.FileInfo, error)
	Close() error
}

// osFS is the real filesystem.
type osFS struct{}

func (osFS) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

func (osFS) Stat(name string) (os.FileInfo, error) { return os.Stat(name) }

func (osFS) Open(name string) (statFile, error) { return os.Open(name) }

func (osFS) CreateTemp(dir, pattern string) (tempFile, error) { return os.CreateTemp(dir, pattern) }

func (osFS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }

func (osFS) Remove(name string) error { return os.Remove(name) }

func (osFS) MkdirAll(path string, perm os.FileMode) error { return os.MkdirAll(path, perm) }

func (osFS) ReadDirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, err
}

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	// Some filesystems cannot fsync a directory and say so with EINVAL;
	// there is nothing more durable to be had there.
	if errors.Is(err, syscall.EINVAL) {
		err = nil
	}
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// fileID identifies one version of a file's content without reading it:
// every write of [File] renames a new file (a new inode) into place, and a
// change made in place changes the size or the modification time. An inode
// number is reused once its file is gone, so a fileID names a file only
// while something holds it open ([pin]).
type fileID struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

// idOf is the fileID of fi; false when the platform does not say which inode
// fi is.
func idOf(fi os.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, size: fi.Size(), mtime: fi.ModTime().UnixNano()}, true
}

// pin holds open the file a [File] renamed into place, so that no other file
// can get its inode number while the File compares the checkpoint's fileID
// with it.
type pin struct {
	file statFile
	id   fileID
}

// release closes the pinned file; a nil pin is none.
func (p *pin) release() {
	if p != nil {
		_ = p.file.Close() // read-only: nothing to lose
	}
}
