package webhook

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// TestHAMiCoreSharedClaimWarning: a ResourceClaim whose share uses HAMiCore
// is admitted with a warning that several pods (or containers without
// shareProcessNamespace) on it break HAMi-core's per-PID accounting; the
// same share from a template (one claim per pod) and a ResourceClaim with
// another backend get none.
func TestHAMiCoreSharedClaimWarning(t *testing.T) {
	spec := func(isolation string) string {
		return `
devices:
  requests:
  - name: gpu
    exactly:
      deviceClassName: shared.gpu.tessera.dev
      capacity: {requests: {memory: 8Gi, cores: "20"}}
  config:
  - requests: [gpu]
    opaque:
      driver: gpu.tessera.dev
      parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, sharing: {isolation: ` + isolation + `}}`
	}
	indent := func(s string) string { return strings.ReplaceAll(s, "\n", "\n  ") }
	review := func(kind, object string) *admissionv1.AdmissionResponse {
		t.Helper()
		raw, err := yaml.YAMLToJSON([]byte(object))
		if err != nil {
			t.Fatal(err)
		}
		return Review(context.Background(), &admissionv1.AdmissionRequest{
			UID:       "1",
			Kind:      metav1.GroupVersionKind{Group: ResourceGroup, Version: "v1", Kind: kind},
			Operation: admissionv1.Create,
			Namespace: "default",
			Name:      "train",
			Object:    runtime.RawExtension{Raw: raw},
		}, nil)
	}
	want := "spec.devices.config[0].opaque.parameters.sharing.isolation: HAMiCore counts usage per PID namespace: reference this claim from one pod only"

	resp := review("ResourceClaim", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: train}\nspec:"+indent(spec("HAMiCore")))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.HasPrefix(resp.Warnings[0], want) || !strings.Contains(resp.Warnings[0], "shareProcessNamespace") {
		t.Errorf("HAMiCore ResourceClaim: allowed %v, warnings %q; want allowed with one warning starting %q", resp.Allowed, resp.Warnings, want)
	}
	for _, w := range resp.Warnings {
		if len(w) > 256 {
			t.Errorf("warning of %d characters (the API server truncates at 256): %s", len(w), w)
		}
	}
	for name, resp := range map[string]*admissionv1.AdmissionResponse{
		"HAMiCore template": review("ResourceClaimTemplate", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: train}\nspec:\n  spec:"+indent(indent(spec("HAMiCore")))),
		"MPS claim":         review("ResourceClaim", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: train}\nspec:"+indent(spec("MPS"))),
	} {
		if !resp.Allowed || len(resp.Warnings) != 0 {
			t.Errorf("%s: allowed %v, warnings %q; want allowed without warnings", name, resp.Allowed, resp.Warnings)
		}
	}
}
