package legacy

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// AnnotationSource is the pod annotation that records, as the JSON of a
// [Source], what translation removed from the pod: the pod is rewritten at
// admission, and whoever later creates its ResourceClaimTemplates rebuilds
// them from this annotation alone ([Source.ClaimTemplates]).
const AnnotationSource = modelnames.DriverName + "/legacy-source"

// maxSourceContainers bounds the containers one Source may list: a pod
// larger than this is no pod Kubernetes runs, and each entry costs a
// translation.
const maxSourceContainers = 256

// Source is what [Translate] removed from a pod template: the pod
// annotations it consumed (GPU type and UUID selectors) and, for each
// container it translated, the legacy resources it dropped. It holds
// nothing Translate did not read, so translating a Source again can ask
// for no more than the pod's own spec asked for.
type Source struct {
	// Annotations are the consumed pod annotations.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Containers are the translated containers, in the order of the pod's
	// spec.resourceClaims entries Translate added.
	Containers []ContainerSource `json:"containers"`
}

// ContainerSource is one translated container's removed resources.
type ContainerSource struct {
	// Init and Index name the container: spec.initContainers[Index] when
	// Init, else spec.containers[Index]; its claim is ClaimName(Init, Index).
	Init  bool `json:"init,omitempty"`
	Index int  `json:"index"`
	// Limits and Requests are the names removed from its resources.
	Limits   corev1.ResourceList `json:"limits,omitempty"`
	Requests corev1.ResourceList `json:"requests,omitempty"`
}

// SourceOf is what out lacks of in: in is a pod template, out the Template
// Translate returned for it (Translate only removes annotations and
// resources, and appends claims). A container is listed when it gained a
// translated claim (ClaimName).
func SourceOf(in, out *corev1.PodTemplateSpec) Source {
	var s Source
	for k, v := range in.Annotations {
		if _, kept := out.Annotations[k]; !kept {
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[k] = v
		}
	}
	removed := func(in, out corev1.ResourceList) corev1.ResourceList {
		var r corev1.ResourceList
		for k, v := range in {
			if _, kept := out[k]; !kept {
				if r == nil {
					r = corev1.ResourceList{}
				}
				r[k] = v
			}
		}
		return r
	}
	for _, list := range []struct {
		init    bool
		in, out []corev1.Container
	}{{true, in.Spec.InitContainers, out.Spec.InitContainers}, {false, in.Spec.Containers, out.Spec.Containers}} {
		for i := range list.out {
			if i >= len(list.in) || !slices.ContainsFunc(list.out[i].Resources.Claims, func(c corev1.ResourceClaim) bool { return c.Name == ClaimName(list.init, i) }) {
				continue
			}
			s.Containers = append(s.Containers, ContainerSource{
				Init: list.init, Index: i,
				Limits:   removed(list.in[i].Resources.Limits, list.out[i].Resources.Limits),
				Requests: removed(list.in[i].Resources.Requests, list.out[i].Resources.Requests),
			})
		}
	}
	return s
}

// Encode is the annotation's value: s as JSON.
func (s Source) Encode() (string, error) {
	raw, err := json.Marshal(s)
	return string(raw), err
}

// ParseSource reads an AnnotationSource value. It refuses what no
// translation writes: no container, more than maxSourceContainers, a
// negative index, or one container listed twice.
func ParseSource(value string) (Source, error) {
	var s Source
	if err := json.Unmarshal([]byte(value), &s); err != nil {
		return Source{}, fmt.Errorf("annotation %s: %w", AnnotationSource, err)
	}
	if len(s.Containers) == 0 || len(s.Containers) > maxSourceContainers {
		return Source{}, fmt.Errorf("annotation %s: %d containers, want 1 to %d", AnnotationSource, len(s.Containers), maxSourceContainers)
	}
	seen := map[string]bool{}
	for _, c := range s.Containers {
		name := ClaimName(c.Init, c.Index)
		if c.Index < 0 || seen[name] {
			return Source{}, fmt.Errorf("annotation %s: container index %d (init %v) negative or listed twice", AnnotationSource, c.Index, c.Init)
		}
		seen[name] = true
	}
	return s, nil
}

// ClaimTemplates translates each container of s as Translate translated it
// in its pod: a pod template with the container's removed resources alone
// and the consumed annotations (a container's template depends on nothing
// else of the pod). The result maps each container's claim name
// (ClaimName) to its template, without a namespace; with the same Options
// the templates, and so their names, are the ones Translate returned. A
// container that translates to nothing, or fails to, is an error and has
// no entry; the others are returned.
func (s Source) ClaimTemplates(opts Options) (map[string]resourceapi.ResourceClaimTemplate, field.ErrorList) {
	out := map[string]resourceapi.ResourceClaimTemplate{}
	var errs field.ErrorList
	root := field.NewPath("metadata", "annotations").Key(AnnotationSource)
	for i, c := range s.Containers {
		path := root.Child("containers").Index(i)
		in := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:      "c",
			Resources: corev1.ResourceRequirements{Limits: c.Limits, Requests: c.Requests},
		}}}}
		if len(s.Annotations) > 0 {
			in.Annotations = maps.Clone(s.Annotations)
		}
		got, cerrs := Translate(in, path, opts)
		switch {
		case len(cerrs) > 0:
			errs = append(errs, cerrs...)
		case len(got.ClaimTemplates) != 1:
			errs = append(errs, field.Invalid(path, c, fmt.Sprintf("translates to %d templates, want 1", len(got.ClaimTemplates))))
		default:
			out[ClaimName(c.Init, c.Index)] = got.ClaimTemplates[0]
		}
	}
	return out, errs
}
