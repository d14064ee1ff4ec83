package legacypods

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// operation is one JSONPatch (RFC 6902) operation.
type operation struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// pointer escapes a JSON pointer token (RFC 6901): ~ as ~0, / as ~1.
func pointer(token string) string {
	return strings.ReplaceAll(strings.ReplaceAll(token, "~", "~0"), "/", "~1")
}

// podPatch is the JSONPatch from pod to out. It touches only what
// legacy.Translate changes — annotations, spec.resourceClaims and each
// container's resources.limits, resources.requests and resources.claims —
// key by key and entry by entry, so fields of the object this webhook's
// types do not know are kept.
func podPatch(pod *corev1.Pod, out *corev1.PodTemplateSpec) ([]byte, error) {
	var ops []operation
	ops = append(ops, mapPatch("/metadata/annotations", pod.Annotations, out.Annotations, func(v string) any { return v })...)
	ops = append(ops, mapPatch("/metadata/labels", pod.Labels, out.Labels, func(v string) any { return v })...)
	ops = append(ops, listPatch("/spec/resourceClaims", pod.Spec.ResourceClaims, out.Spec.ResourceClaims)...)
	for _, list := range []struct {
		name     string
		old, new []corev1.Container
	}{{"initContainers", pod.Spec.InitContainers, out.Spec.InitContainers}, {"containers", pod.Spec.Containers, out.Spec.Containers}} {
		if len(list.old) != len(list.new) {
			return nil, fmt.Errorf("spec.%s: %d containers became %d", list.name, len(list.old), len(list.new))
		}
		for i := range list.old {
			base := "/spec/" + list.name + "/" + strconv.Itoa(i) + "/resources"
			o, n := list.old[i].Resources, list.new[i].Resources
			quantity := func(q corev1.ResourceList) map[string]string {
				m := map[string]string{}
				for k, v := range q {
					m[string(k)] = v.String()
				}
				return m
			}
			ops = append(ops, mapPatch(base+"/limits", quantity(o.Limits), quantity(n.Limits), func(v string) any { return v })...)
			ops = append(ops, mapPatch(base+"/requests", quantity(o.Requests), quantity(n.Requests), func(v string) any { return v })...)
			ops = append(ops, listPatch(base+"/claims", o.Claims, n.Claims)...)
		}
	}
	return json.Marshal(ops)
}

// mapPatch is the operations from old to new of a map of strings at path:
// a map that becomes empty is removed; otherwise keys are removed, added or
// replaced one by one ("add" replaces an existing member).
func mapPatch(path string, old, new map[string]string, value func(string) any) []operation {
	if maps.Equal(old, new) {
		return nil
	}
	if len(new) == 0 {
		return []operation{{Op: "remove", Path: path}}
	}
	if len(old) == 0 {
		whole := map[string]any{}
		for k, v := range new {
			whole[k] = value(v)
		}
		return []operation{{Op: "add", Path: path, Value: whole}}
	}
	var ops []operation
	for _, k := range slices.Sorted(maps.Keys(old)) {
		if _, ok := new[k]; !ok {
			ops = append(ops, operation{Op: "remove", Path: path + "/" + pointer(k)})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(new)) {
		if v, ok := old[k]; !ok || v != new[k] {
			ops = append(ops, operation{Op: "add", Path: path + "/" + pointer(k), Value: value(new[k])})
		}
	}
	return ops
}

// listPatch is the operations from old to new of a list at path: entries
// appended when old is new's beginning (Translate only appends), else the
// whole list replaced.
func listPatch[T any](path string, old, new []T) []operation {
	if equality.Semantic.DeepEqual(old, new) {
		return nil
	}
	if len(new) == 0 {
		return []operation{{Op: "remove", Path: path}}
	}
	if len(old) == 0 || len(old) > len(new) || !equality.Semantic.DeepEqual(old, new[:len(old)]) {
		return []operation{{Op: "add", Path: path, Value: new}}
	}
	var ops []operation
	for _, v := range new[len(old):] {
		ops = append(ops, operation{Op: "add", Path: path + "/-", Value: v})
	}
	return ops
}

// checkPatch applies patch to the pod's JSON and checks that the result is
// out: the metadata Translate may change and the whole spec.
func checkPatch(raw, patch []byte, out *corev1.PodTemplateSpec) error {
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		return err
	}
	patched, err := p.Apply(raw)
	if err != nil {
		return err
	}
	var got corev1.Pod
	if err := json.Unmarshal(patched, &got); err != nil {
		return err
	}
	if !equality.Semantic.DeepEqual(got.Annotations, out.Annotations) || !equality.Semantic.DeepEqual(got.Labels, out.Labels) ||
		!equality.Semantic.DeepEqual(got.Spec, out.Spec) {
		return errors.New("the patched pod differs from the translation")
	}
	return nil
}
