package legacy

import (
	"testing"

	"github.com/tessera-dev/tessera/pkg/fraction"
)

// TestApplies: Applies is true for every pod Translate changes or refuses
// (the documented examples, refused inputs, init containers, annotations
// alone) and false for pods it leaves as they are, which the webhook's
// matchConditions then never send.
func TestApplies(t *testing.T) {
	gpu := "      limits:\n        nvidia.com/gpu: 1\n"
	initPod := `
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  initContainers:
  - name: i
    image: busybox
    resources: {requests: {aliyun.com/gpu-mem: 2}}
  containers:
  - {name: c, image: busybox}
`
	for _, tc := range []struct {
		name     string
		manifest string
		want     bool
	}{
		{"HAMi default use", hamiDefaultUse, true},
		{"HAMi memory fraction", hamiMemoryFraction, true},
		{"HAMi exclusive", hamiExclusive, true},
		{"HAMi use type", hamiUseType, true},
		{"HAMi nouse type", hamiNoUseType, true},
		{"gpushare", gpushareUserGuide, true},
		{"Koordinator core and ratio", koordCoreRatio, true},
		{"Koordinator core and memory", koordCoreMemory, true},
		{"Koordinator shorthand", koordShorthand, true},
		{"gpushare in an init container", initPod, true},
		{"HAMi priority (refused)", pod("", "      limits:\n        nvidia.com/priority: 1\n"), true},
		{"unknown nvidia.com name (refused)", pod("", "      limits:\n        nvidia.com/mig-1g.10gb: 1\n"), true},
		{"gpushare gpu-count (refused)", pod("", "      requests:\n        aliyun.com/gpu-count: 1\n"), true},
		{"numa-bind (refused)", pod("    nvidia.com/numa-bind: \"true\"\n", gpu), true},
		{"type selector without a GPU (refused)", pod("    nvidia.com/use-gputype: A100\n", "      limits:\n        cpu: 1\n"), true},
		{"UUID selector", pod("    nvidia.com/use-gpuuuid: GPU-1\n", gpu), true},
		{"device plugin", devicePlugin, false},
		{"no GPU", pod("", "      limits:\n        cpu: 1\n"), false},
		{"Koordinator's RDMA", pod("", "      limits:\n        koordinator.sh/rdma: 1\n"), false},
		{"another vendor's annotation", pod("    example.com/gpu: x\n", gpu), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := podTemplate(t, tc.manifest)
			if got := Applies(tmpl); got != tc.want {
				t.Fatalf("Applies = %v, want %v", got, tc.want)
			}
			out, errs := Translate(tmpl, nil, Options{Models: []fraction.Model{h100}})
			if acts := out.Changed || len(errs) > 0; acts != tc.want {
				t.Errorf("Translate changed %v, errors %v; Applies says %v", out.Changed, errs, tc.want)
			}
		})
	}
}
