//go:build e2e

package e2e

import (
	"maps"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	"encoding/json"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

func TestParseCRILog(t *testing.T) {
	in := "2026-11-22T05:20:35.1Z stdout F A=1\n" +
		"2026-11-22T05:20:35.2Z stdout P B=\n" +
		"2026-11-22T05:20:35.3Z stdout F two\n" +
		"2026-11-22T05:20:35.4Z stderr F \n"
	if got, want := framework.ParseCRILog(in), "A=1\nB=two\n\n"; got != want {
		t.Errorf("ParseCRILog = %q, want %q", got, want)
	}
}

func TestParseEnv(t *testing.T) {
	log := "A=1\nB=x=y\nnot env\n" + framework.EnvDoneMarker + "\nC=after\n"
	want := map[string]string{"A": "1", "B": "x=y"}
	if diff := cmp.Diff(want, framework.ParseEnv(log)); diff != "" {
		t.Errorf("ParseEnv (-want +got):\n%s", diff)
	}
}

func TestParseVisibleGPUs(t *testing.T) {
	env := map[string]string{
		"NVIDIA_VISIBLE_DEVICES":         "void",
		"CUDA_DEVICE_ORDER":              "PCI_BUS_ID",
		"TESSERA_GPU_0":                  "GPU-a",
		"TESSERA_GPU_0_MEMORY_LIMIT":     "8589934592",
		"TESSERA_GPU_0_CORES_LIMIT":      "10",
		"TESSERA_GPU_12":                 "GPU-b",
		"TF_FORCE_GPU_ALLOW_GROWTH":      "true",
		"CUDA_MPS_ACTIVE_THREAD_PERCENT": "50",
	}
	got, err := framework.VisibleGPUs(env)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[int]string{0: "GPU-a", 12: "GPU-b"}, got); diff != "" {
		t.Errorf("VisibleGPUs (-want +got):\n%s", diff)
	}
	if got, err := framework.VisibleGPUs(map[string]string{"PATH": "/bin"}); err != nil || len(got) != 0 {
		t.Errorf("VisibleGPUs without GPUs = %v, %v; want none", got, err)
	}
	for _, k := range []string{"TESSERA_GPU_", "TESSERA_GPU_x", "TESSERA_GPU_01", "TESSERA_GPU_-1", "TESSERA_GPU_0_LIMIT", "TESSERA_GPU__MEMORY_LIMIT"} {
		if _, err := framework.VisibleGPUs(map[string]string{"TESSERA_GPU_1": "GPU-c", k: "1"}); err == nil {
			t.Errorf("VisibleGPUs with %s: no error", k)
		}
	}
}

