package helm

import (
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

// TestKubeVersionMinimum: the chart installs only where the API server
// checks the kubelet plugin's claim status writes per driver and node
// (DRAResourceClaimGranularStatusAuthorization, beta and on by default from
// 1.36): on 1.35 the plugin's cluster-wide patch on resourceclaims/status
// would let one node's token rewrite any claim's status.
func TestKubeVersionMinimum(t *testing.T) {
	data, err := os.ReadFile(chartDir + "/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		KubeVersion string `json:"kubeVersion"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		t.Fatal(err)
	}
	if chart.KubeVersion != ">=1.36.0-0" {
		t.Errorf("Chart.yaml kubeVersion %q, want >=1.36.0-0", chart.KubeVersion)
	}
	for _, v := range []string{"1.34.0", "1.35.3"} {
		out, err := helm(t, "template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", v)
		if err == nil || !strings.Contains(out, "incompatible with Kubernetes") {
			t.Errorf("rendered for Kubernetes %s: %v\n%.300s", v, err, out)
		}
	}
	for _, v := range []string{"1.36.0", "1.36.0-gke.100", kubeVersion} {
		if _, err := helm(t, "template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", v); err != nil {
			t.Errorf("Kubernetes %s: %v", v, err)
		}
	}
}

// TestWebhookMemoryLimit: the webhook is told its container's memory limit,
// from which it sets the Go runtime's soft limit, and the chart's limit
// leaves room for its body budget.
func TestWebhookMemoryLimit(t *testing.T) {
	dep := find[appsv1.Deployment](t, objects(t, render(t)), "Deployment", "tessera-webhook")
	c := dep.Spec.Template.Spec.Containers[0]
	if v, _ := flagValue(c.Args, "memory-limit"); v != "$(MEMORY_LIMIT)" {
		t.Errorf("--memory-limit=%q, want $(MEMORY_LIMIT)", v)
	}
	var env *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == "MEMORY_LIMIT" {
			env = &c.Env[i]
		}
	}
	if env == nil || env.ValueFrom == nil || env.ValueFrom.ResourceFieldRef == nil ||
		env.ValueFrom.ResourceFieldRef.Resource != "limits.memory" || env.ValueFrom.ResourceFieldRef.ContainerName != c.Name {
		t.Errorf("MEMORY_LIMIT %+v, want limits.memory of container %s", env, c.Name)
	}
	if limit := c.Resources.Limits.Memory(); limit.Value() < 256<<20 {
		t.Errorf("memory limit %s, want at least 256Mi", limit)
	}
	// The host-network variant keeps the API server's address beside it.
	dep = find[appsv1.Deployment](t, objects(t, render(t, "-f", "../../demo/clusters/local/overlay/values.yaml")), "Deployment", "tessera-webhook")
	names := []string{}
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		names = append(names, e.Name)
	}
	if !slices.Contains(names, "MEMORY_LIMIT") || !slices.Contains(names, "KUBERNETES_SERVICE_HOST") {
		t.Errorf("host-network env %v, want MEMORY_LIMIT and KUBERNETES_SERVICE_HOST", names)
	}
}

// TestWebhookNetworkPolicy: off by default; on, it admits only the listed
// API server CIDRs to the webhook's port; it refuses to render without
// CIDRs or with the host network, where it would do nothing.
func TestWebhookNetworkPolicy(t *testing.T) {
	for _, o := range objects(t, render(t)) {
		if o.GetKind() == "NetworkPolicy" {
			t.Errorf("NetworkPolicy %s rendered by default", o.GetName())
		}
	}
	objs := objects(t, render(t, "--set", "webhook.networkPolicy.enabled=true",
		"--set", "webhook.networkPolicy.apiServerCIDRs={10.0.0.10/32,192.168.1.0/24}"))
	np := find[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", "tessera-webhook")
	dep := find[appsv1.Deployment](t, objs, "Deployment", "tessera-webhook")
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("podSelector %v does not select the webhook's pods %v", np.Spec.PodSelector.MatchLabels, dep.Spec.Template.Labels)
		}
	}
	if len(np.Spec.PodSelector.MatchLabels) == 0 {
		t.Error("empty podSelector selects every pod of the namespace")
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(np.Spec.Ingress) != 1 {
		t.Fatalf("policy %+v, want one ingress rule", np.Spec)
	}
	rule := np.Spec.Ingress[0]
	var cidrs []string
	for _, from := range rule.From {
		if from.IPBlock == nil || from.PodSelector != nil || from.NamespaceSelector != nil {
			t.Errorf("peer %+v, want an ipBlock only", from)
			continue
		}
		cidrs = append(cidrs, from.IPBlock.CIDR)
	}
	if !slices.Equal(cidrs, []string{"10.0.0.10/32", "192.168.1.0/24"}) {
		t.Errorf("from %v", cidrs)
	}
	if len(rule.Ports) != 1 || rule.Ports[0].Port.IntValue() != 9443 {
		t.Errorf("ports %+v, want the webhook's 9443", rule.Ports)
	}

	for name, args := range map[string][]string{
		"no CIDRs":     {"--set", "webhook.networkPolicy.enabled=true"},
		"host network": {"--set", "webhook.networkPolicy.enabled=true", "--set", "webhook.networkPolicy.apiServerCIDRs={10.0.0.10/32}", "--set", "webhook.hostNetwork=true"},
		"not a CIDR":   {"--set", "webhook.networkPolicy.enabled=true", "--set", "webhook.networkPolicy.apiServerCIDRs={kube-apiserver}"},
	} {
		out, err := helm(t, append([]string{"template", "tessera", chartDir, "--kube-version", kubeVersion}, args...)...)
		if err == nil {
			t.Errorf("%s: rendered", name)
			continue
		}
		if !strings.Contains(out, "networkPolicy") {
			t.Errorf("%s: error does not name webhook.networkPolicy: %s", name, out)
		}
	}
}
