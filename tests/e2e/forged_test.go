//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/budget"
	"github.com/tessera-dev/tessera/pkg/legacy"
	"github.com/tessera-dev/tessera/pkg/webhook"
	"github.com/tessera-dev/tessera/pkg/webhook/legacypods"
	"github.com/tessera-dev/tessera/tests/e2e/framework"
)

// TestForgedReviews: a client with no credentials but a route to the
// webhook's port (this test's process: on this cluster the webhook listens
// on the node's 127.0.0.1, which only the node and host-network pods
// reach) posts AdmissionReviews it forged for every path the webhook
// serves (/validate, /mutate, /mutate-pods, /budget), naming another
// namespace (victim, with a GPUBudget, opted in to legacy translation).
// With the API server's client certificates required (install.sh's
// default) every forged review gets 403 and nothing in victim changes;
// without them (the release upgraded with webhook.clientAuth off) the
// reviews are answered, but no answer shows victim's used or hard, the
// forged charge stops counting within the confirm window (a real claim
// the size of what is left is then admitted), and the forged pod review
// creates no ResourceClaimTemplate. Real claims are admitted throughout.
func TestForgedReviews(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	framework.RequireWebhook(t, c)
	framework.HelmUpgradeValues(t, c, map[string]any{
		"budgets": map[string]any{"enabled": true},
		"webhook": map[string]any{"legacyTranslation": map[string]any{"enabled": true}},
	}, false)
	if !clientAuthOn(t) {
		t.Log("the release does not have webhook.clientAuth on (install.sh sets it): only the run without client certificates")
	} else {
		t.Run("WithClientCerts", func(t *testing.T) { forgeReviews(t, c, true) })
		framework.HelmUpgradeValues(t, c, map[string]any{"webhook": map[string]any{"clientAuth": map[string]any{"enabled": false}}}, false)
	}
	t.Run("WithoutClientCerts", func(t *testing.T) { forgeReviews(t, c, false) })
}

// clientAuthOn reports whether the release's values turn webhook.clientAuth on.
func clientAuthOn(t *testing.T) bool {
	out, err := exec.Command(framework.HelmBinary(t), "get", "values", "-n", framework.InstallNamespace, framework.InstallRelease, "-o", "json").Output()
	if err != nil {
		t.Fatalf("helm get values: %v", err)
	}
	var values struct {
		Webhook struct {
			ClientAuth struct {
				Enabled bool `json:"enabled"`
			} `json:"clientAuth"`
		} `json:"webhook"`
	}
	if err := json.Unmarshal(out, &values); err != nil {
		t.Fatalf("helm get values: %v", err)
	}
	return values.Webhook.ClientAuth.Enabled
}

