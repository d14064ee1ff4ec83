//go:build e2e

package framework

import (
	"path/filepath"
	"runtime"
	"testing"
)

// RepoRoot is the repository's root, from this file's location.
var RepoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}()

// Testdata returns the path of a file in testdata/.
func Testdata(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join(RepoRoot, "tests", "e2e", "testdata", name)
}

// SpecPath returns the path of a demo spec users copy (demo/specs).
func SpecPath(name string) string {
	return filepath.Join(RepoRoot, "demo", "specs", name)
}
