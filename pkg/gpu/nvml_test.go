package gpu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// These tests run the real go-nvml loader (dlopen). They expect a machine without
// the NVIDIA driver, like CI, and skip where NVML is installed.
func skipIfNVMLInstalled(t *testing.T) {
	t.Helper()
	lib := nvml.New()
	if lib.Init() == nvml.SUCCESS {
		lib.Shutdown()
		t.Skip("the NVIDIA driver is installed on this machine")
	}
}

func TestOpenWithoutDriverAtRoot(t *testing.T) {
	skipIfNVMLInstalled(t)
	if _, found := findLibrary("/"); found {
		t.Skip(LibraryName + " exists on this machine")
	}
	lib, err := NewNVML("/")
	if err != nil {
		t.Fatalf("NewNVML(/) = %v; the loader should get its chance", err)
	}
	err = Open(lib)
	const want = `NVML library libnvidia-ml.so.1 not found under driver root "/" (set --driver-root to where the NVIDIA driver is installed, or --mock-profile for a node without GPUs)`
	if err == nil || err.Error() != want {
		t.Fatalf("Open = %v, want %q", err, want)
	}
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Errorf("error does not match ErrLibraryNotFound")
	}
}

func TestNewNVMLMissingUnderDriverRoot(t *testing.T) {
	root := t.TempDir()
	_, err := NewNVML(root)
	want := `NVML library libnvidia-ml.so.1 not found under driver root "` + root + `" (set --driver-root to where the NVIDIA driver is installed, or --mock-profile for a node without GPUs)`
	if err == nil || err.Error() != want {
		t.Fatalf("NewNVML = %v, want %q", err, want)
	}
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Errorf("error does not match ErrLibraryNotFound")
	}
	if _, err := NewNVML("run/nvidia/driver"); err == nil {
		t.Errorf("NewNVML accepted a relative driver root")
	}
}

// A file that is not a loadable library goes through the real dlopen, which
// fails; the error says which file and why.
func TestOpenUnloadableLibrary(t *testing.T) {
	skipIfNVMLInstalled(t)
	root := t.TempDir()
	dir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, LibraryName)
	if err := os.WriteFile(path, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := NewNVML(root)
	if err != nil {
		t.Fatal(err)
	}
	err = Open(lib)
	if err == nil {
		t.Fatal("Open succeeded with a bogus library")
	}
	t.Log(err)
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Errorf("error %q does not match ErrLibraryNotFound", err)
	}
	for _, want := range []string{path, `driver root "` + root + `"`, "could not be loaded", "--driver-root"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// Open can be retried (the plugin may retry on start-up) and still fails cleanly.
	if err2 := Open(lib); err2 == nil || err2.Error() != err.Error() {
		t.Errorf("second Open = %v, want %v", err2, err)
	}
}

// Driver containers link the library with absolute targets that are only valid
// inside the container; they must resolve under the driver root.
func TestFindLibraryResolvesLinksInsideRoot(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "usr/lib64")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(dir, "libnvidia-ml.so.580.95.05")
	if err := os.WriteFile(real, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/lib64/libnvidia-ml.so.580.95.05", filepath.Join(dir, LibraryName)); err != nil {
		t.Fatal(err)
	}
	if got, found := findLibrary(root); !found || got != real {
		t.Errorf("findLibrary = %q, %v; want %q", got, found, real)
	}

	dangling := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dangling, "lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/nowhere/libnvidia-ml.so.1", filepath.Join(dangling, "lib64", LibraryName)); err != nil {
		t.Fatal(err)
	}
	if got, found := findLibrary(dangling); found {
		t.Errorf("findLibrary followed a dangling link to %q", got)
	}
}

func TestOpenOtherFailures(t *testing.T) {
	tests := []struct {
		name string
		init func() nvml.Return
		want string
	}{
		{"success", func() nvml.Return { return nvml.SUCCESS }, ""},
		{"driver not loaded", func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }, "initialising NVML: ERROR_DRIVER_NOT_LOADED (is the nvidia kernel module loaded on this node?)"},
		{"no permission", func() nvml.Return { return nvml.ERROR_NO_PERMISSION }, "initialising NVML: ERROR_NO_PERMISSION"},
		{"library not found in a custom interface", func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }, "NVML library could not be loaded: nvmlInit: ERROR_LIBRARY_NOT_FOUND (set --driver-root to where the NVIDIA driver is installed, or --mock-profile for a node without GPUs)"},
		{"panic", func() nvml.Return { panic("dlopen exploded") }, "initialising NVML: nvmlInit panicked: dlopen exploded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Open(&mock.Interface{InitFunc: tt.init})
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("Open = %q, want %q", got, tt.want)
			}
		})
	}
}

// A node without NVML is "unavailable", with the admin's message intact; a
// misconfigured driver root is not.
func TestOpenNVMLUnavailable(t *testing.T) {
	root := t.TempDir()
	_, err := OpenNVML(root)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrLibraryNotFound) {
		t.Fatalf("OpenNVML(empty root) = %v, want ErrUnavailable and ErrLibraryNotFound", err)
	}
	if want := `NVML library libnvidia-ml.so.1 not found under driver root "` + root + `"`; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message %q, want it to start with %q", err, want)
	}
	if _, err := OpenNVML("relative/root"); err == nil || errors.Is(err, ErrUnavailable) {
		t.Errorf("OpenNVML(relative) = %v, want a configuration error", err)
	}
}

func TestWaitForNVML(t *testing.T) {
	calls := 0
	node := mustMockNode(t, "l4x4")
	shutdown := 0
	node.ShutdownFunc = func() nvml.Return { shutdown++; return nvml.SUCCESS }
	open := func() (nvml.Interface, error) {
		calls++
		if calls < 3 {
			return nil, unavailable{errors.New("not yet")}
		}
		return node, nil
	}
	if !WaitForNVML(t.Context(), time.Millisecond, open) || calls != 3 || shutdown != 1 {
		t.Errorf("calls %d, shutdowns %d; want 3 and 1", calls, shutdown)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if WaitForNVML(ctx, time.Millisecond, func() (nvml.Interface, error) { return nil, errors.New("never") }) {
		t.Error("WaitForNVML reported success after its context ended")
	}
}
