package legacypods

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/legacy"
	"github.com/tessera-dev/tessera/pkg/webhook"
)

const (
	// Path is where the API server sends Pods to translate.
	Path = "/mutate-pods"
	// NamespaceLabel, set to "true" on a namespace, opts its pods in: the
	// webhook configuration's namespaceSelector selects it, the Translator
	// translates only there, and the Controller creates and deletes
	// templates only there.
	NamespaceLabel = "gpu.tessera.dev/translate-legacy"
	// LabelAdmission, "true", is set on every template the Controller
	// creates (and those earlier versions' webhook created), beside
	// legacy.LabelTranslated. Templates that `tessera convert` wrote carry
	// legacy.LabelTranslated alone: the Controller never deletes them (a
	// CronJob's template between runs is referenced by no pod).
	LabelAdmission = "gpu.tessera.dev/legacy-admission"
	// AnnotationAdmitted was set by earlier versions' webhook on the
	// templates it created, and renewed when a later pod used one: the time
	// (RFC 3339) of the last admission that relied on it. The Controller
	// still counts its grace period from it on such templates.
	AnnotationAdmitted = "gpu.tessera.dev/legacy-admitted"
	// AnnotationCreatedFor is set on every template the Controller creates:
	// the pod it was created for, "<name> (uid <uid>)", in the template's
	// namespace. Other pods of the same shape share it.
	AnnotationCreatedFor = "gpu.tessera.dev/legacy-created-for"
	// DefaultGrace is how long an unused template is kept after it was made.
	DefaultGrace = 5 * time.Minute
	// MinGrace bounds Grace from below: a Deployment's pods replaced one by
	// one keep their template rather than have it deleted and created again.
	MinGrace = 2 * time.Minute
)

// NamespaceReader says whether a namespace opted in to translation
// (NamespaceLabel).
type NamespaceReader interface {
	OptedIn(ctx context.Context, namespace string) (bool, error)
}

// Translator answers Pod CREATE with legacy.Translate's rewrite. It writes
// nothing to the API server: the templates the rewritten pod names are
// created by the Controller once the pod exists, from the pod alone, so an
// AdmissionReview sent by anyone but the API server changes nothing.
type Translator struct {
	// Client reads ResourceClaimTemplates (get on
	// resourceclaimtemplates.resource.k8s.io).
	Client kubernetes.Interface
	// Namespaces says which namespaces opted in (the Controller); a review
	// for another namespace is allowed unchanged, as the webhook
	// configuration's namespaceSelector would have it. Nil: every review's
	// namespace is taken as opted in.
	Namespaces NamespaceReader
	// Models reads the GPU models the cluster publishes (legacy.Options'
	// Models: only a HAMi percentage of memory with another percentage of
	// cores needs them); nil reads none.
	Models webhook.GPUModelReader
	// GPUShareUnit is the installation's unit of aliyun.com/gpu-mem.
	GPUShareUnit legacy.MemoryUnit
}

var podKind = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}

