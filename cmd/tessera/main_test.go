package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// run executes the CLI with args and returns stdout, stderr and the error that
// makes main exit non-zero.
func run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := newRootCommand()
	cmd.SetArgs(args)
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	err := cmd.Execute()
	return stdout.String(), stderr.String(), err
}

// splitYAML splits a multi-document stream into its documents.
func splitYAML(t *testing.T, s string) []string {
	t.Helper()
	if !strings.HasPrefix(s, "---\n") {
		t.Fatalf("YAML output does not start with ---:\n%s", s)
	}
	return strings.Split(strings.TrimPrefix(s, "---\n"), "\n---\n")
}

func TestSlicesYAML(t *testing.T) {
	out, _, err := run(t, "slices", "--profile", "hgx-h100")
	if err != nil {
		t.Fatalf("tessera slices: %v", err)
	}
	docs := splitYAML(t, out)
	if len(docs) != 2 {
		t.Fatalf("%d documents, want 2 (counters, devices):\n%s", len(docs), out)
	}
	var slices []resourceapi.ResourceSlice
	for i, doc := range docs {
		var s resourceapi.ResourceSlice
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		slices = append(slices, s)
	}
	for i, s := range slices {
		if s.APIVersion != "resource.k8s.io/v1" || s.Kind != "ResourceSlice" {
			t.Errorf("slice %d: %s %s", i, s.APIVersion, s.Kind)
		}
		if s.Spec.Driver != "gpu.tessera.dev" || s.Spec.NodeName == nil || *s.Spec.NodeName != "hgx-h100" ||
			s.Spec.Pool.Name != "hgx-h100" || s.Spec.Pool.ResourceSliceCount != 2 || s.Spec.Pool.Generation != 1 {
			t.Errorf("slice %d: driver %q node %v pool %+v, want gpu.tessera.dev on node and pool hgx-h100, 2 slices, generation 1",
				i, s.Spec.Driver, s.Spec.NodeName, s.Spec.Pool)
		}
	}
	if len(slices[0].Spec.SharedCounters) != 8 || len(slices[0].Spec.Devices) != 0 {
		t.Errorf("first slice: %d counter sets, %d devices; want 8 counter sets only", len(slices[0].Spec.SharedCounters), len(slices[0].Spec.Devices))
	}
	if len(slices[1].Spec.Devices) != 16 || slices[1].Spec.Devices[0].Name != "gpu-0-shared" {
		t.Errorf("second slice: %d devices starting with %q; want 16 starting with gpu-0-shared", len(slices[1].Spec.Devices), slices[1].Spec.Devices[0].Name)
	}
	if got := slices[1].GenerateName; got != "00001-gpu.tessera.dev-hgx-h100-" {
		t.Errorf("generateName %q", got)
	}
}

func TestSlicesJSONWithNode(t *testing.T) {
	out, _, err := run(t, "slices", "--profile", "l4x4", "--node", "gpu-node-7", "-o", "json")
	if err != nil {
		t.Fatalf("tessera slices: %v", err)
	}
	var list struct {
		APIVersion string                      `json:"apiVersion"`
		Kind       string                      `json:"kind"`
		Items      []resourceapi.ResourceSlice `json:"items"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&list); err != nil {
		t.Fatalf("decode: %v\n%s", err, out)
	}
	if list.APIVersion != "v1" || list.Kind != "List" || len(list.Items) != 2 {
		t.Fatalf("got %s %s with %d items, want a v1 List of 2", list.APIVersion, list.Kind, len(list.Items))
	}
	for _, s := range list.Items {
		if *s.Spec.NodeName != "gpu-node-7" || s.Spec.Pool.Name != "gpu-node-7" {
			t.Errorf("node %q pool %q, want gpu-node-7", *s.Spec.NodeName, s.Spec.Pool.Name)
		}
	}
	if n := len(list.Items[1].Spec.Devices); n != 8 {
		t.Errorf("%d devices for 4 L4s, want 8", n)
	}
}

func TestSlicesErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{name: "unknown profile", args: []string{"slices", "--profile", "dgx-b300"}, want: append([]string{`"dgx-b300"`}, gpu.Profiles()...)},
		{name: "no profile", args: []string{"slices"}, want: []string{`"profile" not set`}},
		{name: "bad format", args: []string{"slices", "--profile", "l4x4", "-o", "xml"}, want: []string{`"xml"`, "yaml", "json"}},
		{name: "bad node name", args: []string{"slices", "--profile", "l4x4", "--node", "Not_A_Node"}, want: []string{`node name "Not_A_Node"`}},
		{name: "extra argument", args: []string{"slices", "--profile", "l4x4", "extra"}, want: []string{"unknown command"}},
		{name: "deviceclasses bad format", args: []string{"deviceclasses", "-o", "table"}, want: []string{`"table"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, stderr, err := run(t, tc.args...)
			if err == nil {
				t.Fatalf("tessera %v succeeded, want an error (non-zero exit)", tc.args)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
			if out != "" {
				t.Errorf("stdout not empty on error:\n%s", out)
			}
			if !strings.Contains(stderr, err.Error()) {
				t.Errorf("stderr %q does not show the error", stderr)
			}
		})
	}
}

