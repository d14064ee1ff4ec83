package gpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// LibraryName is the soname of the NVML library that ships with the NVIDIA driver.
const LibraryName = "libnvidia-ml.so.1"

// ErrLibraryNotFound matches (errors.Is) the errors of NewNVML and Open when the
// NVML library cannot be found or loaded. Their text is meant for the admin.
var ErrLibraryNotFound = errors.New("NVML library not found")

// libraryDirs are where driver installations put libnvidia-ml.so.1, relative to
// the driver root: distribution packages, the runfile installer, and the GPU
// operator's driver container (which is mounted at /run/nvidia/driver).
var libraryDirs = []string{
	"usr/lib64",
	"usr/lib/x86_64-linux-gnu",
	"usr/lib/aarch64-linux-gnu",
	"lib64",
	"lib/x86_64-linux-gnu",
	"lib/aarch64-linux-gnu",
	"usr/lib",
	"lib",
}

// ErrUnavailable matches (errors.Is) the errors of OpenNVML that mean this
// node has no usable NVML right now: the library is missing or does not load,
// the kernel module is not loaded, nvmlInit fails. A node selected for the
// plugin without GPUs, or whose driver is still being installed (the GPU
// Operator's driver container), gives these; the plugin then runs without
// GPUs instead of failing. Other errors of OpenNVML are configuration errors.
var ErrUnavailable = errors.New("NVML unavailable")

// unavailable marks err as ErrUnavailable without changing its message.
type unavailable struct{ err error }

func (u unavailable) Error() string   { return u.err.Error() }
func (u unavailable) Unwrap() []error { return []error{u.err, ErrUnavailable} }

// OpenNVML is NewNVML and Open: the initialised NVML of the driver under
// driverRoot. When this node has no usable NVML the error wraps
// ErrUnavailable (and, for a missing library, ErrLibraryNotFound) and keeps
// the message of NewNVML or Open; a driverRoot that is not absolute is an
// error of its own.
func OpenNVML(driverRoot string) (nvml.Interface, error) {
	lib, err := NewNVML(driverRoot)
	if err != nil {
		if errors.Is(err, ErrLibraryNotFound) {
			return nil, unavailable{err}
		}
		return nil, err
	}
	if err := Open(lib); err != nil {
		return nil, unavailable{err}
	}
	return lib, nil
}

// WaitForNVML calls open every interval until it returns a library or ctx is
// done, and reports whether it did. The library is shut down again at once:
// the caller only learns that NVML has become usable (the kubelet plugin
// restarts then, to take the GPUs over with everything that needs NVML).
func WaitForNVML(ctx context.Context, interval time.Duration, open func() (nvml.Interface, error)) bool {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		if lib, err := open(); err == nil {
			_ = lib.Shutdown()
			return true
		}
	}
}

// library is the real NVML with where it was looked for, so that Open can say
// what went wrong in terms of the node's configuration.
type library struct {
	nvml.Interface
	driverRoot string
	// path handed to dlopen: absolute when found under driverRoot, else the bare
	// soname for the dynamic loader to resolve.
	path string
}

// NewNVML returns the real NVML library of the driver installed under driverRoot
// ("" means "/"). It searches the usual library directories under driverRoot; when
// driverRoot is "/" and none has the library, it leaves the search to the dynamic
// loader (ld.so.cache, LD_LIBRARY_PATH). For any other driverRoot a missing
// library is an error wrapping ErrLibraryNotFound.
//
// NewNVML does not load the library; call Open, then Discover, and Shutdown when
// done.
func NewNVML(driverRoot string) (nvml.Interface, error) {
	root := driverRoot
	if root == "" {
		root = "/"
	}
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("driver root %q is not an absolute path", driverRoot)
	}
	root = filepath.Clean(root)

	path, found := findLibrary(root)
	if !found {
		if root != "/" {
			return nil, notFoundError(root)
		}
		path = LibraryName
	}
	return &library{
		Interface:  nvml.New(nvml.WithLibraryPath(path)),
		driverRoot: root,
		path:       path,
	}, nil
}

