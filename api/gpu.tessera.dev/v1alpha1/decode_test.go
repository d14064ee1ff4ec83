package v1alpha1

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

const header = "apiVersion: gpu.tessera.dev/v1alpha1\nkind: GpuConfig\n"

// decodeAndValidate is what the admission webhook does with a config.
func decodeAndValidate(raw []byte) (*GpuConfig, error) {
	config, err := DecodeStrict(raw)
	if err != nil {
		return nil, err
	}
	if errs := config.Validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return config, nil
}

// checkError fails t unless err is the error want says: none for "",
// else one whose message is want. It returns true when the case wanted an
// error, which leaves no result to check; got, the result, is named when an
// error was wanted and none came.
func checkError(t *testing.T, err error, want string, got any) bool {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Fatalf("got %+v, want error %q", got, want)
	case want != "" && err.Error() != want:
		t.Fatalf("wrong error\n got: %s\nwant: %s", err, want)
	}
	return want != ""
}

func TestBadConfigs(t *testing.T) {
	tests := []struct {
		name string
		in   string
		// want is the whole error message.
		want string
	}{
		// Identity.
		{
			name: "wrong kind",
			in:   "apiVersion: gpu.tessera.dev/v1alpha1\nkind: DeviceClass\n",
			want: `invalid GpuConfig: kind "DeviceClass" is not supported (supported: GpuConfig)`,
		},
		{
			name: "kind in wrong case",
			in:   "apiVersion: gpu.tessera.dev/v1alpha1\nkind: gpuconfig\n",
			want: `invalid GpuConfig: kind "gpuconfig" is not supported (supported: GpuConfig)`,
		},
		{
			name: "wrong apiVersion",
			in:   "apiVersion: gpu.tessera.dev/v1\nkind: GpuConfig\n",
			want: `invalid GpuConfig: apiVersion "gpu.tessera.dev/v1" is not supported (supported: gpu.tessera.dev/v1alpha1)`,
		},
		{
			name: "wrong group and kind",
			in:   `{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}`,
			want: `invalid GpuConfig: apiVersion "resource.k8s.io/v1" is not supported (supported: gpu.tessera.dev/v1alpha1); ` +
				`kind "ResourceClaim" is not supported (supported: GpuConfig)`,
		},
		{
			name: "missing apiVersion",
			in:   "kind: GpuConfig\nsharing:\n  isolation: MPS\n",
			want: `invalid GpuConfig: apiVersion is missing (supported: gpu.tessera.dev/v1alpha1)`,
		},
		{
			name: "missing kind",
			in:   "apiVersion: gpu.tessera.dev/v1alpha1\n",
			want: `invalid GpuConfig: kind is missing (supported: GpuConfig)`,
		},
		{
			name: "apiVersion not a string",
			in:   `{"apiVersion": 1, "kind": "GpuConfig"}`,
			want: `invalid GpuConfig: apiVersion: must be a string, not a number`,
		},
		// Shape.
		{
			name: "unknown top-level field",
			in:   header + "sharding:\n  isolation: MPS\n",
			want: `invalid GpuConfig: sharding: unknown field`,
		},
		{
			name: "metadata is not part of GpuConfig",
			in:   header + "metadata:\n  name: fast\n",
			want: `invalid GpuConfig: metadata: unknown field`,
		},
		{
			name: "unknown nested field",
			in:   header + "sharing:\n  isolaton: MPS\n",
			want: `invalid GpuConfig: sharing.isolaton: unknown field`,
		},
		{
			name: "field names are case-sensitive",
			in:   header + "topology:\n  NVLink: Required\n",
			want: `invalid GpuConfig: topology.NVLink: unknown field`,
		},
		{
			name: "all unknown fields at once, JSON",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolaton":"MPS"},"topology":{"nvlnk":"Required"},"env":{"A":"b"}}`,
			want: `invalid GpuConfig: sharing.isolaton: unknown field; topology.nvlnk: unknown field; env: unknown field`,
		},
		{
			name: "computeLimit is a string",
			in:   header + "sharing:\n  computeLimit: \"50\"\n",
			want: `invalid GpuConfig: sharing.computeLimit: must be an integer that fits in 32 bits, not a string`,
		},
		{
			name: "computeLimit is a fraction",
			in:   header + "sharing:\n  computeLimit: 50.5\n",
			want: `invalid GpuConfig: sharing.computeLimit: must be an integer that fits in 32 bits, not the number 50.5`,
		},
		{
			name: "computeLimit overflows",
			in:   header + "sharing:\n  computeLimit: 99999999999\n",
			want: `invalid GpuConfig: sharing.computeLimit: must be an integer that fits in 32 bits, not the number 99999999999`,
		},
		{
			name: "sharing is a string",
			in:   header + "sharing: MPS\n",
			want: `invalid GpuConfig: sharing: must be an object, not a string`,
		},
		{
			name: "isolation is a YAML boolean",
			in:   header + "sharing:\n  isolation: yes\n",
			want: `invalid GpuConfig: sharing.isolation: must be a string, not a bool`,
		},
		{
			name: "memoryLimit is not a quantity",
			in:   header + "sharing:\n  memoryLimit: lots\n",
			want: `invalid GpuConfig: sharing.memoryLimit: must be a quantity such as 16Gi or 512Mi`,
		},
		{
			// Parsing it would take apimachinery's Quantity most of a minute.
			name: "memoryLimit with an exponent beyond 1000",
			in:   header + "sharing:\n  memoryLimit: \"1e-99999999\"\n",
			want: `invalid GpuConfig: sharing.memoryLimit: Invalid value: "1e-99999999": the exponent must be between -1000 and 1000`,
		},
		{
			name: "memoryLimit with a huge exponent, JSON number under an escaped key",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"memory\u004cimit":1e-99999999}}`,
			want: `invalid GpuConfig: sharing.memoryLimit: Invalid value: "1e-99999999": the exponent must be between -1000 and 1000`,
		},
		{
			name: "memoryLimit with too many digits",
			in:   header + "sharing:\n  memoryLimit: \"" + strings.Repeat("9", 65) + "\"\n",
			want: `invalid GpuConfig: sharing.memoryLimit: Invalid value: "99999999999999999999...": must be at most 64 characters`,
		},
		{
			name: "duplicate field, JSON",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS","isolation":"HAMiCore"}}`,
			want: `invalid GpuConfig: sharing.isolation: duplicate field`,
		},
		{
			name: "duplicate field, YAML",
			in:   header + "sharing:\n  isolation: MPS\n  isolation: HAMiCore\n",
			want: `invalid GpuConfig: line 5: duplicate field "isolation"`,
		},
		// Syntax.
		{
			name: "not JSON or YAML",
			in:   header + "sharing:\n\tisolation: MPS\n",
			want: `invalid GpuConfig: not valid JSON or YAML: line 4: found character that cannot start any token`,
		},
		{
			name: "truncated JSON",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig",`,
			want: `invalid GpuConfig: not valid JSON or YAML: line 1: did not find expected node content`,
		},
		{
			name: "a scalar",
			in:   "MPS",
			want: `invalid GpuConfig: must be an object with apiVersion and kind, not a string`,
		},
		{
			name: "a list",
			in:   "- apiVersion: gpu.tessera.dev/v1alpha1\n  kind: GpuConfig\n",
			want: `invalid GpuConfig: must be an object with apiVersion and kind, not an array`,
		},
		{
			name: "empty",
			in:   " \n",
			want: `invalid GpuConfig: the input is empty; expected an object with apiVersion gpu.tessera.dev/v1alpha1 and kind GpuConfig`,
		},
		{
			name: "only comments",
			in:   "# isolation: MPS\n",
			want: `invalid GpuConfig: the input is empty; expected an object with apiVersion gpu.tessera.dev/v1alpha1 and kind GpuConfig`,
		},
		{
			name: "two documents",
			in:   header + "---\n" + header,
			want: `invalid GpuConfig: the input holds 2 YAML documents; exactly one GpuConfig is accepted`,
		},
		{
			name: "too large",
			in:   "# " + strings.Repeat("x", MaxConfigBytes-2) + "\n",
			want: `invalid GpuConfig: the input is 65537 bytes, more than the 65536 accepted`,
		},
		// Values (Validate).
		{
			name: "computeLimit 0",
			in:   header + "sharing:\n  computeLimit: 0\n",
			want: `sharing.computeLimit: Invalid value: 0: must be between 1 and 100`,
		},
		{
			name: "computeLimit 101",
			in:   header + "sharing:\n  computeLimit: 101\n",
			want: `sharing.computeLimit: Invalid value: 101: must be between 1 and 100`,
		},
		{
			name: "computeLimit -5",
			in:   header + "sharing:\n  computeLimit: -5\n",
			want: `sharing.computeLimit: Invalid value: -5: must be between 1 and 100`,
		},
		{
			name: "memoryLimit 0",
			in:   header + "sharing:\n  memoryLimit: 0\n",
			want: `sharing.memoryLimit: Invalid value: "0": must be greater than zero`,
		},
		{
			name: "memoryLimit negative",
			in:   header + "sharing:\n  memoryLimit: -1Gi\n",
			want: `sharing.memoryLimit: Invalid value: "-1Gi": must be greater than zero`,
		},
		{
			name: "memoryLimit below 1Mi",
			in:   header + "sharing:\n  memoryLimit: 512Ki\n",
			want: `sharing.memoryLimit: Invalid value: "512Ki": must be at least 1Mi`,
		},
		{
			name: "memoryLimit of fractional bytes",
			in:   header + "sharing:\n  memoryLimit: 1048576500m\n",
			want: `sharing.memoryLimit: Invalid value: "1048576500m": must be a whole number of bytes`,
		},
		{
			name: "memoryLimit beyond int64",
			in:   header + "sharing:\n  memoryLimit: \"1e30\"\n",
			want: `sharing.memoryLimit: Invalid value: "1e30": must be less than 8Ei`,
		},
		{
			name: "memoryLimit with a large exponent",
			in:   header + "sharing:\n  memoryLimit: \"1e1000\"\n",
			want: `sharing.memoryLimit: Invalid value: "10e999": must be less than 8Ei`,
		},
		{
			name: "isolation in wrong case",
			in:   header + "sharing:\n  isolation: mps\n",
			want: `sharing.isolation: Unsupported value: "mps": supported values: "Advisory", "MPS", "HAMiCore", "DriverMemory"`,
		},
		{
			name: "isolation unknown",
			in:   header + "sharing:\n  isolation: Foo\n",
			want: `sharing.isolation: Unsupported value: "Foo": supported values: "Advisory", "MPS", "HAMiCore", "DriverMemory"`,
		},
		{
			name: "nvlink unknown",
			in:   header + "topology:\n  nvlink: Maybe\n",
			want: `topology.nvlink: Unsupported value: "Maybe": supported values: "Required", "Preferred", "Ignore"`,
		},
		{
			name: "locality labels that are not label values",
			in:   header + "locality:\n  affinity: \"-a\"\n  antiAffinity: \"a b\"\n  exclusion: " + strings.Repeat("x", 64) + "\n",
			want: `[locality.affinity: Invalid value: "-a": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?'), ` +
				`locality.antiAffinity: Invalid value: "a b": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?'), ` +
				`locality.exclusion: Invalid value: "` + strings.Repeat("x", 64) + `": must be no more than 63 bytes]`,
		},
		{
			name: "allowedIsolations empty",
			in:   header + "sharing:\n  allowedIsolations: []\n",
			want: `sharing.allowedIsolations: Required value: must name at least one isolation; leave the field out to allow every isolation`,
		},
		{
			name: "allowedIsolations with an unknown and a repeated isolation",
			in:   header + "sharing:\n  allowedIsolations: [MPS, mps, MPS]\n",
			want: `[sharing.allowedIsolations[1]: Unsupported value: "mps": supported values: "Advisory", "MPS", "HAMiCore", "DriverMemory", ` +
				`sharing.allowedIsolations[2]: Duplicate value: "MPS"]`,
		},
		{
			name: "allowedIsolations not a list",
			in:   header + "sharing:\n  allowedIsolations: MPS\n",
			want: `invalid GpuConfig: sharing.allowedIsolations: must be a list, not a string`,
		},
		{
			name: "every value wrong",
			in:   header + "sharing:\n  isolation: Foo\n  computeLimit: 0\n  memoryLimit: 0\ntopology:\n  nvlink: Maybe\n",
			want: `[sharing.isolation: Unsupported value: "Foo": supported values: "Advisory", "MPS", "HAMiCore", "DriverMemory", ` +
				`sharing.computeLimit: Invalid value: 0: must be between 1 and 100, ` +
				`sharing.memoryLimit: Invalid value: "0": must be greater than zero, ` +
				`topology.nvlink: Unsupported value: "Maybe": supported values: "Required", "Preferred", "Ignore"]`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			config, err := decodeAndValidate([]byte(tc.in))
			if err == nil {
				t.Fatalf("got config %+v, want error %q", config, tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("wrong error\n got: %s\nwant: %s", err, tc.want)
			}
		})
	}
}

