package legacy

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// hamiDeployment is HAMi's examples/nvidia/example.yaml (a Deployment) in a
// namespace.
const hamiDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: cuda-sample-vector-add
  namespace: team-a
  labels:
    app: cuda-sample-vector-add
spec:
  replicas: 1
  selector:
    matchLabels:
      app: cuda-sample-vector-add
  template:
    metadata:
      labels:
        app: cuda-sample-vector-add
    spec:
      containers:
        - name: cuda-sample-vector-add
          image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04
          command:
            - /bin/bash
            - "-c"
            - "--"
          args:
            - while true; do /cuda-samples/vectorAdd; done
          resources:
            limits:
              nvidia.com/gpu: 1 # declare how many physical GPUs the pod needs
              nvidia.com/gpumem: 3000 # Each vGPU contains 3000M device memory （Optional,Integer）
      restartPolicy: Always
`

const cronJob = `apiVersion: batch/v1
kind: CronJob
metadata:
  name: nightly
  namespace: team-a
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers:
          - name: train
            image: busybox
            resources:
              limits:
                nvidia.com/gpumem: 3000
`

const configMap = `# a comment kept as it is
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  nvidia.com/gpumem: "3000"
`

// documents splits a converted stream into objects.
func documents(t *testing.T, out []byte) []map[string]any {
	t.Helper()
	var objs []map[string]any
	for _, d := range strings.Split(string(out), "---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("output YAML: %v\n%s", err, d)
		}
		if len(m) > 0 {
			objs = append(objs, m)
		}
	}
	return objs
}

func TestConvertManifests(t *testing.T) {
	in := hamiDeployment + "---\n" + configMap + "---\n" + cronJob + "---\n" + devicePlugin + "---\n# only a comment\n"
	out, err := ConvertManifests([]byte(in), Options{})
	if err != nil {
		t.Fatal(err)
	}
	objs := documents(t, out)
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o["kind"].(string))
	}
	// One template: the Deployment and the CronJob ask for the same shape in
	// one namespace.
	if got := strings.Join(kinds, ","); got != "ResourceClaimTemplate,Deployment,ConfigMap,CronJob,Pod" {
		t.Fatalf("kinds %s", got)
	}
	tmpl := objs[0]
	meta := tmpl["metadata"].(map[string]any)
	if meta["namespace"] != "team-a" || !strings.HasPrefix(meta["name"].(string), "tessera-legacy-") {
		t.Errorf("template metadata %v", meta)
	}
	if !strings.Contains(string(out), configMap) {
		t.Errorf("the ConfigMap is not passed through byte for byte:\n%s", out)
	}
	if !strings.Contains(string(out), strings.TrimPrefix(devicePlugin, "\n")) {
		t.Errorf("the device-plugin Pod (nothing to translate) is not passed through byte for byte:\n%s", out)
	}
	if strings.Contains(string(out), "gpumem: 3000") || strings.Contains(string(out), "nvidia.com/gpumem\": 3000") {
		t.Errorf("nvidia.com/gpumem left in a workload:\n%s", out)
	}
	for _, want := range []string{"resourceClaimTemplateName: " + meta["name"].(string), "- name: tessera-gpu-0"} {
		if strings.Count(string(out), want) < 2 {
			t.Errorf("output has %q fewer than twice (Deployment and CronJob):\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "creationTimestamp") {
		t.Errorf("output has creationTimestamp:\n%s", out)
	}
	// The output converts to itself.
	again, err := ConvertManifests(out, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(out) {
		t.Errorf("converting the output changed it:\n--- first\n%s--- second\n%s", out, again)
	}
	// The template decodes as a ResourceClaimTemplate.
	reader := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(out)), 4096)
	var rct resourceapi.ResourceClaimTemplate
	if err := reader.Decode(&rct); err != nil || rct.Kind != "ResourceClaimTemplate" {
		t.Errorf("first document: %v %v", err, rct.Kind)
	}
}

func TestConvertManifestsErrors(t *testing.T) {
	bad := strings.Replace(hamiDeployment, "nvidia.com/gpumem: 3000", "nvidia.com/gpumem: 0", 1)
	for _, tc := range []struct{ in, want string }{
		{configMap + "---\n" + bad, "document 2 (Deployment team-a/cuda-sample-vector-add): spec.template.spec.containers[0].resources.limits[nvidia.com/gpumem]"},
		{strings.Replace(cronJob, "nvidia.com/gpumem: 3000", "nvidia.com/gpumem: -1", 1), "document 1 (CronJob team-a/nightly): spec.jobTemplate.spec.template.spec.containers[0].resources.limits[nvidia.com/gpumem]"},
		{strings.Replace(hamiDeployment, "restartPolicy: Always", "restartPolicy: Always\n      notAField: 1", 1), "document 1 (Deployment team-a/cuda-sample-vector-add): spec.template: "},
		{"apiVersion: v1\nkind: List\nitems: []\n", "document 1 (List ): a List"},
	} {
		_, err := ConvertManifests([]byte(tc.in), Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v\nwant one containing %q", err, tc.want)
		}
	}
}
