//go:build e2e

package e2e

// The hardened control surface (docs/security.md): the ResourceSlice policy
// pins the plugin's token to its own driver and pool, /metrics needs a token
// allowed to get it, and the webhook keeps answering while one replica goes.

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// pluginClient is a client with a token of the plugin's service account
// bound to its running pod, as the pod's own token is.
func pluginClient(t *testing.T, c *framework.Cluster) (kubernetes.Interface, string) {
	t.Helper()
	ctx := context.Background()
	pod, err := framework.PluginPod(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	return pluginTokenClient(t, c, pod), pod.Spec.NodeName
}

// TestPluginTokenCannotWriteOtherDriversSlices: on its own node, the plugin's
// token is refused a slice of another driver (create, and update and delete
// of one an admin created) and a slice of its driver in a pool other than
// the node's.
func TestPluginTokenCannotWriteOtherDriversSlices(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev")
	ctx := context.Background()
	plugin, node := pluginClient(t, c)
	slice := func(driver, pool string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-security-"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driver,
				NodeName: &node,
				Pool:     resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 1},
			},
		}
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	const otherDriver = "other.e2e.example.com"

	// The control: its own driver and pool is admitted (dry run).
	if _, err := plugin.ResourceV1().ResourceSlices().Create(ctx, slice(framework.Driver, node), dryRun); err != nil {
		t.Fatalf("the plugin's token may not create its own slice on %s: %v", node, err)
	}
	wantDriver := fmt.Sprintf("may only modify ResourceSlices of driver %s, not of driver '%s'", framework.Driver, otherDriver)
	_, err := plugin.ResourceV1().ResourceSlices().Create(ctx, slice(otherDriver, node), dryRun)
	framework.CheckDenied(t, "create another driver's slice", err, wantDriver)
	_, err = plugin.ResourceV1().ResourceSlices().Create(ctx, slice(framework.Driver, "e2e-other-pool"), dryRun)
	framework.CheckDenied(t, "create a slice in another pool", err, fmt.Sprintf("may only modify ResourceSlices of pool '%s', not of pool 'e2e-other-pool'", node))

	existing := c.CreateSlice(ctx, t, slice(otherDriver, node))
	changed := existing.DeepCopy()
	changed.Spec.Pool.Generation++
	_, err = plugin.ResourceV1().ResourceSlices().Update(ctx, changed, metav1.UpdateOptions{})
	framework.CheckDenied(t, "update another driver's slice", err, wantDriver)
	// Taking it over (turning it into one of its own) is refused too: by the
	// API server's own validation (spec.driver is immutable) before the
	// policy, which refuses it as well (deployments/helm/security_test.go).
	takeover := existing.DeepCopy()
	takeover.Spec.Driver = framework.Driver
	if _, err = plugin.ResourceV1().ResourceSlices().Update(ctx, takeover, metav1.UpdateOptions{}); err == nil {
		t.Error("the plugin's token took over another driver's slice")
	} else {
		t.Logf("take over another driver's slice: refused: %v", err)
	}
	err = plugin.ResourceV1().ResourceSlices().Delete(ctx, existing.Name, metav1.DeleteOptions{})
	framework.CheckDenied(t, "delete another driver's slice", err, wantDriver)
	if _, err := c.Client.ResourceV1().ResourceSlices().Get(ctx, existing.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the other driver's slice is gone: %v", err)
	}
}

