package helm

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/model"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from `helm template`")

// HelmVersion is the helm the chart is tested with; build-tools.sh pins the same.
const HelmVersion = "v3.22.0"

const chartDir = "tessera"

// kubeVersion is what `helm template` assumes (helm's own default is older than
// the chart's kubeVersion).
const kubeVersion = "1.37.0"

// findHelm returns the pinned helm: $TESSERA_HELM, else the one build-tools.sh
// put in the tools cache ($TESSERA_CACHE_DIR or ~/.cache/tessera, bin-*/helm),
// else helm on PATH, each only at HelmVersion. Without one the test fails with
// the command that builds it; TESSERA_SKIP_HELM=1 skips instead.
func findHelm(t *testing.T) string {
	t.Helper()
	if os.Getenv("TESSERA_SKIP_HELM") == "1" {
		t.Skip("TESSERA_SKIP_HELM=1: chart tests skipped")
	}
	var candidates []string
	if p := os.Getenv("TESSERA_HELM"); p != "" {
		candidates = append(candidates, p)
	}
	cache := os.Getenv("TESSERA_CACHE_DIR")
	if cache == "" {
		if dir, err := os.UserCacheDir(); err == nil {
			cache = filepath.Join(dir, "tessera")
		}
	}
	if cache != "" {
		matches, _ := filepath.Glob(filepath.Join(cache, "bin-*", "helm"))
		candidates = append(candidates, matches...)
	}
	if p, err := exec.LookPath("helm"); err == nil {
		candidates = append(candidates, p)
	}
	var seen []string
	for _, c := range candidates {
		out, err := exec.Command(c, "version", "--template", "{{.Version}}").Output()
		if err == nil && strings.TrimSpace(string(out)) == HelmVersion {
			return c
		}
		seen = append(seen, fmt.Sprintf("%s (%s)", c, strings.TrimSpace(string(out))))
	}
	t.Fatalf("no helm %s found (looked at $TESSERA_HELM, %s/bin-*/helm, PATH; found %v).\n"+
		"Build it with the other tools:   demo/clusters/local/build-tools.sh\n"+
		"or only helm:                     GOBIN=%s/bin-helm go install -ldflags '-X helm.sh/helm/v3/internal/version.version=%s' helm.sh/helm/v3/cmd/helm@%s\n"+
		"or skip the chart tests:          TESSERA_SKIP_HELM=1",
		HelmVersion, cache, seen, cache, HelmVersion, HelmVersion)
	return ""
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(findHelm(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// render runs `helm template` with the release name and namespace install.sh uses.
func render(t *testing.T, args ...string) string {
	t.Helper()
	out, err := helm(t, append([]string{"template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", kubeVersion}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// generated matches what differs from one render to the next: the
// chart-generated certificates and the checksum over them.
var generated = regexp.MustCompile(`(?m)^(\s*(?:tls\.crt|tls\.key|ca\.crt|caBundle|checksum/tls):) \S+$`)

var cases = []struct {
	name   string
	values []string // -f files, relative to this directory
}{
	{name: "default"},
	// What demo/clusters/local/install.sh installs (plus its --set flags' usual values).
	{name: "local", values: []string{"../../demo/clusters/local/overlay/values.yaml"}},
	{name: "cert-manager", values: []string{"testdata/values-cert-manager.yaml"}},
	{name: "servicemonitor", values: []string{"testdata/values-servicemonitor.yaml"}},
	{name: "legacy-translation", values: []string{"testdata/values-legacy-translation.yaml"}},
	{name: "budgets", values: []string{"testdata/values-budgets.yaml"}},
}

func valueArgs(files []string) []string {
	var args []string
	for _, f := range files {
		args = append(args, "-f", f)
	}
	return args
}

func TestLint(t *testing.T) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helm(t, append([]string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}, valueArgs(tc.values)...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// TestGolden compares `helm template` with testdata/<case>.golden.yaml; the
// certificates the chart generates are masked. Rewrite with -update and review
// the diff.
func TestGolden(t *testing.T) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := generated.ReplaceAllString(render(t, valueArgs(tc.values)...), "$1 <generated>")
			path := filepath.Join("testdata", tc.name+".golden.yaml")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (create it: go test ./deployments/helm -run TestGolden -update)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("helm template differs from %s (-want +got; -update rewrites it):\n%s", path, diff)
			}
		})
	}
}

// objects decodes rendered YAML into unstructured objects.
func objects(t *testing.T, rendered string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(rendered, "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

func find[T any](t *testing.T, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			data, err := yaml.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			var out T
			if err := yaml.UnmarshalStrict(data, &out); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return &out
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

// TestDeviceClassesMatchModel: the chart's classes select exactly what
// pkg/model's do (the classes the allocator tests use), and their config is a
// GpuConfig that the plugin's strict decoding and validation accept.
func TestDeviceClassesMatchModel(t *testing.T) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Lending is off by default: its class is rendered only with it
			// on (the local cluster's overlay turns it on).
			if len(tc.values) == 0 {
				for _, o := range objects(t, render(t)) {
					if o.GetKind() == "DeviceClass" && o.GetName() == "lent.gpu.tessera.dev" {
						t.Error("lent.gpu.tessera.dev rendered with lending off")
					}
				}
			}
			objs := objects(t, render(t, append(valueArgs(tc.values), "--set", "lending.enabled=true")...))
			for _, want := range model.DeviceClasses() {
				got := find[resourceapi.DeviceClass](t, objs, "DeviceClass", want.Name)
				if diff := cmp.Diff(want.Spec.Selectors, got.Spec.Selectors); diff != "" {
					t.Errorf("DeviceClass %s selectors (-model +chart):\n%s", want.Name, diff)
				}
				if diff := cmp.Diff(want.Spec.ExtendedResourceName, got.Spec.ExtendedResourceName); diff != "" {
					t.Errorf("DeviceClass %s extendedResourceName (-model +chart):\n%s", want.Name, diff)
				}
				for i, c := range got.Spec.Config {
					if c.Opaque == nil || c.Opaque.Driver != configapi.GroupName {
						t.Errorf("DeviceClass %s config %d: not an opaque config for %s", want.Name, i, configapi.GroupName)
						continue
					}
					cfg, err := configapi.DecodeStrict(c.Opaque.Parameters.Raw)
					if err != nil {
						t.Errorf("DeviceClass %s config %d: %v", want.Name, i, err)
						continue
					}
					if errs := cfg.Validate(); len(errs) > 0 {
						t.Errorf("DeviceClass %s config %d: %v", want.Name, i, errs.ToAggregate())
					}
				}
			}
		})
	}
}

// TestPluginRBAC: the plugin's ClusterRole grants exactly the calls it makes,
// and the webhook's only what it reads (DeviceClasses).
func TestPluginRBAC(t *testing.T) {
	objs := objects(t, render(t))
	role := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-kubelet-plugin")
	got := map[string][]string{}
	for _, r := range role.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				key := g + "/" + res
				if len(r.ResourceNames) > 0 {
					key += "[" + strings.Join(r.ResourceNames, ",") + "]"
				}
				got[key] = append(got[key], r.Verbs...)
				slices.Sort(got[key])
			}
		}
	}
	want := map[string][]string{
		"resource.k8s.io/resourceslices":                         {"create", "delete", "list", "update", "watch"},
		"resource.k8s.io/resourceclaims":                         {"get"},
		"resource.k8s.io/resourceclaims/status":                  {"patch"},
		"resource.k8s.io/resourceclaims/driver[gpu.tessera.dev]": {"associated-node:patch"},
		"/nodes":  {"get"},
		"/events": {"create", "patch"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("plugin ClusterRole (-want +got):\n%s", diff)
	}
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" && o.GetName() == "tessera-webhook" {
			if v, _, _ := unstructured.NestedBool(o.Object, "automountServiceAccountToken"); v {
				t.Error("the webhook's ServiceAccount mounts a token; it needs none")
			}
		}
		if o.GetKind() == "RoleBinding" && strings.Contains(o.GetName(), "webhook") {
			t.Errorf("RoleBinding %s: the webhook needs no namespaced API access", o.GetName())
		}
	}
	// The webhook reads DeviceClasses (their sharing.allowedIsolations) and
	// ResourceSlices (the GPU models of fraction claims), and nothing else.
	webhookRole := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-webhook")
	wantWebhook := []rbacv1.PolicyRule{
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"deviceclasses"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"list", "watch"}},
	}
	if diff := cmp.Diff(wantWebhook, webhookRole.Rules); diff != "" {
		t.Errorf("webhook ClusterRole (-want +got):\n%s", diff)
	}
	binding := find[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", "tessera-webhook")
	if binding.RoleRef.Name != "tessera-webhook" || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "tessera-webhook" {
		t.Errorf("webhook ClusterRoleBinding %+v: want ClusterRole tessera-webhook for ServiceAccount tessera-webhook", binding)
	}
}

