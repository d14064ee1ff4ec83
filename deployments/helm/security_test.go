package helm

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/authentication/user"
)

func volumeByName(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// hostMounts maps each mount path of c to its hostPath and read-only flag.
func hostMounts(t *testing.T, spec corev1.PodSpec, c corev1.Container) map[string]struct {
	host     string
	readOnly bool
} {
	t.Helper()
	out := map[string]struct {
		host     string
		readOnly bool
	}{}
	for _, m := range c.VolumeMounts {
		v := volumeByName(spec, m.Name)
		if v == nil {
			t.Fatalf("mount %s of an undeclared volume %s", m.MountPath, m.Name)
		}
		if v.HostPath != nil {
			out[m.MountPath] = struct {
				host     string
				readOnly bool
			}{v.HostPath.Path, m.ReadOnly}
		}
	}
	return out
}

// TestPluginLeastPrivilege: what the plugin pod gets on real GPUs and with a
// mock profile — the securityContext, hostPID and every host path.
func TestPluginLeastPrivilege(t *testing.T) {
	t.Run("real GPUs, driver on the host", func(t *testing.T) {
		ds, c := pluginDaemonSet(t)
		spec := ds.Spec.Template.Spec
		if spec.HostPID {
			t.Error("hostPID by default: the host's /proc is mounted instead")
		}
		if spec.SecurityContext == nil || spec.SecurityContext.SeccompProfile == nil || spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("pod securityContext %+v, want seccompProfile RuntimeDefault", spec.SecurityContext)
		}
		sc := c.SecurityContext
		if sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("container securityContext %+v, want privileged (device access) with a read-only root filesystem", sc)
		}
		if v, _ := flagValue(c.Args, "proc-root"); v != "/host/proc" {
			t.Errorf("--proc-root=%q, want /host/proc", v)
		}
		mounts := hostMounts(t, spec, c)
		want := map[string]struct {
			host     string
			readOnly bool
		}{
			"/host/proc":                               {"/proc", true},
			"/driver-root/usr/lib":                     {"/usr/lib", true},
			"/driver-root/usr/lib64":                   {"/usr/lib64", true},
			"/driver-root/usr/bin":                     {"/usr/bin", true},
			"/driver-root/dev":                         {"/dev", true},
			"/dev":                                     {"/dev", false},
			"/host/sys/fs/cgroup":                      {"/sys/fs/cgroup", true},
			"/host/usr/bin":                            {"/usr/bin", true},
			"/etc/cdi":                                 {"/etc/cdi", true},
			"/var/run/cdi":                             {"/var/run/cdi", false},
			"/var/run/tessera/hami-claims":             {"/var/run/tessera/hami-claims", false},
			"/var/lib/kubelet/plugins_registry":        {"/var/lib/kubelet/plugins_registry", false},
			"/var/lib/kubelet/plugins/gpu.tessera.dev": {"/var/lib/kubelet/plugins/gpu.tessera.dev", false},
		}
		for path, w := range want {
			if got, ok := mounts[path]; !ok || got != w {
				t.Errorf("mount %s: %+v (present %v), want host %s read-only %v", path, got, ok, w.host, w.readOnly)
			}
		}
		for path, m := range mounts {
			if _, ok := want[path]; !ok {
				t.Errorf("unexpected host mount %s <- %s", path, m.host)
			}
			if m.host == "/" {
				t.Errorf("the host's / is mounted at %s", path)
			}
		}
	})
	t.Run("GPU Operator driver root", func(t *testing.T) {
		ds, c := pluginDaemonSet(t, "--set", "kubeletPlugin.driverRoot=/run/nvidia/driver")
		mounts := hostMounts(t, ds.Spec.Template.Spec, c)
		if m := mounts["/driver-root"]; m.host != "/run/nvidia/driver" || !m.readOnly {
			t.Errorf("/driver-root <- %+v, want the driver container's root read-only", m)
		}
		if _, ok := mounts["/driver-root/usr/lib"]; ok {
			t.Error("host library directories mounted with a driver root of its own")
		}
	})
	t.Run("hostPID opt-in", func(t *testing.T) {
		ds, c := pluginDaemonSet(t, "--set", "kubeletPlugin.metrics.hostPID=true")
		if !ds.Spec.Template.Spec.HostPID {
			t.Error("metrics.hostPID=true renders no hostPID")
		}
		if _, ok := flagValue(c.Args, "proc-root"); ok {
			t.Error("--proc-root with hostPID: /proc is the host's already")
		}
		if _, ok := hostMounts(t, ds.Spec.Template.Spec, c)["/host/proc"]; ok {
			t.Error("/host/proc mounted with hostPID")
		}
	})
	t.Run("mock profile", func(t *testing.T) {
		ds, c := pluginDaemonSet(t, "--set", "kubeletPlugin.mockProfile=hgx-h100")
		spec := ds.Spec.Template.Spec
		sc := c.SecurityContext
		if spec.HostPID || sc == nil || sc.Privileged == nil || *sc.Privileged ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("mock profile: hostPID %v, securityContext %+v; want unprivileged, no escalation, read-only root, all capabilities dropped", spec.HostPID, sc)
		}
		for path, m := range hostMounts(t, spec, c) {
			if strings.HasPrefix(path, "/dev") || strings.HasPrefix(path, "/driver-root") || strings.HasPrefix(path, "/host/") {
				t.Errorf("mock profile mounts %s <- %s", path, m.host)
			}
		}
	})
	t.Run("metrics server", func(t *testing.T) {
		ds, c := pluginDaemonSet(t, "--set", "kubeletPlugin.metrics.bindAddress=10.0.0.1",
			"--set", "kubeletPlugin.metrics.tlsSecretName=metrics-tls", "--set", "kubeletPlugin.metrics.maxInFlight=2")
		for name, want := range map[string]string{
			"metrics-address":         "10.0.0.1:9477",
			"metrics-tls-cert-file":   "/etc/tessera-metrics/tls/tls.crt",
			"metrics-tls-key-file":    "/etc/tessera-metrics/tls/tls.key",
			"metrics-max-in-flight":   "2",
			"metrics-request-timeout": "30s",
		} {
			if v, _ := flagValue(c.Args, name); v != want {
				t.Errorf("--%s=%q, want %q", name, v, want)
			}
		}
		if v := volumeByName(ds.Spec.Template.Spec, "metrics-tls"); v == nil || v.Secret == nil || v.Secret.SecretName != "metrics-tls" {
			t.Errorf("metrics-tls volume %+v", v)
		}
		p := c.LivenessProbe
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Host != "10.0.0.1" {
			t.Errorf("livenessProbe %+v, want HTTPS on 10.0.0.1", p)
		}
		if _, ok := flagValue(c.Args, "mock-fault-injection-address"); ok {
			t.Error("the mock knob's address on real GPUs")
		}
	})
}

