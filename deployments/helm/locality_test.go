package helm

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/tessera-dev/tessera/pkg/model"
)

// TestLocalityController: locality.enabled turns on the plugin's binding
// conditions and renders the controller (the webhook's image, subcommand
// locality-controller) with exactly the permissions it uses; off, neither.
func TestLocalityController(t *testing.T) {
	_, plugin := pluginDaemonSet(t)
	if v, _ := flagValue(plugin.Args, "locality-verdicts"); v != "false" {
		t.Errorf("default: --locality-verdicts=%q, want false", v)
	}
	for _, o := range objects(t, render(t)) {
		if o.GetName() == "tessera-locality" {
			t.Errorf("default: %s %s rendered", o.GetKind(), o.GetName())
		}
	}

	args := []string{"-f", "../../demo/clusters/local/overlay/values.yaml", "--set", "locality.enabled=true"}
	_, plugin = pluginDaemonSet(t, args...)
	if v, _ := flagValue(plugin.Args, "locality-verdicts"); v != "true" {
		t.Errorf("enabled: --locality-verdicts=%q, want true", v)
	}
	objs := objects(t, render(t, args...))
	d := find[appsv1.Deployment](t, objs, "Deployment", "tessera-locality")
	if *d.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2 (one leader, one standby)", *d.Spec.Replicas)
	}
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	if c.Args[0] != "locality-controller" || !slices.Contains(c.Args, "--lease-name=tessera-locality") ||
		!slices.Contains(c.Args, "--fences=true") || !slices.Contains(c.Args, "--fence-ttl=30s") {
		t.Errorf("args %v", c.Args)
	}
	if !pod.HostNetwork || pod.ServiceAccountName != "tessera-locality" {
		t.Errorf("local cluster: hostNetwork %v, service account %q", pod.HostNetwork, pod.ServiceAccountName)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if diff := cmp.Diff(map[string]string{
		"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
		"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443",
	}, env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}

	role := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-locality")
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/driver"}, ResourceNames: []string{model.DriverName}, Verbs: []string{"arbitrary-node:patch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"devicetaintrules"}, Verbs: []string{"create", "delete", "list"}},
	}
	if diff := cmp.Diff(want, role.Rules); diff != "" {
		t.Errorf("ClusterRole rules (-want +got):\n%s", diff)
	}
	lease := find[rbacv1.Role](t, objs, "Role", "tessera-locality")
	if diff := cmp.Diff([]rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"tessera-locality"}, Verbs: []string{"get", "update"}},
	}, lease.Rules); diff != "" {
		t.Errorf("Role rules (-want +got):\n%s", diff)
	}
	find[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", "tessera-locality")
	find[rbacv1.RoleBinding](t, objs, "RoleBinding", "tessera-locality")

	// The fences' DeviceTaintRules are bounded by a policy; without fences
	// the controller has no access to DeviceTaintRules and no policy.
	policy := find[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", "tessera-locality-fences")
	if got := policy.Spec.MatchConditions[0].Expression; !strings.Contains(got, "system:serviceaccount:tessera:tessera-locality") {
		t.Errorf("fence policy matches %q, want the controller's service account", got)
	}
	find[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding", "tessera-locality-fences")
	for _, o := range objects(t, render(t, append(args, "--set", "locality.fences=false")...)) {
		if o.GetName() == "tessera-locality-fences" {
			t.Errorf("locality.fences=false still renders %s %s", o.GetKind(), o.GetName())
		}
	}
}

// TestLocalityWithoutFences: locality.fences=false drops the flag's value
// and the DeviceTaintRule permissions.
func TestLocalityWithoutFences(t *testing.T) {
	objs := objects(t, render(t, "--set", "locality.enabled=true", "--set", "locality.fences=false"))
	c := find[appsv1.Deployment](t, objs, "Deployment", "tessera-locality").Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--fences=false") {
		t.Errorf("args %v", c.Args)
	}
	for _, r := range find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-locality").Rules {
		if slices.Contains(r.Resources, "devicetaintrules") {
			t.Errorf("without fences the controller may still write DeviceTaintRules: %+v", r)
		}
	}
}
