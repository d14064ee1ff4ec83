package webhook

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/model/modelnames"
	"github.com/tessera-dev/tessera/pkg/webhook/webhooktest"
)

var mutateModels = []fraction.Model{
	{Products: []string{"NVIDIA L4"}, Memory: resource.MustParse("23034Mi"), MemoryStep: resource.MustParse("1Mi"), Cores: 100, CoresStep: 1},
	{Products: []string{"NVIDIA H100 80GB HBM3"}, Memory: resource.MustParse("81559Mi"), MemoryStep: resource.MustParse("1Mi"), Cores: 100, CoresStep: 1},
}

func claimReview(t *testing.T, version, claimYAML string) *admissionv1.AdmissionRequest {
	t.Helper()
	raw, err := yaml.YAMLToJSON([]byte(claimYAML))
	if err != nil {
		t.Fatal(err)
	}
	return &admissionv1.AdmissionRequest{
		UID: "u", Kind: metav1.GroupVersionKind{Group: ResourceGroup, Version: version, Kind: "ResourceClaim"},
		Operation: admissionv1.Create, Namespace: "ns", Name: "c", Object: runtime.RawExtension{Raw: raw},
	}
}

// fractionClaim is a claim annotated with the given fraction whose first
// request, of the given name and class, has a selector of its own.
func fractionClaim(fraction, name, class string) string {
	return `
metadata: {name: c, annotations: {gpu.tessera.dev/fraction: "` + fraction + `"}}
spec:
  devices:
    requests:
    - name: ` + name + `
      exactly:
        deviceClassName: ` + class + `
        selectors: [{cel: {expression: 'device.attributes["gpu.tessera.dev"].minor >= 0'}}]
`
}

func TestMutateExpandsFraction(t *testing.T) {
	req := claimReview(t, "v1", fractionClaim("1/2", "gpu", "shared.gpu.tessera.dev")+`    - name: whole
      exactly: {deviceClassName: gpu.tessera.dev}
    config:
    - requests: [gpu]
      opaque: {driver: gpu.tessera.dev, parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, sharing: {isolation: Advisory}}}
`)
	requests := webhooktest.PatchedRequests(t, Mutate(req, func() ([]fraction.Model, error) { return mutateModels, nil }))
	var claim resourceapi.ResourceClaim
	if err := json.Unmarshal(req.Object.Raw, &claim); err != nil {
		t.Fatal(err)
	}
	claim.Spec.Devices.Requests = requests
	reqs := claim.Spec.Devices.Requests
	if len(reqs) != 2 || reqs[0].Name != "gpu" || len(reqs[0].FirstAvailable) != 2 || reqs[1].Exactly == nil {
		t.Fatalf("requests after the patch: %+v", reqs)
	}
	for i, want := range []string{"11517Mi", "40779Mi"} {
		s := reqs[0].FirstAvailable[i]
		if got := s.Capacity.Requests["memory"]; got.String() != want || len(s.Selectors) != 2 {
			t.Errorf("subrequest %s: memory %s, %d selectors; want %s and the model's and the claim's selectors", s.Name, got.String(), len(s.Selectors), want)
		}
	}
	// The validating webhook admits the mutated claim.
	if errs, _ := ValidateDeviceClaim(&claim.Spec.Devices, field.NewPath("spec", "devices")); len(errs) > 0 {
		t.Errorf("the mutated claim is refused: %v", errs)
	}
}

