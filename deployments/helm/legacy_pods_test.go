package helm

import (
	"context"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/cel/environment"

	"github.com/tessera-dev/tessera/pkg/legacy"
	"github.com/tessera-dev/tessera/pkg/webhook/legacypods"
)

// legacyPodsWebhook is the pod-translation entry of the rendered
// MutatingWebhookConfiguration, or nil.
func legacyPodsWebhook(t *testing.T, args ...string) *admissionregistrationv1.MutatingWebhook {
	t.Helper()
	cfg := find[admissionregistrationv1.MutatingWebhookConfiguration](t, objects(t, render(t, args...)), "MutatingWebhookConfiguration", "tessera-webhook")
	for i := range cfg.Webhooks {
		if cfg.Webhooks[i].Name == "legacy-pods.gpu.tessera.dev" {
			return &cfg.Webhooks[i]
		}
	}
	return nil
}

// webhookGrants reports whether the webhook's ClusterRole grants verb on
// resource.
func webhookGrants(t *testing.T, resource, verb string, args ...string) bool {
	t.Helper()
	role := find[rbacv1.ClusterRole](t, objects(t, render(t, args...)), "ClusterRole", "tessera-webhook")
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// TestLegacyPodTranslation: off by default (no webhook entry, no flag, no
// access to pods); on, the entry is what docs/migration.md says —
// sideEffects None, Fail, Never, the opt-in label, the Translator's path — and
// the webhook gets its flags and RBAC.
func TestLegacyPodTranslation(t *testing.T) {
	if w := legacyPodsWebhook(t); w != nil {
		t.Errorf("pod translation rendered by default: %+v", w)
	}
	if webhookGrants(t, "pods", "list") || webhookGrants(t, "resourceclaimtemplates", "create") {
		t.Error("the webhook may list pods or create templates by default")
	}
	on := []string{"--set", "webhook.legacyTranslation.enabled=true", "--set", "webhook.legacyTranslation.gpushareMemoryUnit=MiB"}
	w := legacyPodsWebhook(t, on...)
	if w == nil {
		t.Fatal("no legacy-pods webhook with webhook.legacyTranslation.enabled")
	}
	if *w.SideEffects != admissionregistrationv1.SideEffectClassNone || *w.FailurePolicy != admissionregistrationv1.Fail ||
		*w.ReinvocationPolicy != admissionregistrationv1.NeverReinvocationPolicy {
		t.Errorf("sideEffects %s, failurePolicy %s, reinvocationPolicy %s", *w.SideEffects, *w.FailurePolicy, *w.ReinvocationPolicy)
	}
	if w.NamespaceSelector == nil || w.NamespaceSelector.MatchLabels[legacypods.NamespaceLabel] != "true" || len(w.NamespaceSelector.MatchLabels) != 1 {
		t.Errorf("namespaceSelector %+v, want %s=true", w.NamespaceSelector, legacypods.NamespaceLabel)
	}
	if w.ClientConfig.Service == nil || *w.ClientConfig.Service.Path != legacypods.Path {
		t.Errorf("clientConfig %+v, want path %s", w.ClientConfig, legacypods.Path)
	}
	if len(w.Rules) != 1 || !slices.Equal(w.Rules[0].Resources, []string{"pods"}) ||
		!slices.Equal(w.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) {
		t.Errorf("rules %+v, want CREATE of pods", w.Rules)
	}
	dep := find[appsv1.Deployment](t, objects(t, render(t, on...)), "Deployment", "tessera-webhook")
	args := dep.Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"--translate-legacy-pods", "--gpushare-memory-unit=MiB", "--legacy-template-grace=5m"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	for _, g := range []struct{ resource, verb string }{
		{"pods", "list"}, {"pods", "watch"}, {"namespaces", "get"}, {"namespaces", "list"}, {"namespaces", "watch"},
		{"resourceclaimtemplates", "create"}, {"resourceclaimtemplates", "get"}, {"resourceclaimtemplates", "list"},
		{"resourceclaimtemplates", "watch"}, {"resourceclaimtemplates", "delete"}, {"events", "create"}, {"events", "patch"},
	} {
		if !webhookGrants(t, g.resource, g.verb, on...) {
			t.Errorf("the webhook may not %s %s", g.verb, g.resource)
		}
	}
	if webhookGrants(t, "pods", "update", on...) || webhookGrants(t, "pods", "delete", on...) || webhookGrants(t, "pods", "patch", on...) {
		t.Error("the webhook may change pods")
	}
	if webhookGrants(t, "resourceclaimtemplates", "patch", on...) || webhookGrants(t, "resourceclaimtemplates", "update", on...) {
		t.Error("the webhook may change templates it did not create")
	}
}

// TestLegacyPodMatchConditions: the entry's matchConditions, compiled as
// the API server compiles them, send exactly the pods pkg/legacy.Applies
// says Translate acts on.
func TestLegacyPodMatchConditions(t *testing.T) {
	w := legacyPodsWebhook(t, "--set", "webhook.legacyTranslation.enabled=true")
	if w == nil || len(w.MatchConditions) == 0 {
		t.Fatal("no matchConditions")
	}
	var exprs []cel.ExpressionAccessor
	for i := range w.MatchConditions {
		exprs = append(exprs, (*matchconditions.MatchCondition)(&w.MatchConditions[i]))
	}
	compiler, err := cel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	optional := cel.OptionalVariableDeclarations{HasAuthorizer: true}
	// NewExpressions: what the API server checks when the configuration
	// is written; StoredExpressions: what it evaluates.
	for _, env := range []environment.Type{environment.NewExpressions, environment.StoredExpressions} {
		for _, err := range compiler.CompileCondition(exprs, optional, env).CompilationErrors() {
			t.Fatalf("matchConditions: %v", err)
		}
	}
	matcher := matchconditions.NewMatcher(compiler.CompileCondition(exprs, optional, environment.StoredExpressions), w.FailurePolicy, "webhook", "admit", w.Name)

	q := resource.MustParse("1")
	limits := func(names ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for _, n := range names {
			l[corev1.ResourceName(n)] = q
		}
		return l
	}
	pod := func(annotations map[string]string, init, main corev1.ResourceRequirements) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team", Annotations: annotations},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x", Resources: main}}},
		}
		if init.Limits != nil || init.Requests != nil {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Image: "x", Resources: init}}
		}
		return p
	}
	none := corev1.ResourceRequirements{}
	var cases []*corev1.Pod
	for _, name := range []string{legacy.NvidiaGPU, legacy.HAMiMemory, legacy.HAMiMemoryPercentage, legacy.HAMiCores, legacy.HAMiPriority,
		legacy.GPUShareMemory, legacy.GPUShareCount, legacy.KoordCore, legacy.KoordMemory, legacy.KoordMemoryRatio, legacy.KoordGPU,
		legacy.KoordShared, "nvidia.com/mig-1g.10gb", "koordinator.sh/rdma", "example.com/gpu", "cpu"} {
		cases = append(cases,
			pod(nil, none, corev1.ResourceRequirements{Limits: limits(name)}),
			pod(nil, none, corev1.ResourceRequirements{Requests: limits("cpu", name)}),
			pod(nil, corev1.ResourceRequirements{Limits: limits(name)}, none))
	}
	for _, a := range append(slices.Clone(legacy.PodAnnotations), "nvidia.com/other", "example.com/use-gputype") {
		cases = append(cases, pod(map[string]string{a: "A100"}, none, corev1.ResourceRequirements{Limits: limits(legacy.NvidiaGPU)}))
	}
	cases = append(cases, pod(nil, none, none))
	sent := 0
	for _, p := range cases {
		attr := admission.NewAttributesRecord(p, nil, corev1.SchemeGroupVersion.WithKind("Pod"), p.Namespace, p.Name, podsGVR, "",
			admission.Create, &metav1.CreateOptions{}, false, nil)
		versioned := &admission.VersionedAttributes{Attributes: attr, VersionedKind: corev1.SchemeGroupVersion.WithKind("Pod")}
		versioned.VersionedObject.Set(p)
		res := matcher.Match(context.Background(), versioned, nil, nil)
		if res.Error != nil {
			t.Fatalf("pod %+v: %v", p.Spec, res.Error)
		}
		want := legacy.Applies(&corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec})
		if res.Matches != want {
			t.Errorf("annotations %v, init %v, containers %v: sent %v, legacy.Applies %v", p.Annotations,
				strings.Join(names(p.Spec.InitContainers), ","), strings.Join(names(p.Spec.Containers), ","), res.Matches, want)
		}
		if res.Matches {
			sent++
		}
	}
	if sent == 0 || sent == len(cases) {
		t.Errorf("%d of %d pods sent: the cases do not tell the condition apart", sent, len(cases))
	}
}