// Admit translates a Pod at CREATE: it reads the pod as the template
// legacy.Translate takes (errors name spec.containers[i]... and
// metadata.annotations[...]) and
//
//   - leaves a pod with nothing to translate, or in a namespace that did not
//     opt in, as it is (no patch);
//   - refuses contradictory or unsupported input with Translate's field
//     errors (422);
//   - refuses the pod (403), naming it, when a template of a name the
//     translation uses exists that is not Tessera's or differs;
//   - otherwise answers with the JSONPatch from the pod to Translate's
//     rewrite, plus the label legacy.LabelTranslated=true and the
//     annotation legacy.AnnotationSource (what was removed), from which the
//     Controller creates the templates the pod names that do not exist.
//
// It makes no write to the API server, dry run or not. Other kinds,
// operations and subresources are allowed unchanged. Translating a
// translated pod changes nothing, so a second call is a no-op.
func (t *Translator) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind != podKind || req.Operation != admissionv1.Create || req.SubResource != "" {
		return resp
	}
	deny := func(status *metav1.Status) *admissionv1.AdmissionResponse {
		resp.Allowed, resp.Result = false, status
		return resp
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return deny(&metav1.Status{Status: metav1.StatusFailure, Code: 400, Reason: metav1.StatusReasonBadRequest,
			Message: fmt.Sprintf("Pod %s: cannot read the object: %v", podName(req), err)})
	}
	in := &corev1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec}
	if !legacy.Applies(in) {
		return resp
	}
	if t.Namespaces != nil {
		optedIn, err := t.Namespaces.OptedIn(ctx, req.Namespace)
		if err != nil {
			return deny(&metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError,
				Message: fmt.Sprintf("Pod %s: cannot read whether namespace %s opted in to translation (%s): %v", podName(req), req.Namespace, NamespaceLabel, err)})
		}
		if !optedIn {
			return resp
		}
	}
	opts := legacy.Options{GPUShareUnit: t.GPUShareUnit}
	var modelsErr error
	if t.Models != nil {
		opts.Models, modelsErr = t.Models.Models(ctx)
	}
	out, errs := legacy.Translate(in, nil, opts)
	if len(errs) > 0 {
		if modelsErr != nil {
			errs = append(errs, field.InternalError(field.NewPath("spec"), fmt.Errorf("the cluster's GPU models could not be read: %w", modelsErr)))
		}
		return deny(webhook.Denial(req, errs))
	}
	if !out.Changed {
		return resp
	}
	if len(opts.Models) == 0 {
		if errs := unsizedFractions(&out, modelsErr); len(errs) > 0 {
			return deny(webhook.Denial(req, errs))
		}
	}
	internal := func(what string, err error) *admissionv1.AdmissionResponse {
		return deny(&metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: fmt.Sprintf("Pod %s: %s: %v", podName(req), what, err)})
	}
	source, err := legacy.SourceOf(in, &out.Template).Encode()
	if err != nil {
		return internal("the translation cannot be recorded", err)
	}
	if out.Template.Labels == nil {
		out.Template.Labels = map[string]string{}
	}
	out.Template.Labels[legacy.LabelTranslated] = "true"
	if out.Template.Annotations == nil {
		out.Template.Annotations = map[string]string{}
	}
	out.Template.Annotations[legacy.AnnotationSource] = source
	patch, err := podPatch(&pod, &out.Template)
	if err == nil {
		err = checkPatch(req.Object.Raw, patch, &out.Template)
	}
	if err != nil {
		return internal("the translation cannot be written as a patch", err)
	}
	for i := range out.ClaimTemplates {
		if status := t.check(ctx, req.Namespace, &out.ClaimTemplates[i]); status != nil {
			return deny(status)
		}
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	klog.FromContext(ctx).V(4).Info("Translated legacy GPU resources", "namespace", req.Namespace, "name", podName(req),
		"templates", len(out.ClaimTemplates))
	return resp
}

// unsizedFractions refuses, on each container that uses it, a template
// that asks for a percentage of a GPU (fraction.Annotation: HAMi's
// gpumem-percentage, Koordinator's gpu-memory-ratio or gpu) when no GPU
// model is known: the fraction webhook sizes such a claim per model when the
// claim is created, and with none it refuses the claim, which would leave
// the admitted pod pending without a word. modelsErr, when the models could
// not be read, is named.
func unsizedFractions(out *legacy.Translation, modelsErr error) field.ErrorList {
	fractions := map[string]bool{} // pod claim names whose template is a fraction
	for i := range out.ClaimTemplates {
		tmpl := &out.ClaimTemplates[i]
		if _, ok := tmpl.Spec.Annotations[fraction.Annotation]; !ok {
			continue
		}
		for _, c := range out.Template.Spec.ResourceClaims {
			if c.ResourceClaimTemplateName != nil && *c.ResourceClaimTemplateName == tmpl.Name {
				fractions[c.Name] = true
			}
		}
	}
	if len(fractions) == 0 {
		return nil
	}
	why := "no node publishes Tessera's shared devices yet, so no GPU model is known"
	if modelsErr != nil {
		why = fmt.Sprintf("the cluster's GPU models could not be read (%v)", modelsErr)
	}
	msg := "asks for a percentage of a GPU's memory (HAMi nvidia.com/gpumem-percentage, Koordinator gpu-memory-ratio or gpu), " +
		"which is sized per GPU model when the claim is created, and " + why + ": the claim would be refused and the pod never start; " +
		"create the pod once the kubelet plugin runs on a GPU node, or ask for memory in MiB (nvidia.com/gpumem)"
	var errs field.ErrorList
	for _, list := range []struct {
		path       *field.Path
		containers []corev1.Container
	}{{field.NewPath("spec", "initContainers"), out.Template.Spec.InitContainers}, {field.NewPath("spec", "containers"), out.Template.Spec.Containers}} {
		for i, c := range list.containers {
			for _, claim := range c.Resources.Claims {
				if fractions[claim.Name] {
					errs = append(errs, field.Forbidden(list.path.Index(i).Child("resources"), msg))
					break
				}
			}
		}
	}
	return errs
}

