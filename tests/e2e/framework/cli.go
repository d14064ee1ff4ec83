//go:build e2e

package framework

import (
	"fmt"
	"io"
	"net/http"
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

// PostMockKnob posts q to the plugin's mock knob at path, fails the test on
// an error or an answer other than 200 OK, and logs the answer.
func PostMockKnob(t testing.TB, path string, q url.Values) {
	t.Helper()
	resp, err := http.Post(MockKnobURL(path, q), "", nil)
	if err != nil {
		t.Fatalf("mock knob %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("mock knob %s: %s: %s", path, resp.Status, body)
	}
	t.Logf("mock knob %s?%s: %s", path, q.Encode(), strings.TrimSpace(string(body)))
}

// mockKnobBase is the plugin's test knob (--mock-fault-injection): plain
// HTTP on the host's 127.0.0.1:9477 on the local cluster.
func mockKnobBase() string {
	if u := os.Getenv("TESSERA_E2E_MOCK_KNOB_URL"); u != "" {
		return strings.TrimSuffix(u, "/")
	}
	return "http://127.0.0.1:9477"
}

// TesseraCLI builds cmd/tessera once per run.
func TesseraCLI(t *testing.T) string {
	t.Helper()
	path, err := buildCLI()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

var buildCLI = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "tessera-e2e-cli-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "tessera")
	out, err := exec.Command("go", "build", "-o", path, filepath.Join(RepoRoot, "cmd", "tessera")).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/tessera: %v\n%s", err, out)
	}
	return path, nil
})

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
