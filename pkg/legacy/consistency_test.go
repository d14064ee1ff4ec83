package legacy

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/internal/cli/claimtemplate"
	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/model/modelnames"
	"github.com/tessera-dev/tessera/pkg/webhook"
	"github.com/tessera-dev/tessera/pkg/webhook/webhooktest"
)

// TestNamesAreTheModels: the names repeated from pkg/model are its.
func TestNamesAreTheModels(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{string(modelnames.UUIDAttribute), model.DriverName + "/" + string(model.AttrUUID)},
		{attrProductName, string(model.AttrProductName)},
		{attrUUID, string(model.AttrUUID)},
		{requestName, claimtemplate.RequestName},
	} {
		if c.got != c.want {
			t.Errorf("%q, pkg/model has %q", c.got, c.want)
		}
	}
}

// TestExactIsClaimTemplateBuild: whole GPUs and shares of fixed memory are
// what `tessera claim-template` builds for the same options.
func TestExactIsClaimTemplateBuild(t *testing.T) {
	for _, tc := range []struct {
		s    shape
		opts claimtemplate.Options
	}{
		{shape{gpus: 1, whole: true}, claimtemplate.Options{}},
		{shape{gpus: 4, whole: true}, claimtemplate.Options{GPUs: 4}},
		{shape{gpus: 1, memory: ptr.To(resourceQuantity("3000Mi"))}, claimtemplate.Options{Memory: "3000Mi"}},
		{shape{gpus: 2, memory: ptr.To(resourceQuantity("4Gi")), cores: ptr.To(int64(30))}, claimtemplate.Options{GPUs: 2, Memory: "4Gi", Cores: 30}},
	} {
		tc.opts.Name = "x"
		want, _, err := claimtemplate.Build(tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		got := tc.s.exact(nil)
		if diff := cmp.Diff(want.Spec, got); diff != "" {
			t.Errorf("%s (-claimtemplate.Build +legacy):\n%s", tc.s.describe(), diff)
		}
	}
}

// TestSelectorsCompile: the selectors compile with the scheduler's CEL
// library and select what HAMi's CheckType and CheckUUID would.
func TestSelectorsCompile(t *testing.T) {
	sels, _, errs := podSelectors(map[string]string{
		HAMiUseType: "a100,H100", HAMiNoUseType: "PCIe", HAMiNoUseUUID: "GPU-bad",
	}, nil)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	device := func(product, uuid string) cel.Device {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
		if product != "" {
			attrs["productName"] = resourceapi.DeviceAttribute{StringValue: ptr.To(product)}
		}
		attrs["uuid"] = resourceapi.DeviceAttribute{StringValue: ptr.To(uuid)}
		return cel.Device{Driver: modelnames.DriverName, Attributes: attrs}
	}
	for _, tc := range []struct {
		d    cel.Device
		want bool
	}{
		{device("NVIDIA H100 80GB HBM3", "GPU-1"), true},
		{device("NVIDIA A100-SXM4-80GB", "GPU-2"), true},
		{device("NVIDIA A100 80GB PCIe", "GPU-3"), false}, // nouse PCIe
		{device("NVIDIA H100 80GB HBM3", "GPU-bad"), false},
		{device("NVIDIA L4", "GPU-4"), false},
		{device("", "GPU-5"), false}, // no product name: no positive type matches
	} {
		all := true
		for _, s := range sels {
			res := cache.GetOrCompile(s)
			if res.Error != nil {
				t.Fatalf("%s: %v", s, res.Error)
			}
			ok, _, err := res.DeviceMatches(context.Background(), tc.d)
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			all = all && ok
		}
		if all != tc.want {
			t.Errorf("device %v selected %v, want %v", tc.d.Attributes, all, tc.want)
		}
	}
}

// TestFractionTemplateExpands: the admission webhook's mutation expands the
// claims of a fraction template (two shares on distinct GPUs, a type
// selector) and its validation accepts the result.
func TestFractionTemplateExpands(t *testing.T) {
	in := podTemplate(t, pod("    nvidia.com/use-gputype: H100\n", "      limits:\n        nvidia.com/gpu: 2\n        nvidia.com/gpumem-percentage: 25\n"))
	got, errs := Translate(in, nil, Options{})
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	tmpl := got.ClaimTemplates[0]
	if s := summary(tmpl); s != "fraction 1/4; gpu-0: shared x1 selectors=1; gpu-1: shared x1 selectors=1; distinct gpu.tessera.dev/uuid over gpu-0,gpu-1" {
		t.Fatalf("template %s", s)
	}
	claim := resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", Annotations: tmpl.Spec.Annotations}, Spec: tmpl.Spec.Spec}
	resp := webhook.Mutate(webhooktest.ClaimCreate(t, claim), func() ([]fraction.Model, error) { return []fraction.Model{h100}, nil })
	claim.Spec.Devices.Requests = webhooktest.PatchedRequests(t, resp)
	for _, r := range claim.Spec.Devices.Requests {
		if len(r.FirstAvailable) != 1 || len(r.FirstAvailable[0].Selectors) != 2 {
			t.Errorf("request %s expanded to %+v, want one alternative with the model's and the type selector", r.Name, r.FirstAvailable)
		}
	}
	if errs, _ := webhook.ValidateDeviceClaim(&claim.Spec.Devices, nil); len(errs) > 0 {
		t.Errorf("the expanded claim fails validation: %v", errs.ToAggregate())
	}
}

// TestDeviceClassFile: deployments/deviceclass-nvidia-gpu.yaml is DeviceClass().
func TestDeviceClassFile(t *testing.T) {
	const path = "../../deployments/deviceclass-nvidia-gpu.yaml"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got resourceapi.DeviceClass
	if err := yaml.UnmarshalStrict(raw, &got); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if diff := cmp.Diff(DeviceClass(), got); diff != "" {
		t.Errorf("%s is not DeviceClass() (-want +got):\n%s", path, diff)
	}
	whole := model.DeviceClasses()[0]
	if diff := cmp.Diff(whole.Spec.Selectors, got.Spec.Selectors); diff != "" {
		t.Errorf("selects other devices than %s (-whole +nvidia):\n%s", whole.Name, diff)
	}
}

// TestNoNVML: the package builds without cgo, so that the admission webhook
// (CGO_ENABLED=0) can call it: it must not import pkg/model or
// internal/cli/claimtemplate, which link NVML.
func TestNoNVML(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "go-nvml") || strings.HasSuffix(dep, "tessera/pkg/model") || strings.HasSuffix(dep, "tessera/internal/cli/claimtemplate") {
			t.Errorf("pkg/legacy depends on %s", dep)
		}
	}
}

func resourceQuantity(s string) resource.Quantity { return resource.MustParse(s) }
