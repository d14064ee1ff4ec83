package legacy

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/webhook"
)

// podTemplate reads a Pod manifest as the template Translate takes.
func podTemplate(t *testing.T, manifest string) *corev1.PodTemplateSpec {
	t.Helper()
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(manifest), &pod); err != nil {
		t.Fatalf("pod YAML: %v", err)
	}
	return &corev1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec}
}

// h100 is a GPU model as fraction.Models reads it from the mock hgx-h100
// profile's slices (81089Mi published, 1Mi steps): a test fixture, not a
// measurement.
var h100 = fraction.Model{
	Products: []string{"NVIDIA H100 80GB HBM3"}, Memory: resource.MustParse("81089Mi"),
	MemoryStep: resource.MustParse("1Mi"), Cores: 100, CoresStep: 1,
}

// summary is a template's devices in one line: each request's class, count
// and capacity (each alternative of a firstAvailable request), the
// constraints, the fraction annotation and how many selectors each has.
func summary(tmpl resourceapi.ResourceClaimTemplate) string {
	var parts []string
	if f, ok := tmpl.Spec.Annotations[fraction.Annotation]; ok {
		parts = append(parts, "fraction "+f)
	}
	one := func(class string, count int64, c *resourceapi.CapacityRequirements, sels int) string {
		s := fmt.Sprintf("%s x%d", strings.TrimSuffix(class, ".gpu.tessera.dev"), count)
		if c != nil {
			var keys []string
			for k := range c.Requests {
				keys = append(keys, string(k))
			}
			sort.Strings(keys)
			for _, k := range keys {
				q := c.Requests[resourceapi.QualifiedName(k)]
				s += fmt.Sprintf(" %s=%s", k, q.String())
			}
		}
		if sels > 0 {
			s += fmt.Sprintf(" selectors=%d", sels)
		}
		return s
	}
	for _, r := range tmpl.Spec.Spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			parts = append(parts, r.Name+": "+one(e.DeviceClassName, e.Count, e.Capacity, len(e.Selectors)))
		}
		for _, s := range r.FirstAvailable {
			parts = append(parts, r.Name+"/"+s.Name+": "+one(s.DeviceClassName, s.Count, s.Capacity, len(s.Selectors)))
		}
	}
	for _, c := range tmpl.Spec.Spec.Devices.Constraints {
		if c.DistinctAttribute != nil {
			parts = append(parts, fmt.Sprintf("distinct %s over %s", *c.DistinctAttribute, strings.Join(c.Requests, ",")))
		}
	}
	return strings.Join(parts, "; ")
}

