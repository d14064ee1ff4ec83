//go:build e2e

package framework

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// MockKnobURL is the plugin's mock knob (--mock-fault-injection) on its own
// address (mockKnobBase).
func MockKnobURL(path string, q url.Values) string {
	return mockKnobBase() + path + "?" + q.Encode()
}

// mockKnobBase is the plugin's test knob (--mock-fault-injection): plain
// HTTP on the host's 127.0.0.1:9477 on the local cluster.
func mockKnobBase() string {
	if u := os.Getenv("TESSERA_E2E_MOCK_KNOB_URL"); u != "" {
		return strings.TrimSuffix(u, "/")
	}
	return "http://127.0.0.1:9477"
}

var (
	cliOnce sync.Once
	cliPath string
	cliErr  error
)

// TesseraCLI builds cmd/tessera once per run.
func TesseraCLI(t *testing.T) string {
	t.Helper()
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tessera-e2e-cli-")
		if err != nil {
			cliErr = err
			return
		}
		cliPath = filepath.Join(dir, "tessera")
		out, err := exec.Command("go", "build", "-o", cliPath, filepath.Join(RepoRoot, "cmd", "tessera")).CombinedOutput()
		if err != nil {
			cliErr = fmt.Errorf("go build ./cmd/tessera: %v\n%s", err, out)
		}
	})
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return cliPath
}

// Kubeconfig is the kubeconfig file of the cluster under test.
func Kubeconfig(t *testing.T) string {
	t.Helper()
	if k := os.Getenv("KUBECONFIG"); k != "" {
		return k
	}
	out, err := exec.Command(filepath.Join(RepoRoot, "demo", "clusters", "local", "cluster.sh"), "kubeconfig").Output()
	if err != nil {
		t.Fatalf("cluster.sh kubeconfig: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func RunCLI(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(TesseraCLI(t), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tessera %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}
