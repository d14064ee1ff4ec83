package legacypods

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/legacy"
)

// honourDryRun makes client's creates of templates with DryRun answer the
// object without storing it, as the API server does (the fake's tracker
// stores it); change, when set, edits what is answered.
func honourDryRun(client *fake.Clientset, change func(*resourceapi.ResourceClaimTemplate)) {
	client.PrependReactor("create", "resourceclaimtemplates", func(action k8stesting.Action) (bool, runtime.Object, error) {
		create := action.(k8stesting.CreateActionImpl)
		if !slices.Contains(create.CreateOptions.DryRun, metav1.DryRunAll) {
			return false, nil, nil
		}
		tmpl := create.GetObject().(*resourceapi.ResourceClaimTemplate).DeepCopy()
		if _, err := client.Tracker().Get(action.GetResource(), action.GetNamespace(), tmpl.Name); err == nil {
			return true, nil, apierrors.NewAlreadyExists(action.GetResource().GroupResource(), tmpl.Name)
		}
		if change != nil {
			change(tmpl)
		}
		return true, tmpl, nil
	})
}

// admittedPod is hamiPod as the Translator admits it, in namespace ns.
func admittedPod(t *testing.T, ns string) *corev1.Pod {
	t.Helper()
	tr, _ := translator()
	raw := podJSON(t, hamiPod)
	resp := review(t, tr, raw, false)
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("admission: %+v", resp)
	}
	var pod corev1.Pod
	if err := json.Unmarshal(apply(t, raw, resp), &pod); err != nil {
		t.Fatal(err)
	}
	pod.Namespace, pod.UID = ns, types.UID("uid-"+ns)
	return &pod
}

// realCreates are the client's creates that were no dry run, as
// "namespace/name".
func realCreates(client *fake.Clientset) []string {
	var out []string
	for _, a := range client.Actions() {
		create, ok := a.(k8stesting.CreateActionImpl)
		if !ok || a.GetResource().Resource != "resourceclaimtemplates" || len(create.CreateOptions.DryRun) > 0 {
			continue
		}
		out = append(out, a.GetNamespace()+"/"+create.GetObject().(*resourceapi.ResourceClaimTemplate).Name)
	}
	return out
}

// startController starts the caches of a Controller of client (no worker:
// the test calls sync); it stops with the test.
func startController(t *testing.T, client *fake.Clientset) (*Controller, context.Context) {
	t.Helper()
	c, err := NewController(client, Options{Models: h100})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := c.start(ctx, ctx.Done()); err != nil {
		t.Fatal(err)
	}
	return c, ctx
}

// TestControllerCreatesTemplates: for a translated pod stored in a
// namespace that opted in, the Controller creates the template the pod
// names, equal to Translate's, labelled as its own and annotated with the
// pod; the same pod in a namespace that did not opt in gets nothing. A
// second sync creates nothing more; the sweep deletes the template once the
// pod is gone.
func TestControllerCreatesTemplates(t *testing.T) {
	team, other := admittedPod(t, "team"), admittedPod(t, "other")
	client := fake.NewClientset(namespace("team", true), namespace("other", false), team, other)
	honourDryRun(client, nil)
	c, ctx := startController(t, client)
	for _, key := range []string{"team/gpu-pod", "other/gpu-pod"} {
		if err := c.sync(ctx, key); err != nil {
			t.Fatalf("sync %s: %v", key, err)
		}
	}
	want := translatedTemplate(t)
	if diff := cmp.Diff([]string{"team/" + want.Name}, realCreates(client)); diff != "" {
		t.Fatalf("created (-want +got):\n%s", diff)
	}
	got, err := client.ResourceV1().ResourceClaimTemplates("team").Get(ctx, want.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want.Spec, got.Spec); diff != "" {
		t.Errorf("template spec (-Translate +created):\n%s", diff)
	}
	if got.Labels[legacy.LabelTranslated] != "true" || got.Labels[LabelAdmission] != "true" || got.Labels[legacy.LabelManagedBy] != "tessera" {
		t.Errorf("template labels %v", got.Labels)
	}
	if a := got.Annotations[AnnotationCreatedFor]; a != "gpu-pod (uid uid-team)" {
		t.Errorf("annotation %s %q, want the pod", AnnotationCreatedFor, a)
	}
	// Once the cache holds the template, a sync writes nothing.
	if err := eventually(ctx, func() bool {
		_, err := c.templates.ResourceClaimTemplates("team").Get(want.Name)
		return err == nil
	}); err != nil {
		t.Fatal(err)
	}
	before := len(client.Actions())
	if err := c.sync(ctx, "team/gpu-pod"); err != nil {
		t.Fatal(err)
	}
	if w := writesOf(client.Actions()[before:]); len(w) != 0 {
		t.Errorf("second sync wrote %v", w)
	}

	// The sweep keeps the template while its pod lives, and deletes it once
	// the pod is gone (the fake stores no creation time: it is old).
	if deleted, err := c.Sweep(ctx); err != nil || len(deleted) != 0 {
		t.Errorf("sweep with the pod alive: deleted %v (%v)", deleted, err)
	}
	if err := client.CoreV1().Pods("team").Delete(ctx, "gpu-pod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := eventually(ctx, func() bool {
		deleted, err := c.Sweep(ctx)
		return err == nil && slices.Equal(deleted, []string{"team/" + want.Name})
	}); err != nil {
		t.Errorf("the controller's template once its pod is gone: %v", err)
	}
}

