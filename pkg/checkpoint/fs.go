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

// osFS is the real filesystem.
type osFS struct{}

func (osFS) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

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
