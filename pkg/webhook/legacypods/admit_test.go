package legacypods

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/legacy"
	"github.com/tessera-dev/tessera/pkg/webhook"
)

// hamiPod is HAMi's examples/nvidia/default_use.yaml with a second,
// GPU-less container and an annotation of its own, which stay as they are.
const hamiPod = `
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  namespace: team
  annotations: {example.com/keep: "yes", nvidia.com/use-gputype: "A100"}
spec:
  containers:
  - name: ubuntu-container
    image: ubuntu:22.04
    resources:
      limits:
        cpu: "1"
        nvidia.com/gpu: 1
        nvidia.com/gpumem: 3000
        nvidia.com/gpucores: 30
  - name: sidecar
    image: busybox
    resources: {limits: {cpu: 100m}}
`

// clock is a fixed time for the tests.
var clock = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

// models is a fixed GPU model, a fixture (not read from a GPU).
type models []fraction.Model

func (m models) Models(context.Context) ([]fraction.Model, error) { return m, nil }

var h100 = models{{Products: []string{"NVIDIA H100 80GB HBM3"}, Memory: resource.MustParse("81089Mi"),
	MemoryStep: resource.MustParse("1Mi"), Cores: 100, CoresStep: 1}}

func podJSON(t *testing.T, manifest string) []byte {
	t.Helper()
	raw, err := yaml.YAMLToJSON([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// review sends raw as a Pod CREATE AdmissionReview through the HTTP handler
// and returns the response.
func review(t *testing.T, tr *Translator, raw []byte, dryRun bool) *admissionv1.AdmissionResponse {
	t.Helper()
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "u1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Operation: admissionv1.Create, Namespace: "team", Name: "gpu-pod", DryRun: &dryRun,
			Object: runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	webhook.AdmitFunc(tr.Admit).ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if out.Response == nil || out.Response.UID != "u1" {
		t.Fatalf("response %+v: want one for request u1", out.Response)
	}
	return out.Response
}

// apply applies the response's JSONPatch to raw.
func apply(t *testing.T, raw []byte, resp *admissionv1.AdmissionResponse) []byte {
	t.Helper()
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("response %+v: want a JSONPatch", resp)
	}
	p, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("apply %s: %v", resp.Patch, err)
	}
	return out
}

// fixedOptIn is a NamespaceReader of a fixed answer for every namespace.
type fixedOptIn bool

func (o fixedOptIn) OptedIn(context.Context, string) (bool, error) { return bool(o), nil }

func translator(objects ...runtime.Object) (*Translator, *fake.Clientset) {
	client := fake.NewClientset(objects...)
	return &Translator{Client: client, Models: h100, Namespaces: fixedOptIn(true)}, client
}

// writes are the client's create, update, patch and delete calls.
func writes(client *fake.Clientset) []string {
	return writesOf(client.Actions())
}

// writesOf are the create, update, patch and delete calls of actions.
func writesOf(actions []k8stesting.Action) []string {
	var out []string
	for _, a := range actions {
		if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
			out = append(out, v+" "+a.GetResource().Resource)
		}
	}
	return out
}

// translation is what the Translator makes of a pod: Translate's rewrite,
// labelled as translated and annotated with its Source.
func translation(t *testing.T, raw []byte, models []fraction.Model) (legacy.Translation, corev1.Pod) {
	t.Helper()
	var orig corev1.Pod
	if err := json.Unmarshal(raw, &orig); err != nil {
		t.Fatal(err)
	}
	in := &corev1.PodTemplateSpec{ObjectMeta: orig.ObjectMeta, Spec: orig.Spec}
	want, errs := legacy.Translate(in, nil, legacy.Options{Models: models})
	if len(errs) > 0 || !want.Changed {
		t.Fatalf("Translate: %v, %+v", errs, want)
	}
	source, err := legacy.SourceOf(in, &want.Template).Encode()
	if err != nil {
		t.Fatal(err)
	}
	if want.Template.Labels == nil {
		want.Template.Labels = map[string]string{}
	}
	want.Template.Labels[legacy.LabelTranslated] = "true"
	want.Template.Annotations[legacy.AnnotationSource] = source
	return want, orig
}

