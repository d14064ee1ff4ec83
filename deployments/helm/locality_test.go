package helm

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/locality"
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

// captureWriter is a locality.StatusWriter that keeps what the controller
// would write.
type captureWriter struct {
	devices []resourceapi.AllocatedDeviceStatus
}

func (w *captureWriter) WriteDevices(_ context.Context, _ *resourceapi.ResourceClaim, devices []resourceapi.AllocatedDeviceStatus) error {
	w.devices = devices
	return nil
}

var claimsGVR = resourceapi.SchemeGroupVersion.WithResource("resourceclaims")

// admitClaimStatus evaluates the policy on a status update of a claim from
// old to updated by u and returns the messages of the validations that deny
// it (nil: admitted).
func admitClaimStatus(t *testing.T, v validating.Validator, old, updated *resourceapi.ResourceClaim, u user.Info) []string {
	t.Helper()
	return denials(v, resourceapi.SchemeGroupVersion.WithKind("ResourceClaim"), claimsGVR, "status", admission.Update, updated, old, old.Namespace, old.Name, u)
}

// TestLocalityVerdictPolicy: the locality controller's own verdict write
// (pkg/locality's Controller, on a claim with a judged share, a whole GPU
// the node already reported on and another driver's device) passes the
// policy; a write that changes the allocation or reservedFor, rewrites or
// drops an entry the node wrote, or adds an entry with data is refused; the
// policy does not apply to other users.
func TestLocalityVerdictPolicy(t *testing.T) {
	objs := objects(t, render(t, "--set", "locality.enabled=true"))
	v := compiledPolicy(t, find[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", "tessera-locality-verdicts"))
	find[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding", "tessera-locality-verdicts")
	controller := &user.DefaultInfo{Name: serviceaccount.MakeUsername("tessera", "tessera-locality"), Groups: serviceaccount.MakeGroupNames("tessera")}

	raw := []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","locality":{"antiAffinity":"replicas"}}`)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "replica-0", UID: "uid-1", ResourceVersion: "7"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{
					{Request: "gpu", Driver: model.DriverName, Pool: "node-a", Device: "gpu-2-shared", ShareID: ptr.To(types.UID("share-1")),
						BindingConditions: []string{model.LocalityAcceptedCondition}, BindingFailureConditions: []string{model.LocalityRejectedCondition}},
					{Request: "whole", Driver: model.DriverName, Pool: "node-a", Device: "gpu-3"},
					{Request: "nic", Driver: "nic.example.com", Pool: "node-a", Device: "nic-0"},
				},
				Config: []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"gpu"},
					DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: model.DriverName, Parameters: runtime.RawExtension{Raw: raw}}}}},
			}},
			Devices: []resourceapi.AllocatedDeviceStatus{
				{Driver: model.DriverName, Pool: "node-a", Device: "gpu-3", Data: &runtime.RawExtension{Raw: []byte(`{"uuid":"GPU-3"}`)},
					Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Prepared", LastTransitionTime: metav1.Unix(100, 0)}}},
				{Driver: "nic.example.com", Pool: "node-a", Device: "nic-0", NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "eth1"}},
			},
		},
	}
	w := &captureWriter{}
	c := &locality.Controller{Writer: w}
	if err := c.Sync(context.Background(), "shop/replica-0", claim); err != nil {
		t.Fatal(err)
	}
	if len(w.devices) != 3 {
		t.Fatalf("the controller wrote %d entries, want 3: %+v", len(w.devices), w.devices)
	}
	verdict := claim.DeepCopy()
	verdict.Status.Devices = w.devices
	if denied := admitClaimStatus(t, v, claim, verdict, controller); denied != nil {
		t.Fatalf("the controller's own verdict is refused: %v", denied)
	}
	// And a second verdict over the first (rejected after accepted).
	again := verdict.DeepCopy()
	again.Status.Devices[2].Conditions[0].Type = model.LocalityRejectedCondition
	if denied := admitClaimStatus(t, v, verdict, again, controller); denied != nil {
		t.Errorf("a verdict replacing a verdict is refused: %v", denied)
	}

	// A claim the node prepared before the verdict was written (the plugin
	// writes its node's entries whole: data and Ready, no verdict), with a
	// second judged share: the controller puts the verdict back into both.
	prepared := claim.DeepCopy()
	res := &prepared.Status.Allocation.Devices
	res.Results = append(res.Results, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: model.DriverName, Pool: "node-a", Device: "gpu-4-shared", ShareID: ptr.To(types.UID("share-2")),
		BindingConditions: []string{model.LocalityAcceptedCondition}, BindingFailureConditions: []string{model.LocalityRejectedCondition}})
	for _, r := range res.Results {
		if r.ShareID != nil {
			prepared.Status.Devices = append(prepared.Status.Devices, resourceapi.AllocatedDeviceStatus{Driver: r.Driver, Pool: r.Pool, Device: r.Device, ShareID: ptr.To(string(*r.ShareID)),
				Data:       &runtime.RawExtension{Raw: []byte(`{"kind":"GpuAttestation"}`)},
				Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Prepared", LastTransitionTime: metav1.Unix(100, 0)}}})
		}
	}
	w = &captureWriter{}
	if err := (&locality.Controller{Writer: w}).Sync(context.Background(), "shop/replica-0", prepared); err != nil {
		t.Fatal(err)
	}
	rewritten := prepared.DeepCopy()
	rewritten.Status.Devices = w.devices
	verdicts := 0
	for _, d := range w.devices {
		for _, cond := range d.Conditions {
			if cond.Type == model.LocalityAcceptedCondition {
				verdicts++
			}
		}
	}
	if verdicts != 2 {
		t.Fatalf("the controller wrote %d verdicts on the prepared claim, want 2: %+v", verdicts, w.devices)
	}
	if denied := admitClaimStatus(t, v, prepared, rewritten, controller); denied != nil {
		t.Errorf("the controller's verdict on a prepared claim is refused: %v", denied)
	}

	for name, change := range map[string]func(*resourceapi.ResourceClaim){
		"deallocate":     func(c *resourceapi.ResourceClaim) { c.Status.Allocation = nil },
		"move the share": func(c *resourceapi.ResourceClaim) { c.Status.Allocation.Devices.Results[0].Device = "gpu-5-shared" },
		"reserve": func(c *resourceapi.ResourceClaim) {
			c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "x", UID: "u"}}
		},
		"rewrite data": func(c *resourceapi.ResourceClaim) {
			c.Status.Devices[0].Data = &runtime.RawExtension{Raw: []byte(`{"uuid":"GPU-9"}`)}
		},
		"drop Ready":      func(c *resourceapi.ResourceClaim) { c.Status.Devices[0].Conditions = nil },
		"drop an entry":   func(c *resourceapi.ResourceClaim) { c.Status.Devices = c.Status.Devices[1:] },
		"rewrite the NIC": func(c *resourceapi.ResourceClaim) { c.Status.Devices[1].NetworkData.InterfaceName = "eth9" },
		"add data": func(c *resourceapi.ResourceClaim) {
			c.Status.Devices[2].Data = &runtime.RawExtension{Raw: []byte(`{"uuid":"GPU-2"}`)}
		},
		"add a condition": func(c *resourceapi.ResourceClaim) {
			c.Status.Devices[2].Conditions = append(c.Status.Devices[2].Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "X", LastTransitionTime: metav1.Unix(1, 0)})
		},
	} {
		bad := verdict.DeepCopy()
		change(bad)
		denied := admitClaimStatus(t, v, claim, bad, controller)
		if len(denied) == 0 {
			t.Errorf("%s: admitted", name)
		}
		for _, m := range denied {
			if !strings.HasPrefix(m, "the locality controller") && !strings.HasPrefix(m, "a device entry the locality controller adds") {
				t.Errorf("%s: refused by an error, not a rule: %s", name, m)
			}
		}
		t.Logf("%s: %v", name, denied)
		other := &user.DefaultInfo{Name: "system:kube-scheduler"}
		if denied := admitClaimStatus(t, v, claim, bad, other); denied != nil {
			t.Errorf("%s by the scheduler: refused %v, want the policy not to apply", name, denied)
		}
	}
}
