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

// TestWebhookNetworkPolicy: on by default, admitting any source to the
// webhook's port only; with podCIDRs any address but those; with
// apiServerCIDRs only those; none with the host network (where it would do
// nothing), and an error when CIDRs are given there; the budget metrics
// port open to any address.
func TestWebhookNetworkPolicy(t *testing.T) {
	// rule is the policy's rule for port: its ipBlocks as "cidr except..".
	rule := func(t *testing.T, np *networkingv1.NetworkPolicy, port int) []string {
		t.Helper()
		for _, r := range np.Spec.Ingress {
			if len(r.Ports) != 1 || r.Ports[0].Port.IntValue() != port {
				continue
			}
			blocks := []string{}
			for _, from := range r.From {
				if from.IPBlock == nil || from.PodSelector != nil || from.NamespaceSelector != nil {
					t.Errorf("peer %+v, want an ipBlock only", from)
					continue
				}
				blocks = append(blocks, strings.Join(append([]string{from.IPBlock.CIDR}, from.IPBlock.Except...), " except "))
			}
			return blocks
		}
		t.Fatalf("no rule for port %d in %+v", port, np.Spec.Ingress)
		return nil
	}
	policy := func(t *testing.T, args ...string) *networkingv1.NetworkPolicy {
		t.Helper()
		objs := objects(t, render(t, args...))
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
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("policy types %v, want Ingress", np.Spec.PolicyTypes)
		}
		return np
	}
	for name, tc := range map[string]struct {
		args []string
		want []string
	}{
		"default": {nil, []string{}}, // from anywhere: no peer
		"pod CIDRs": {[]string{"--set", "webhook.networkPolicy.podCIDRs={10.244.0.0/16,fd00:10:244::/56}"},
			[]string{"0.0.0.0/0 except 10.244.0.0/16", "::/0 except fd00:10:244::/56"}},
		"API server CIDRs": {[]string{"--set", "webhook.networkPolicy.apiServerCIDRs={10.0.0.10/32,192.168.1.0/24}",
			"--set", "webhook.networkPolicy.podCIDRs={10.244.0.0/16}"}, []string{"10.0.0.10/32", "192.168.1.0/24"}},
	} {
		np := policy(t, tc.args...)
		if got := rule(t, np, 9443); !slices.Equal(got, tc.want) {
			t.Errorf("%s: from %q, want %q", name, got, tc.want)
		}
		if len(np.Spec.Ingress) != 1 {
			t.Errorf("%s: %d rules, want the webhook port's only", name, len(np.Spec.Ingress))
		}
	}
	np := policy(t, "--set", "budgets.enabled=true", "--set", "budgets.metrics.enabled=true",
		"--set", "webhook.networkPolicy.apiServerCIDRs={10.0.0.10/32}")
	if len(np.Spec.Ingress) != 2 || len(np.Spec.Ingress[1].From) != 0 || len(np.Spec.Ingress[1].Ports) != 1 {
		t.Errorf("with budget metrics: rules %+v, want the webhook port's and the metrics port's from anywhere", np.Spec.Ingress)
	}
	for _, args := range [][]string{
		{"--set", "webhook.networkPolicy.enabled=false"},
		{"--set", "webhook.hostNetwork=true"},
	} {
		for _, o := range objects(t, render(t, args...)) {
			if o.GetKind() == "NetworkPolicy" && o.GetName() == "tessera-webhook" {
				t.Errorf("%v: NetworkPolicy rendered", args)
			}
		}
	}

	for name, args := range map[string][]string{
		"host network":    {"--set", "webhook.networkPolicy.apiServerCIDRs={10.0.0.10/32}", "--set", "webhook.hostNetwork=true"},
		"not a CIDR":      {"--set", "webhook.networkPolicy.apiServerCIDRs={kube-apiserver}"},
		"pods not a CIDR": {"--set", "webhook.networkPolicy.podCIDRs={pods}"},
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

// TestWebhookClientAuth: off by default; on, the webhook verifies client
// certificates against the CA of caBundle (a ConfigMap the chart renders)
// or of existingConfigMap, for the names given, and refuses unverified
// reviews unless require is false; a missing, doubled or base64 CA is an
// error.
func TestWebhookClientAuth(t *testing.T) {
	args := func(dep *appsv1.Deployment) string {
		return strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
	}
	dep := find[appsv1.Deployment](t, objects(t, render(t)), "Deployment", "tessera-webhook")
	if a := args(dep); strings.Contains(a, "--client-ca-file") || strings.Contains(a, "--require-client-cert") {
		t.Errorf("client certificates by default: %s", a)
	}
	const pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	objs := objects(t, render(t, "--set", "webhook.clientAuth.enabled=true", "--set", "webhook.clientAuth.caBundle="+pem))
	dep = find[appsv1.Deployment](t, objs, "Deployment", "tessera-webhook")
	for _, want := range []string{"--client-ca-file=/etc/tessera-webhook/client-ca/ca.crt", "--client-names=kube-apiserver", "--require-client-cert=true"} {
		if !strings.Contains(args(dep), want) {
			t.Errorf("args %s, want %s", args(dep), want)
		}
	}
	cm := find[corev1.ConfigMap](t, objs, "ConfigMap", "tessera-webhook-client-ca")
	if !strings.HasPrefix(cm.Data["ca.crt"], "-----BEGIN CERTIFICATE-----\nMIIB\n") {
		t.Errorf("ConfigMap ca.crt %q", cm.Data["ca.crt"])
	}
	mounted := false
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == "tessera-webhook-client-ca" {
			mounted = true
		}
	}
	if !mounted {
		t.Error("the client CA ConfigMap is not a volume of the webhook")
	}

	objs = objects(t, render(t, "--set", "webhook.clientAuth.enabled=true", "--set", "webhook.clientAuth.existingConfigMap=my-ca",
		"--set", "webhook.clientAuth.names={apiserver-a,apiserver-b}", "--set", "webhook.clientAuth.require=false"))
	dep = find[appsv1.Deployment](t, objs, "Deployment", "tessera-webhook")
	for _, want := range []string{"--client-names=apiserver-a,apiserver-b", "--require-client-cert=false"} {
		if !strings.Contains(args(dep), want) {
			t.Errorf("args %s, want %s", args(dep), want)
		}
	}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == "tessera-webhook-client-ca" {
			t.Error("a client CA ConfigMap rendered beside existingConfigMap")
		}
	}

	for name, extra := range map[string][]string{
		"no CA":  nil,
		"both":   {"--set", "webhook.clientAuth.caBundle=" + pem, "--set", "webhook.clientAuth.existingConfigMap=my-ca"},
		"base64": {"--set", "webhook.clientAuth.caBundle=LS0tLS1CRUdJTg=="},
	} {
		a := append([]string{"template", "tessera", chartDir, "--kube-version", kubeVersion, "--set", "webhook.clientAuth.enabled=true"}, extra...)
		out, err := helm(t, a...)
		if err == nil {
			t.Errorf("%s: rendered", name)
			continue
		}
		if !strings.Contains(out, "webhook.clientAuth") {
			t.Errorf("%s: error does not name webhook.clientAuth: %s", name, out)
		}
	}
}
