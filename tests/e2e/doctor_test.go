//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	"github.com/tessera-dev/tessera/pkg/doctor"
)

// kubectlBinary is the kubectl the cluster tools put in the cache, else
// the one in PATH.
func kubectlBinary(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("TESSERA_CACHE_DIR")
	if cache == "" {
		if dir, err := os.UserCacheDir(); err == nil {
			cache = filepath.Join(dir, "tessera")
		}
	}
	matches, _ := filepath.Glob(filepath.Join(cache, "bin-*", "kubectl"))
	if len(matches) > 0 {
		return matches[0]
	}
	p, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skipf("no kubectl (%s/bin-*/kubectl or PATH): %v", cache, err)
	}
	return p
}

// kubectlTessera runs "kubectl tessera ARGS" with the tessera CLI
// installed as the kubectl plugin kubectl-tessera (what make kubectl-plugin
// builds), and returns stdout, stderr and the error.
func kubectlTessera(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(framework.TesseraCLI(t), filepath.Join(dir, "kubectl-tessera")); err != nil {
		t.Fatal(err)
	}
	kubectl := kubectlBinary(t)
	cmd := exec.Command(kubectl, append([]string{"tessera"}, args...)...)
	// kubectl finds plugins in PATH; doctor runs "kubectl exec" with the
	// same kubectl.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+framework.Kubeconfig(t), "PATH="+dir+string(os.PathListSeparator)+filepath.Dir(kubectl)+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// TestDoctorOnMockNode: "kubectl tessera doctor NODE" runs the plugin's
// doctor in the plugin pod through kubectl exec. On the local cluster's
// mock node it checks with the running plugin's settings and passes: NVML
// is the mock's, the kubelet's sockets answer, the clock agrees with the
// API server's, and what a mock node lacks is skipped with the reason.
func TestDoctorOnMockNode(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev")
	pod, err := c.ReadyPluginPod(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	node := pod.Spec.NodeName

	out, stderr, err := kubectlTessera(t, "doctor", node, "--kubeconfig", framework.Kubeconfig(t), "-o", "json")
	if err != nil {
		t.Fatalf("kubectl tessera doctor %s -o json: %v\n%s\n%s", node, err, out, stderr)
	}
	var report doctor.Report
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("doctor -o json: %v\n%s", err, out)
	}
	if report.Node != node || !strings.Contains(report.Config, "running plugin") {
		t.Errorf("report of node %q (%s), want %s with the running plugin's settings", report.Node, report.Config, node)
	}
	byCheck := map[string]doctor.Result{}
	for _, r := range report.Results {
		byCheck[r.Check] = r
		t.Logf("%-4s %-20s %s", r.Status, r.Check, r.Message)
	}
	for check, want := range map[string]struct {
		status doctor.Status
		says   string
	}{
		"nvml":                 {doctor.OK, "mock of profile hgx-h100"},
		"kubelet-registration": {doctor.OK, "accepts connections"},
		"dra-socket":           {doctor.OK, "accepts connections"},
		"mps-image":            {doctor.OK, "tessera-kubelet-plugin"},
		"clock-skew":           {doctor.OK, "the API server's"},
		"toolkit-cdi":          {doctor.Skip, "mock profile hgx-h100"},
		"mps-binary":           {doctor.Skip, "mock profile hgx-h100"},
		"driver-memory":        {doctor.Skip, "mock profile hgx-h100"},
	} {
		got, ok := byCheck[check]
		if !ok {
			t.Errorf("no %s line", check)
			continue
		}
		if got.Status != want.status || !strings.Contains(got.Message, want.says) {
			t.Errorf("%s: %s %q, want %s saying %q", check, got.Status, got.Message, want.status, want.says)
		}
	}
	if n := report.Count(doctor.Fail); n != 0 {
		t.Errorf("%d checks failed on the local cluster's node", n)
	}

	// The table, without naming the node (the cluster has one).
	table, stderr, err := kubectlTessera(t, "doctor", "--kubeconfig", framework.Kubeconfig(t))
	if err != nil || !strings.Contains(table, "Node "+node) || !strings.Contains(table, " 0 FAIL") {
		t.Errorf("kubectl tessera doctor: %v, want a table for node %s without failures:\n%s\n%s", err, node, table, stderr)
	}
	t.Logf("kubectl tessera doctor:\n%s", table)

	// A node without the plugin: the error says so, the exit status is 1.
	_, stderr, err = kubectlTessera(t, "doctor", "no-such-node", "--kubeconfig", framework.Kubeconfig(t))
	if err == nil || !strings.Contains(stderr, "no running kubelet plugin pod") || !strings.Contains(stderr, "on node no-such-node") {
		t.Errorf("doctor no-such-node: %v, stderr %q", err, stderr)
	}
}
