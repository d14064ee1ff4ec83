package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hamiPod is HAMi's examples/nvidia/default_use.yaml.
const hamiPod = `apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  namespace: ml
spec:
  containers:
    - name: ubuntu-container
      image: ubuntu:22.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          nvidia.com/gpu: 1 # declare how many physical GPUs the pod needs
          nvidia.com/gpumem: 3000 # identifies 3000M GPU memory each physical GPU allocates to the pod （Optional,Integer）
          nvidia.com/gpucores: 30 # identifies 30% GPU GPU core each physical GPU allocates to the pod （Optional,Integer)
`

const gpusharePod = `apiVersion: v1
kind: Pod
metadata:
  name: binpack
spec:
  containers:
  - name: binpack-1
    image: cheyang/gpu-player:v2
    resources:
      limits:
        # GiB
        aliyun.com/gpu-mem: 2
`

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConvert(t *testing.T) {
	stdout, _, err := run(t, "convert", "-f", writeFile(t, hamiPod))
	if err != nil {
		t.Fatal(err)
	}
	docs := splitYAML(t, stdout)
	if len(docs) != 2 || !strings.Contains(docs[0], "kind: ResourceClaimTemplate") || !strings.Contains(docs[1], "kind: Pod") {
		t.Fatalf("want a template then the pod:\n%s", stdout)
	}
	for _, want := range []string{"namespace: ml", "memory: 3000Mi", "cores: \"30\"", "deviceClassName: shared.gpu.tessera.dev"} {
		if !strings.Contains(docs[0], want) {
			t.Errorf("template lacks %q:\n%s", want, docs[0])
		}
	}
	if strings.Contains(docs[1], "nvidia.com/") || !strings.Contains(docs[1], "resourceClaimTemplateName: tessera-legacy-") {
		t.Errorf("pod not translated:\n%s", docs[1])
	}
}

func TestConvertStdinAndUnit(t *testing.T) {
	var stdout strings.Builder
	cmd := newRootCommand()
	cmd.SetArgs([]string{"convert", "-f", "-", "--gpushare-unit", "MiB"})
	cmd.SetIn(strings.NewReader(gpusharePod))
	cmd.SetOut(&stdout)
	cmd.SetErr(&strings.Builder{})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "memory: 2Mi") {
		t.Errorf("--gpushare-unit MiB: want 2Mi:\n%s", stdout.String())
	}
}

func TestConvertProfile(t *testing.T) {
	pod := strings.Replace(hamiPod, "nvidia.com/gpumem: 3000", "nvidia.com/gpumem-percentage: 50", 1)
	if _, _, err := run(t, "convert", "-f", writeFile(t, pod)); err == nil || !strings.Contains(err.Error(), "spec.containers[0].resources.limits[nvidia.com/gpucores]") {
		t.Errorf("without --profile: error %v, want one naming gpucores", err)
	}
	stdout, _, err := run(t, "convert", "-f", writeFile(t, pod), "--profile", "hgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "firstAvailable") || !strings.Contains(stdout, "cores: \"30\"") {
		t.Errorf("--profile hgx-h100: want per-model alternatives with 30 cores:\n%s", stdout)
	}
}

func TestConvertErrors(t *testing.T) {
	bad := strings.Replace(hamiPod, "nvidia.com/gpucores: 30", "nvidia.com/gpumem-percentage: 50", 1)
	path := writeFile(t, gpusharePod+"---\n"+bad)
	stdout, _, err := run(t, "convert", "-f", path)
	if err == nil || !strings.Contains(err.Error(), "document 2 (Pod ml/gpu-pod): spec.containers[0].resources.limits[nvidia.com/gpumem-percentage]") {
		t.Errorf("error %v, want document 2 and the field", err)
	}
	if stdout != "" {
		t.Errorf("printed on error:\n%s", stdout)
	}
	if _, _, err := run(t, "convert", "-f", path, "--gpushare-unit", "KiB"); err == nil || !strings.Contains(err.Error(), "--gpushare-unit") {
		t.Errorf("--gpushare-unit KiB: error %v", err)
	}
	if _, _, err := run(t, "convert"); err == nil || !strings.Contains(err.Error(), "filename") {
		t.Errorf("without -f: error %v", err)
	}
}
