package mpsdaemon

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes/fake"
)

// TestPodResources: the daemon container gets the configured requests and
// limits, or DefaultResources when none are configured; a change of them
// changes the spec hash (so an idle pod is replaced by one with the new
// sizing).
func TestPodResources(t *testing.T) {
	guaranteed := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")},
	}
	for name, tc := range map[string]struct {
		set  corev1.ResourceRequirements
		want corev1.ResourceRequirements
	}{
		"default": {corev1.ResourceRequirements{}, corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}},
		"guaranteed": {guaranteed, guaranteed},
		"limits only": {corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}},
			corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}}},
	} {
		cfg := testConfig(false)
		cfg.Resources = tc.set
		pod := cfg.Pod(daemonOf("GPU-1"))
		if diff := cmp.Diff(tc.want, pod.Spec.Containers[0].Resources); diff != "" {
			t.Errorf("%s: resources (-want +got):\n%s", name, diff)
		}
	}
	plain, sized := testConfig(false), testConfig(false)
	sized.Resources = guaranteed
	if a, b := plain.Pod(daemonOf("GPU-1")).Annotations[AnnotationSpecHash], sized.Pod(daemonOf("GPU-1")).Annotations[AnnotationSpecHash]; a == b {
		t.Errorf("spec hash %s is the same with other resources", a)
	}
}

func TestParseResourceList(t *testing.T) {
	got, err := ParseResourceList(map[string]string{"cpu": "250m", "memory": "256Mi", "ephemeral-storage": "1Gi"})
	if err != nil {
		t.Fatal(err)
	}
	want := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("256Mi"), corev1.ResourceEphemeralStorage: resource.MustParse("1Gi")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got, err := ParseResourceList(nil); err != nil || got != nil {
		t.Errorf("empty: %v, %v; want nil, nil", got, err)
	}
	for in, wantErr := range map[string]string{
		"gpu=1":       `unknown resource "gpu"`,
		"cpu=lots":    "cpu=lots:",
		"memory=-1Gi": "memory=-1Gi: negative",
	} {
		k, v, _ := strings.Cut(in, "=")
		if _, err := ParseResourceList(map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: %v, want an error with %q", in, err, wantErr)
		}
	}
}

// TestNewPodsRefusesLimitBelowRequest: the API server would refuse every
// daemon pod; NewPods says so at startup, naming the flags.
func TestNewPodsRefusesLimitBelowRequest(t *testing.T) {
	cfg := testConfig(true)
	cfg.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
	}
	_, err := NewPods(fake.NewClientset(), cfg)
	if err == nil || !strings.Contains(err.Error(), "memory limit 512Mi is below its request 1Gi") || !strings.Contains(err.Error(), "--mps-limits") {
		t.Errorf("NewPods = %v, want the limit below the request named", err)
	}
}