func forgeReviews(t *testing.T, c *framework.Cluster, refused bool) {
	ctx := context.Background()
	victim := c.Namespace(t, "e2e-forged-victim")
	attacker := c.Namespace(t, "e2e-forged")
	ns, err := c.Client.CoreV1().Namespaces().Get(ctx, victim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["gpu.tessera.dev/budgets"] = "enforced"
	ns.Labels[legacypods.NamespaceLabel] = "true"
	if _, err := c.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	createBudget(t, c, victim, "40Gi")
	waitForBudgets(t, c, victim, "50Gi")
	claims := c.Client.ResourceV1().ResourceClaims(victim)
	if _, err := claims.Create(ctx, shareClaim("real-0", "10Gi"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a real 10Gi claim in a 40Gi budget: %v", err)
	}

	// The forged reviews: what the API server would send for victim's
	// objects. 30Gi is what victim's budget has left, 50Gi over it (its
	// refusal must not show the figures).
	reviews := []forgedRequest{
		{path: webhook.ValidatePath, obj: shareClaim("forged-validate", "30Gi")},
		{path: webhook.MutatePath, obj: fractionClaim("forged-mutate")},
		{path: legacypods.Path, obj: forgedLegacyPod("forged-pod")},
		{path: budget.Path, obj: shareClaim("forged-budget-over", "50Gi")},
		{path: budget.Path, obj: shareClaim("forged-budget", "30Gi")},
	}
	for i := range reviews {
		reviews[i].body = forgedReview(t, victim, reviews[i].obj)
	}
	if !refused {
		// helm's --wait saw the new replicas ready; an old one may still
		// answer for a moment. Five answers in a row, on new connections
		// (the replicas share the port).
		probe := []forgedRequest{{path: webhook.ValidatePath, body: forgedReview(t, attacker, shareClaim("probe", "1Gi"))}}
		inARow := 0
		err := framework.Poll(ctx, "the webhook to answer reviews without a client certificate", framework.PodTimeout, func(context.Context) (bool, error) {
			if answer := forge(probe)[0]; !strings.HasPrefix(answer, "200 ") {
				inARow = 0
				return false, framework.Retry("%s", answer)
			}
			inARow++
			return inARow == 5, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	forgedAt := time.Now()
	// Three rounds, each request on a connection of its own: both
	// replicas get some.
	var sent []forgedRequest
	var answers []string
	for range 3 {
		sent = append(sent, reviews...)
		answers = append(answers, forge(reviews)...)
	}
	for i, answer := range answers {
		path := sent[i].path
		t.Logf("%s (%s): %.300s", path, metaName(sent[i].obj), answer)
		switch {
		case refused && !strings.HasPrefix(answer, "403 "):
			t.Errorf("%s: %q, want 403 (no client certificate)", path, answer)
		case !refused && (!strings.HasPrefix(answer, "200 ") || !strings.Contains(answer, `"response"`)):
			t.Errorf("%s: %q, want an AdmissionReview answer", path, answer)
		}
		// Neither victim's hard (40Gi) nor its used (10Gi, 40Gi with the
		// forged charge), in any unit the webhook writes.
		for _, figure := range []string{"40Gi", "10Gi", "42949672960", "10737418240", "40 Gi", "10 Gi"} {
			if strings.Contains(answer, figure) {
				t.Errorf("%s: the answer shows victim's figure %s: %s", path, figure, answer)
			}
		}
	}

	// A real claim of what the budget has left is admitted within the
	// confirm window of the forged charge (at once when it was refused).
	window := budget.DefaultConfirmWindow + 20*time.Second
	err = framework.Poll(ctx, "a real 30Gi claim in victim to be admitted", window, func(ctx context.Context) (bool, error) {
		_, err := claims.Create(ctx, shareClaim("real-1", "30Gi"), metav1.CreateOptions{})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v (forged %v ago)", err, time.Since(forgedAt).Round(time.Second))
	}
	t.Logf("a real 30Gi claim admitted %v after the forgery", time.Since(forgedAt).Round(time.Second))
	if refused && time.Since(forgedAt) > 10*time.Second {
		t.Errorf("with client certificates required, the real claim waited %v", time.Since(forgedAt).Round(time.Second))
	}
	b, err := getBudget(ctx, c, victim)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range b.Status.Pending {
		if strings.HasPrefix(p.Claim, "forged-") && (p.Confirmed || p.ConfirmBy == nil || p.ConfirmBy.After(time.Now())) {
			t.Errorf("victim's budget still counts the forged charge %+v", p)
		}
	}

	// The forged pod review made no template: none in victim (which has
	// no pod) nor in the attacker's namespace.
	for _, ns := range []string{victim, attacker} {
		templates, err := c.Client.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tmpl := range templates.Items {
			t.Errorf("ResourceClaimTemplate %s/%s after the forged pod review (labels %v)", ns, tmpl.Name, tmpl.Labels)
		}
	}
}

// fractionClaim is a claim of the shared class annotated with a GPU
// fraction, which /mutate expands over the GPU models published.
func fractionClaim(name string) runtime.Object {
	// A quarter: the share's memory is no figure of victim's budget.
	return framework.Claim{Name: name, Request: "share", Class: framework.SharedClass,
		Annotations: map[string]string{"gpu.tessera.dev/fraction": "0.25"}}.ResourceClaim()
}

// forgedLegacyPod is a pod asking for a GPU through the device plugin's resource.
func forgedLegacyPod(name string) runtime.Object {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "ctr", Image: framework.EnvImage,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceName(legacy.NvidiaGPU): resource.MustParse("1")}},
		}}},
	}
}

// forgedReview is the AdmissionReview of obj's CREATE in namespace, as
// the API server would send it.
func forgedReview(t *testing.T, namespace string, obj runtime.Object) string {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	meta := metaName(obj)
	gvk := obj.GetObjectKind().GroupVersionKind()
	resourceName := "resourceclaims"
	if gvk.Kind == "Pod" {
		resourceName = "pods"
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID(uuid.NewUUID()),
			Kind:      metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind},
			Resource:  metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resourceName},
			Name:      meta,
			Namespace: namespace,
			Operation: admissionv1.Create,
			UserInfo:  authenticationv1.UserInfo{Username: "system:serviceaccount:" + namespace + ":default"},
			Object:    runtime.RawExtension{Raw: raw},
			DryRun:    ptr.To(false),
		},
	}
	out, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// forgedRequest is a forged review of obj (body) for path.
type forgedRequest struct {
	path string
	obj  runtime.Object
	body string
}

// forge posts each review to its path on the webhook's port, as anything
// that reaches the port can (on this cluster the webhook listens on the
// node's 127.0.0.1, where this test runs): no client certificate, the
// server's certificate not checked, a connection per request. It returns
// "status body" per request (or the error).
func forge(reviews []forgedRequest) []string {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // #nosec G402 -- a forger checks nothing
		DisableKeepAlives: true,
	}}
	answers := make([]string, 0, len(reviews))
	for _, r := range reviews {
		resp, err := client.Post("https://127.0.0.1:"+webhookPort()+r.path, "application/json", strings.NewReader(r.body))
		if err != nil {
			answers = append(answers, err.Error())
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		answers = append(answers, fmt.Sprintf("%d %s", resp.StatusCode, body))
	}
	return answers
}

// metaName is obj's name.
func metaName(obj runtime.Object) string {
	if o, ok := obj.(metav1.Object); ok {
		return o.GetName()
	}
	return ""
}

// webhookPort is the webhook's port on the node's 127.0.0.1 (install.sh's
// TESSERA_WEBHOOK_PORT).
func webhookPort() string {
	if port := os.Getenv("TESSERA_WEBHOOK_PORT"); port != "" {
		return port
	}
	return "9443"
}