// TestSchemaRejects: values.schema.json refuses what would otherwise render a
// broken install, with a message naming the value.
func TestSchemaRejects(t *testing.T) {
	tests := []struct {
		set  string
		want string
	}{
		{"deviceClasses.shared.config.sharing.isolation=Bogus", "isolation"},
		{"deviceClasses.shared.config.sharing.computeLimit=0", "computeLimit"},
		{"deviceClasses.shared.config.env.LD_PRELOAD=/x.so", "env"},
		{"deviceClasses.whole.config.topology.nvlink=Always", "nvlink"},
		{"kubeletPlugin.mockProfile=h100", "mockProfile"},
		{"kubeletPlugin.defaultIsolation=mps", "defaultIsolation"},
		{"kubeletPlugin.hamiCore.libraryPath=libvgpu.so", "libraryPath"},
		{"webhook.failurePolicy=Maybe", "failurePolicy"},
		{"webhook.timeoutSeconds=60", "timeoutSeconds"},
		{"webhook.url=http://127.0.0.1:9443", "url"},
		{"kubeletPlugin.privileged=true", "privileged"},
		{"kubeletPlugin.metrics.port=0", "port"},
		{"kubeletPlugin.metrics.serviceMonitor.interval=30", "interval"},
		{"kubeletPlugin.health.fatalEffect=PreferNoSchedule", "fatalEffect"},
		{"kubeletPlugin.health.recoveryPeriod=5min", "recoveryPeriod"},
		{"kubeletPlugin.health.ignoredXIDs={-1}", "ignoredXIDs"},
		{"kubeletPlugin.health.fatalXIDs={}", "fatalXIDs"},
		{"kubeletPlugin.health.fatalXIDs={79,79}", "fatalXIDs"},
		// Not the schema: the template refuses what the plugin's --health-* would.
		{"kubeletPlugin.health.ignoredXIDs={13,79}", "XID 79 is in both"},
	}
	for _, tc := range tests {
		t.Run(tc.set, func(t *testing.T) {
			out, err := helm(t, "template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", kubeVersion, "--set", tc.set)
			if err == nil {
				t.Fatalf("--set %s rendered; want the schema to refuse it", tc.set)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("--set %s: message does not name %q:\n%s", tc.set, tc.want, out)
			}
		})
	}
}