// TestTranslatesHAMiPod: the patch makes the pod exactly what
// legacy.Translate returns, labelled as translated and annotated with what
// was removed; nothing is written to the API server (the Controller
// creates the template); admitting the patched pod again changes nothing.
func TestTranslatesHAMiPod(t *testing.T) {
	tr, client := translator()
	raw := podJSON(t, hamiPod)
	resp := review(t, tr, raw, false)
	if !resp.Allowed {
		t.Fatalf("denied: %v", resp.Result)
	}
	var got corev1.Pod
	if err := json.Unmarshal(apply(t, raw, resp), &got); err != nil {
		t.Fatal(err)
	}
	want, _ := translation(t, raw, h100)
	if len(want.ClaimTemplates) != 1 {
		t.Fatalf("%d templates, want 1", len(want.ClaimTemplates))
	}
	if diff := cmp.Diff(want.Template.ObjectMeta, got.ObjectMeta); diff != "" {
		t.Errorf("metadata (-Translate +patched):\n%s", diff)
	}
	if diff := cmp.Diff(want.Template.Spec, got.Spec); diff != "" {
		t.Errorf("spec (-Translate +patched):\n%s", diff)
	}
	if got.Annotations["example.com/keep"] != "yes" || got.Spec.Containers[0].Resources.Limits.Cpu().String() != "1" {
		t.Errorf("the pod's own annotation or cpu limit was lost: %+v", got.ObjectMeta.Annotations)
	}
	if w := writes(client); len(w) != 0 {
		t.Errorf("admission wrote %v", w)
	}

	// Re-admission of the translated pod: allowed, no patch.
	patched, _ := json.Marshal(got)
	again := review(t, tr, patched, false)
	if !again.Allowed || again.Patch != nil {
		t.Errorf("re-admission: %+v, want allowed without a patch", again)
	}
}

// TestForgedReviewsWriteNothing: reviews anyone could send to the webhook's
// Service — for a namespace that opted in, one that did not, one that does
// not exist, dry runs or not, many of them — make no write to the API
// server. Reviews for a namespace that did not opt in are allowed
// unchanged, as the webhook configuration would not have sent them.
func TestForgedReviewsWriteNothing(t *testing.T) {
	client := fake.NewClientset(namespace("team", true), namespace("other", false))
	c, err := NewController(client, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := c.start(ctx, ctx.Done()); err != nil {
		t.Fatal(err)
	}
	tr := &Translator{Client: client, Models: h100, Namespaces: c}
	for _, ns := range []string{"team", "other", "nowhere"} {
		for i := range 20 {
			raw := podJSON(t, strings.Replace(hamiPod, "gpumem: 3000", fmt.Sprintf("gpumem: %d", 1000+i), 1))
			for _, dryRun := range []bool{false, true} {
				req := &admissionv1.AdmissionRequest{UID: "u", Kind: podKind, Operation: admissionv1.Create, Namespace: ns,
					Name: "forged", DryRun: &dryRun, Object: runtime.RawExtension{Raw: raw}}
				resp := tr.Admit(ctx, req)
				if !resp.Allowed {
					t.Fatalf("namespace %s: denied %v", ns, resp.Result)
				}
				if translated := resp.Patch != nil; translated != (ns == "team") {
					t.Errorf("namespace %s: patched %v, want a patch only where the namespace opted in", ns, translated)
				}
			}
		}
	}
	if w := writes(client); len(w) != 0 {
		t.Errorf("forged reviews wrote %v", w)
	}
	list, err := client.ResourceV1().ResourceClaimTemplates("").List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("templates %v (%v), want none", list, err)
	}
}

// TestDryRunCreatesNothing: a dry run answers the same patch as a real
// review, and neither writes anything.
func TestDryRunCreatesNothing(t *testing.T) {
	tr, client := translator()
	resp := review(t, tr, podJSON(t, hamiPod), true)
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("dry run: %+v, want allowed with a patch", resp)
	}
	if w := writes(client); len(w) != 0 {
		t.Errorf("a dry run wrote %v", w)
	}
	real := review(t, tr, podJSON(t, hamiPod), false)
	if !bytes.Equal(real.Patch, resp.Patch) {
		t.Errorf("dry-run patch %s differs from the real one %s", resp.Patch, real.Patch)
	}
}