func TestGoodConfigs(t *testing.T) {
	typeMeta := metav1.TypeMeta{APIVersion: "gpu.tessera.dev/v1alpha1", Kind: "GpuConfig"}
	defaultSharing := &SharingConfig{Isolation: IsolationAdvisory}
	defaultTopology := &TopologyConfig{NVLink: NVLinkIgnore}
	tests := []struct {
		name string
		in   string
		// decoded is what DecodeStrict returns; defaulted is after Default.
		decoded, defaulted *GpuConfig
	}{
		{
			name:      "type meta only",
			in:        header,
			decoded:   &GpuConfig{TypeMeta: typeMeta},
			defaulted: &GpuConfig{TypeMeta: typeMeta, Sharing: defaultSharing, Topology: defaultTopology},
		},
		{
			name: "everything set, YAML",
			in:   header + "sharing:\n  isolation: HAMiCore\n  computeLimit: 50\n  memoryLimit: 16Gi\ntopology:\n  nvlink: Required\n",
			decoded: &GpuConfig{TypeMeta: typeMeta,
				Sharing:  &SharingConfig{Isolation: IsolationHAMiCore, ComputeLimit: ptr.To[int32](50), MemoryLimit: ptr.To(resource.MustParse("16Gi"))},
				Topology: &TopologyConfig{NVLink: NVLinkRequired}},
			defaulted: &GpuConfig{TypeMeta: typeMeta,
				Sharing:  &SharingConfig{Isolation: IsolationHAMiCore, ComputeLimit: ptr.To[int32](50), MemoryLimit: ptr.To(resource.MustParse("16Gi"))},
				Topology: &TopologyConfig{NVLink: NVLinkRequired}},
		},
		{
			name:      "JSON, as the API server delivers it",
			in:        `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS"}}`,
			decoded:   &GpuConfig{TypeMeta: typeMeta, Sharing: &SharingConfig{Isolation: IsolationMPS}},
			defaulted: &GpuConfig{TypeMeta: typeMeta, Sharing: &SharingConfig{Isolation: IsolationMPS}, Topology: defaultTopology},
		},
		{
			name:      "YAML flow mapping that is not JSON",
			in:        `{apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, topology: {nvlink: Preferred}}`,
			decoded:   &GpuConfig{TypeMeta: typeMeta, Topology: &TopologyConfig{NVLink: NVLinkPreferred}},
			defaulted: &GpuConfig{TypeMeta: typeMeta, Sharing: defaultSharing, Topology: &TopologyConfig{NVLink: NVLinkPreferred}},
		},
		{
			name: "bounds: computeLimit 1, memoryLimit 1Mi in plain bytes",
			in:   header + "sharing:\n  computeLimit: 1\n  memoryLimit: 1048576\n",
			decoded: &GpuConfig{TypeMeta: typeMeta,
				Sharing: &SharingConfig{ComputeLimit: ptr.To[int32](1), MemoryLimit: ptr.To(resource.MustParse("1Mi"))}},
			defaulted: &GpuConfig{TypeMeta: typeMeta,
				Sharing:  &SharingConfig{Isolation: IsolationAdvisory, ComputeLimit: ptr.To[int32](1), MemoryLimit: ptr.To(resource.MustParse("1Mi"))},
				Topology: defaultTopology},
		},
		{
			name: "bounds: computeLimit 100, decimal memoryLimit",
			in:   header + "sharing:\n  computeLimit: 100\n  memoryLimit: 20G\n",
			decoded: &GpuConfig{TypeMeta: typeMeta,
				Sharing: &SharingConfig{ComputeLimit: ptr.To[int32](100), MemoryLimit: ptr.To(resource.MustParse("20G"))}},
			defaulted: &GpuConfig{TypeMeta: typeMeta,
				Sharing:  &SharingConfig{Isolation: IsolationAdvisory, ComputeLimit: ptr.To[int32](100), MemoryLimit: ptr.To(resource.MustParse("20G"))},
				Topology: defaultTopology},
		},
		{
			name: "a class's floor: allowedIsolations with isolation",
			in:   header + "sharing:\n  isolation: MPS\n  allowedIsolations: [MPS, HAMiCore]\n",
			decoded: &GpuConfig{TypeMeta: typeMeta,
				Sharing: &SharingConfig{Isolation: IsolationMPS, AllowedIsolations: []Isolation{IsolationMPS, IsolationHAMiCore}}},
			defaulted: &GpuConfig{TypeMeta: typeMeta,
				Sharing:  &SharingConfig{Isolation: IsolationMPS, AllowedIsolations: []Isolation{IsolationMPS, IsolationHAMiCore}},
				Topology: defaultTopology},
		},
		{
			name:      "empty and null sections",
			in:        header + "sharing: {}\ntopology: null\n",
			decoded:   &GpuConfig{TypeMeta: typeMeta, Sharing: &SharingConfig{}},
			defaulted: &GpuConfig{TypeMeta: typeMeta, Sharing: defaultSharing, Topology: defaultTopology},
		},
		{
			name:      "comments and document markers",
			in:        "# a share for notebooks\n---\n" + header + "sharing:\n  isolation: MPS # enforced\n",
			decoded:   &GpuConfig{TypeMeta: typeMeta, Sharing: &SharingConfig{Isolation: IsolationMPS}},
			defaulted: &GpuConfig{TypeMeta: typeMeta, Sharing: &SharingConfig{Isolation: IsolationMPS}, Topology: defaultTopology},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			config, err := decodeAndValidate([]byte(tc.in))
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if diff := cmp.Diff(tc.decoded, config); diff != "" {
				t.Errorf("decoded config (-want +got):\n%s", diff)
			}
			config.Default()
			if diff := cmp.Diff(tc.defaulted, config); diff != "" {
				t.Errorf("defaulted config (-want +got):\n%s", diff)
			}
			if errs := config.Validate(); len(errs) > 0 {
				t.Errorf("defaulted config is invalid: %v", errs)
			}
			again := config.DeepCopy()
			again.Default()
			if diff := cmp.Diff(config, again); diff != "" {
				t.Errorf("Default is not idempotent (-once +twice):\n%s", diff)
			}
		})
	}
}

