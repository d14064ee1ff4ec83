package legacy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/pkg/fraction"
)

// TestSourceRebuildsTemplates: for each documented pod, and one with the
// same shape in an init container and two containers, the Source of its
// translation, through its annotation, rebuilds exactly the templates
// Translate returned, under the claim names the translated pod uses; a
// pod with nothing to translate has no container in its Source.
func TestSourceRebuildsTemplates(t *testing.T) {
	shared := podTemplate(t, gpushareUserGuide)
	shared.Spec.Containers = append(shared.Spec.Containers, *shared.Spec.Containers[0].DeepCopy())
	shared.Spec.Containers[1].Name = "second"
	shared.Spec.InitContainers = []corev1.Container{*shared.Spec.Containers[0].DeepCopy()}
	shared.Spec.InitContainers[0].Name = "init"
	mixed := podTemplate(t, koordShorthand)
	opts := Options{Models: []fraction.Model{h100}}
	for name, in := range map[string]*corev1.PodTemplateSpec{
		"hami-default-use": podTemplate(t, hamiDefaultUse), "hami-memory-fraction": podTemplate(t, hamiMemoryFraction),
		"hami-exclusive": podTemplate(t, hamiExclusive), "hami-use-type": podTemplate(t, hamiUseType),
		"hami-no-use-type": podTemplate(t, hamiNoUseType), "gpushare": podTemplate(t, gpushareUserGuide),
		"koord-core-ratio": podTemplate(t, koordCoreRatio), "koord-core-memory": podTemplate(t, koordCoreMemory),
		"koord-shorthand": mixed, "init and two containers": shared, "device plugin": podTemplate(t, devicePlugin),
	} {
		t.Run(name, func(t *testing.T) {
			out, errs := Translate(in, nil, opts)
			if len(errs) > 0 {
				t.Fatal(errs.ToAggregate())
			}
			src := SourceOf(in, &out.Template)
			if !out.Changed {
				if len(src.Containers) != 0 {
					t.Errorf("nothing translated, Source %+v", src)
				}
				return
			}
			value, err := src.Encode()
			if err != nil {
				t.Fatal(err)
			}
			parsed, err := ParseSource(value)
			if err != nil {
				t.Fatalf("ParseSource(%s): %v", value, err)
			}
			built, errs := parsed.ClaimTemplates(opts)
			if len(errs) > 0 {
				t.Fatalf("ClaimTemplates of %s: %v", value, errs.ToAggregate())
			}
			byName := map[string]int{}
			for i := range out.ClaimTemplates {
				byName[out.ClaimTemplates[i].Name] = i
			}
			if len(built) != len(out.Template.Spec.ResourceClaims) {
				t.Errorf("rebuilt %d templates for %d claim entries (%s)", len(built), len(out.Template.Spec.ResourceClaims), value)
			}
			for _, entry := range out.Template.Spec.ResourceClaims {
				got, ok := built[entry.Name]
				if !ok {
					t.Errorf("claim %s: no rebuilt template (%s)", entry.Name, value)
					continue
				}
				if got.Name != *entry.ResourceClaimTemplateName {
					t.Errorf("claim %s: rebuilt %s, the pod names %s", entry.Name, got.Name, *entry.ResourceClaimTemplateName)
					continue
				}
				if diff := cmp.Diff(out.ClaimTemplates[byName[got.Name]], got); diff != "" {
					t.Errorf("claim %s (-Translate +rebuilt):\n%s", entry.Name, diff)
				}
			}
		})
	}
}

// TestParseSourceRefuses: what no translation writes is refused, naming
// the annotation.
func TestParseSourceRefuses(t *testing.T) {
	many := `{"containers":[` + strings.Repeat(`{"index":1},`, maxSourceContainers) + `{"index":0}]}`
	for name, value := range map[string]string{
		"not JSON":       `{`,
		"no container":   `{"containers":[]}`,
		"negative index": `{"containers":[{"index":-1}]}`,
		"twice":          `{"containers":[{"index":1},{"index":1}]}`,
		"too many":       many,
	} {
		if _, err := ParseSource(value); err == nil || !strings.Contains(err.Error(), AnnotationSource) {
			t.Errorf("%s: %v, want an error naming %s", name, err, AnnotationSource)
		}
	}
	if _, err := ParseSource(`{"containers":[{"index":0},{"init":true,"index":0}]}`); err != nil {
		t.Errorf("container 0 and init container 0: %v", err)
	}
}

// TestSourceAsksNoMore: a Source edited to ask for something Translate
// refuses is refused as Translate refuses it; it yields no template.
func TestSourceAsksNoMore(t *testing.T) {
	src, err := ParseSource(`{"annotations":{"nvidia.com/numa-bind":"true"},"containers":[{"index":0,"limits":{"nvidia.com/gpumem":"1000"}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	built, errs := src.ClaimTemplates(Options{})
	if len(built) != 0 || len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), "nvidia.com/numa-bind") {
		t.Errorf("built %v, errors %v: want none built and the annotation named", built, errs)
	}
	src, _ = ParseSource(`{"containers":[{"index":0,"limits":{"cpu":"1"}}]}`)
	if built, errs := src.ClaimTemplates(Options{}); len(built) != 0 || len(errs) == 0 {
		t.Errorf("a container with nothing to translate: built %v, errors %v", built, errs)
	}
}