// translatedTemplate is the template hamiPod translates to.
func translatedTemplate(t *testing.T) resourceapi.ResourceClaimTemplate {
	t.Helper()
	var pod corev1.Pod
	if err := json.Unmarshal(podJSON(t, hamiPod), &pod); err != nil {
		t.Fatal(err)
	}
	out, errs := legacy.Translate(&corev1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec}, nil, legacy.Options{Models: h100})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	tmpl := out.ClaimTemplates[0]
	tmpl.Namespace = "team"
	return tmpl
}

// TestSquattedTemplate: a template of the translated name that lacks
// Tessera's label, or has another spec, refuses the pod, naming it, on
// real and dry runs alike; nothing is written.
func TestSquattedTemplate(t *testing.T) {
	unlabelled := translatedTemplate(t)
	unlabelled.Labels = nil
	other := translatedTemplate(t)
	other.Spec.Spec.Devices.Requests[0].Exactly.Count = 2
	for name, tc := range map[string]struct {
		squat resourceapi.ResourceClaimTemplate
		why   string
	}{
		"no label":   {unlabelled, "lacks Tessera's label"},
		"other spec": {other, "has another spec"},
	} {
		for _, dryRun := range []bool{false, true} {
			t.Run(name, func(t *testing.T) {
				tr, client := translator(&tc.squat)
				resp := review(t, tr, podJSON(t, hamiPod), dryRun)
				if resp.Allowed || resp.Patch != nil {
					t.Fatalf("allowed: %+v", resp)
				}
				msg := resp.Result.Message
				if !strings.Contains(msg, "team/"+tc.squat.Name) || !strings.Contains(msg, tc.why) || resp.Result.Code != 403 {
					t.Errorf("denial %d %q: want 403 naming team/%s and %q", resp.Result.Code, msg, tc.squat.Name, tc.why)
				}
				if w := writes(client); len(w) != 0 {
					t.Errorf("wrote %v", w)
				}
			})
		}
	}
}

// TestExistingTemplateReused: a template Tessera made for an earlier pod,
// or that `tessera convert` wrote, is used as it is: the pod is admitted
// and nothing is written.
func TestExistingTemplateReused(t *testing.T) {
	for name, converted := range map[string]bool{"by the controller": false, "by tessera convert": true} {
		t.Run(name, func(t *testing.T) {
			existing := translatedTemplate(t)
			if !converted {
				existing.Labels[LabelAdmission] = "true"
			}
			tr, client := translator(&existing)
			resp := review(t, tr, podJSON(t, hamiPod), false)
			if !resp.Allowed || resp.Patch == nil {
				t.Fatalf("%+v: want allowed with a patch", resp)
			}
			if w := writes(client); len(w) != 0 {
				t.Errorf("wrote %v", w)
			}
		})
	}
}

// TestRefusedWithField: contradictory input is refused with the field, and
// nothing is created.
func TestRefusedWithField(t *testing.T) {
	tr, client := translator()
	bad := strings.Replace(hamiPod, "nvidia.com/gpucores: 30", "nvidia.com/gpumem-percentage: 50", 1)
	resp := review(t, tr, podJSON(t, bad), false)
	if resp.Allowed || resp.Result.Code != 422 {
		t.Fatalf("%+v: want 422", resp)
	}
	const field = "spec.containers[0].resources.limits[nvidia.com/gpumem-percentage]"
	if !strings.Contains(resp.Result.Message, field) || len(resp.Result.Details.Causes) == 0 || resp.Result.Details.Causes[0].Field != field {
		t.Errorf("denial %+v: want the field %s", resp.Result, field)
	}
	if w := writes(client); len(w) != 0 {
		t.Errorf("wrote %v", w)
	}
	// Without models, a percentage of memory with other cores is refused
	// on the cores field.
	tr.Models = nil
	frac := strings.Replace(strings.Replace(hamiPod, "nvidia.com/gpumem: 3000", "nvidia.com/gpumem-percentage: 50", 1), "nvidia.com/use-gputype: \"A100\"", "x: z", 1)
	resp = review(t, tr, podJSON(t, frac), false)
	if resp.Allowed || !strings.Contains(resp.Result.Message, "spec.containers[0].resources.limits[nvidia.com/gpucores]") {
		t.Errorf("%+v: want a denial on gpucores without models", resp.Result)
	}
	// With them it is translated, shares sized per model.
	tr.Models = h100
	if resp = review(t, tr, podJSON(t, frac), false); !resp.Allowed {
		t.Errorf("with models: %v", resp.Result)
	}
}