// Open initialises lib (nvmlInit) and turns a failure into an error an admin can
// act on. A missing or unloadable library gives an error wrapping
// ErrLibraryNotFound that names the driver root and the flags to fix it; other
// failures wrap the nvml.Return. Open never panics: a panic inside lib.Init (a
// custom nvml.Interface, or a go-nvml version that panics without a library) is
// returned as an error.
func Open(lib nvml.Interface) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("initialising NVML: nvmlInit panicked: %v", r)
		}
	}()
	ret := lib.Init()
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return loadError(lib)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("initialising NVML: %w (is the nvidia kernel module loaded on this node?)", ret)
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return fmt.Errorf("initialising NVML: %w (the NVML library under the driver root does not match the loaded kernel module)", ret)
	default:
		return fmt.Errorf("initialising NVML: %w", ret)
	}
}

// findLibrary returns the first libraryDirs entry under root that holds the
// library. Symbolic links are resolved inside root, as the loader in a chroot
// would, so an absolute link in a driver container does not point at the host.
func findLibrary(root string) (string, bool) {
	for _, dir := range libraryDirs {
		path := filepath.Join(root, dir, LibraryName)
		if resolved, ok := resolveIn(root, path); ok {
			return resolved, true
		}
	}
	return "", false
}

// resolveIn follows path's final symbolic links with absolute targets taken
// relative to root, and reports whether it ends at a regular file.
func resolveIn(root, path string) (string, bool) {
	for range 16 {
		fi, err := os.Lstat(path)
		if err != nil {
			return "", false
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return path, fi.Mode().IsRegular()
		}
		target, err := os.Readlink(path)
		if err != nil {
			return "", false
		}
		if filepath.IsAbs(target) {
			path = filepath.Join(root, target)
		} else {
			path = filepath.Join(filepath.Dir(path), target)
		}
	}
	return "", false // a link loop
}

func notFoundError(root string) error {
	return libraryError(fmt.Sprintf("NVML library %s not found under driver root %q (%s)", LibraryName, root, remedy))
}

// libraryError is a message for the admin that matches ErrLibraryNotFound.
type libraryError string

func (e libraryError) Error() string        { return string(e) }
func (e libraryError) Is(target error) bool { return target == ErrLibraryNotFound }

const remedy = "set --driver-root to where the NVIDIA driver is installed, or --mock-profile for a node without GPUs"

// loadError explains an ERROR_LIBRARY_NOT_FOUND from nvmlInit. go-nvml drops the
// loader's message, so when the library exists but did not load, it is opened
// once more here to report why (wrong architecture, missing dependency, ...).
func loadError(lib nvml.Interface) error {
	l, ok := lib.(*library)
	if !ok {
		return libraryError(fmt.Sprintf("NVML library could not be loaded: nvmlInit: %v (%s)", nvml.ERROR_LIBRARY_NOT_FOUND, remedy))
	}
	if !filepath.IsAbs(l.path) {
		// Left to the dynamic loader, which did not find it.
		return notFoundError(l.driverRoot)
	}
	reason := "unknown reason"
	probe := dl.New(l.path, dl.RTLD_LAZY|dl.RTLD_LOCAL)
	if err := probe.Open(); err != nil {
		reason = err.Error()
	} else {
		_ = probe.Close()
	}
	// The loader's message names the file.
	return libraryError(fmt.Sprintf("NVML library under driver root %q could not be loaded: %s (%s)",
		l.driverRoot, reason, remedy))
}

// ComputeProcesses returns how many processes NVML sees running compute work
// on the GPU with this UUID.
func ComputeProcesses(lib nvml.Interface, uuid string) (int, error) {
	dev, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("nvml: GPU %s: %v", uuid, nvml.ErrorString(ret))
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("nvml: GPU %s: compute processes: %v", uuid, nvml.ErrorString(ret))
	}
	return len(procs), nil
}