func TestParseDeviceMinor(t *testing.T) {
	for in, want := range map[string]int{"gpu-0": 0, "gpu-7-shared": 7, "gpu-12": 12} {
		if got, err := framework.DeviceMinor(in); err != nil || got != want {
			t.Errorf("DeviceMinor(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "gpu-", "gpu-x", "gpu-01", "gpu--1", "gpu-1-shared-shared", "mig-1", "gpu-1-p2-0"} {
		if got, err := framework.DeviceMinor(in); err == nil {
			t.Errorf("DeviceMinor(%q) = %d; want an error", in, got)
		}
	}
}

// TestParseEnvPodWith: the pod EnvPodWith builds is a valid Pod (no unknown
// field) with the claims and containers asked for.
func TestParseEnvPodWith(t *testing.T) {
	obj := framework.EnvPodWith("p",
		[]framework.PodClaim{{Name: "gpu", Claim: "two-requests"}, {Name: "whole", Template: "whole-gpu"}},
		framework.EnvContainer{Name: "first", Init: true, Claims: []string{"whole"}},
		framework.EnvContainer{Name: "small", Claims: []string{"gpu/small"}},
		framework.EnvContainer{Name: "both", Claims: []string{"gpu", "whole"}},
	)
	var pod corev1.Pod
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(obj.Object, &pod, true); err != nil {
		t.Fatal(err)
	}
	want := corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](1),
		ResourceClaims: []corev1.PodResourceClaim{
			{Name: "gpu", ResourceClaimName: ptr.To("two-requests")},
			{Name: "whole", ResourceClaimTemplateName: ptr.To("whole-gpu")},
		},
		InitContainers: []corev1.Container{{
			Name: "first", Image: framework.EnvImage, Command: []string{"sh", "-c", framework.InitEnvCommand},
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "whole"}}},
		}},
		Containers: []corev1.Container{{
			Name: "small", Image: framework.EnvImage, Command: []string{"sh", "-c", framework.EnvCommand},
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu", Request: "small"}}},
		}, {
			Name: "both", Image: framework.EnvImage, Command: []string{"sh", "-c", framework.EnvCommand},
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}, {Name: "whole"}}},
		}},
	}
	if diff := cmp.Diff(want, pod.Spec); diff != "" {
		t.Errorf("EnvPodWith spec (-want +got):\n%s", diff)
	}
	if !strings.HasSuffix(framework.InitEnvCommand, framework.EnvDoneMarker) || !strings.HasPrefix(framework.EnvCommand, framework.InitEnvCommand+";") {
		t.Errorf("InitEnvCommand %q must print the env and the marker and exit; EnvCommand %q the same, then sleep", framework.InitEnvCommand, framework.EnvCommand)
	}
}

// TestParseGPUEnv: what wantGPUs accepts and refuses, on environments merged
// from pkg/isolation.DeviceEdits the way the runtime merges CDI devices (in
// order, the last value of a variable wins).
func TestParseGPUEnv(t *testing.T) {
	merge := func(gpus ...isolation.GPU) map[string]string {
		env := map[string]string{}
		for _, g := range gpus {
			edits, err := isolation.DeviceEdits(g, false)
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range edits.Env {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
		return env
	}
	share := isolation.GPU{UUID: "GPU-3", Minor: 3, Shared: true, MemoryLimit: 8 << 30, CoresLimit: 10}
	whole := isolation.GPU{UUID: "GPU-5", Minor: 5}
	seenShare := framework.SeenGPU{Device: "gpu-3-shared", Minor: 3, Uuid: "GPU-3", Share: true, Memory: 8 << 30, Cores: 10}
	seenWhole := framework.SeenGPU{Device: "gpu-5", Minor: 5, Uuid: "GPU-5"}

	with := func(env map[string]string, kv ...string) map[string]string {
		env = maps.Clone(env)
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(env, kv[i])
			} else {
				env[kv[i]] = kv[i+1]
			}
		}
		return env
	}
	both := merge(share, whole)
	tests := []struct {
		name string
		env  map[string]string
		want []framework.SeenGPU
		ok   bool
	}{
		{"share", merge(share), []framework.SeenGPU{seenShare}, true},
		{"whole", merge(whole), []framework.SeenGPU{seenWhole}, true},
		{"share and whole", both, []framework.SeenGPU{seenShare, seenWhole}, true},
		{"whole and share", merge(whole, share), []framework.SeenGPU{seenWhole, seenShare}, true},
		{"a GPU too many", both, []framework.SeenGPU{seenShare}, false},
		{"a GPU missing", merge(share), []framework.SeenGPU{seenShare, seenWhole}, false},
		{"another UUID", with(both, "TESSERA_GPU_5", "GPU-6"), []framework.SeenGPU{seenShare, seenWhole}, false},
		{"another memory limit", with(both, "TESSERA_GPU_3_MEMORY_LIMIT", "1"), []framework.SeenGPU{seenShare, seenWhole}, false},
		{"no cores limit", with(both, "TESSERA_GPU_3_CORES_LIMIT", ""), []framework.SeenGPU{seenShare, seenWhole}, false},
		{"limits on a whole GPU", with(both, "TESSERA_GPU_5_CORES_LIMIT", "10"), []framework.SeenGPU{seenShare, seenWhole}, false},
		{"old memory limit", with(both, "TESSERA_MEMORY_LIMIT", "1"), []framework.SeenGPU{seenShare, seenWhole}, false},
		{"a UUID list", with(both, "CUDA_VISIBLE_DEVICES", "GPU-3,GPU-5"), []framework.SeenGPU{seenShare, seenWhole}, false},
		{"NVIDIA_VISIBLE_DEVICES not void", with(both, "NVIDIA_VISIBLE_DEVICES", "GPU-3"), []framework.SeenGPU{seenShare, seenWhole}, false},
		{"no CUDA_DEVICE_ORDER", with(both, "CUDA_DEVICE_ORDER", ""), []framework.SeenGPU{seenShare, seenWhole}, false},
		{"a malformed GPU variable", with(both, "TESSERA_GPU_x", "GPU-7"), []framework.SeenGPU{seenShare, seenWhole}, false},
		{"nothing", map[string]string{}, []framework.SeenGPU{seenShare}, false},
	}
	for _, tc := range tests {
		problems := framework.GPUProblems("ctr", tc.env, tc.want...)
		if tc.ok != (len(problems) == 0) {
			t.Errorf("%s: env %v, want %v: problems %q; want ok=%v", tc.name, tc.env, tc.want, problems, tc.ok)
		}
	}
}