func TestDecodeLenient(t *testing.T) {
	typeMeta := metav1.TypeMeta{APIVersion: "gpu.tessera.dev/v1alpha1", Kind: "GpuConfig"}
	tests := []struct {
		name    string
		in      string
		want    *GpuConfig
		wantErr string
	}{
		{
			name: "unknown fields a newer plugin wrote are ignored",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS","smPartition":3},"future":{"x":1}}`,
			want: &GpuConfig{TypeMeta: typeMeta, Sharing: &SharingConfig{Isolation: IsolationMPS}},
		},
		{
			name: "duplicate fields: the last wins",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","topology":{"nvlink":"Required","nvlink":"Ignore"}}`,
			want: &GpuConfig{TypeMeta: typeMeta, Topology: &TopologyConfig{NVLink: NVLinkIgnore}},
		},
		{
			name: "YAML with unknown fields",
			in:   header + "sharing:\n  isolation: HAMiCore\n  isolaton: MPS\n",
			want: &GpuConfig{TypeMeta: typeMeta, Sharing: &SharingConfig{Isolation: IsolationHAMiCore}},
		},
		{
			name:    "the kind is still checked",
			in:      `{"apiVersion":"gpu.tessera.dev/v1alpha2","kind":"GpuConfig"}`,
			wantErr: `invalid GpuConfig: apiVersion "gpu.tessera.dev/v1alpha2" is not supported (supported: gpu.tessera.dev/v1alpha1)`,
		},
		{
			name:    "types are still checked",
			in:      `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"computeLimit":"all"}}`,
			wantErr: `invalid GpuConfig: sharing.computeLimit: must be an integer that fits in 32 bits, not a string`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			config, err := DecodeLenient([]byte(tc.in))
			if checkError(t, err, tc.wantErr, config) {
				return
			}
			if diff := cmp.Diff(tc.want, config); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// architectureExample is the GpuConfig example of ARCHITECTURE.md ("Opaque
// config"), with one choice made for each field that lists alternatives.
const architectureExample = `apiVersion: gpu.tessera.dev/v1alpha1
kind: GpuConfig
sharing:
  computeLimit: 50
  isolation: MPS
  memoryLimit: 16Gi
topology:
  nvlink: Required
`

func TestArchitectureExampleRoundTrip(t *testing.T) {
	config, err := decodeAndValidate([]byte(architectureExample))
	if err != nil {
		t.Fatalf("the documented example does not decode: %v", err)
	}
	want := &GpuConfig{
		TypeMeta: metav1.TypeMeta{APIVersion: "gpu.tessera.dev/v1alpha1", Kind: "GpuConfig"},
		Sharing: &SharingConfig{
			Isolation:    IsolationMPS,
			ComputeLimit: ptr.To[int32](50),
			MemoryLimit:  ptr.To(resource.MustParse("16Gi")),
		},
		Topology: &TopologyConfig{NVLink: NVLinkRequired},
	}
	if diff := cmp.Diff(want, config); diff != "" {
		t.Fatalf("decoded example (-want +got):\n%s", diff)
	}
	out, err := yaml.Marshal(config)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	if diff := cmp.Diff(architectureExample, string(out)); diff != "" {
		t.Errorf("re-encoded example differs (-want +got):\n%s", diff)
	}
	// What the checkpoint writes, the checkpoint reads.
	back, err := DecodeLenient(out)
	if err != nil {
		t.Fatalf("lenient decode of the re-encoded example: %v", err)
	}
	if diff := cmp.Diff(config, back); diff != "" {
		t.Errorf("lenient round trip (-want +got):\n%s", diff)
	}
}

func TestDecodeReturnsFreshObjects(t *testing.T) {
	a, err := DecodeStrict([]byte(architectureExample))
	if err != nil {
		t.Fatal(err)
	}
	b, err := DecodeStrict([]byte(architectureExample))
	if err != nil {
		t.Fatal(err)
	}
	*a.Sharing.ComputeLimit = 99
	if *b.Sharing.ComputeLimit != 50 {
		t.Errorf("decoded configs share memory")
	}
}

// A quantity built in Go skips the decoders' exponent guard; Validate must still
// reject it without a comparison whose cost grows with the exponent.
func TestValidateHugeQuantityFromGo(t *testing.T) {
	c := &GpuConfig{Sharing: &SharingConfig{MemoryLimit: ptr.To(resource.MustParse("1e999999999"))}}
	want := `sharing.memoryLimit: Invalid value: "1e999999999": must be less than 8Ei`
	if err := c.Validate().ToAggregate(); err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
}

// A key the user wrote reaches the message Go-quoted when it holds control
// characters or quotes, so that it cannot forge lines in events and logs.
func TestUnknownKeyQuoted(t *testing.T) {
	for raw, want := range map[string]string{
		`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","bad\nkey: forged":1}`:   `"bad\nkey: forged": unknown field`,
		`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","q\"uote":1}`:            `"q\"uote": unknown field`,
		`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharding":{}}`:          `sharding: unknown field`,
		`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"\u0007":1}}`: `"sharing.\a": unknown field`,
	} {
		_, err := DecodeStrict([]byte(raw))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeStrict(%s): %v, want %s", raw, err, want)
		}
		if err != nil && strings.ContainsAny(err.Error(), "\n\a") {
			t.Errorf("DecodeStrict(%s): raw control character in %q", raw, err)
		}
	}
}