// TestPluginMPSRole: the plugin may manage pods (its MPS control daemon
// pods) in its own namespace only, and only with the calls it makes; it is
// told the namespace and the image the pods run (the plugin's by default).
func TestPluginMPSRole(t *testing.T) {
	objs := objects(t, render(t))
	role := find[rbacv1.Role](t, objs, "Role", "tessera-kubelet-plugin-mps")
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "delete"}}}
	if diff := cmp.Diff(want, role.Rules); diff != "" || role.Namespace != "tessera" {
		t.Errorf("Role %s/%s rules (-want +got):\n%s", role.Namespace, role.Name, diff)
	}
	binding := find[rbacv1.RoleBinding](t, objs, "RoleBinding", "tessera-kubelet-plugin-mps")
	if binding.RoleRef.Kind != "Role" || binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 ||
		binding.Subjects[0].Name != "tessera-kubelet-plugin" || binding.Subjects[0].Namespace != "tessera" {
		t.Errorf("RoleBinding %+v: want Role %s for ServiceAccount tessera/tessera-kubelet-plugin", binding, role.Name)
	}
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetName() == "tessera-kubelet-plugin" && strings.Contains(fmt.Sprint(o.Object["rules"]), "pods") {
			t.Error("the plugin's ClusterRole grants pods: daemon pods are namespaced (the Role)")
		}
	}

	for name, tc := range map[string]struct {
		set  []string
		want []string
	}{
		"default": {nil, []string{"--mps-image=ghcr.io/tessera-dev/tessera-kubelet-plugin:", "--mps-image-pull-policy=IfNotPresent", "--mps-priority-class=system-node-critical", "--mps-ready-timeout=30s", "--mps-host-driver-root=/"}},
		"own image": {[]string{"--set", "kubeletPlugin.mps.image.repository=example.com/mps,kubeletPlugin.mps.image.tag=v9,kubeletPlugin.mps.image.pullPolicy=Always,kubeletPlugin.mps.priorityClassName=mps"},
			[]string{"--mps-image=example.com/mps:v9", "--mps-image-pull-policy=Always", "--mps-priority-class=mps"}},
	} {
		ds := find[appsv1.DaemonSet](t, objects(t, render(t, tc.set...)), "DaemonSet", "tessera-kubelet-plugin")
		ctr := ds.Spec.Template.Spec.Containers[0]
		args := strings.Join(ctr.Args, " ")
		for _, w := range tc.want {
			if !strings.Contains(args, w) {
				t.Errorf("%s: plugin args %q lack %q", name, args, w)
			}
		}
		if !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool {
			return e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
		}) {
			t.Errorf("%s: no POD_NAMESPACE from metadata.namespace in %v", name, ctr.Env)
		}
	}
}
