package legacy

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// PodAnnotations are the pod annotations Translate reads: the GPU-type and
// UUID selectors it turns into CEL, and the HAMi annotations it refuses.
var PodAnnotations = []string{HAMiUseType, HAMiNoUseType, HAMiUseUUID, HAMiNoUseUUID, HAMiNUMABind, HAMiVGPUMode}

// ResourcePrefixes start the container resource names Translate reads or
// refuses (the GPU families of NVIDIA and HAMi, gpushare and Koordinator),
// except plain nvidia.com/gpu, which alone it keeps.
var ResourcePrefixes = []string{"nvidia.com/", "aliyun.com/gpu", koordPrefix + "gpu"}

// IsLegacyResource reports whether Translate reads or refuses the container
// resource name: a name under ResourcePrefixes other than nvidia.com/gpu.
func IsLegacyResource(name string) bool {
	if name == NvidiaGPU {
		return false
	}
	return slices.ContainsFunc(ResourcePrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// Applies reports whether Translate has anything to translate or refuse in
// t: a container or init container with a legacy resource name
// (IsLegacyResource) in its limits or requests, or a pod annotation of
// PodAnnotations. When it is false Translate changes nothing; it may still
// refuse a value of plain nvidia.com/gpu that is no count of GPUs (0, or
// limits and requests that differ), which the API server's own checks of
// extended resources cover. The admission webhook's matchConditions
// (deployments/helm/tessera/templates/webhook-configuration.yaml) are this
// test in CEL; a chart test holds the two equal.
func Applies(t *corev1.PodTemplateSpec) bool {
	for _, key := range PodAnnotations {
		if _, ok := t.Annotations[key]; ok {
			return true
		}
	}
	for _, list := range [][]corev1.Container{t.Spec.InitContainers, t.Spec.Containers} {
		for i := range list {
			for _, res := range []corev1.ResourceList{list[i].Resources.Limits, list[i].Resources.Requests} {
				for name := range res {
					if IsLegacyResource(string(name)) {
						return true
					}
				}
			}
		}
	}
	return false
}
