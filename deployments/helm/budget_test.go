package helm

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// TestBudgets: budgets.enabled installs the GPUBudget CRD (kept by helm),
// the webhook's flags and RBAC, and a budgets entry that no claim of a
// selected namespace can avoid: every ResourceClaim CREATE, failurePolicy
// Fail, NoneOnDryRun, no objectSelector or matchConditions, and a
// namespaceSelector of budgets.namespaceSelector (a Namespace label) that
// never selects kube-system, kube-public, kube-node-lease or the release's
// namespace, whatever webhook.namespaceSelector says; the webhook gets the
// same selector for the budgets' Enforced condition. Off, none of it.
func TestBudgets(t *testing.T) {
	budgetsEntry := func(objs []*unstructured.Unstructured) *admissionregistrationv1.ValidatingWebhook {
		cfg := find[admissionregistrationv1.ValidatingWebhookConfiguration](t, objs, "ValidatingWebhookConfiguration", "tessera-webhook")
		for i := range cfg.Webhooks {
			if cfg.Webhooks[i].Name == "budgets.gpu.tessera.dev" {
				return &cfg.Webhooks[i]
			}
		}
		return nil
	}
	t.Run("off", func(t *testing.T) {
		objs := objects(t, render(t))
		if w := budgetsEntry(objs); w != nil {
			t.Errorf("budgets entry rendered by default: %+v", w)
		}
		if hasKind(objs, "CustomResourceDefinition", "gpubudgets.gpu.tessera.dev") {
			t.Error("GPUBudget CRD rendered by default")
		}
		_, c := webhookDeployment(t, objs)
		if slices.Contains(c.Args, "--budgets") {
			t.Error("--budgets by default")
		}
		if role := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-webhook"); grants(role, "gpu.tessera.dev", "gpubudgets", "list") ||
			grants(role, "resource.k8s.io", "resourceclaims", "list") {
			t.Error("the webhook may list gpubudgets or resourceclaims by default")
		}
	})
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"on", []string{"-f", "testdata/values-budgets.yaml"}},
		// webhook.namespaceSelector limits the other entries, not this one.
		{"namespaceSelector", []string{"-f", "testdata/values-budgets.yaml", "--set", "webhook.namespaceSelector.matchLabels.team=a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := objects(t, render(t, tc.args...))
			w := budgetsEntry(objs)
			if w == nil {
				t.Fatal("no budgets.gpu.tessera.dev entry in the ValidatingWebhookConfiguration")
			}
			if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Fail {
				t.Errorf("failurePolicy %v, want Fail", w.FailurePolicy)
			}
			if w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun {
				t.Errorf("sideEffects %v, want NoneOnDryRun (the webhook writes the budget's status)", w.SideEffects)
			}
			if w.ObjectSelector != nil || len(w.MatchConditions) != 0 {
				t.Errorf("objectSelector %+v, matchConditions %+v: a claim could avoid its budget", w.ObjectSelector, w.MatchConditions)
			}
			sel, err := metav1.LabelSelectorAsSelector(w.NamespaceSelector)
			if err != nil || w.NamespaceSelector == nil {
				t.Fatalf("namespaceSelector %+v: %v", w.NamespaceSelector, err)
			}
			for _, ns := range []struct {
				name     string
				labelled bool
				want     bool
			}{{"team-a", true, true}, {"team-a", false, false}, {"kube-system", true, false}, {"kube-public", true, false},
				{"kube-node-lease", true, false}, {"tessera", true, false}} {
				set := labels.Set{"kubernetes.io/metadata.name": ns.name, "team": "a"}
				if ns.labelled {
					set["gpu.tessera.dev/budgets"] = "enforced"
				}
				if got := sel.Matches(set); got != ns.want {
					t.Errorf("namespaceSelector %v selects namespace %s (labelled %v): %v, want %v", sel, ns.name, ns.labelled, got, ns.want)
				}
			}
			if w.TimeoutSeconds == nil || *w.TimeoutSeconds != 5 {
				t.Errorf("timeoutSeconds %v, want webhook.timeoutSeconds 5", w.TimeoutSeconds)
			}
			if len(w.Rules) != 1 || !slices.Equal(w.Rules[0].APIGroups, []string{"resource.k8s.io"}) ||
				!slices.Equal(w.Rules[0].Resources, []string{"resourceclaims"}) ||
				!slices.Equal(w.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) {
				t.Errorf("rules %+v, want CREATE of resource.k8s.io resourceclaims", w.Rules)
			}
			if w.MatchPolicy == nil || *w.MatchPolicy != admissionregistrationv1.Equivalent {
				t.Errorf("matchPolicy %v, want Equivalent (claims of every version)", w.MatchPolicy)
			}
			if s := w.ClientConfig.Service; s == nil || s.Path == nil || *s.Path != "/budget" || s.Name != "tessera-webhook" {
				t.Errorf("clientConfig %+v, want the webhook Service's /budget", w.ClientConfig)
			}

			_, c := webhookDeployment(t, objs)
			for name, v := range map[string]string{"budget-pending-ttl": "2m", "budget-resync": "1m", "budget-webhook-timeout": "5s"} {
				if got, ok := flagValue(c.Args, name); !ok || got != v {
					t.Errorf("--%s=%q (set: %v), want %q", name, got, ok, v)
				}
			}
			if !slices.Contains(c.Args, "--budgets") {
				t.Errorf("no --budgets in %v", c.Args)
			}
			if got, ok := flagValue(c.Args, "budget-namespace-selector"); !ok {
				t.Error("no --budget-namespace-selector")
			} else {
				var flagSel metav1.LabelSelector
				if err := json.Unmarshal([]byte(got), &flagSel); err != nil || !equality.Semantic.DeepEqual(&flagSel, w.NamespaceSelector) {
					t.Errorf("--budget-namespace-selector=%s (%v), want the entry's %+v", got, err, w.NamespaceSelector)
				}
			}
			role := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-webhook")
			for _, g := range [][3]string{
				{"gpu.tessera.dev", "gpubudgets", "get"}, {"gpu.tessera.dev", "gpubudgets", "list"}, {"gpu.tessera.dev", "gpubudgets", "watch"},
				{"gpu.tessera.dev", "gpubudgets/status", "update"},
				{"resource.k8s.io", "resourceclaims", "get"}, {"resource.k8s.io", "resourceclaims", "list"}, {"resource.k8s.io", "resourceclaims", "watch"},
				{"", "namespaces", "get"},
			} {
				if !grants(role, g[0], g[1], g[2]) {
					t.Errorf("the webhook may not %s %s.%s", g[2], g[1], g[0])
				}
			}
			// It writes only the status, never a budget's spec.
			if grants(role, "gpu.tessera.dev", "gpubudgets", "update") || grants(role, "gpu.tessera.dev", "gpubudgets", "patch") {
				t.Error("the webhook may change gpubudgets, not only their status")
			}

			checkBudgetCRD(t, find[unstructured.Unstructured](t, objs, "CustomResourceDefinition", "gpubudgets.gpu.tessera.dev"))

			// Only the webhook's service account writes the ledger, and
			// whoever may view a namespace may read its budgets.
			policy := find[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", "tessera-webhook-budget-status")
			if len(policy.Spec.MatchConstraints.ResourceRules) != 1 || !slices.Equal(policy.Spec.MatchConstraints.ResourceRules[0].Resources, []string{"gpubudgets/status"}) ||
				len(policy.Spec.Validations) != 1 || !strings.Contains(policy.Spec.Validations[0].Expression, `"system:serviceaccount:tessera:tessera-webhook"`) {
				t.Errorf("budget status policy %+v: want gpubudgets/status writable only by system:serviceaccount:tessera:tessera-webhook", policy.Spec)
			}
			binding := find[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding", "tessera-webhook-budget-status")
			if binding.Spec.PolicyName != policy.Name || !slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
				t.Errorf("budget status binding %+v", binding.Spec)
			}
			view := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "tessera-webhook-budgets-view")
			if view.Labels["rbac.authorization.k8s.io/aggregate-to-view"] != "true" || !grants(view, "gpu.tessera.dev", "gpubudgets", "list") ||
				grants(view, "gpu.tessera.dev", "gpubudgets", "update") {
				t.Errorf("budgets view role %+v: want list on gpubudgets, aggregated to view, no writes", view)
			}
		})
	}
}