// podName is the pod's name, or its generateName with "*".
func podName(req *admissionv1.AdmissionRequest) string {
	if req.Name != "" {
		return req.Namespace + "/" + req.Name
	}
	var meta struct {
		Metadata struct {
			GenerateName string `json:"generateName"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(req.Object.Raw, &meta)
	return req.Namespace + "/" + meta.Metadata.GenerateName + "*"
}

// check reads the template of want's name in namespace: missing (the
// Controller creates it once the pod exists) or Tessera's and equal is
// fine; otherwise it returns the denial.
func (t *Translator) check(ctx context.Context, namespace string, want *resourceapi.ResourceClaimTemplate) *metav1.Status {
	existing, err := t.Client.ResourceV1().ResourceClaimTemplates(namespace).Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return &metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: fmt.Sprintf("read ResourceClaimTemplate %s/%s for the pod's legacy GPU resources: %v", namespace, want.Name, err)}
	}
	if why := foreign(existing, want); why != "" {
		return &metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
			Details: &metav1.StatusDetails{Name: want.Name, Group: resourceapi.GroupName, Kind: "resourceclaimtemplates"},
			Message: fmt.Sprintf("the pod's legacy GPU resources translate to ResourceClaimTemplate %s/%s, and a template of that name exists that %s: "+
				"Tessera never uses a template it did not make; delete or rename that template (docs/migration.md)", namespace, want.Name, why)}
	}
	return nil
}

// missingFields lists the JSON paths under path that want sets and got
// lacks (an object key absent, or a list shorter); fields only got has
// (defaults) are ignored.
func missingFields(want, got any, path *field.Path) []string {
	var w, g any
	if raw, err := json.Marshal(want); err == nil {
		_ = json.Unmarshal(raw, &w)
	}
	if raw, err := json.Marshal(got); err == nil {
		_ = json.Unmarshal(raw, &g)
	}
	var out []string
	var walk func(w, g any, path *field.Path)
	walk = func(w, g any, path *field.Path) {
		switch w := w.(type) {
		case map[string]any:
			gm, _ := g.(map[string]any)
			keys := make([]string, 0, len(w))
			for k := range w {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if gv, ok := gm[k]; ok {
					walk(w[k], gv, path.Child(k))
				} else {
					out = append(out, path.Child(k).String())
				}
			}
		case []any:
			gl, _ := g.([]any)
			for i := range w {
				if i < len(gl) {
					walk(w[i], gl[i], path.Index(i))
				} else {
					out = append(out, path.Index(i).String())
				}
			}
		}
	}
	walk(w, g, path)
	return out
}

// foreign says why existing is not the template want, or "" when it is:
// Tessera's label, and a spec semantically equal to want's (the API server
// may have defaulted fields that Translate sets explicitly).
func foreign(existing, want *resourceapi.ResourceClaimTemplate) string {
	if existing.Labels[legacy.LabelTranslated] != "true" {
		return fmt.Sprintf("lacks Tessera's label %s=true", legacy.LabelTranslated)
	}
	if !equality.Semantic.DeepEqual(existing.Spec, want.Spec) {
		return "has another spec"
	}
	return ""
}

// lastUsed is the later of tmpl's creation and its AnnotationAdmitted.
func lastUsed(tmpl *resourceapi.ResourceClaimTemplate) time.Time {
	last := tmpl.CreationTimestamp.Time
	if v, ok := tmpl.Annotations[AnnotationAdmitted]; ok {
		if at, err := time.Parse(time.RFC3339, v); err == nil && at.After(last) {
			last = at
		}
	}
	return last
}