// TestDocumentedExamples: each system's documented pods, translated. want
// maps each container to the summary of its template; kept are the
// resources left on the container.
func TestDocumentedExamples(t *testing.T) {
	type container struct {
		template string // "" when the container keeps its resources
		kept     []string
	}
	for _, tc := range []struct {
		name     string
		manifest string
		opts     Options
		want     []container
		changed  bool
	}{
		{"HAMi default_use: 3000 MiB and 30% of one GPU", hamiDefaultUse, Options{},
			[]container{{template: "gpu: shared x1 cores=30 memory=3000Mi"}}, true},
		{"HAMi use_memory_fraction: 50% memory and 30% cores on 2 GPUs, per model", hamiMemoryFraction, Options{Models: []fraction.Model{h100}},
			[]container{{template: "gpu-0/m81089mi: shared x1 cores=30 memory=40544Mi selectors=1; gpu-1/m81089mi: shared x1 cores=30 memory=40544Mi selectors=1; distinct gpu.tessera.dev/uuid over gpu-0,gpu-1"}}, true},
		{"HAMi use_exclusive_card: 100% and 100% is two whole GPUs", hamiExclusive, Options{},
			[]container{{template: "gpu: gpu.tessera.dev x2"}}, true},
		{"HAMi specify_card_type_to_use: whole GPUs with a product selector", hamiUseType, Options{},
			[]container{{template: "gpu: gpu.tessera.dev x2 selectors=1"}}, true},
		{"HAMi specify_card_type_not_use", hamiNoUseType, Options{},
			[]container{{template: "gpu: gpu.tessera.dev x2 selectors=1"}}, true},
		{"gpushare user guide: 3 GiB", gpushareUserGuide, Options{},
			[]container{{template: "gpu: shared x1 memory=3Gi"}}, true},
		{"gpushare in MiB", gpushareUserGuide, Options{GPUShareUnit: MiB},
			[]container{{template: "gpu: shared x1 memory=3Mi"}}, true},
		{"Koordinator gpu-core 50, gpu-memory-ratio 60, per model", koordCoreRatio, Options{Models: []fraction.Model{h100}},
			[]container{{template: "gpu/m81089mi: shared x1 cores=50 memory=48653Mi selectors=1", kept: []string{"cpu", "memory"}}}, true},
		{"Koordinator gpu-core 60, gpu-memory 4Gi", koordCoreMemory, Options{},
			[]container{{template: "gpu: shared x1 cores=60 memory=4Gi", kept: []string{"cpu", "memory"}}}, true},
		{"Koordinator gpu 50 is half a GPU; gpu-core 200 two whole GPUs", koordShorthand, Options{},
			[]container{{template: "fraction 1/2; gpu: shared x1", kept: []string{"cpu", "memory"}}, {template: "gpu: gpu.tessera.dev x2"}}, true},
		{"device plugin: nvidia.com/gpu kept for the extended-resource class", devicePlugin, Options{},
			[]container{{kept: []string{NvidiaGPU}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := podTemplate(t, tc.manifest)
			before := in.DeepCopy()
			got, errs := Translate(in, nil, tc.opts)
			if len(errs) > 0 {
				t.Fatalf("Translate: %v", errs.ToAggregate())
			}
			if diff := cmp.Diff(before, in); diff != "" {
				t.Errorf("Translate modified its input:\n%s", diff)
			}
			if got.Changed != tc.changed {
				t.Errorf("Changed %v, want %v", got.Changed, tc.changed)
			}
			byName := map[string]resourceapi.ResourceClaimTemplate{}
			for _, tmpl := range got.ClaimTemplates {
				byName[tmpl.Name] = tmpl
				if tmpl.Labels[LabelTranslated] != "true" || tmpl.Labels[LabelManagedBy] != "tessera" {
					t.Errorf("template %s labels %v", tmpl.Name, tmpl.Labels)
				}
				if errs, _ := webhook.ValidateDeviceClaim(&tmpl.Spec.Spec.Devices, field.NewPath("spec", "spec", "devices")); len(errs) > 0 {
					t.Errorf("template %s: the webhook refuses it: %v", tmpl.Name, errs.ToAggregate())
				}
			}
			spec := got.Template.Spec
			for i, want := range tc.want {
				c := spec.Containers[i]
				var kept []string
				for n := range c.Resources.Limits {
					kept = append(kept, string(n))
				}
				for n := range c.Resources.Requests {
					if _, dup := c.Resources.Limits[n]; !dup {
						kept = append(kept, string(n))
					}
				}
				sort.Strings(kept)
				if diff := cmp.Diff(want.kept, kept); diff != "" {
					t.Errorf("container %d resources left (-want +got):\n%s", i, diff)
				}
				if want.template == "" {
					if len(c.Resources.Claims) > 0 {
						t.Errorf("container %d got claims %v", i, c.Resources.Claims)
					}
					continue
				}
				if len(c.Resources.Claims) != 1 || c.Resources.Claims[0].Name != ClaimName(false, i) {
					t.Fatalf("container %d claims %v, want one named %s", i, c.Resources.Claims, ClaimName(false, i))
				}
				var tmplName string
				for _, p := range spec.ResourceClaims {
					if p.Name == ClaimName(false, i) && p.ResourceClaimTemplateName != nil {
						tmplName = *p.ResourceClaimTemplateName
					}
				}
				tmpl, ok := byName[tmplName]
				if !ok {
					t.Fatalf("container %d: spec.resourceClaims names template %q, which is not among the results", i, tmplName)
				}
				if diff := cmp.Diff(want.template, summary(tmpl)); diff != "" {
					t.Errorf("container %d template (-want +got):\n%s", i, diff)
				}
			}
			for _, key := range []string{HAMiUseType, HAMiNoUseType} {
				if _, ok := got.Template.Annotations[key]; ok {
					t.Errorf("annotation %s left on the translated pod", key)
				}
			}
		})
	}
}

// TestIdempotent: a translated template translates to itself, and the
// templates of one input are the same each time.
func TestIdempotent(t *testing.T) {
	for _, manifest := range []string{hamiDefaultUse, hamiMemoryFraction, hamiExclusive, hamiUseType, gpushareUserGuide, koordCoreMemory, koordShorthand, devicePlugin} {
		opts := Options{Models: []fraction.Model{h100}}
		first, errs := Translate(podTemplate(t, manifest), nil, opts)
		if len(errs) > 0 {
			t.Fatal(errs.ToAggregate())
		}
		second, errs := Translate(&first.Template, nil, opts)
		if len(errs) > 0 {
			t.Fatalf("second translation: %v", errs.ToAggregate())
		}
		if second.Changed || len(second.ClaimTemplates) > 0 {
			t.Errorf("second translation changed the pod (%d templates)", len(second.ClaimTemplates))
		}
		if diff := cmp.Diff(first.Template, second.Template); diff != "" {
			t.Errorf("second translation (-first +second):\n%s", diff)
		}
		again, _ := Translate(podTemplate(t, manifest), nil, opts)
		if diff := cmp.Diff(first, again); diff != "" {
			t.Errorf("two translations of one input differ:\n%s", diff)
		}
	}
}

// TestSelectors: HAMi's type and UUID annotations as the CEL the requests
// carry.
func TestSelectors(t *testing.T) {
	got, errs := Translate(podTemplate(t, hamiUseType), nil, Options{})
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	sel := got.ClaimTemplates[0].Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression
	want := `"productName" in device.attributes["gpu.tessera.dev"] && (device.attributes["gpu.tessera.dev"].productName.upperAscii().contains("A100") || device.attributes["gpu.tessera.dev"].productName.upperAscii().contains("V100"))`
	if sel != want {
		t.Errorf("selector\n got %s\nwant %s", sel, want)
	}
	uuids, _, errs := podSelectors(map[string]string{HAMiNoUseUUID: "GPU-1, GPU-2,"}, field.NewPath("metadata", "annotations"))
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	want = `!("uuid" in device.attributes["gpu.tessera.dev"]) || !(device.attributes["gpu.tessera.dev"].uuid in ["GPU-1", "GPU-2"])`
	if uuids[0] != want {
		t.Errorf("uuid selector\n got %s\nwant %s", uuids[0], want)
	}
}

// TestSharedTemplates: equal shapes in two containers share one template,
// and each container gets its own claim.
func TestSharedTemplates(t *testing.T) {
	in := podTemplate(t, gpushareUserGuide)
	in.Spec.Containers = append(in.Spec.Containers, *in.Spec.Containers[0].DeepCopy())
	in.Spec.Containers[1].Name = "second"
	in.Spec.InitContainers = []corev1.Container{*in.Spec.Containers[0].DeepCopy()}
	in.Spec.InitContainers[0].Name = "init"
	got, errs := Translate(in, nil, Options{})
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	if len(got.ClaimTemplates) != 1 {
		t.Fatalf("%d templates, want 1", len(got.ClaimTemplates))
	}
	var claims []string
	for _, p := range got.Template.Spec.ResourceClaims {
		claims = append(claims, p.Name+"="+*p.ResourceClaimTemplateName)
	}
	name := got.ClaimTemplates[0].Name
	want := []string{"tessera-gpu-init-0=" + name, "tessera-gpu-0=" + name, "tessera-gpu-1=" + name}
	if diff := cmp.Diff(want, claims); diff != "" {
		t.Errorf("spec.resourceClaims (-want +got):\n%s", diff)
	}
}

// TestTemplateNamesStable: names are a hash of the content, the same in
// every version; a change of content changes the name.
func TestTemplateNamesStable(t *testing.T) {
	for _, tc := range []struct {
		manifest, want string
	}{
		{hamiDefaultUse, "tessera-legacy-25d60541f99d99c5"},
		{gpushareUserGuide, "tessera-legacy-5cc9e6dffce30560"},
		{hamiExclusive, "tessera-legacy-6e757f83e0574934"},
	} {
		got, errs := Translate(podTemplate(t, tc.manifest), nil, Options{})
		if len(errs) > 0 {
			t.Fatal(errs.ToAggregate())
		}
		if name := got.ClaimTemplates[0].Name; name != tc.want {
			t.Errorf("template name %s, want %s", name, tc.want)
		}
	}
	a, _ := Translate(podTemplate(t, gpushareUserGuide), nil, Options{})
	b, _ := Translate(podTemplate(t, gpushareUserGuide), nil, Options{GPUShareUnit: MiB})
	if a.ClaimTemplates[0].Name == b.ClaimTemplates[0].Name {
		t.Errorf("3Gi and 3Mi templates share the name %s", a.ClaimTemplates[0].Name)
	}
}