// checkBudgetCRD: the CRD serves gpu.tessera.dev/v1alpha1 GPUBudget,
// namespaced, with a status subresource (the webhook's updates cannot
// change the spec), kept by helm, and a schema whose hard limits cannot be
// negative.
func checkBudgetCRD(t *testing.T, crd *unstructured.Unstructured) {
	t.Helper()
	str := func(path ...string) string { v, _, _ := unstructured.NestedString(crd.Object, path...); return v }
	if str("spec", "group") != "gpu.tessera.dev" || str("spec", "scope") != "Namespaced" || str("spec", "names", "kind") != "GPUBudget" {
		t.Errorf("CRD group %q scope %q kind %q", str("spec", "group"), str("spec", "scope"), str("spec", "names", "kind"))
	}
	if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Errorf("CRD annotations %v: helm would delete the budgets with it", crd.GetAnnotations())
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	if len(versions) != 1 {
		t.Fatalf("CRD versions %v, want v1alpha1 only", versions)
	}
	v := versions[0].(map[string]any)
	if v["name"] != "v1alpha1" || v["served"] != true || v["storage"] != true {
		t.Errorf("CRD version %v %v %v", v["name"], v["served"], v["storage"])
	}
	if _, ok, _ := unstructured.NestedMap(v, "subresources", "status"); !ok {
		t.Error("no status subresource")
	}
	hard, _, _ := unstructured.NestedMap(v, "schema", "openAPIV3Schema", "properties", "spec", "properties", "hard", "properties")
	for _, dim := range []string{"cores", "gpus"} {
		if m, _, _ := unstructured.NestedFieldNoCopy(hard, dim, "minimum"); m != int64(0) && m != float64(0) {
			t.Errorf("spec.hard.%s minimum %v, want 0", dim, m)
		}
	}
	if m, _, _ := unstructured.NestedFieldNoCopy(hard, "memory", "minimum"); m != int64(0) && m != float64(0) {
		t.Errorf("spec.hard.memory minimum %v, want 0 (an integer -1 passes the string pattern)", m)
	}
}