// TestDeviceClassesYAMLIsTheManifest: what the CLI prints is what
// deployments/deviceclasses.yaml holds, comment header aside.
func TestDeviceClassesYAMLIsTheManifest(t *testing.T) {
	out, _, err := run(t, "deviceclasses")
	if err != nil {
		t.Fatalf("tessera deviceclasses: %v", err)
	}
	file, err := os.ReadFile(filepath.Join("..", "..", "deployments", "deviceclasses.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var body []string
	for _, line := range strings.SplitAfter(string(file), "\n") {
		if !strings.HasPrefix(line, "#") {
			body = append(body, line)
		}
	}
	if want := strings.Join(body, ""); out != want {
		t.Errorf("tessera deviceclasses differs from deployments/deviceclasses.yaml\n--- file\n%s--- cli\n%s", want, out)
	}
}

func TestDeviceClassesJSON(t *testing.T) {
	out, _, err := run(t, "deviceclasses", "-o", "json")
	if err != nil {
		t.Fatalf("tessera deviceclasses: %v", err)
	}
	var list struct {
		Items []resourceapi.DeviceClass `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if len(list.Items) != 4 || list.Items[0].Name != "gpu.tessera.dev" || list.Items[1].Name != "shared.gpu.tessera.dev" || list.Items[2].Name != "lent.gpu.tessera.dev" || list.Items[3].Name != "mig.gpu.tessera.dev" {
		t.Errorf("got %d classes: %+v", len(list.Items), list.Items)
	}
}

func TestClaimTemplateRefusesWhatAdmissionRefuses(t *testing.T) {
	_, _, err := run(t, "claim-template", "--name", "x", "--memory", "10Gi", "--cores", "25", "--compute-limit", "20")
	want := `the admission webhook would refuse this template: spec.spec.devices.config[0].opaque.parameters.sharing.computeLimit: Invalid value: 20: is below the 25 cores`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error = %v, want one starting with %q", err, want)
	}
	_, _, err = run(t, "claim-template", "--name", "x", "--gpus", "2", "--memory", "10Gi", "--isolation", "MPS")
	want = `the admission webhook would refuse this template: spec.spec.devices.requests[0].exactly.count: Invalid value: 2: request "gpu" has isolation MPS`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error = %v, want one starting with %q", err, want)
	}
}

func TestClaimTemplateWarnsOfShareWithoutMemory(t *testing.T) {
	out, stderr, err := run(t, "claim-template", "--name", "best-effort", "--cores", "30")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "kind: ResourceClaimTemplate") {
		t.Errorf("no template printed:\n%s", out)
	}
	want := `Warning: spec.spec.devices.requests[0].exactly.capacity.requests[memory]: not set, so request "gpu" of class shared.gpu.tessera.dev ` +
		"is allocated all of a GPU's memory and no other share fits on that GPU\n"
	if stderr != want {
		t.Errorf("stderr = %q, want %q", stderr, want)
	}
}

// TestClaimTemplateMIG: --mig PROFILE (as a separate word or with =) and
// --mig --fraction print templates of the MIG class, offline; a stray
// argument without a bare --mig is refused; HAMiCore on MIG is refused with
// the webhook's field path.
func TestClaimTemplateMIG(t *testing.T) {
	template := func(args ...string) resourceapi.ResourceClaimTemplate {
		t.Helper()
		out, stderr, err := run(t, append([]string{"claim-template", "--name", "m"}, args...)...)
		if err != nil || stderr != "" {
			t.Fatalf("tessera claim-template %v: %v %s", args, err, stderr)
		}
		var tmpl resourceapi.ResourceClaimTemplate
		if err := yaml.UnmarshalStrict([]byte(strings.TrimPrefix(out, "---\n")), &tmpl); err != nil {
			t.Fatal(err)
		}
		return tmpl
	}
	for _, args := range [][]string{{"--mig", "3g.40gb"}, {"--mig=3g.40gb"}} {
		ex := template(args...).Spec.Spec.Devices.Requests[0].Exactly
		if ex == nil || ex.DeviceClassName != "mig.gpu.tessera.dev" || len(ex.Selectors) != 1 ||
			ex.Selectors[0].CEL.Expression != `device.attributes["gpu.tessera.dev"].profile == "3g.40gb"` {
			t.Errorf("%v: request %+v, want the MIG class with a 3g.40gb selector", args, ex)
		}
	}
	fa := template("--mig", "--fraction", "1/7").Spec.Spec.Devices.Requests[0].FirstAvailable
	if len(fa) != 4 || fa[2].Name != "h100-80gb-1g-20gb" || fa[2].DeviceClassName != "mig.gpu.tessera.dev" {
		t.Errorf("--mig --fraction 1/7: %+v, want four subrequests, the H100's for 1g.20gb", fa)
	}
	if _, _, err := run(t, "claim-template", "--name", "m", "3g.40gb"); err == nil || !strings.Contains(err.Error(), `unknown command "3g.40gb"`) {
		t.Errorf("a profile without --mig: %v, want refused", err)
	}
	_, _, err := run(t, "claim-template", "--name", "m", "--mig", "3g.40gb", "--isolation", "HAMiCore")
	want := `the admission webhook would refuse this template: spec.spec.devices.config[0].opaque.parameters.sharing.isolation: Invalid value: "HAMiCore"`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error = %v, want one starting with %q", err, want)
	}
}