// TestMetricsNeedAuthorization: an anonymous scrape and one by a
// ServiceAccount without the tessera-metrics-reader binding are refused, one
// bound to it is served; /healthz answers without a token (the kubelet's
// liveness probe has none).
func TestMetricsNeedAuthorization(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev")
	ctx := context.Background()
	metricsURL := operateMetricsURL()
	if !strings.HasPrefix(metricsURL, "https://") {
		t.Fatalf("the metrics URL %s is not HTTPS", metricsURL)
	}
	code, body, err := getMetrics(ctx, metricsURL, "")
	if err != nil {
		t.Fatal(err)
	}
	if code != 401 || strings.Contains(body, "tessera_") {
		t.Errorf("anonymous scrape: %d %.200q, want 401 and no series", code, body)
	}
	code, body, err = getMetrics(ctx, metricsURL, "not-a-token")
	if err != nil {
		t.Fatal(err)
	}
	if code != 401 {
		t.Errorf("scrape with a forged token: %d %.200q, want 401", code, body)
	}
	unbound, err := serviceAccountToken(ctx, c, "tessera-e2e-no-metrics", "")
	if err != nil {
		t.Fatal(err)
	}
	code, body, err = getMetrics(ctx, metricsURL, unbound)
	if err != nil {
		t.Fatal(err)
	}
	if code != 403 || strings.Contains(body, "tessera_") {
		t.Errorf("scrape by a ServiceAccount without the binding: %d %.200q, want 403", code, body)
	}
	reader, err := metricsToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The binding may take a moment to reach the authorizer's cache.
	deadline := time.Now().Add(time.Minute)
	for {
		code, body, err = getMetrics(ctx, metricsURL, reader)
		if err == nil && code == 200 && strings.Contains(body, "tessera_") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape by tessera-metrics-reader: %d %.300q %v, want 200 with tessera_ series", code, body, err)
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("authorized scrape: %d bytes", len(body))
	healthz := strings.TrimSuffix(metricsURL, "/metrics") + "/healthz"
	code, body, err = getMetrics(ctx, healthz, "")
	if err != nil || code != 200 || !strings.HasPrefix(body, "ok") {
		t.Errorf("anonymous /healthz: %d %q %v, want 200 ok", code, body, err)
	}
	// The test knob is not on the metrics server.
	code, _, err = getMetrics(ctx, strings.TrimSuffix(metricsURL, "/metrics")+"/mock/xid?"+url.Values{"gpu": {"0"}}.Encode(), reader)
	if err == nil && code != 404 && code != 405 {
		t.Errorf("/mock/xid on the metrics server: %d, want 404", code)
	}
}

// TestWebhookSurvivesReplicaDeletion: claims are created without a pause
// while one of the webhook's replicas is deleted; every create gets the
// webhook's answer (good claims admitted, a bad one refused with the field),
// none fails because the webhook could not be reached.
func TestWebhookSurvivesReplicaDeletion(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	ctx := context.Background()
	dep, err := c.Client.AppsV1().Deployments(framework.InstallNamespace).Get(ctx, "tessera-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 || dep.Status.ReadyReplicas < 2 {
		t.Skipf("the webhook has %d ready of %v replicas; this test needs 2 (webhook.replicas)", dep.Status.ReadyReplicas, dep.Spec.Replicas)
	}
	pods, err := c.Client.CoreV1().Pods(framework.InstallNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=webhook"})
	if err != nil || len(pods.Items) < 2 {
		t.Fatalf("webhook pods: %v (%d)", err, len(pods.Items))
	}
	ns := c.Namespace(t, "e2e-webhook-ha")
	claim := func(name, isolation string) *resourceapi.ResourceClaim {
		return framework.Claim{Name: name, Memory: "1Gi",
			Config: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"` + isolation + `":"Advisory"}}`}.ResourceClaim()
	}
	var created, refused atomic.Int64
	var mu sync.Mutex
	var failures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("c-%d-%d", w, i)
				bad := i%5 == 4
				field := "isolation"
				if bad {
					field = "isolaton"
				}
				_, err := c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim(name, field), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				switch {
				case !bad && err == nil:
					created.Add(1)
				case bad && err != nil && strings.Contains(err.Error(), "sharing.isolaton: unknown field"):
					refused.Add(1)
				default:
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s (bad %v): %v", name, bad, err))
					mu.Unlock()
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	time.Sleep(2 * time.Second)
	victim := pods.Items[0].Name
	t.Logf("deleting webhook pod %s while claims are created", victim)
	if err := c.Client.CoreV1().Pods(framework.InstallNamespace).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Keep creating through the deletion and the replacement's start.
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if _, err := c.Client.CoreV1().Pods(framework.InstallNamespace).Get(ctx, victim, metav1.GetOptions{}); err != nil {
			break
		}
		time.Sleep(time.Second)
	}
	time.Sleep(10 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d good claims admitted, %d bad ones refused by the webhook", created.Load(), refused.Load())
	if len(failures) > 0 {
		t.Errorf("%d creates did not get the webhook's answer, first: %s", len(failures), failures[0])
	}
	if created.Load() == 0 || refused.Load() == 0 {
		t.Errorf("nothing checked: %d admitted, %d refused", created.Load(), refused.Load())
	}
}
