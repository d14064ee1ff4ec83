package legacypods

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	// webhook configuration's namespaceSelector selects it. The Cleaner
	// deletes templates only in namespaces that carry it.
	NamespaceLabel = "gpu.tessera.dev/translate-legacy"
	// LabelAdmission, "true", is set on every template the webhook creates,
	// beside legacy.LabelTranslated. Templates that `tessera convert` wrote
	// carry legacy.LabelTranslated alone: the Cleaner never deletes them (a
	// CronJob's template between runs is referenced by no pod).
	LabelAdmission = "gpu.tessera.dev/legacy-admission"
	// AnnotationAdmitted is set on every template the webhook makes, and
	// renewed when a later pod uses it: the time (RFC 3339) of the last
	// admission that relied on it. The Cleaner counts its grace period from
	// it.
	AnnotationAdmitted = "gpu.tessera.dev/legacy-admitted"
	// DefaultGrace is how long an unused template is kept after it was made
	// or last used by an admission.
	DefaultGrace = 5 * time.Minute
	// MinGrace bounds Grace from below: half of it must outlast an admission
	// (the API server waits at most 30s for a webhook) and the Cleaner's
	// view of the new pod arriving.
	MinGrace = 2 * time.Minute
)

// Translator answers Pod CREATE with legacy.Translate's rewrite.
type Translator struct {
	// Client creates and reads the ResourceClaimTemplates (create, get and
	// patch on resourceclaimtemplates.resource.k8s.io).
	Client kubernetes.Interface
	// Models reads the GPU models the cluster publishes (legacy.Options'
	// Models: only a HAMi percentage of memory with another percentage of
	// cores needs them); nil reads none.
	Models webhook.GPUModelReader
	// GPUShareUnit is the installation's unit of aliyun.com/gpu-mem.
	GPUShareUnit legacy.MemoryUnit
	// Grace is the Cleaner's grace period (0: DefaultGrace). A template in
	// use is marked again (AnnotationAdmitted) when its mark is older than
	// half of it.
	Grace time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

func (t *Translator) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

func (t *Translator) grace() time.Duration {
	if t.Grace > 0 {
		return t.Grace
	}
	return DefaultGrace
}

var podKind = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}