// TestControllerCreatesOnlyWhatThePodNames: a pod whose annotation was
// edited to another shape names a template its annotation no longer
// translates to: nothing is created, and the error says so and is not
// retried. A pod that names no translated template, or whose annotation is
// not a Source, gets nothing either.
func TestControllerCreatesOnlyWhatThePodNames(t *testing.T) {
	edited := admittedPod(t, "team")
	edited.Annotations[legacy.AnnotationSource] = strings.Replace(edited.Annotations[legacy.AnnotationSource], `"3k"`, `"6k"`, 1)
	if !strings.Contains(edited.Annotations[legacy.AnnotationSource], `"6k"`) {
		t.Fatalf("the test's edit did not apply: %s", edited.Annotations[legacy.AnnotationSource])
	}
	garbled := admittedPod(t, "team")
	garbled.Name = "garbled"
	garbled.Annotations[legacy.AnnotationSource] = "{"
	client := fake.NewClientset(namespace("team", true), edited, garbled)
	honourDryRun(client, nil)
	c, ctx := startController(t, client)
	err := c.sync(ctx, "team/gpu-pod")
	var permanent permanentError
	if !errors.As(err, &permanent) || !strings.Contains(err.Error(), "translates to") {
		t.Errorf("edited annotation: %v, want a permanent error naming the mismatch", err)
	}
	if err := c.sync(ctx, "team/garbled"); !errors.As(err, &permanent) || !strings.Contains(err.Error(), legacy.AnnotationSource) {
		t.Errorf("garbled annotation: %v, want a permanent error naming the annotation", err)
	}
	if created := realCreates(client); len(created) != 0 {
		t.Errorf("created %v", created)
	}
}

// TestControllerDroppedFields: an API server whose feature gate is off
// drops the template's capacity (the dry run's answer here): the template
// is not created, so the pod never gets a weaker claim, and the error names
// the field and a feature gate.
func TestControllerDroppedFields(t *testing.T) {
	client := fake.NewClientset(namespace("team", true), admittedPod(t, "team"))
	honourDryRun(client, func(tmpl *resourceapi.ResourceClaimTemplate) {
		for i := range tmpl.Spec.Spec.Devices.Requests {
			if r := tmpl.Spec.Spec.Devices.Requests[i].Exactly; r != nil {
				r.Capacity = nil
			}
		}
	})
	c, ctx := startController(t, client)
	err := c.sync(ctx, "team/gpu-pod")
	const lost = "spec.spec.devices.requests[0].exactly.capacity"
	var permanent permanentError
	if !errors.As(err, &permanent) || !strings.Contains(err.Error(), "drops "+lost) || !strings.Contains(err.Error(), "feature gate") {
		t.Errorf("sync: %v, want a permanent error naming %s and a feature gate", err, lost)
	}
	if created := realCreates(client); len(created) != 0 {
		t.Errorf("created %v", created)
	}
}

// TestControllerRun: with the workers running, a pod stored in a namespace
// that opted in gets its template; a template deleted while the pod names
// it is made again; a pod in a namespace that opts in later gets its
// template once the label is set; a pod whose template cannot be made gets
// a warning event saying why.
func TestControllerRun(t *testing.T) {
	client := fake.NewClientset(namespace("team", true), namespace("later", false))
	honourDryRun(client, nil)
	events := record.NewFakeRecorder(10)
	c, err := NewController(client, Options{Models: h100, Events: events})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	name := translatedTemplate(t).Name
	exists := func(ns string) func() bool {
		return func() bool {
			_, err := client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil
		}
	}
	if _, err := client.CoreV1().Pods("team").Create(ctx, admittedPod(t, "team"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := eventually(ctx, exists("team")); err != nil {
		t.Fatalf("the pod's template: %v", err)
	}
	// The informer must have seen it before the delete means anything.
	if err := eventually(ctx, func() bool { _, err := c.templates.ResourceClaimTemplates("team").Get(name); return err == nil }); err != nil {
		t.Fatal(err)
	}
	if err := client.ResourceV1().ResourceClaimTemplates("team").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := eventually(ctx, exists("team")); err != nil {
		t.Fatalf("the template deleted under its pod: %v", err)
	}

	if _, err := client.CoreV1().Pods("later").Create(ctx, admittedPod(t, "later"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if exists("later")() {
		t.Fatal("a template was created in a namespace that did not opt in")
	}
	if _, err := client.CoreV1().Namespaces().Update(ctx, namespace("later", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := eventually(ctx, exists("later")); err != nil {
		t.Fatalf("the template once the namespace opted in: %v", err)
	}

	// A pod that names a template its record does not translate to.
	edited := admittedPod(t, "team")
	edited.Name = "edited"
	edited.Spec.ResourceClaims[0].ResourceClaimTemplateName = ptr.To(legacy.TemplatePrefix + "0000000000000000")
	if _, err := client.CoreV1().Pods("team").Create(ctx, edited, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-events.Events:
		if !strings.HasPrefix(e, "Warning "+ReasonTemplateNotCreated) || !strings.Contains(e, "team/edited") {
			t.Errorf("event %q, want a warning %s about team/edited", e, ReasonTemplateNotCreated)
		}
	case <-time.After(10 * time.Second):
		t.Error("no event within 10s for a pod whose template cannot be made")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// eventually polls cond every 10ms for at most 10s.
func eventually(ctx context.Context, cond func() bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within 10s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}