// TestLeavesOthersAlone: pods without legacy names (the device plugin's
// nvidia.com/gpu alone included), other operations and kinds are allowed
// unchanged without a write.
func TestLeavesOthersAlone(t *testing.T) {
	tr, client := translator()
	plain := `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x","resources":{"limits":{"nvidia.com/gpu":"1","cpu":"1"}}}]}}`
	if resp := review(t, tr, []byte(plain), false); !resp.Allowed || resp.Patch != nil {
		t.Errorf("plain pod: %+v", resp)
	}
	update := &admissionv1.AdmissionRequest{UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Operation: admissionv1.Update, Object: runtime.RawExtension{Raw: podJSON(t, hamiPod)}}
	if resp := tr.Admit(context.Background(), update); !resp.Allowed || resp.Patch != nil {
		t.Errorf("update: %+v", resp)
	}
	if w := writes(client); len(w) != 0 {
		t.Errorf("wrote %v", w)
	}
}

// TestPatchKeepsUnknownFields: fields of the pod this webhook's types do not
// know survive the patch (it edits keys, not whole objects).
func TestPatchKeepsUnknownFields(t *testing.T) {
	tr, _ := translator()
	raw := podJSON(t, strings.Replace(hamiPod, "    image: ubuntu:22.04\n", "    image: ubuntu:22.04\n    futureField: kept\n", 1))
	raw = bytes.Replace(raw, []byte(`"spec":{`), []byte(`"spec":{"futureSpecField":1,`), 1)
	resp := review(t, tr, raw, false)
	if !resp.Allowed {
		t.Fatalf("denied: %v", resp.Result)
	}
	out := string(apply(t, raw, resp))
	if !strings.Contains(out, `"futureField":"kept"`) || !strings.Contains(out, `"futureSpecField":1`) {
		t.Errorf("unknown fields lost: %s", out)
	}
}

// TestMissingFields: the paths want sets and got lacks; defaults only got
// has are not reported.
func TestMissingFields(t *testing.T) {
	want := map[string]any{"a": map[string]any{"b": 1, "c": []any{1, 2}}, "d": "x"}
	got := map[string]any{"a": map[string]any{"c": []any{1}, "e": "default"}, "d": "x"}
	if diff := cmp.Diff([]string{"spec.a.b", "spec.a.c[1]"}, missingFields(want, got, field.NewPath("spec"))); diff != "" {
		t.Errorf("missingFields (-want +got):\n%s", diff)
	}
}

// TestFractionWithoutModels: with no GPU model known (no node publishes
// slices), a pod asking for a percentage of a GPU's memory is refused,
// naming its container, and nothing is created; a share in MiB needs no
// model and is admitted; with a model the percentage is admitted.
func TestFractionWithoutModels(t *testing.T) {
	tr, client := translator()
	tr.Models = models{}
	percent := strings.Replace(strings.Replace(hamiPod, "nvidia.com/gpumem: 3000", "nvidia.com/gpumem-percentage: 50", 1), "nvidia.com/gpucores: 30", "cpu: \"1\"", 1)
	percent = strings.Replace(percent, "        cpu: \"1\"\n        nvidia.com/gpu: 1\n", "        nvidia.com/gpu: 1\n", 1)
	resp := review(t, tr, podJSON(t, percent), false)
	if resp.Allowed {
		t.Fatalf("a percentage of memory admitted without GPU models: %+v", resp)
	}
	const field = "spec.containers[0].resources"
	if !strings.Contains(resp.Result.Message, field) || !strings.Contains(resp.Result.Message, "no GPU model is known") {
		t.Errorf("denial %q: want %s and the reason", resp.Result.Message, field)
	}
	if w := writes(client); len(w) != 0 {
		t.Errorf("wrote %v", w)
	}
	if resp := review(t, tr, podJSON(t, hamiPod), false); !resp.Allowed {
		t.Errorf("a share in MiB refused without models: %v", resp.Result)
	}
	tr.Models = h100
	if resp := review(t, tr, podJSON(t, percent), false); !resp.Allowed {
		t.Errorf("with a model: %v", resp.Result)
	}
}