// sliceRequest evaluates the ResourceSlice policy on a request by u; obj is
// the slice after the request (nil on DELETE), old before it (nil on
// CREATE). It returns the messages of the validations that deny it.
func sliceRequest(t *testing.T, v validating.Validator, op admission.Operation, obj, old *resourceapi.ResourceSlice, u user.Info) []string {
	t.Helper()
	gvr := resourceapi.SchemeGroupVersion.WithResource("resourceslices")
	gvk := resourceapi.SchemeGroupVersion.WithKind("ResourceSlice")
	toObj := func(s *resourceapi.ResourceSlice) runtime.Object {
		if s == nil {
			return nil
		}
		return s
	}
	name := ""
	if obj != nil {
		name = obj.Name
	} else {
		name = old.Name
	}
	return denials(v, gvk, gvr, "", op, toObj(obj), toObj(old), "", name, u)
}

// TestResourceSlicePolicy compiles the chart's ResourceSlice policy as the
// API server does and evaluates it: the plugin's token on node-a may create,
// update and delete only slices of driver gpu.tessera.dev in pool node-a on
// node-a.
func TestResourceSlicePolicy(t *testing.T) {
	objs := objects(t, render(t))
	policy := find[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", "tessera-kubelet-plugin-resourceslices")
	binding := find[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding", "tessera-kubelet-plugin-resourceslices")
	if !slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("binding actions %v, want Deny", binding.Spec.ValidationActions)
	}
	if ops := policy.Spec.MatchConstraints.ResourceRules[0].Operations; !slices.Equal(ops, []admissionregistrationv1.OperationType{"CREATE", "UPDATE", "DELETE"}) {
		t.Errorf("operations %v", ops)
	}
	v := compiledPolicy(t, policy)
	slice := func(driver, node, pool string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "s-" + driver + "-" + node + "-" + pool},
			Spec:       resourceapi.ResourceSliceSpec{Driver: driver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 1}},
		}
	}
	own := slice("gpu.tessera.dev", "node-a", "node-a")
	otherDriver := slice("other.example.com", "node-a", "node-a")
	otherPool := slice("gpu.tessera.dev", "node-a", "pool-x")
	otherNode := slice("gpu.tessera.dev", "node-b", "node-b")
	plugin := pluginUser("node-a")
	admin := &user.DefaultInfo{Name: "admin", Groups: []string{"system:masters"}}
	noNode := &user.DefaultInfo{Name: plugin.GetName(), Groups: plugin.GetGroups()}
	tests := []struct {
		name     string
		op       admission.Operation
		obj, old *resourceapi.ResourceSlice
		u        user.Info
		want     string // "" admitted
	}{
		{"own slice create", admission.Create, own, nil, plugin, ""},
		{"own slice update", admission.Update, own, own, plugin, ""},
		{"own slice delete", admission.Delete, nil, own, plugin, ""},
		{"other driver create", admission.Create, otherDriver, nil, plugin, "not of driver 'other.example.com'"},
		{"other driver update", admission.Update, otherDriver, otherDriver, plugin, "not of driver 'other.example.com'"},
		{"other driver delete", admission.Delete, nil, otherDriver, plugin, "not of driver 'other.example.com'"},
		{"other driver taken over", admission.Update, own, otherDriver, plugin, "may not update a ResourceSlice that was not of driver gpu.tessera.dev"},
		{"other pool create", admission.Create, otherPool, nil, plugin, "not of pool 'pool-x'"},
		{"other pool delete", admission.Delete, nil, otherPool, plugin, "not of pool 'pool-x'"},
		{"other node create", admission.Create, otherNode, nil, plugin, "may not modify ResourceSlices of node 'node-b'"},
		{"other node moved here", admission.Update, own, otherNode, plugin, "may not update a ResourceSlice"},
		{"other node delete", admission.Delete, nil, otherNode, plugin, "may not modify ResourceSlices of node 'node-b'"},
		{"token without a node", admission.Create, own, nil, noNode, "must use a pod-bound service account token"},
		{"admin is not matched", admission.Delete, nil, otherDriver, admin, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			denied := sliceRequest(t, v, tc.op, tc.obj, tc.old, tc.u)
			switch {
			case tc.want == "" && len(denied) > 0:
				t.Errorf("denied: %v", denied)
			case tc.want != "" && !slices.ContainsFunc(denied, func(m string) bool { return strings.Contains(m, tc.want) }):
				t.Errorf("denials %v, want one with %q", denied, tc.want)
			}
		})
	}
}

