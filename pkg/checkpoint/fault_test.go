package checkpoint

import (
	"os"
	"sync"
)

// op is one step of a write that faultFS can fail.
type op string

const (
	opCreate  op = "create temp"
	opWrite   op = "write"
	opSync    op = "fsync"
	opClose   op = "close"
	opRename  op = "rename"
	opSyncDir op = "fsync dir"
)

// faultFS is the real filesystem with injectable failures, so that tests
// see real files on disk while a step of the write fails (a full disk, an
// I/O error). noSync skips fsyncs where a test only needs speed.
type faultFS struct {
	osFS
	noSync bool

	mu   sync.Mutex
	fail map[op]error
	// hooks run at the start of a step, before its failure (if any) and
	// the real call; a hook's error fails the step. Tests use them to hold
	// a write at one step while other calls queue, or to fail one step of
	// one particular write.
	hooks map[op]func() error
}

func newFaultFS() *faultFS { return &faultFS{fail: map[op]error{}} }

func (f *faultFS) set(o op, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fail, o)
		return
	}
	f.fail[o] = err
}

// hook sets the hook of step o; nil removes it.
func (f *faultFS) hook(o op, h func() error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hooks == nil {
		f.hooks = map[op]func() error{}
	}
	if h == nil {
		delete(f.hooks, o)
		return
	}
	f.hooks[o] = h
}

// err runs step o's hook, then returns the hook's error or the failure set
// for o.
func (f *faultFS) err(o op) error {
	f.mu.Lock()
	h := f.hooks[o]
	f.mu.Unlock()
	if h != nil {
		if err := h(); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fail[o]
}

func (f *faultFS) CreateTemp(dir, pattern string) (tempFile, error) {
	if err := f.err(opCreate); err != nil {
		return nil, &os.PathError{Op: "open", Path: dir + "/" + pattern, Err: err}
	}
	file, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f}, nil
}

func (f *faultFS) Rename(oldpath, newpath string) error {
	if err := f.err(opRename); err != nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
	}
	return f.osFS.Rename(oldpath, newpath)
}

func (f *faultFS) SyncDir(dir string) error {
	if err := f.err(opSyncDir); err != nil {
		return &os.PathError{Op: "sync", Path: dir, Err: err}
	}
	if f.noSync {
		return nil
	}
	return f.osFS.SyncDir(dir)
}

type faultFile struct {
	*os.File
	fs *faultFS
}

// Write writes half of p before failing, as a disk that fills up mid-write.
func (f *faultFile) Write(p []byte) (int, error) {
	if err := f.fs.err(opWrite); err != nil {
		n, _ := f.File.Write(p[:len(p)/2])
		return n, &os.PathError{Op: "write", Path: f.Name(), Err: err}
	}
	return f.File.Write(p)
}

func (f *faultFile) Sync() error {
	if err := f.fs.err(opSync); err != nil {
		return &os.PathError{Op: "sync", Path: f.Name(), Err: err}
	}
	if f.fs.noSync {
		return nil
	}
	return f.File.Sync()
}

func (f *faultFile) Close() error {
	cerr := f.File.Close()
	if err := f.fs.err(opClose); err != nil {
		return &os.PathError{Op: "close", Path: f.Name(), Err: err}
	}
	return cerr
}
