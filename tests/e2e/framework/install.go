//go:build e2e

package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HelmValues upgrades the Tessera release with overrides on top of its
// current values (--reuse-values) and waits until a new plugin pod runs
// with them. The returned restore (also registered with t.Cleanup, so it runs
// when the test fails) puts back exactly the values the release had before
// (--reset-values with the saved user values) and waits for the plugin; it
// runs once. Tests that do not find Tessera installed as a helm release skip
// (fail when the suite installed it).
func HelmValues(t *testing.T, c *Cluster, overrides map[string]any) (restore func()) {
	t.Helper()
	return HelmUpgradeValues(t, c, overrides, true)
}

// HelmUpgradeValues is helmValues; with pluginRolls false the overrides
// leave the plugin's pod template alone (webhook or DeviceClass values), so
// only helm's --wait (the webhook Deployment's rollout) is waited for and the
// caller checks that the change took effect.
func HelmUpgradeValues(t *testing.T, c *Cluster, overrides map[string]any, pluginRolls bool) (restore func()) {
	t.Helper()
	ctx := context.Background()
	helm := HelmBinary(t)
	if out, err := exec.Command(helm, "status", "-n", InstallNamespace, InstallRelease).CombinedOutput(); err != nil {
		if os.Getenv("TESSERA_E2E_INSTALL") == "1" {
			t.Fatalf("helm status: %v\n%s", err, out)
		}
		t.Skipf("Tessera is not installed with helm as release %s/%s: %s", InstallNamespace, InstallRelease, out)
	}
	dir := t.TempDir()
	saved, err := exec.Command(helm, "get", "values", "-n", InstallNamespace, InstallRelease, "-o", "yaml").Output()
	if err != nil {
		t.Fatalf("helm get values: %v", err)
	}
	savedFile := filepath.Join(dir, "saved-values.yaml")
	overrideFile := filepath.Join(dir, "override-values.json")
	raw, err := json.Marshal(overrides)
	if err != nil {
		t.Fatal(err)
	}
	for path, data := range map[string][]byte{savedFile: saved, overrideFile: raw} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	chart := filepath.Join(RepoRoot, "deployments", "helm", "tessera")

	var once sync.Once
	restore = func() {
		once.Do(func() {
			start := time.Now()
			out, err := exec.Command(helm, "upgrade", InstallRelease, chart, "--namespace", InstallNamespace,
				"--reset-values", "-f", savedFile, "--wait", "--timeout", "4m").CombinedOutput()
			if err != nil {
				t.Errorf("restore the release's values: helm upgrade: %v\n%s", err, out)
				return
			}
			if _, err := c.ReadyPluginPod(ctx); err != nil {
				t.Errorf("after restoring the release's values: %v", err)
				return
			}
			t.Logf("release values restored (%v)", time.Since(start).Round(time.Second))
		})
	}
	t.Cleanup(restore)

	before, err := c.ReadyPluginPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := exec.Command(helm, "upgrade", InstallRelease, chart, "--namespace", InstallNamespace,
		"--reuse-values", "-f", overrideFile, "--wait", "--timeout", "4m").CombinedOutput()
	if err != nil {
		t.Fatalf("helm upgrade with %s: %v\n%s", raw, err, out)
	}
	if !pluginRolls {
		t.Logf("helm upgrade with %s (%v)", raw, time.Since(start).Round(time.Second))
		return restore
	}
	if err := c.WaitPluginReplaced(ctx, before.UID); err != nil {
		t.Fatalf("helm upgrade with %s: %v", raw, err)
	}
	t.Logf("helm upgrade with %s: plugin pod replaced (%v)", raw, time.Since(start).Round(time.Second))
	return restore
}

// What install.sh installs: release "tessera" of deployments/helm/tessera in
// namespace "tessera".
const (
	InstallNamespace = "tessera"
	InstallRelease   = "tessera"
	PluginSelector   = "app.kubernetes.io/instance=tessera,app.kubernetes.io/component=kubelet-plugin"
)

// RequireWebhook skips (or, when the suite installed Tessera, fails) without
// the chart's webhook configuration.
func RequireWebhook(t *testing.T, c *Cluster) {
	t.Helper()
	c.RequireDriver(t, "shared.gpu.tessera.dev")
	_, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), "tessera-webhook", metav1.GetOptions{})
	if err != nil {
		if os.Getenv("TESSERA_E2E_INSTALL") == "1" {
			t.Fatalf("webhook configuration tessera-webhook: %v", err)
		}
		t.Skipf("webhook configuration tessera-webhook: %v (install with the chart: demo/clusters/local/install.sh)", err)
	}
}

// PluginPod returns the running kubelet plugin pod (one node).
func PluginPod(ctx context.Context, c *Cluster) (*corev1.Pod, error) {
	pods, err := c.Client.CoreV1().Pods(InstallNamespace).List(ctx, metav1.ListOptions{LabelSelector: PluginSelector})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no running pod with %s in namespace %s", PluginSelector, InstallNamespace)
}

func CheckDenied(t *testing.T, op string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: the plugin's token was allowed to modify another node's ResourceSlice", op)
		return
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: refused with %v; want the policy's message %q", op, err, want)
		return
	}
	t.Logf("%s: refused: %v", op, err)
}

// CreateSlice creates the slice with the cluster's own (admin) client, for a
// test of what the plugin's token may do to it, and deletes it when the test
// ends.
func (c *Cluster) CreateSlice(ctx context.Context, t testing.TB, slice *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
	t.Helper()
	created, err := c.Client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("admin: create a slice of driver %s, pool %s: %v", slice.Spec.Driver, slice.Spec.Pool.Name, err)
	}
	t.Cleanup(func() {
		_ = c.Client.ResourceV1().ResourceSlices().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	return created
}

// HelmBinary finds the pinned helm the way deployments/helm's tests do:
// $TESSERA_HELM, the tools cache, PATH.
func HelmBinary(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv("TESSERA_HELM")}
	cache := os.Getenv("TESSERA_CACHE_DIR")
	if cache == "" {
		if dir, err := os.UserCacheDir(); err == nil {
			cache = filepath.Join(dir, "tessera")
		}
	}
	matches, _ := filepath.Glob(filepath.Join(cache, "bin-*", "helm"))
	candidates = append(candidates, matches...)
	if p, err := exec.LookPath("helm"); err == nil {
		candidates = append(candidates, p)
	}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if out, err := exec.Command(c, "version", "--template", "{{.Version}}").Output(); err == nil && strings.HasPrefix(string(out), "v3.") {
			return c
		}
	}
	t.Fatalf("no helm v3 found ($TESSERA_HELM, %s/bin-*/helm, PATH); demo/clusters/local/build-tools.sh builds it", cache)
	return ""
}

func ShortID(id string) string {
	if i := strings.LastIndex(id, "/"); i >= 0 {
		id = id[i+1:]
	}
	if len(id) > 12 {
		id = id[:12]
	}
	return id
}
