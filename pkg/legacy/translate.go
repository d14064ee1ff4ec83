package legacy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-dev/tessera/pkg/fraction"
)

// Options are the installation's settings that the legacy names leave open.
// The zero value is gpushare's default unit and no GPU models.
type Options struct {
	// GPUShareUnit is the unit of aliyun.com/gpu-mem: GiB (empty, and
	// gpushare's default) or MiB.
	GPUShareUnit MemoryUnit
	// Models are the GPU models the cluster publishes (fraction.Models of
	// its ResourceSlices). Only a percentage of memory with a different
	// percentage of compute (HAMi's gpumem-percentage: 50 with gpucores: 30)
	// needs them: its shares are sized per model when translated. Without
	// them such a container is refused, naming the cores field.
	Models []fraction.Model
}

// Translation is the result of [Translate].
type Translation struct {
	// Template is the rewritten pod template (equal to the input when
	// Changed is false).
	Template corev1.PodTemplateSpec
	// ClaimTemplates are the ResourceClaimTemplates Template refers to, once
	// each, sorted by name, without a namespace: they belong in the pod's.
	ClaimTemplates []resourceapi.ResourceClaimTemplate
	// Changed reports whether Template differs from the input.
	Changed bool
}

// ClaimName is the name of the spec.resourceClaims entry for a translated
// container: "tessera-gpu-<index>" for spec.containers[index],
// "tessera-gpu-init-<index>" for spec.initContainers[index].
func ClaimName(init bool, index int) string {
	if init {
		return "tessera-gpu-init-" + strconv.Itoa(index)
	}
	return "tessera-gpu-" + strconv.Itoa(index)
}

// Translate rewrites the legacy GPU resources and annotations of a pod
// template (a Pod's metadata and spec, or a workload's spec.template) into
// ResourceClaimTemplates of gpu.tessera.dev and references to them (see the
// package comment for what a caller may assume). root is the template's
// path in its object, for errors: nil for a Pod (errors read
// spec.containers[0]...), field.NewPath("spec", "template") for a
// Deployment. All errors of the template are returned together.
func Translate(in *corev1.PodTemplateSpec, root *field.Path, opts Options) (Translation, field.ErrorList) {
	unit := opts.GPUShareUnit
	switch unit {
	case "":
		unit = GiB
	case GiB, MiB:
	default:
		return Translation{}, field.ErrorList{field.NotSupported(field.NewPath("options", "gpuShareUnit"), unit, []MemoryUnit{GiB, MiB})}
	}
	out := in.DeepCopy()
	annotationsPath := root.Child("metadata", "annotations")
	specPath := root.Child("spec")
	selectors, consumed, errs := podSelectors(out.Annotations, annotationsPath)

	type translated struct {
		init  bool
		index int
		c     *corev1.Container
		shape *shape
		drop  []string
		path  *field.Path
	}
	var work []translated
	for _, list := range []struct {
		init       bool
		name       string
		containers []corev1.Container
	}{{true, "initContainers", out.Spec.InitContainers}, {false, "containers", out.Spec.Containers}} {
		for i := range list.containers {
			c := &list.containers[i]
			r := &container{c: c, path: specPath.Child(list.name).Index(i), unit: unit}
			s, kept, drop := r.read()
			errs = append(errs, r.errs...)
			if s == nil && kept > 0 && len(selectors) > 0 {
				// Whole GPUs with a type or UUID selector: the extended
				// resource cannot carry the selector, so they become a claim.
				s, drop = &shape{gpus: kept, whole: true}, []string{NvidiaGPU}
				if kept > maxGPUs {
					errs = append(errs, field.Invalid(r.fieldOf(NvidiaGPU), kept, fmt.Sprintf("at most %d GPUs in one claim", maxGPUs)))
					continue
				}
			}
			if s != nil {
				work = append(work, translated{init: list.init, index: i, c: c, shape: s, drop: drop, path: r.path})
			}
		}
	}
	if len(work) > 0 {
		for _, key := range []string{KoordDeviceJointAllocate, KoordDeviceAllocateHint} {
			if v, ok := out.Annotations[key]; ok {
				errs = append(errs, field.Invalid(annotationsPath.Key(key), v,
					"Koordinator's joint allocation and device hints (GPUs on the PCIe switch of the pod's RDMA NICs, VF selection) have no Tessera equivalent: "+
						"remove the annotation to translate the pod without them, or keep it on Koordinator"))
			}
		}
	}
	if len(consumed) > 0 && len(work) == 0 && len(errs) == 0 {
		errs = append(errs, field.Invalid(annotationsPath.Key(consumed[0]), out.Annotations[consumed[0]], "selects GPUs, but no container asks for one"))
	}
	if len(errs) > 0 {
		return Translation{}, errs
	}
	if len(work) == 0 {
		return Translation{Template: *out}, nil
	}

	templates := map[string]resourceapi.ResourceClaimTemplate{}
	for _, w := range work {
		tmpl, err := w.shape.template(selectors, opts.Models, w.path.Child("resources"))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		templates[tmpl.Name] = *tmpl
		claim := ClaimName(w.init, w.index)
		if slices.ContainsFunc(out.Spec.ResourceClaims, func(p corev1.PodResourceClaim) bool { return p.Name == claim }) {
			errs = append(errs, field.Duplicate(specPath.Child("resourceClaims"), claim))
			continue
		}
		out.Spec.ResourceClaims = append(out.Spec.ResourceClaims, corev1.PodResourceClaim{Name: claim, ResourceClaimTemplateName: ptrTo(tmpl.Name)})
		w.c.Resources.Claims = append(w.c.Resources.Claims, corev1.ResourceClaim{Name: claim})
		for _, n := range w.drop {
			delete(w.c.Resources.Limits, corev1.ResourceName(n))
			delete(w.c.Resources.Requests, corev1.ResourceName(n))
		}
		if len(w.c.Resources.Limits) == 0 {
			w.c.Resources.Limits = nil
		}
		if len(w.c.Resources.Requests) == 0 {
			w.c.Resources.Requests = nil
		}
	}
	if len(errs) > 0 {
		return Translation{}, errs
	}
	for _, key := range consumed {
		delete(out.Annotations, key)
	}
	if len(out.Annotations) == 0 {
		out.Annotations = nil
	}
	result := Translation{Template: *out, Changed: true}
	for _, name := range slices.Sorted(maps.Keys(templates)) {
		result.ClaimTemplates = append(result.ClaimTemplates, templates[name])
	}
	return result, nil
}
