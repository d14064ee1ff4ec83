package helm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu"
)

// schemaNode is the part of JSON Schema values.schema.json uses.
type schemaNode struct {
	Ref        string                 `json:"$ref"`
	Enum       []any                  `json:"enum"`
	Properties map[string]*schemaNode `json:"properties"`
	Minimum    *float64               `json:"minimum"`
	Maximum    *float64               `json:"maximum"`
	Items      *schemaNode            `json:"items"`
}

func loadSchema(t *testing.T) (root *schemaNode, definitions map[string]*schemaNode) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		schemaNode
		Definitions map[string]*schemaNode `json:"definitions"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return &doc.schemaNode, doc.Definitions
}

func stringValues(values []any) []string {
	out := make([]string, 0, len(values))
	for _, v := range values {
		s, _ := v.(string)
		out = append(out, s)
	}
	return out
}

// TestSchemaFollowsTheCode: the enums and bounds values.schema.json checks
// are the ones the Go code accepts, so the schema neither refuses a valid
// value nor lets an invalid one through to the plugin.
func TestSchemaFollowsTheCode(t *testing.T) {
	root, defs := loadSchema(t)
	plugin := root.Properties["kubeletPlugin"].Properties

	wantProfiles := append([]string{""}, gpu.Profiles()...)
	if diff := cmp.Diff(wantProfiles, stringValues(plugin["mockProfile"].Enum)); diff != "" {
		t.Errorf("kubeletPlugin.mockProfile enum differs from gpu.Profiles() (-code +schema):\n%s", diff)
	}
	isolations := make([]string, 0, len(configapi.SupportedIsolations))
	for _, i := range configapi.SupportedIsolations {
		isolations = append(isolations, string(i))
	}
	if diff := cmp.Diff(isolations, stringValues(plugin["defaultIsolation"].Enum)); diff != "" {
		t.Errorf("kubeletPlugin.defaultIsolation enum (-code +schema):\n%s", diff)
	}

	cfg := defs["gpuConfig"].Properties
	var paths []string
	for section, node := range cfg {
		for field := range node.Properties {
			paths = append(paths, section+"."+field)
		}
	}
	slices.Sort(paths)
	want := []string{"sharing.allowedIsolations", "sharing.computeLimit", "sharing.isolation", "sharing.memoryLimit", "topology.nvlink"}
	if diff := cmp.Diff(want, paths); diff != "" {
		t.Errorf("gpuConfig fields in the schema differ from GpuConfig's (-code +schema):\n%s", diff)
	}
	if diff := cmp.Diff(isolations, stringValues(cfg["sharing"].Properties["isolation"].Enum)); diff != "" {
		t.Errorf("gpuConfig sharing.isolation enum (-code +schema):\n%s", diff)
	}
	if items := cfg["sharing"].Properties["allowedIsolations"].Items; items == nil ||
		!cmp.Equal(isolations, stringValues(items.Enum)) {
		t.Errorf("gpuConfig sharing.allowedIsolations items must be the isolations %v", isolations)
	}
	var policies []string
	for _, p := range configapi.SupportedNVLinkPolicies {
		policies = append(policies, string(p))
	}
	if diff := cmp.Diff(policies, stringValues(cfg["topology"].Properties["nvlink"].Enum)); diff != "" {
		t.Errorf("gpuConfig topology.nvlink enum (-code +schema):\n%s", diff)
	}
	limit := cfg["sharing"].Properties["computeLimit"]
	if limit.Minimum == nil || *limit.Minimum != configapi.MinComputeLimit || limit.Maximum == nil || *limit.Maximum != configapi.MaxComputeLimit {
		t.Errorf("gpuConfig sharing.computeLimit bounds %v..%v, want %d..%d", limit.Minimum, limit.Maximum,
			configapi.MinComputeLimit, configapi.MaxComputeLimit)
	}
}