// TestParseClaim: what framework.Claim builds is the claim the tests wrote
// by hand before it: a share with a config, a pinned whole GPU, a count, a
// template with claim annotations.
func TestParseClaim(t *testing.T) {
	for _, tc := range []struct {
		claim framework.Claim
		yaml  string
	}{{
		framework.Claim{Name: "mps", Memory: "10Gi", Cores: "20", Config: framework.GpuConfig("sharing: {isolation: MPS, computeLimit: 40}")}, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: mps}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: shared.gpu.tessera.dev
        capacity:
          requests: {memory: 10Gi, cores: "20"}
    config:
    - requests: [gpu]
      opaque:
        driver: gpu.tessera.dev
        parameters:
          apiVersion: gpu.tessera.dev/v1alpha1
          kind: GpuConfig
          sharing: {isolation: MPS, computeLimit: 40}
`}, {
		framework.Claim{Name: "that-gpu", Selectors: []string{framework.PinnedToMinor("3")}}, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: that-gpu}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.tessera.dev
        selectors:
        - cel:
            expression: device.attributes["gpu.tessera.dev"].minor == 3
`}, {
		framework.Claim{Name: "nine-gpus", Count: 9}, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: nine-gpus}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.tessera.dev
        allocationMode: ExactCount
        count: 9
`}, {
		framework.Claim{Name: "half-gpu", Template: true, Class: framework.SharedClass, ClaimAnnotations: map[string]string{"gpu.tessera.dev/fraction": "1/2"}}, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: half-gpu}
spec:
  metadata:
    annotations: {gpu.tessera.dev/fraction: "1/2"}
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: shared.gpu.tessera.dev}
`}} {
		want := framework.MustDecodeYAML(t, tc.yaml)[0]
		got := tc.claim.Object()
		var wantObj, gotObj any = &resourceapi.ResourceClaim{}, &resourceapi.ResourceClaim{}
		if tc.claim.Template {
			wantObj, gotObj = &resourceapi.ResourceClaimTemplate{}, &resourceapi.ResourceClaimTemplate{}
		}
		for _, c := range []struct {
			u   map[string]any
			out any
		}{{want.Object, wantObj}, {got.Object, gotObj}} {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(c.u, c.out, true); err != nil {
				t.Fatalf("%s: %v", tc.claim.Name, err)
			}
		}
		if diff := cmp.Diff(wantObj, gotObj, cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 }),
			cmp.Comparer(func(a, b runtime.RawExtension) bool { return jsonEqual(t, a.Raw, b.Raw) })); diff != "" {
			t.Errorf("%s (-hand-written +built):\n%s", tc.claim.Name, diff)
		}
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return cmp.Equal(x, y)
}
