package legacy

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-dev/tessera/pkg/fraction"
)

// pod is a Pod manifest with these annotations (YAML lines, indented 4) and
// these containers' resources blocks (YAML lines, indented 8).
func pod(annotations string, resources ...string) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n")
	if annotations != "" {
		b.WriteString("  annotations:\n" + annotations)
	}
	b.WriteString("spec:\n  containers:\n")
	for i, r := range resources {
		b.WriteString("  - name: c" + string(rune('0'+i)) + "\n    image: busybox\n    resources:\n" + r)
	}
	return b.String()
}

// TestErrors: every refused input names its field, and the message says why.
func TestErrors(t *testing.T) {
	ok := "      limits:\n        nvidia.com/gpu: 1\n"
	for _, tc := range []struct {
		name     string
		manifest string
		opts     Options
		field    string
		message  string
	}{
		{"gpumem and gpumem-percentage both",
			pod("", ok, "      limits:\n        nvidia.com/gpumem: 3000\n        nvidia.com/gpumem-percentage: 50\n"), Options{},
			"spec.containers[1].resources.limits[nvidia.com/gpumem-percentage]", "not both"},
		{"gpumem zero", pod("", "      limits:\n        nvidia.com/gpumem: 0\n"), Options{},
			"spec.containers[0].resources.limits[nvidia.com/gpumem]", "between 1 and"},
		{"gpumem negative", pod("", "      limits:\n        nvidia.com/gpumem: -5\n"), Options{},
			"spec.containers[0].resources.limits[nvidia.com/gpumem]", "between 1 and"},
		{"gpumem fractional", pod("", "      limits:\n        nvidia.com/gpumem: 1.5\n"), Options{},
			"spec.containers[0].resources.limits[nvidia.com/gpumem]", "whole number"},
		{"gpumem-percentage over 100", pod("", "      limits:\n        nvidia.com/gpumem-percentage: 150\n"), Options{},
			"spec.containers[0].resources.limits[nvidia.com/gpumem-percentage]", "between 1 and 100"},
		{"gpucores over 100", pod("", "      limits:\n        nvidia.com/gpumem: 1000\n        nvidia.com/gpucores: 101\n"), Options{},
			"spec.containers[0].resources.limits[nvidia.com/gpucores]", "between 0 and 100"},
		{"HAMi gpu count zero", pod("", "      limits:\n        nvidia.com/gpu: 0\n        nvidia.com/gpumem: 1000\n"), Options{},
			"spec.containers[0].resources.limits[nvidia.com/gpu]", "between 1 and 32"},
		{"HAMi priority", pod("", "      limits:\n        nvidia.com/gpumem: 1000\n        nvidia.com/priority: 1\n"), Options{},
			"spec.containers[0].resources.limits[nvidia.com/priority]", "no Tessera equivalent"},
		{"percentage with other cores and no models", hamiMemoryFraction, Options{},
			"spec.containers[0].resources.limits[nvidia.com/gpucores]", "30% of compute with 50% of memory"},
		{"limits and requests differ", pod("", "      limits:\n        nvidia.com/gpumem: 1000\n      requests:\n        nvidia.com/gpumem: 2000\n"), Options{},
			"spec.containers[0].resources.requests[nvidia.com/gpumem]", "differs from limits"},
		{"gpu-core 150", pod("", "      requests:\n        koordinator.sh/gpu-core: 150\n        koordinator.sh/gpu-memory-ratio: 50\n"), Options{},
			"spec.containers[0].resources.requests[koordinator.sh/gpu-core]", "multiple of 100"},
		{"gpu-core 200 on the memory of one GPU", pod("", "      requests:\n        koordinator.sh/gpu-core: 200\n        koordinator.sh/gpu-memory: 8Gi\n"), Options{},
			"spec.containers[0].resources.requests[koordinator.sh/gpu-core]", "divided over 1 GPU(s)"},
		{"gpu-core alone", pod("", "      requests:\n        koordinator.sh/gpu-core: 50\n"), Options{},
			"spec.containers[0].resources.requests[koordinator.sh/gpu-core]", "requires the memory"},
		{"gpu-memory and ratio both", pod("", "      requests:\n        koordinator.sh/gpu-memory: 4Gi\n        koordinator.sh/gpu-memory-ratio: 50\n"), Options{},
			"spec.containers[0].resources.requests[koordinator.sh/gpu-memory-ratio]", "not both"},
		{"gpu-memory zero", pod("", "      requests:\n        koordinator.sh/gpu-memory: \"0\"\n"), Options{},
			"spec.containers[0].resources.requests[koordinator.sh/gpu-memory]", "positive"},
		{"gpu shorthand beside gpu-core", pod("", "      requests:\n        koordinator.sh/gpu: 50\n        koordinator.sh/gpu-core: 50\n"), Options{},
			"spec.containers[0].resources.requests[koordinator.sh/gpu]", "shorthand"},
		{"gpu.shared not dividing the ratio", pod("", "      requests:\n        koordinator.sh/gpu-memory-ratio: 100\n        koordinator.sh/gpu.shared: 3\n"), Options{},
			"spec.containers[0].resources.requests[koordinator.sh/gpu-memory-ratio]", "multiple of 3"},
		{"Koordinator beside nvidia.com/gpu", pod("", "      limits:\n        nvidia.com/gpu: 1\n        koordinator.sh/gpu-core: 50\n        koordinator.sh/gpu-memory-ratio: 50\n"), Options{},
			"spec.containers[0].resources.limits[nvidia.com/gpu]", "Koordinator refuses"},
		{"HAMi mixed with gpushare", pod("", "      limits:\n        nvidia.com/gpumem: 1000\n        aliyun.com/gpu-mem: 2\n"), Options{},
			"spec.containers[0].resources.limits[aliyun.com/gpu-mem]", "mixes HAMi"},
		{"gpushare zero", pod("", "      limits:\n        aliyun.com/gpu-mem: 0\n"), Options{},
			"spec.containers[0].resources.limits[aliyun.com/gpu-mem]", "between 1 and"},
		{"gpushare gpu-count in a pod", pod("", "      limits:\n        aliyun.com/gpu-mem: 2\n        aliyun.com/gpu-count: 1\n"), Options{},
			"spec.containers[0].resources.limits[aliyun.com/gpu-count]", "node resource"},
		{"gpushare unit unknown", pod("", "      limits:\n        aliyun.com/gpu-mem: 2\n"), Options{GPUShareUnit: "KiB"},
			"options.gpuShareUnit", "Unsupported value"},
		{"unknown nvidia.com resource", pod("", "      limits:\n        nvidia.com/mig-1g.10gb: 1\n"), Options{},
			"spec.containers[0].resources.limits[nvidia.com/mig-1g.10gb]", "not a GPU resource Tessera can translate"},
		{"type selector naming nothing", pod("    nvidia.com/use-gputype: \" , \"\n", ok), Options{},
			"metadata.annotations[nvidia.com/use-gputype]", "names nothing"},
		{"type selector without a GPU", pod("    nvidia.com/use-gputype: A100\n", "      limits:\n        cpu: 1\n"), Options{},
			"metadata.annotations[nvidia.com/use-gputype]", "no container asks for one"},
		{"numa-bind", pod("    nvidia.com/numa-bind: \"true\"\n", ok), Options{},
			"metadata.annotations[nvidia.com/numa-bind]", "no equivalent"},
		{"Koordinator joint allocation", pod("    scheduling.koordinator.sh/device-joint-allocate: '{\"deviceTypes\": [\"gpu\",\"rdma\"]}'\n",
			"      requests:\n        koordinator.sh/gpu-core: 100\n        koordinator.sh/gpu-memory-ratio: 100\n"), Options{},
			"metadata.annotations[scheduling.koordinator.sh/device-joint-allocate]", "no Tessera equivalent"},
		{"Koordinator device hint", pod("    scheduling.koordinator.sh/device-allocate-hint: '{\"rdma\": {\"vfSelector\": {}}}'\n",
			"      requests:\n        koordinator.sh/gpu-memory: 8Gi\n"), Options{},
			"metadata.annotations[scheduling.koordinator.sh/device-allocate-hint]", "no Tessera equivalent"},
		{"percentage on a model too small for it", pod("", "      limits:\n        nvidia.com/gpumem-percentage: 1\n        nvidia.com/gpucores: 0\n"),
			Options{Models: []fraction.Model{{Products: []string{"tiny"}, Memory: h100.Memory, MemoryStep: h100.Memory, Cores: 100, CoresStep: 1}}},
			"spec.containers[0].resources", "less than one step"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errs := Translate(podTemplate(t, tc.manifest), nil, tc.opts)
			if len(errs) == 0 {
				t.Fatal("translated; want an error")
			}
			found := false
			for _, e := range errs {
				if e.Field == tc.field && strings.Contains(e.Error(), tc.message) {
					found = true
				}
			}
			if !found {
				t.Errorf("errors %v\nwant one on %s containing %q", errs.ToAggregate(), tc.field, tc.message)
			}
		})
	}
}