func TestMutateRefuses(t *testing.T) {
	share := func(annotation, exactly string) string {
		return `
metadata: {name: c, annotations: {gpu.tessera.dev/fraction: "` + annotation + `"}}
spec: {devices: {requests: [{name: gpu, exactly: ` + exactly + `}]}}`
	}
	models := func() ([]fraction.Model, error) { return mutateModels, nil }
	for name, tc := range map[string]struct {
		claim  string
		models func() ([]fraction.Model, error)
		want   string
	}{
		"bad value":      {share("half", `{deviceClassName: shared.gpu.tessera.dev}`), models, `metadata.annotations[gpu.tessera.dev/fraction]: Invalid value: "half": fraction "half": not a number`},
		"capacity set":   {share("1/2", `{deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 1Gi}}}`), models, "drop capacity.requests or the annotation"},
		"count 2":        {share("1/2", `{deviceClassName: shared.gpu.tessera.dev, count: 2}`), models, "count must be 1"},
		"all":            {share("1/2", `{deviceClassName: shared.gpu.tessera.dev, allocationMode: All}`), models, "count must be 1"},
		"admin access":   {share("1/2", `{deviceClassName: shared.gpu.tessera.dev, adminAccess: true}`), models, "asks for a share; admin access takes none"},
		"MIG count 2":    {share("1/7", `{deviceClassName: mig.gpu.tessera.dev, count: 2}`), models, "asks for a MIG device of one GPU: count must be 1"},
		"whole only":     {share("1/2", `{deviceClassName: gpu.tessera.dev}`), models, "no request of the claim asks for exactly one device of class shared.gpu.tessera.dev or mig.gpu.tessera.dev"},
		"no models":      {share("1/2", `{deviceClassName: shared.gpu.tessera.dev}`), func() ([]fraction.Model, error) { return nil, nil }, "no GPU model publishes Tessera shared devices"},
		"models unknown": {share("1/2", `{deviceClassName: shared.gpu.tessera.dev}`), func() ([]fraction.Model, error) { return nil, errors.New("timeout") }, "read the GPU models the cluster publishes: timeout"},
	} {
		t.Run(name, func(t *testing.T) {
			resp := Mutate(claimReview(t, "v1", tc.claim), tc.models)
			if resp.Allowed || !strings.Contains(resp.Result.Message, tc.want) {
				t.Errorf("response %+v: want a denial with %q", resp.Result, tc.want)
			}
		})
	}
}

func TestMutateLeavesOthersAlone(t *testing.T) {
	models := func() ([]fraction.Model, error) { t.Fatal("models read"); return nil, nil }
	plain := Mutate(claimReview(t, "v1", `{metadata: {name: c}, spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: shared.gpu.tessera.dev}}]}}}`), models)
	other := Mutate(claimReview(t, "v1beta2", `{metadata: {name: c, annotations: {gpu.tessera.dev/fraction: "1/2"}}}`), models)
	for _, resp := range []*admissionv1.AdmissionResponse{plain, other} {
		if !resp.Allowed || resp.Patch != nil {
			t.Errorf("response %+v: want allowed, unchanged", resp)
		}
	}
}

// TestMutateExpandsMIGFraction: the annotation on a request of the MIG
// class becomes one subrequest per GPU model with a known MIG table, each
// for that model's smallest profile covering the fraction (1/7 of an H100
// is a 1g.20gb), keeping the claim's selectors, without reading the
// cluster's models; the validating webhook admits the result.
func TestMutateExpandsMIGFraction(t *testing.T) {
	req := claimReview(t, "v1", fractionClaim("1/7", "mig", "mig.gpu.tessera.dev"))
	reqs := webhooktest.PatchedRequests(t, Mutate(req, func() ([]fraction.Model, error) { t.Fatal("models read for a MIG fraction"); return nil, nil }))
	if len(reqs) != 1 || len(reqs[0].FirstAvailable) != len(fraction.MIGModels()) {
		t.Fatalf("requests %+v: want one subrequest per MIG model", reqs)
	}
	var h100 *resourceapi.DeviceSubRequest
	for i := range reqs[0].FirstAvailable {
		s := &reqs[0].FirstAvailable[i]
		if s.DeviceClassName != modelnames.MIGClassName || len(s.Selectors) != 2 || s.Selectors[1].CEL.Expression != `device.attributes["gpu.tessera.dev"].minor >= 0` {
			t.Errorf("subrequest %+v: want class %s with the model's and the claim's selectors", s, modelnames.MIGClassName)
		}
		if s.Name == "h100-80gb-1g-20gb" {
			h100 = s
		}
	}
	if h100 == nil || !strings.Contains(h100.Selectors[0].CEL.Expression, `.profile == "1g.20gb"`) {
		t.Errorf("no H100 subrequest for 1g.20gb in %+v", reqs[0].FirstAvailable)
	}
	claim := resourceapi.ResourceClaim{}
	claim.Spec.Devices.Requests = reqs
	if errs, _ := ValidateDeviceClaim(&claim.Spec.Devices, field.NewPath("spec", "devices")); len(errs) > 0 {
		t.Errorf("the mutated claim is refused: %v", errs)
	}
}