func TestResourceSlicePolicyNeedsAcknowledgement(t *testing.T) {
	out, err := helm(t, "template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", kubeVersion, "--set", "resourceSlicePolicy.enabled=false")
	if err == nil || !strings.Contains(out+err.Error(), "resourceSlicePolicy.iUnderstandAnyNodeCanWriteAnySlice=true") {
		t.Fatalf("rendered without the policy and without the acknowledgement: %v\n%.500s", err, out)
	}
	for _, o := range objects(t, render(t, "--set", "resourceSlicePolicy.enabled=false", "--set", "resourceSlicePolicy.iUnderstandAnyNodeCanWriteAnySlice=true")) {
		if strings.HasSuffix(o.GetName(), "-resourceslices") {
			t.Errorf("%s %s rendered with the policy off", o.GetKind(), o.GetName())
		}
	}
}

// TestMetricsAccess: scrapers need the metrics-reader ClusterRole, the plugin
// may ask the API server about their tokens, the ServiceMonitor sends a token
// over HTTPS, and the optional NetworkPolicy opens only the metrics port.
func TestMetricsAccess(t *testing.T) {
	objs := objects(t, render(t, "-f", "testdata/values-servicemonitor.yaml",
		"--set", "kubeletPlugin.metrics.networkPolicy.enabled=true",
		"--set", "kubeletPlugin.metrics.readers[0].kind=ServiceAccount",
		"--set", "kubeletPlugin.metrics.readers[0].name=prometheus",
		"--set", "kubeletPlugin.metrics.readers[0].namespace=monitoring"))
	reader := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-metrics-reader")
	if len(reader.Rules) != 1 || !slices.Equal(reader.Rules[0].NonResourceURLs, []string{"/metrics"}) || !slices.Equal(reader.Rules[0].Verbs, []string{"get"}) {
		t.Errorf("metrics-reader rules %+v, want get on /metrics only", reader.Rules)
	}
	readers := find[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", "tessera-metrics-reader")
	if len(readers.Subjects) != 1 || readers.Subjects[0].Name != "prometheus" || readers.Subjects[0].Namespace != "monitoring" {
		t.Errorf("metrics-reader subjects %+v", readers.Subjects)
	}
	delegator := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-kubelet-plugin-auth-delegator")
	var got []string
	for _, r := range delegator.Rules {
		for _, res := range r.Resources {
			got = append(got, r.APIGroups[0]+"/"+res+":"+strings.Join(r.Verbs, ","))
		}
	}
	if want := []string{"authentication.k8s.io/tokenreviews:create", "authorization.k8s.io/subjectaccessreviews:create"}; !slices.Equal(got, want) {
		t.Errorf("auth-delegator rules %v, want %v", got, want)
	}
	binding := find[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", "tessera-kubelet-plugin-auth-delegator")
	if len(binding.Subjects) != 1 || binding.Subjects[0].Name != "tessera-kubelet-plugin" {
		t.Errorf("auth-delegator subjects %+v", binding.Subjects)
	}
	for _, o := range objs {
		if o.GetKind() != "ServiceMonitor" {
			continue
		}
		endpoints, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
		ep := endpoints[0].(map[string]any)
		if ep["scheme"] != "https" || ep["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
			t.Errorf("ServiceMonitor endpoint %v, want https with the bearer token", ep)
		}
	}
	// With the admin's certificate, its CA and a dedicated scraper's token
	// Secret, the ServiceMonitor verifies the plugin and sends that token.
	verified := objects(t, render(t, "-f", "testdata/values-servicemonitor.yaml",
		"--set", "kubeletPlugin.metrics.tlsSecretName=tessera-metrics-tls",
		"--set", "kubeletPlugin.metrics.serviceMonitor.ca.secret.name=tessera-metrics-ca,kubeletPlugin.metrics.serviceMonitor.ca.secret.key=ca.crt",
		"--set", "kubeletPlugin.metrics.serviceMonitor.authorization.type=Bearer,kubeletPlugin.metrics.serviceMonitor.authorization.credentials.name=scraper,kubeletPlugin.metrics.serviceMonitor.authorization.credentials.key=token"))
	var monitors int
	for _, o := range verified {
		if o.GetKind() != "ServiceMonitor" {
			continue
		}
		monitors++
		endpoints, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
		ep := endpoints[0].(map[string]any)
		tlsConfig, _ := ep["tlsConfig"].(map[string]any)
		want := map[string]any{
			"insecureSkipVerify": false,
			"serverName":         "tessera-kubelet-plugin-metrics.tessera.svc",
			"ca":                 map[string]any{"secret": map[string]any{"name": "tessera-metrics-ca", "key": "ca.crt"}},
		}
		if diff := cmp.Diff(want, tlsConfig); diff != "" {
			t.Errorf("ServiceMonitor tlsConfig (-want +got):\n%s", diff)
		}
		wantAuth := map[string]any{"type": "Bearer", "credentials": map[string]any{"name": "scraper", "key": "token"}}
		if diff := cmp.Diff(wantAuth, ep["authorization"]); diff != "" || ep["bearerTokenFile"] != nil {
			t.Errorf("ServiceMonitor authorization (-want +got):\n%s\nbearerTokenFile %v, want none", diff, ep["bearerTokenFile"])
		}
	}
	if monitors != 1 {
		t.Errorf("%d ServiceMonitors with a CA, want 1", monitors)
	}
	if out, err := helm(t, "template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", kubeVersion, "-f", "testdata/values-servicemonitor.yaml",
		"--set", "kubeletPlugin.metrics.serviceMonitor.ca.secret.name=tessera-metrics-ca,kubeletPlugin.metrics.serviceMonitor.ca.secret.key=ca.crt"); err == nil || !strings.Contains(out+err.Error(), "needs kubeletPlugin.metrics.tlsSecretName") {
		t.Errorf("serviceMonitor.ca without tlsSecretName rendered: %v", err)
	}
	np := find[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", "tessera-kubelet-plugin")
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.IntValue() != 9478 { // values-servicemonitor.yaml
		t.Errorf("NetworkPolicy ingress %+v, want the metrics port only", np.Spec.Ingress)
	}
	for _, o := range objects(t, render(t)) {
		if o.GetKind() == "NetworkPolicy" && o.GetName() == "tessera-kubelet-plugin" {
			t.Error("the metrics NetworkPolicy by default")
		}
	}
}

// TestWebhookAvailability: two replicas spread over nodes, a PDB, the
// concurrency cap, the DeviceClass rule, and a stable render with a
// pre-created Secret.
func TestWebhookAvailability(t *testing.T) {
	objs := objects(t, render(t))
	dep := find[appsv1.Deployment](t, objs, "Deployment", "tessera-webhook")
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", dep.Spec.Replicas)
	}
	aff := dep.Spec.Template.Spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("affinity %+v, want preferred anti-affinity per hostname", aff)
	}
	if v, _ := flagValue(dep.Spec.Template.Spec.Containers[0].Args, "max-in-flight"); v != "32" {
		t.Errorf("--max-in-flight=%q", v)
	}
	pdb := find[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", "tessera-webhook")
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.Selector.MatchLabels["app.kubernetes.io/component"] != "webhook" {
		t.Errorf("PDB %+v", pdb.Spec)
	}
	cfg := find[admissionregistrationv1.ValidatingWebhookConfiguration](t, objs, "ValidatingWebhookConfiguration", "tessera-webhook")
	var classes *admissionregistrationv1.ValidatingWebhook
	for i := range cfg.Webhooks {
		if cfg.Webhooks[i].Name == "deviceclasses.gpu.tessera.dev" {
			classes = &cfg.Webhooks[i]
		}
	}
	if classes == nil {
		t.Fatal("no webhook for deviceclasses")
	}
	rule := classes.Rules[0]
	if !slices.Equal(rule.Operations, []admissionregistrationv1.OperationType{"CREATE", "UPDATE"}) || *rule.Scope != admissionregistrationv1.ClusterScope ||
		*classes.FailurePolicy != admissionregistrationv1.Ignore || classes.NamespaceSelector != nil && len(classes.NamespaceSelector.MatchLabels) > 0 {
		t.Errorf("deviceclasses webhook %+v", classes)
	}

	t.Run("host network", func(t *testing.T) {
		dep := find[appsv1.Deployment](t, objects(t, render(t, "-f", "../../demo/clusters/local/overlay/values.yaml")), "Deployment", "tessera-webhook")
		c := dep.Spec.Template.Spec.Containers[0]
		if !slices.Contains(c.Args, "--reuse-port") || len(c.Ports) != 0 {
			t.Errorf("host-network replicas: args %v ports %v; want --reuse-port and no host port", c.Args, c.Ports)
		}
	})
	t.Run("pre-created secret renders stably", func(t *testing.T) {
		args := []string{"--set", "webhook.tls.existingSecret=my-webhook-tls", "--set", "webhook.tls.caBundle=Q0EK"}
		first, second := render(t, args...), render(t, args...)
		if first != second {
			t.Error("two renders with webhook.tls.existingSecret differ")
		}
		objs := objects(t, first)
		for _, o := range objs {
			if o.GetKind() == "Secret" {
				t.Errorf("Secret %s rendered with existingSecret", o.GetName())
			}
		}
		dep := find[appsv1.Deployment](t, objs, "Deployment", "tessera-webhook")
		if v := volumeByName(dep.Spec.Template.Spec, "tls"); v == nil || v.Secret.SecretName != "my-webhook-tls" {
			t.Errorf("tls volume %+v", v)
		}
		cfg := find[admissionregistrationv1.ValidatingWebhookConfiguration](t, objs, "ValidatingWebhookConfiguration", "tessera-webhook")
		for _, w := range cfg.Webhooks {
			if string(w.ClientConfig.CABundle) != "CA\n" {
				t.Errorf("%s caBundle %q, want the given one", w.Name, w.ClientConfig.CABundle)
			}
		}
		if out, err := helm(t, "template", "tessera", chartDir, "--kube-version", kubeVersion, "--set", "webhook.tls.existingSecret=x"); err == nil || !strings.Contains(out+err.Error(), "caBundle") {
			t.Errorf("existingSecret without caBundle rendered: %v", err)
		}
	})
}

// TestRendersWithPreviousReleaseValues: `helm upgrade --reuse-values` renders
// the chart with the previous release's values only, without the keys this
// chart added since: testdata/values-v0.1.0-previous.yaml is the values.yaml
// before the hardening, testdata/values-c3361f1.yaml the one before lending,
// locality, dashboards, the resourceSlicePolicy acknowledgement and the
// webhook's PodDisruptionBudget. It must render, the plugin must keep its
// least-privilege defaults (the host's /proc, the driver directories, no host
// /) and the new features their values.yaml defaults.
func TestRendersWithPreviousReleaseValues(t *testing.T) {
	for _, fixture := range []string{"values-v0.1.0-previous.yaml", "values-c3361f1.yaml"} {
		t.Run(fixture, func(t *testing.T) {
			dir := t.TempDir()
			chart := filepath.Join(dir, "tessera")
			if err := os.CopyFS(chart, os.DirFS(chartDir)); err != nil {
				t.Fatal(err)
			}
			previous, err := os.ReadFile(filepath.Join("testdata", fixture))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(chart, "values.yaml"), previous, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := helm(t, "template", "tessera", chart, "--namespace", "tessera", "--kube-version", kubeVersion)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			objs := objects(t, out)
			ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "tessera-kubelet-plugin")
			spec := ds.Spec.Template.Spec
			mounts := hostMounts(t, spec, spec.Containers[0])
			// The previous values said metrics.hostPID: true, which --reuse-values
			// keeps; host PIDs reach the plugin one way or the other.
			if _, proc := mounts["/host/proc"]; !spec.HostPID && !proc {
				t.Error("neither hostPID nor the host's /proc with the previous release's values: lending cannot map GPU processes to pods")
			}
			for _, path := range []string{"/driver-root/usr/lib", "/driver-root/usr/bin"} {
				if _, ok := mounts[path]; !ok {
					t.Errorf("no %s mount with the previous release's values", path)
				}
			}
			for path, m := range mounts {
				if m.host == "/" {
					t.Errorf("the host's / is mounted at %s", path)
				}
			}
			if v, _ := flagValue(spec.Containers[0].Args, "metrics-request-timeout"); v != "30s" {
				t.Errorf("--metrics-request-timeout=%q", v)
			}
			// Lending is off unless the values turn it on: the release from
			// before lending existed has none (off: no lending devices, class
			// or policy); v0.1.0's values said enabled: true, which
			// --reuse-values keeps, with its class (MPS floor) and policy, and
			// the host's cgroups writable for killing borrowers.
			lendingOn := fixture == "values-v0.1.0-previous.yaml"
			if v, _ := flagValue(spec.Containers[0].Args, "lending"); v != strconv.FormatBool(lendingOn) {
				t.Errorf("--lending=%q, want %v", v, lendingOn)
			}
			if lendingOn {
				lent := find[resourceapi.DeviceClass](t, objs, "DeviceClass", "lent.gpu.tessera.dev")
				if len(lent.Spec.Config) != 1 || lent.Spec.Config[0].Opaque == nil || !strings.Contains(string(lent.Spec.Config[0].Opaque.Parameters.Raw), `"isolation":"MPS"`) {
					t.Errorf("lent.gpu.tessera.dev config %+v: want the GpuConfig with isolation MPS", lent.Spec.Config)
				}
				find[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", "tessera-kubelet-plugin-borrowers-resourceclaims")
				if m, ok := mounts["/host/sys/fs/cgroup"]; !ok || m.readOnly {
					t.Errorf("host cgroups with lending on: %+v (mounted %v), want read-write", m, ok)
				}
			} else {
				for _, o := range objs {
					if name := o.GetName(); name == "lent.gpu.tessera.dev" || name == "tessera-kubelet-plugin-borrowers-resourceclaims" {
						t.Errorf("%s %s rendered with lending off", o.GetKind(), name)
					}
				}
			}
			find[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", "tessera-kubelet-plugin-mps-pods")
			find[policyv1.PodDisruptionBudget](t, objects(t, mustHelm(t, "template", "tessera", chart, "--namespace", "tessera", "--kube-version", kubeVersion, "--set", "webhook.replicas=2")), "PodDisruptionBudget", "tessera-webhook")
		})
	}
}

func mustHelm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return out
}