// TestErrorPathsUnderRoot: a workload's template reports paths under its
// root (spec.template).
func TestErrorPathsUnderRoot(t *testing.T) {
	_, errs := Translate(podTemplate(t, pod("", "      limits:\n        nvidia.com/gpumem: 0\n")), field.NewPath("spec", "template"), Options{})
	if len(errs) != 1 || errs[0].Field != "spec.template.spec.containers[0].resources.limits[nvidia.com/gpumem]" {
		t.Errorf("errors %v, want one on spec.template.spec.containers[0].resources.limits[nvidia.com/gpumem]", errs.ToAggregate())
	}
}

// TestKoordinatorHintsLeftWithoutGPUs: Koordinator's allocation annotations
// on a pod with nothing to translate (plain nvidia.com/gpu, kept) are no
// error: Translate changes nothing.
func TestKoordinatorHintsLeftWithoutGPUs(t *testing.T) {
	out, errs := Translate(podTemplate(t, pod("    scheduling.koordinator.sh/device-joint-allocate: x\n", "      limits:\n        nvidia.com/gpu: 1\n")), nil, Options{})
	if len(errs) > 0 || out.Changed {
		t.Errorf("errors %v, changed %v: want the pod left as it is", errs.ToAggregate(), out.Changed)
	}
}
