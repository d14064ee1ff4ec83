//go:build cgo && linux

package cuda

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenMissingSymbolFailsEveryTime: a library that lacks one of the
// driver API's symbols is refused, and refused again on the next Open,
// which must not report success with symbols left unresolved.
func TestOpenMissingSymbolFailsEveryTime(t *testing.T) {
	// The first two symbols Open resolves, not the third (cuDeviceGet).
	lib := buildLib(t, "the partial library", "libpartial.so", "int cuInit(unsigned int f) { return 0; }\nint cuDriverGetVersion(int *v) { *v = 12000; return 0; }\n")
	for i := 1; i <= 2; i++ {
		l, err := open(lib)
		if err == nil {
			t.Fatalf("open #%d of a library without cuDeviceGet succeeded (%v)", i, l)
		}
		if !errors.Is(err, ErrNotLoaded) || !strings.Contains(err.Error(), "missing symbol cuDeviceGet") {
			t.Errorf("open #%d: %v; want ErrNotLoaded naming cuDeviceGet", i, err)
		}
	}
}

// buildLib compiles the C source src into the shared library name in a
// temporary directory and returns its path; without a C compiler it skips
// the test, which needed it to build what.
func buildLib(t *testing.T, what, name, src string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build "+what+":", err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "src.c")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, name)
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, file).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", lib, err, out)
	}
	return lib
}