// names lists the resource names of containers' limits and requests.
func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		for _, l := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			for n := range l {
				out = append(out, string(n))
			}
		}
	}
	return out
}

// TestLegacyTranslationSchema: the schema takes the gpushare units
// tessera-webhook takes and a Go duration for the grace period, and
// refuses others, naming the value.
func TestLegacyTranslationSchema(t *testing.T) {
	root, _ := loadSchema(t)
	node := root.Properties["webhook"].Properties["legacyTranslation"].Properties
	if got, want := stringValues(node["gpushareMemoryUnit"].Enum), []string{string(legacy.GiB), string(legacy.MiB)}; !slices.Equal(got, want) {
		t.Errorf("gpushareMemoryUnit enum %v, want %v", got, want)
	}
	for set, want := range map[string]string{
		"webhook.legacyTranslation.gpushareMemoryUnit=KiB":   "gpushareMemoryUnit",
		"webhook.legacyTranslation.templateGracePeriod=5min": "templateGracePeriod",
		"webhook.legacyTranslation.namespaceLabel=x":         "namespaceLabel",
	} {
		out, err := helm(t, "template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", kubeVersion, "--set", set)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("--set %s: %v, want a refusal naming %s\n%.400s", set, err, want, out)
		}
	}
}

// TestLegacyPodNamespaceSelector: the translation entry selects namespaces
// that carry the opt-in label AND match webhook.namespaceSelector (its
// matchLabels and matchExpressions); a selector that sets the opt-in label
// to another value is refused.
func TestLegacyPodNamespaceSelector(t *testing.T) {
	w := legacyPodsWebhook(t, "--set", "webhook.legacyTranslation.enabled=true", "--set", "webhook.namespaceSelector.matchLabels.team=gpu",
		"--set", "webhook.namespaceSelector.matchExpressions[0].key=tier", "--set", "webhook.namespaceSelector.matchExpressions[0].operator=NotIn",
		"--set", "webhook.namespaceSelector.matchExpressions[0].values[0]=system")
	if w == nil || w.NamespaceSelector == nil {
		t.Fatal("no legacy-pods webhook or no namespaceSelector")
	}
	sel, err := metav1.LabelSelectorAsSelector(w.NamespaceSelector)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		labels labels.Set
		want   bool
	}{
		{labels.Set{legacypods.NamespaceLabel: "true", "team": "gpu"}, true},
		{labels.Set{legacypods.NamespaceLabel: "true", "team": "gpu", "tier": "system"}, false},
		{labels.Set{legacypods.NamespaceLabel: "true"}, false},
		{labels.Set{"team": "gpu"}, false},
	} {
		if got := sel.Matches(tc.labels); got != tc.want {
			t.Errorf("namespace labels %v: selected %v, want %v (selector %s)", tc.labels, got, tc.want, sel)
		}
	}
	out, err := helm(t, "template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", kubeVersion,
		"--set", "webhook.legacyTranslation.enabled=true", "--set-string", `webhook.namespaceSelector.matchLabels.gpu\.tessera\.dev/translate-legacy=false`)
	if err == nil || !strings.Contains(out, "gpu.tessera.dev/translate-legacy to other than") {
		t.Errorf("a selector excluding the opt-in label rendered (%v):\n%.300s", err, out)
	}
}
