package claimtemplate

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/internal/cli/clitest"
	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/webhook"
	"github.com/tessera-dev/tessera/pkg/webhook/webhooktest"
)

// migSpecTemplate is the ResourceClaimTemplate of a demo/specs/mig spec.
func migSpecTemplate(t *testing.T, file string) *resourceapi.ResourceClaimTemplate {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "demo", "specs", "mig", file))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if meta.Kind != "ResourceClaimTemplate" {
			continue
		}
		var tmpl resourceapi.ResourceClaimTemplate
		if err := yaml.UnmarshalStrict([]byte(doc), &tmpl); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		// What the API server defaults before admission sees the object.
		for i := range tmpl.Spec.Spec.Devices.Requests {
			if ex := tmpl.Spec.Spec.Devices.Requests[i].Exactly; ex != nil && ex.AllocationMode == "" {
				ex.AllocationMode, ex.Count = resourceapi.DeviceAllocationModeExactCount, max(ex.Count, 1)
			}
		}
		return &tmpl
	}
	t.Fatalf("%s: no ResourceClaimTemplate", file)
	return nil
}

// admitted runs obj (a template or claim) through the validating webhook's
// Review with Tessera's DeviceClasses, failing the test on a denial.
func admitted(t *testing.T, kind string, obj any) {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	resp := webhook.Review(context.Background(), &admissionv1.AdmissionRequest{
		UID: "u", Kind: metav1.GroupVersionKind{Group: webhook.ResourceGroup, Version: "v1", Kind: kind},
		Operation: admissionv1.Create, Namespace: "tessera-demo", Name: "x", Object: runtime.RawExtension{Raw: raw},
	}, webhook.DeviceClassMap(model.NewClassLister(model.DeviceClasses())))
	if !resp.Allowed {
		t.Fatalf("%s denied: %s", kind, resp.Result.Message)
	}
}

// allocateOnMIGNode runs kube-scheduler's allocator for a claim with these
// devices over what the hgx-h100-mig mock node publishes (static MIG on GPUs
// 0 and 1) and returns the allocated devices.
func allocateOnMIGNode(t *testing.T, devices resourceapi.DeviceClaim) []string {
	t.Helper()
	objs := clitest.Slices(t, "node-1", gputest.GPUs(t, "hgx-h100-mig"))
	var slices []*resourceapi.ResourceSlice
	for i := range objs {
		objs[i].Name = fmt.Sprintf("%s%d", objs[i].GenerateName, i)
		slices = append(slices, &objs[i])
	}
	classes := model.NewClassLister(model.DeviceClasses())
	a, err := structured.NewAllocator(context.Background(), model.SchedulerFeatures, model.NewAllocatedState(), classes, slices, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		t.Fatal(err)
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "tessera-demo", UID: k8stypes.UID("uid-c")}, Spec: resourceapi.ResourceClaimSpec{Devices: devices}}
	results, err := a.Allocate(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range results {
		for _, d := range r.Devices.Results {
			got = append(got, d.Device)
		}
	}
	return got
}

// TestDemoMIGProfileSpec: demo/specs/mig/10-mig-profile.yaml is the
// template `tessera claim-template --mig 3g.40gb` prints, admission allows
// it, and on the hgx-h100-mig mock node its claim gets GPU 0's static
// 3g.40gb (GPU instance 2).
func TestDemoMIGProfileSpec(t *testing.T) {
	spec := migSpecTemplate(t, "10-mig-profile.yaml")
	built := mustBuild(t, Options{Name: spec.Name, Namespace: spec.Namespace, MIG: true, MIGProfile: "3g.40gb"})
	if !equality.Semantic.DeepEqual(spec.Spec, built.Spec) {
		t.Errorf("the spec's template differs from tessera claim-template --mig 3g.40gb:\n spec  %+v\n built %+v", spec.Spec, built.Spec)
	}
	admitted(t, "ResourceClaimTemplate", spec)
	if got := allocateOnMIGNode(t, spec.Spec.Spec.Devices); len(got) != 1 || got[0] != "gpu-0-mig-2" {
		t.Errorf("allocated %v, want gpu-0-mig-2 (the static 3g.40gb)", got)
	}
}

// TestDemoMIGFractionSpec: demo/specs/mig/20-mig-fraction.yaml's claims are
// expanded by the mutating webhook into what `tessera claim-template --mig
// --fraction 1/2` prints, the expanded claim is admitted, and on the
// hgx-h100-mig mock node it gets GPU 0's static 4g.40gb (GPU instance 1),
// through the H100 subrequest.
func TestDemoMIGFractionSpec(t *testing.T) {
	spec := migSpecTemplate(t, "20-mig-fraction.yaml")
	admitted(t, "ResourceClaimTemplate", spec)
	// The claim the resourceclaim controller creates from the template.
	claim := resourceapi.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: "mig-half-gpu", Namespace: spec.Namespace, Annotations: spec.Spec.Annotations},
		Spec:       spec.Spec.Spec,
	}
	resp := webhook.Mutate(webhooktest.ClaimCreate(t, claim), func() ([]fraction.Model, error) { return nil, fmt.Errorf("no cluster read for a MIG fraction") })
	claim.Spec.Devices.Requests = webhooktest.PatchedRequests(t, resp)
	built := mustBuild(t, Options{Name: "x", MIG: true, Fraction: "1/2"})
	if !equality.Semantic.DeepEqual(claim.Spec.Devices, built.Spec.Spec.Devices) {
		t.Errorf("the expanded claim differs from tessera claim-template --mig --fraction 1/2:\n claim %+v\n built %+v", claim.Spec.Devices, built.Spec.Spec.Devices)
	}
	admitted(t, "ResourceClaim", claim)
	if got := allocateOnMIGNode(t, claim.Spec.Devices); len(got) != 1 || got[0] != "gpu-0-mig-1" {
		t.Errorf("allocated %v, want gpu-0-mig-1 (the static 4g.40gb)", got)
	}
}
