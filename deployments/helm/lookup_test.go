package helm

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeAPIServer is the least of an API server that `helm template
// --dry-run=server` needs: discovery of the kinds the chart renders, lists
// (lookup's, and Helm's release records) answered with items[kind], and every
// single object not found. It serves no writes: a dry run makes none.
func fakeAPIServer(t *testing.T, items map[string][]map[string]any) string {
	t.Helper()
	type resource struct{ name, kind string }
	groups := map[string][]resource{
		"v1": {{"secrets", "Secret"}, {"services", "Service"}, {"serviceaccounts", "ServiceAccount"},
			{"configmaps", "ConfigMap"}, {"namespaces", "Namespace"}, {"pods", "Pod"}},
		"apps/v1":                         {{"deployments", "Deployment"}, {"daemonsets", "DaemonSet"}},
		"rbac.authorization.k8s.io/v1":    {{"clusterroles", "ClusterRole"}, {"clusterrolebindings", "ClusterRoleBinding"}, {"roles", "Role"}, {"rolebindings", "RoleBinding"}},
		"admissionregistration.k8s.io/v1": {{"mutatingwebhookconfigurations", "MutatingWebhookConfiguration"}, {"validatingwebhookconfigurations", "ValidatingWebhookConfiguration"}, {"validatingadmissionpolicies", "ValidatingAdmissionPolicy"}, {"validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding"}},
		"policy/v1":                       {{"poddisruptionbudgets", "PodDisruptionBudget"}},
		"resource.k8s.io/v1":              {{"deviceclasses", "DeviceClass"}, {"resourceclaimtemplates", "ResourceClaimTemplate"}},
	}
	clusterScoped := map[string]bool{"Namespace": true, "ClusterRole": true, "ClusterRoleBinding": true, "MutatingWebhookConfiguration": true,
		"ValidatingWebhookConfiguration": true, "ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true, "DeviceClass": true}
	write := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := strings.TrimSuffix(r.URL.Path, "/")
		switch path {
		case "/version":
			write(w, 200, map[string]string{"major": "1", "minor": "37", "gitVersion": "v" + kubeVersion, "platform": "linux/amd64"})
			return
		case "/api":
			write(w, 200, map[string]any{"kind": "APIVersions", "versions": []string{"v1"}})
			return
		case "/apis":
			var list []map[string]any
			for gv := range groups {
				if g, v, ok := strings.Cut(gv, "/"); ok {
					ver := map[string]string{"groupVersion": gv, "version": v}
					list = append(list, map[string]any{"name": g, "versions": []any{ver}, "preferredVersion": ver})
				}
			}
			write(w, 200, map[string]any{"kind": "APIGroupList", "apiVersion": "v1", "groups": list})
			return
		}
		for gv, resources := range groups {
			prefix := "/apis/" + gv
			if gv == "v1" {
				prefix = "/api/v1"
			}
			if path == prefix {
				var list []map[string]any
				for _, res := range resources {
					list = append(list, map[string]any{"name": res.name, "kind": res.kind, "namespaced": !clusterScoped[res.kind],
						"verbs": []string{"get", "list", "create", "update", "patch", "delete", "watch"}})
				}
				write(w, 200, map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list})
				return
			}
			if !strings.HasPrefix(path, prefix+"/") {
				continue
			}
			parts := strings.Split(strings.TrimPrefix(path, prefix+"/"), "/")
			if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) != 2 {
				parts = parts[2:] // namespaced: drop namespaces/<ns>
			}
			for _, res := range resources {
				if parts[0] != res.name {
					continue
				}
				if len(parts) == 1 && r.Method == http.MethodGet {
					got := items[res.kind]
					if got == nil {
						got = []map[string]any{}
					}
					write(w, 200, map[string]any{"kind": res.kind + "List", "apiVersion": gv, "metadata": map[string]any{"resourceVersion": "1"}, "items": got})
					return
				}
			}
		}
		write(w, 404, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
			"message": r.Method + " " + r.URL.Path + " not found"})
	}))
	t.Cleanup(srv.Close)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "` + srv.URL + `"}}]
users: [{name: fake, user: {token: fake}}]
contexts: [{name: fake, context: {cluster: fake, user: fake, namespace: tessera}}]
current-context: fake
`
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

// deviceClass is a DeviceClass as the API server lists it.
func deviceClass(name, extendedResourceName string) map[string]any {
	spec := map[string]any{}
	if extendedResourceName != "" {
		spec["extendedResourceName"] = extendedResourceName
	}
	return map[string]any{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": map[string]any{"name": name}, "spec": spec}
}

// TestNvidiaGPUClassConflict: with deviceClasses.nvidiaGPU.create, the
// chart reads the cluster's DeviceClasses (lookup, against a fake API
// server) and refuses to install beside another class serving
// nvidia.com/gpu, such as NVIDIA's DRA driver's gpu.nvidia.com, naming it;
// its own class from an earlier install, or other names, are no conflict.
func TestNvidiaGPUClassConflict(t *testing.T) {
	on := []string{"--set", "deviceClasses.nvidiaGPU.create=true"}
	for name, tc := range map[string]struct {
		classes []map[string]any
		want    string // in the error; "" renders
	}{
		"nvidia dra driver": {[]map[string]any{deviceClass("gpu.nvidia.com", "nvidia.com/gpu"), deviceClass("mig.nvidia.com", "")},
			"DeviceClass gpu.nvidia.com already serves the extended resource nvidia.com/gpu"},
		"own class (upgrade)": {[]map[string]any{deviceClass("nvidia-gpu.gpu.tessera.dev", "nvidia.com/gpu")}, ""},
		"other names":         {[]map[string]any{deviceClass("gpu.tessera.dev", "tessera.dev/gpu"), deviceClass("x.example.com", "example.com/gpu")}, ""},
		"none":                {nil, ""},
	} {
		t.Run(name, func(t *testing.T) {
			kubeconfig := fakeAPIServer(t, map[string][]map[string]any{"DeviceClass": tc.classes})
			args := append([]string{"template", "tessera", chartDir, "--namespace", "tessera", "--dry-run=server", "--kube-version", kubeVersion,
				"--disable-openapi-validation", "--kubeconfig", kubeconfig}, on...)
			out, err := helm(t, args...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && !strings.Contains(out, "name: nvidia-gpu.gpu.tessera.dev"):
				t.Errorf("rendered without the class:\n%s", out)
			case tc.want != "" && err == nil:
				t.Fatalf("rendered beside a class serving nvidia.com/gpu, want an error with %q", tc.want)
			case tc.want != "" && !strings.Contains(out, tc.want):
				t.Errorf("error %s: want %q", out, tc.want)
			}
		})
	}
	// Without the cluster (helm template) lookup returns nothing: the class
	// renders.
	if out := render(t, on...); !strings.Contains(out, "name: nvidia-gpu.gpu.tessera.dev") {
		t.Error("helm template without a cluster: the class is not rendered")
	}
}