// TestBudgetDurations: a pendingTTL below 90s or a resyncPeriod of 0 fails
// the render with the value's name, rather than a webhook that crash-loops
// while every claim CREATE is refused.
func TestBudgetDurations(t *testing.T) {
	for _, c := range []struct{ set, want string }{
		{"budgets.pendingTTL=60s", "budgets.pendingTTL 60s: at least 90s"},
		{"budgets.pendingTTL=1m", "budgets.pendingTTL 1m: at least 90s"},
		{"budgets.resyncPeriod=0s", "budgets.resyncPeriod 0s: above 0"},
		{"budgets.pendingTTL=1.5m", "/budgets/pendingTTL"},
	} {
		out, err := helm(t, "template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", kubeVersion,
			"-f", "testdata/values-budgets.yaml", "--set", c.set)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("--set %s: err %v, output does not say %q", c.set, err, c.want)
		}
	}
	_, c := webhookDeployment(t, objects(t, render(t, "-f", "testdata/values-budgets.yaml", "--set", "budgets.pendingTTL=90s")))
	if got, ok := flagValue(c.Args, "budget-pending-ttl"); !ok || got != "90s" {
		t.Errorf("pendingTTL 90s: --budget-pending-ttl=%q", got)
	}
}

// TestWebhookMemoryByClusterSize: webhook.expectedNodes sets the webhook's
// memory request and limit by the formula values.yaml documents.
func TestWebhookMemoryByClusterSize(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		limit, request string
	}{
		{nil, "256Mi", "32Mi"},
		{[]string{"--set", "webhook.expectedNodes=1000"}, "506Mi", "253Mi"},
		{[]string{"-f", "testdata/values-budgets.yaml", "--set", "webhook.expectedNodes=1000"}, "756Mi", "378Mi"},
	} {
		_, c := webhookDeployment(t, objects(t, render(t, tc.args...)))
		if got := c.Resources.Limits.Memory().String(); got != tc.limit {
			t.Errorf("%v: limits.memory %s, want %s", tc.args, got, tc.limit)
		}
		if got := c.Resources.Requests.Memory().String(); got != tc.request {
			t.Errorf("%v: requests.memory %s, want %s", tc.args, got, tc.request)
		}
	}
}
