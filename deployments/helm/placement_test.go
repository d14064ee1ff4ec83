package helm

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// matches evaluates the required node affinity of a pod spec against node
// labels: terms are ORed, expressions ANDed (only the operators the chart
// and the overlay use). No affinity matches every node.
func matches(t *testing.T, spec corev1.PodSpec, labels map[string]string) bool {
	t.Helper()
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	for _, term := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		ok := len(term.MatchExpressions) > 0
		for _, e := range term.MatchExpressions {
			v, has := labels[e.Key]
			switch e.Operator {
			case corev1.NodeSelectorOpIn:
				ok = ok && has && slices.Contains(e.Values, v)
			case corev1.NodeSelectorOpExists:
				ok = ok && has
			default:
				t.Fatalf("operator %s not understood by this test", e.Operator)
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// TestPluginPlacement: by default the plugin lands on GPU nodes only, as
// node-feature-discovery or the GPU Operator label them, on either label
// alone; the values override it; the local demo's overlay selects its
// unlabelled node; the plugin tolerates every taint.
func TestPluginPlacement(t *testing.T) {
	nfd := map[string]string{"kubernetes.io/os": "linux", "feature.node.kubernetes.io/pci-10de.present": "true"}
	operator := map[string]string{"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"}
	cpu := map[string]string{"kubernetes.io/os": "linux", "feature.node.kubernetes.io/pci-8086.present": "true"}
	cpuFalse := map[string]string{"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "false"}
	bare := map[string]string{"kubernetes.io/os": "linux"}

	custom := filepath.Join(t.TempDir(), "custom.yaml")
	if err := os.WriteFile(custom, []byte(`kubeletPlugin:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - key: example.com/accelerator
            operator: In
            values: [nvidia]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	accel := map[string]string{"kubernetes.io/os": "linux", "example.com/accelerator": "nvidia"}

	for _, tc := range []struct {
		name    string
		args    []string
		lands   []map[string]string
		skips   []map[string]string
		noTerms bool
	}{
		{name: "default", lands: []map[string]string{nfd, operator}, skips: []map[string]string{cpu, cpuFalse, bare}},
		{name: "local overlay", args: []string{"-f", "../../demo/clusters/local/overlay/values.yaml"}, lands: []map[string]string{bare, nfd, cpu}},
		{name: "affinity null", args: []string{"--set", "kubeletPlugin.affinity=null"}, lands: []map[string]string{bare, cpu}, noTerms: true},
		{name: "own terms replace the defaults", args: []string{"-f", custom}, lands: []map[string]string{accel}, skips: []map[string]string{nfd, operator}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, _ := pluginDaemonSet(t, tc.args...)
			spec := ds.Spec.Template.Spec
			if got := spec.Affinity == nil; got != tc.noTerms {
				t.Errorf("affinity %+v, want none: %v", spec.Affinity, tc.noTerms)
			}
			for _, labels := range tc.lands {
				if !matches(t, spec, labels) {
					t.Errorf("does not land on a node labelled %v", labels)
				}
			}
			for _, labels := range tc.skips {
				if matches(t, spec, labels) {
					t.Errorf("lands on a node labelled %v", labels)
				}
			}
			if want := []corev1.Toleration{{Operator: corev1.TolerationOpExists}}; !slices.Equal(spec.Tolerations, want) {
				t.Errorf("tolerations %+v, want %+v", spec.Tolerations, want)
			}
		})
	}
}