// Admit translates a Pod at CREATE: it reads the pod as the template
// legacy.Translate takes (errors name spec.containers[i]... and
// metadata.annotations[...]) and
//
//   - leaves a pod with nothing to translate as it is (no patch);
//   - refuses contradictory or unsupported input with Translate's field
//     errors (422);
//   - otherwise makes sure each template Translate returns exists in the
//     pod's namespace (created, or already there with an equal spec and
//     Tessera's label; on a dry run only read), and answers with the
//     JSONPatch from the pod to Translate's rewrite. A template of that name
//     that is not Tessera's, or differs, refuses the pod (403), naming it;
//     one the API server stored without fields Translate set (a feature
//     gate off) is deleted and refuses the pod (500), naming the fields.
//
// Other kinds, operations and subresources are allowed unchanged.
// Translating a translated pod changes nothing, so a second call is a no-op.
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
	patch, err := podPatch(&pod, &out.Template)
	if err == nil {
		err = checkPatch(req.Object.Raw, patch, &out.Template)
	}
	if err != nil {
		return deny(&metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: fmt.Sprintf("Pod %s: the translation cannot be written as a patch: %v", podName(req), err)})
	}
	dryRun := req.DryRun != nil && *req.DryRun
	for i := range out.ClaimTemplates {
		if status := t.ensure(ctx, req.Namespace, &out.ClaimTemplates[i], dryRun); status != nil {
			return deny(status)
		}
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	klog.FromContext(ctx).V(4).Info("Translated legacy GPU resources", "namespace", req.Namespace, "name", podName(req),
		"templates", len(out.ClaimTemplates), "dryRun", dryRun)
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

// attempts bounds the read/create rounds for one template: a round fails
// when another admission created the template, or the Cleaner deleted it,
// between the read and the write.
const attempts = 3

// ensure makes sure want exists in namespace, Tessera's and equal, and
// that its AnnotationAdmitted is recent enough that the Cleaner leaves it.
// On a dry run it only reads. It returns the denial, or nil.
func (t *Translator) ensure(ctx context.Context, namespace string, want *resourceapi.ResourceClaimTemplate, dryRun bool) *metav1.Status {
	api := t.Client.ResourceV1().ResourceClaimTemplates(namespace)
	now := t.now().UTC()
	internal := func(what string, err error) *metav1.Status {
		return &metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: fmt.Sprintf("%s ResourceClaimTemplate %s/%s for the pod's legacy GPU resources: %v", what, namespace, want.Name, err)}
	}
	for range attempts {
		// Read first: the pods of one workload share a template, and all
		// but the first find it (no failing create each).
		existing, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if dryRun {
				return nil
			}
			tmpl := want.DeepCopy()
			tmpl.Namespace = namespace
			if tmpl.Labels == nil {
				tmpl.Labels = map[string]string{}
			}
			tmpl.Labels[LabelAdmission] = "true"
			tmpl.Annotations = map[string]string{AnnotationAdmitted: now.Format(time.RFC3339)}
			created, err := api.Create(ctx, tmpl, metav1.CreateOptions{FieldManager: "tessera-webhook"})
			if err == nil {
				return t.checkCreated(ctx, namespace, created, want)
			}
			if !apierrors.IsAlreadyExists(err) {
				return internal("create", err)
			}
			continue // created by another admission since the read: read it
		}
		if err != nil {
			return internal("read", err)
		}
		if why := foreign(existing, want); why != "" {
			return &metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
				Details: &metav1.StatusDetails{Name: want.Name, Group: resourceapi.GroupName, Kind: "resourceclaimtemplates"},
				Message: fmt.Sprintf("the pod's legacy GPU resources translate to ResourceClaimTemplate %s/%s, and a template of that name exists that %s: "+
					"Tessera never uses a template it did not make; delete or rename that template (docs/migration.md)", namespace, want.Name, why)}
		}
		// A template the webhook did not make (`tessera convert`'s) is
		// never deleted by the Cleaner: it needs no mark.
		if dryRun || existing.Labels[LabelAdmission] != "true" || recent(existing, now, t.grace()/2) {
			return nil
		}
		// Mark it used now, so the Cleaner keeps it until the pod is seen.
		// The Cleaner deletes only the version it read (a precondition), so
		// either it sees this mark or this patch finds it gone.
		mark, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"annotations": map[string]string{AnnotationAdmitted: now.Format(time.RFC3339)},
			// The patch applies only to the object just checked.
			"uid": existing.UID, "resourceVersion": existing.ResourceVersion,
		}})
		_, err = api.Patch(ctx, want.Name, types.MergePatchType, mark, metav1.PatchOptions{FieldManager: "tessera-webhook"})
		switch {
		case err == nil:
			return nil
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			continue // deleted or changed since the read: look again
		default:
			return internal("mark", err)
		}
	}
	return internal("keep", fmt.Errorf("it was deleted or changed %d times while the pod was admitted", attempts))
}

// checkCreated compares the template the API server stored with want. An
// API server drops the fields of a disabled feature gate silently; a pod
// admitted with such a template would get a weaker claim (no capacity: a
// whole GPU's worth of a share), and every later pod would be refused by
// foreign. So a template that lost fields is deleted again (only the version
// created) and the pod is refused, naming the fields. It returns the
// denial, or nil.
func (t *Translator) checkCreated(ctx context.Context, namespace string, created, want *resourceapi.ResourceClaimTemplate) *metav1.Status {
	if equality.Semantic.DeepEqual(created.Spec, want.Spec) {
		return nil
	}
	lost := missingFields(want.Spec, created.Spec, field.NewPath("spec"))
	what := "changed the spec"
	if len(lost) > 0 {
		what = "dropped " + strings.Join(lost, ", ")
	}
	msg := fmt.Sprintf("the API server %s of ResourceClaimTemplate %s/%s when the webhook created it for the pod's legacy GPU resources: "+
		"a feature gate the translation needs is probably off on the API server (assumed: capacity and distinctAttribute need "+
		"DRAConsumableCapacity, firstAvailable DRAPrioritizedList); the pod is refused rather than given a weaker claim (docs/migration.md)",
		what, namespace, want.Name)
	err := t.Client.ResourceV1().ResourceClaimTemplates(namespace).Delete(ctx, created.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &created.UID, ResourceVersion: &created.ResourceVersion},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		msg += fmt.Sprintf("; deleting the template failed (%v): the webhook's cleanup deletes it later", err)
	}
	return &metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError,
		Details: &metav1.StatusDetails{Name: want.Name, Group: resourceapi.GroupName, Kind: "resourceclaimtemplates"}, Message: msg}
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

// recent reports whether tmpl was made or marked within window before now.
func recent(tmpl *resourceapi.ResourceClaimTemplate, now time.Time, window time.Duration) bool {
	return now.Sub(lastUsed(tmpl)) < window
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
