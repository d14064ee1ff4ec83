package helm

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// webhookDeployment is the rendered tessera-webhook Deployment and its
// container.
func webhookDeployment(t *testing.T, objs []*unstructured.Unstructured) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	d := find[appsv1.Deployment](t, objs, "Deployment", "tessera-webhook")
	return d, d.Spec.Template.Spec.Containers[0]
}

// grants reports whether the ClusterRole grants verb on group/resource.
func grants(role *rbacv1.ClusterRole, group, resource, verb string) bool {
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// hasKind reports whether an object of kind and name is rendered.
func hasKind(objs []*unstructured.Unstructured, kind, name string) bool {
	return slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind && o.GetName() == name })
}

// TestBudgetMetrics: with budgets, the webhook serves the budget metrics
// as the plugin serves its own (budgets.metrics): the flag on
// webhook.bindAddress:port, a named container port (none on the host
// network), the TokenReview and SubjectAccessReview grants its
// authentication needs, and the <release>-metrics-reader ClusterRole even
// when the plugin's metrics are off. The ServiceMonitor scrapes only the
// headless metrics Service, over HTTPS, verifying the certificate the
// webhook serves for the name it gives.
func TestBudgetMetrics(t *testing.T) {
	on := []string{"--set", "budgets.enabled=true"}
	t.Run("default", func(t *testing.T) {
		objs := objects(t, render(t, on...))
		_, c := webhookDeployment(t, objs)
		if v, ok := flagValue(c.Args, "budget-metrics-bind-address"); !ok || v != ":9479" {
			t.Errorf("--budget-metrics-bind-address=%q (set: %v), want :9479", v, ok)
		}
		if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "budget-metrics" && p.ContainerPort == 9479 }) {
			t.Errorf("no containerPort budget-metrics 9479: %+v", c.Ports)
		}
		role := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-webhook")
		if !grants(role, "authentication.k8s.io", "tokenreviews", "create") || !grants(role, "authorization.k8s.io", "subjectaccessreviews", "create") {
			t.Errorf("the webhook may not create tokenreviews and subjectaccessreviews: %+v", role.Rules)
		}
		if hasKind(objs, "ServiceMonitor", "tessera-webhook-budgets") || hasKind(objs, "Service", "tessera-webhook-budget-metrics") {
			t.Error("ServiceMonitor or metrics Service without budgets.metrics.serviceMonitor.enabled")
		}
	})
	t.Run("reader role without the plugin's metrics", func(t *testing.T) {
		objs := objects(t, render(t, append(on, "--set", "kubeletPlugin.metrics.enabled=false")...))
		reader := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-metrics-reader")
		if len(reader.Rules) != 1 || !slices.Equal(reader.Rules[0].NonResourceURLs, []string{"/metrics"}) || !slices.Equal(reader.Rules[0].Verbs, []string{"get"}) {
			t.Errorf("tessera-metrics-reader rules %+v, want get on /metrics", reader.Rules)
		}
		if hasKind(objs, "ClusterRole", "tessera-kubelet-plugin-auth-delegator") {
			t.Error("the plugin's auth-delegator role without the plugin's metrics")
		}
	})
	t.Run("hostNetwork", func(t *testing.T) {
		objs := objects(t, render(t, append(on, "--set", "webhook.hostNetwork=true", "--set", "webhook.bindAddress=127.0.0.1",
			"--set", "webhook.url=https://127.0.0.1:9443", "--set", "budgets.metrics.port=9480")...))
		_, c := webhookDeployment(t, objs)
		if v, _ := flagValue(c.Args, "budget-metrics-bind-address"); v != "127.0.0.1:9480" {
			t.Errorf("--budget-metrics-bind-address=%q, want 127.0.0.1:9480", v)
		}
		if len(c.Ports) != 0 {
			t.Errorf("ports on the host network: %+v", c.Ports)
		}
	})
	t.Run("metrics disabled", func(t *testing.T) {
		args := append(slices.Clone(on), "--set", "budgets.metrics.enabled=false", "--set", "budgets.metrics.serviceMonitor.enabled=true", "--set", "kubeletPlugin.metrics.enabled=false")
		objs := objects(t, render(t, args...))
		_, c := webhookDeployment(t, objs)
		if v, ok := flagValue(c.Args, "budget-metrics-bind-address"); ok {
			t.Errorf("--budget-metrics-bind-address=%q without budgets.metrics", v)
		}
		if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "budget-metrics" }) {
			t.Errorf("budget-metrics port without budgets.metrics: %+v", c.Ports)
		}
		role := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-webhook")
		if grants(role, "authentication.k8s.io", "tokenreviews", "create") {
			t.Error("the webhook may create tokenreviews without budgets.metrics")
		}
		for _, k := range [][2]string{{"ServiceMonitor", "tessera-webhook-budgets"}, {"Service", "tessera-webhook-budget-metrics"}, {"ClusterRole", "tessera-metrics-reader"}} {
			if hasKind(objs, k[0], k[1]) {
				t.Errorf("%s %s rendered without any metrics", k[0], k[1])
			}
		}
	})
	t.Run("budgets disabled", func(t *testing.T) {
		_, c := webhookDeployment(t, objects(t, render(t, "--set", "budgets.metrics.serviceMonitor.enabled=true")))
		if v, ok := flagValue(c.Args, "budget-metrics-bind-address"); ok {
			t.Errorf("--budget-metrics-bind-address=%q without budgets", v)
		}
	})
	t.Run("serviceMonitor", func(t *testing.T) {
		objs := objects(t, render(t, "-f", "testdata/values-budgets.yaml"))
		d, _ := webhookDeployment(t, objs)
		svc := find[corev1.Service](t, objs, "Service", "tessera-webhook-budget-metrics")
		if svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "budget-metrics" ||
			svc.Spec.Ports[0].Port != 9479 || svc.Spec.Ports[0].TargetPort.String() != "budget-metrics" {
			t.Errorf("metrics Service clusterIP %q ports %+v, want headless, budget-metrics 9479", svc.Spec.ClusterIP, svc.Spec.Ports)
		}
		for k, v := range svc.Spec.Selector {
			if d.Spec.Template.Labels[k] != v {
				t.Errorf("metrics Service selector %s=%s does not select the webhook pods", k, v)
			}
		}
		sm := find[unstructured.Unstructured](t, objs, "ServiceMonitor", "tessera-webhook-budgets")
		if sm.GetLabels()["release"] != "kube-prometheus-stack" {
			t.Errorf("ServiceMonitor labels %v lack serviceMonitor.labels", sm.GetLabels())
		}
		sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		selects := func(labels map[string]string) bool {
			for k, v := range sel {
				if labels[k] != v {
					return false
				}
			}
			return true
		}
		if !selects(svc.Labels) {
			t.Errorf("ServiceMonitor selector %v does not select the metrics Service %v", sel, svc.Labels)
		}
		if webhookSvc := find[corev1.Service](t, objs, "Service", "tessera-webhook"); selects(webhookSvc.Labels) {
			t.Errorf("ServiceMonitor selector %v also selects the webhook's Service", sel)
		}
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		if len(eps) != 1 {
			t.Fatalf("ServiceMonitor endpoints %v", eps)
		}
		ep := eps[0].(map[string]any)
		str := func(path ...string) string { v, _, _ := unstructured.NestedString(ep, path...); return v }
		if str("port") != "budget-metrics" || str("path") != "/metrics" || str("scheme") != "https" || str("interval") != "15s" ||
			str("bearerTokenFile") != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
			t.Errorf("ServiceMonitor endpoint %v", ep)
		}
		if skip, _, _ := unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify"); skip {
			t.Error("the ServiceMonitor does not verify the webhook's certificate")
		}
		// The CA and name it verifies with are those of the certificate the
		// webhook serves (its TLS Secret, mounted in the pod).
		secret := find[corev1.Secret](t, objs, "Secret", str("tlsConfig", "ca", "secret", "name"))
		if d.Spec.Template.Spec.Volumes[0].Secret == nil || d.Spec.Template.Spec.Volumes[0].Secret.SecretName != secret.Name {
			t.Errorf("the webhook serves %+v, the ServiceMonitor verifies with Secret %s", d.Spec.Template.Spec.Volumes[0], secret.Name)
		}
		pemOf := func(key string) []byte {
			if v, ok := secret.Data[key]; ok {
				return v
			}
			b, err := base64.StdEncoding.DecodeString(secret.StringData[key])
			if err != nil {
				t.Fatalf("Secret %s %s: %v", secret.Name, key, err)
			}
			return b
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pemOf(str("tlsConfig", "ca", "secret", "key"))) {
			t.Fatalf("Secret %s has no CA under %q", secret.Name, str("tlsConfig", "ca", "secret", "key"))
		}
		block, _ := pem.Decode(pemOf("tls.crt"))
		if block == nil {
			t.Fatalf("Secret %s: tls.crt is not PEM", secret.Name)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: str("tlsConfig", "serverName")}); err != nil {
			t.Errorf("the webhook's certificate does not verify for serverName %q: %v", str("tlsConfig", "serverName"), err)
		}
	})
}
