package legacypods

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-dev/tessera/pkg/legacy"
)

func template(namespace, name string, created time.Time, labelled bool, marked *time.Time) *resourceapi.ResourceClaimTemplate {
	t := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{
		Namespace: namespace, Name: name, UID: types.UID(namespace + "-" + name), CreationTimestamp: metav1.NewTime(created),
	}}
	if labelled {
		t.Labels = map[string]string{legacy.LabelTranslated: "true", LabelAdmission: "true"}
	}
	if marked != nil {
		t.Annotations = map[string]string{AnnotationAdmitted: marked.Format(time.RFC3339)}
	}
	return t
}

// converted is a template as `tessera convert` writes it: Tessera's
// translation label without the webhook's.
func converted(namespace, name string, created time.Time) *resourceapi.ResourceClaimTemplate {
	t := template(namespace, name, created, false, nil)
	t.Labels = map[string]string{legacy.LabelTranslated: "true", legacy.LabelManagedBy: "tessera"}
	return t
}

func namespace(name string, optedIn bool) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if optedIn {
		ns.Labels = map[string]string{NamespaceLabel: "true"}
	}
	return ns
}

func podUsing(namespace, name, tmpl string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{legacy.LabelTranslated: "true"},
			Annotations: map[string]string{"big": "dropped by the cache's transform"}},
		Spec: corev1.PodSpec{
			Containers:     []corev1.Container{{Name: "c", Image: "x"}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "tessera-gpu-0", ResourceClaimTemplateName: &tmpl}},
		},
	}
}

// startCleaner starts the caches of a Controller of client with a grace
// period of five minutes and the given clock (no worker: nothing is
// created); it stops with the test, as does the context it returns.
func startCleaner(t *testing.T, client *fake.Clientset, now func() time.Time) (*Controller, context.Context) {
	t.Helper()
	c, err := NewController(client, Options{Grace: 5 * time.Minute, Now: now})
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

// TestCleaner: a sweep deletes exactly the templates the webhook made in
// namespaces that opted in that no pod of their namespace references and
// that were made and last used more than the grace period ago; once the last
// pod using a template goes, the next sweep deletes it. Templates `tessera
// convert` wrote, and templates in namespaces without the opt-in label, stay.
func TestCleaner(t *testing.T) {
	now := clock
	old, young := now.Add(-time.Hour), now.Add(-time.Minute)
	objects := []runtime.Object{
		template("a", "orphan-old", old, true, nil),         // deleted
		template("a", "orphan-young", young, true, nil),     // within the grace period
		template("a", "orphan-marked", old, true, &young),   // used by an admission a minute ago
		template("a", "orphan-marked-old", old, true, &old), // deleted
		template("a", "in-use", old, true, nil),             // a pod of a uses it
		template("b", "in-use", old, true, nil),             // the pod is in a, not b: deleted
		template("a", "tenant", old, false, nil),            // not Tessera's
		converted("a", "gitops", old),                       // tessera convert's (a CronJob's between runs)
		template("c", "orphan-old", old, true, nil),         // c did not opt in
		template("gone", "orphan-old", old, true, nil),      // no such namespace
		namespace("a", true), namespace("b", true), namespace("c", false),
		podUsing("a", "p", "in-use"),
	}
	client := fake.NewClientset(objects...)
	c, ctx := startCleaner(t, client, func() time.Time { return now })
	// The cache keeps only what the index reads.
	if cached, err := c.pods.ByIndex(byTemplate, "a/in-use"); err != nil || len(cached) != 1 || len(cached[0].(*corev1.Pod).Annotations) != 0 {
		t.Fatalf("cached pods %v (%v): want one, without its annotations", cached, err)
	}
	deleted, err := c.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(deleted)
	if want := []string{"a/orphan-marked-old", "a/orphan-old", "b/in-use"}; !slices.Equal(deleted, want) {
		t.Errorf("deleted %v, want %v", deleted, want)
	}
	for _, ns := range []string{"a", "b"} {
		list, _ := client.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{})
		for _, tmpl := range list.Items {
			if slices.Contains(deleted, ns+"/"+tmpl.Name) {
				t.Errorf("%s/%s still exists", ns, tmpl.Name)
			}
		}
	}

	// The pod goes: its template is deleted by the next sweep.
	if err := client.CoreV1().Pods("a").Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		deleted, err = c.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(deleted, "a/in-use") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a/in-use not deleted within 10s of its pod's deletion")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The young and recently used ones stay until the grace period passed.
	now = now.Add(10 * time.Minute)
	deleted, err = c.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(deleted)
	if want := []string{"a/orphan-marked", "a/orphan-young"}; !slices.Equal(deleted, want) {
		t.Errorf("after the grace period deleted %v, want %v", deleted, want)
	}
	for _, key := range [][2]string{{"a", "tenant"}, {"a", "gitops"}, {"c", "orphan-old"}, {"gone", "orphan-old"}} {
		if _, err := client.ResourceV1().ResourceClaimTemplates(key[0]).Get(ctx, key[1], metav1.GetOptions{}); err != nil {
			t.Errorf("template %s/%s: %v", key[0], key[1], err)
		}
	}
}

// TestCleanerGraceFloor: a grace period below MinGrace is raised to it.
func TestCleanerGraceFloor(t *testing.T) {
	c, err := NewController(fake.NewClientset(), Options{Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if c.grace != MinGrace {
		t.Errorf("grace %v, want %v", c.grace, MinGrace)
	}
}

// TestCleanerListsLiveBeforeDelete: a pod the cache has not seen yet (a
// watch gap; here the live list alone returns it) keeps its template; a
// namespace whose pods cannot be listed loses nothing that sweep.
func TestCleanerListsLiveBeforeDelete(t *testing.T) {
	old := clock.Add(-time.Hour)
	client := fake.NewClientset(template("a", "unseen", old, true, nil), template("b", "unlistable", old, true, nil),
		namespace("a", true), namespace("b", true))
	c, ctx := startCleaner(t, client, func() time.Time { return clock })
	// From now on a List of pods (not the informer's watch) sees a pod in a
	// that uses the template, and fails in b.
	client.PrependReactor("list", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		switch action.GetNamespace() {
		case "a":
			return true, &corev1.PodList{Items: []corev1.Pod{*podUsing("a", "new", "unseen")}}, nil
		case "b":
			return true, nil, apierrors.NewForbidden(corev1.Resource("pods"), "", errors.New("test"))
		}
		return false, nil, nil
	})
	deleted, err := c.Sweep(ctx)
	if len(deleted) != 0 {
		t.Errorf("deleted %v: a/unseen is used by a pod the cache missed, b's pods could not be listed", deleted)
	}
	if err == nil || !strings.Contains(err.Error(), "namespace b") {
		t.Errorf("error %v: want the failed list of namespace b", err)
	}
}

// TestCleanerSyncTimeout: caches that never sync (the ClusterRole lacks
// list on namespaces) make Run fail, naming RBAC, instead of waiting.
func TestCleanerSyncTimeout(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "namespaces", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("namespaces"), "", errors.New("test"))
	})
	c, err := NewController(client, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.run(ctx, 200*time.Millisecond) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "did not sync") || !strings.Contains(err.Error(), "ClusterRole") {
			t.Errorf("Run: %v, want a sync failure naming the ClusterRole", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still waiting for its caches 10s after a 200ms sync timeout")
	}
}
