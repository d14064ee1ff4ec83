package v1alpha1

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

func opaque(source resourceapi.AllocationConfigSource, driver, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source:   source,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver:     driver,
				Parameters: runtime.RawExtension{Raw: []byte(params)},
			},
		},
	}
}

func fromClass(params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return opaque(resourceapi.AllocationConfigSourceClass, GroupName, params, requests...)
}

func fromClaim(params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return opaque(resourceapi.AllocationConfigSourceClaim, GroupName, params, requests...)
}

// cfg builds the JSON of a GpuConfig from the fields after apiVersion and kind.
func cfg(fields string) string {
	if fields == "" {
		return `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig"}`
	}
	return `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig",` + fields + `}`
}

func merged(isolation Isolation, computeLimit *int32, memoryLimit string, nvlink NVLinkPolicy) *GpuConfig {
	c := &GpuConfig{
		TypeMeta: metav1.TypeMeta{APIVersion: "gpu.tessera.dev/v1alpha1", Kind: "GpuConfig"},
		Sharing:  &SharingConfig{Isolation: isolation, ComputeLimit: computeLimit},
		Topology: &TopologyConfig{NVLink: nvlink},
	}
	if memoryLimit != "" {
		c.Sharing.MemoryLimit = ptr.To(resource.MustParse(memoryLimit))
	}
	return c
}

func TestConfigForRequest(t *testing.T) {
	tests := []struct {
		name    string
		configs []resourceapi.DeviceAllocationConfiguration
		request string
		want    *GpuConfig
		wantErr string
	}{
		{
			name:    "no configs: defaults",
			request: "gpus",
			want:    merged(IsolationAdvisory, nil, "", NVLinkIgnore),
		},
		{
			name: "class config applies",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"sharing":{"isolation":"MPS"}`), "gpus"),
			},
			request: "gpus",
			want:    merged(IsolationMPS, nil, "", NVLinkIgnore),
		},
		{
			name: "claim wins over class, even when the claim entry comes first in the list",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(cfg(`"sharing":{"isolation":"HAMiCore"}`)),
				fromClass(cfg(`"sharing":{"isolation":"MPS"}`), "gpus"),
			},
			request: "gpus",
			want:    merged(IsolationHAMiCore, nil, "", NVLinkIgnore),
		},
		{
			name: "later claim entry wins",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(cfg(`"sharing":{"isolation":"MPS"}`)),
				fromClaim(cfg(`"sharing":{"isolation":"HAMiCore"}`)),
			},
			request: "gpus",
			want:    merged(IsolationHAMiCore, nil, "", NVLinkIgnore),
		},
		{
			name: "later class entry wins among classes",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"topology":{"nvlink":"Required"}`), "gpus"),
				fromClass(cfg(`"topology":{"nvlink":"Preferred"}`), "gpus"),
			},
			request: "gpus",
			want:    merged(IsolationAdvisory, nil, "", NVLinkPreferred),
		},
		{
			name: "field by field: a later entry that sets only computeLimit keeps isolation",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"sharing":{"isolation":"MPS","memoryLimit":"8Gi"},"topology":{"nvlink":"Required"}`), "gpus"),
				fromClaim(cfg(`"sharing":{"computeLimit":40}`)),
				fromClaim(cfg(`"sharing":{"memoryLimit":"4Gi"}`), "gpus"),
			},
			request: "gpus",
			want:    merged(IsolationMPS, ptr.To[int32](40), "4Gi", NVLinkRequired),
		},
		{
			name: "locality field by field: the claim sets affinity, the class's exclusion stays",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"locality":{"exclusion":"team-a","affinity":"x"}`), "gpus"),
				fromClaim(cfg(`"locality":{"affinity":"pipeline-1"}`)),
			},
			request: "gpus",
			want: func() *GpuConfig {
				c := merged(IsolationAdvisory, nil, "", NVLinkIgnore)
				c.Locality = &LocalityConfig{Affinity: "pipeline-1", Exclusion: "team-a"}
				return c
			}(),
		},
		{
			name: "an empty later entry changes nothing",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(cfg(`"sharing":{"isolation":"MPS","computeLimit":30}`)),
				fromClaim(cfg(`"sharing":{}`)),
				fromClaim(cfg(``)),
			},
			request: "gpus",
			want:    merged(IsolationMPS, ptr.To[int32](30), "", NVLinkIgnore),
		},
		{
			name: "entries for other requests do not apply",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(cfg(`"sharing":{"isolation":"MPS"}`), "notebook"),
				fromClaim(cfg(`"sharing":{"computeLimit":20}`), "trainer", "gpus"),
				fromClaim(cfg(`"topology":{"nvlink":"Required"}`), "gpu"),
			},
			request: "gpus",
			want:    merged(IsolationAdvisory, ptr.To[int32](20), "", NVLinkIgnore),
		},
		{
			name: "subrequest result: entries for the parent and for the subrequest apply",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"sharing":{"isolation":"MPS"}`), "gpus/nvlink"),
				fromClaim(cfg(`"topology":{"nvlink":"Preferred"}`), "gpus"),
				fromClaim(cfg(`"topology":{"nvlink":"Required"}`), "gpus/nvlink"),
				fromClaim(cfg(`"sharing":{"isolation":"HAMiCore"}`), "gpus/any"),
			},
			request: "gpus/nvlink",
			want:    merged(IsolationMPS, nil, "", NVLinkRequired),
		},
		{
			name: "other subrequest of the same parent",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(cfg(`"topology":{"nvlink":"Preferred"}`), "gpus"),
				fromClaim(cfg(`"topology":{"nvlink":"Required"}`), "gpus/nvlink"),
			},
			request: "gpus/any",
			want:    merged(IsolationAdvisory, nil, "", NVLinkPreferred),
		},
		{
			name: "an entry naming a subrequest does not apply to the plain request",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(cfg(`"topology":{"nvlink":"Required"}`), "gpus/nvlink"),
			},
			request: "gpus",
			want:    merged(IsolationAdvisory, nil, "", NVLinkIgnore),
		},
		{
			name: "configs of other drivers are ignored, even when they are not GpuConfigs",
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaque(resourceapi.AllocationConfigSourceClaim, "gpu.nvidia.com", `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}`),
				opaque(resourceapi.AllocationConfigSourceClass, "net.example.com", `not even JSON`, "gpus"),
				fromClaim(cfg(`"sharing":{"isolation":"MPS"}`)),
			},
			request: "gpus",
			want:    merged(IsolationMPS, nil, "", NVLinkIgnore),
		},
		{
			name: "non-opaque configs are ignored",
			configs: []resourceapi.DeviceAllocationConfiguration{
				{Source: resourceapi.AllocationConfigSourceClaim},
				fromClaim(cfg(`"sharing":{"computeLimit":70}`)),
			},
			request: "gpus",
			want:    merged(IsolationAdvisory, ptr.To[int32](70), "", NVLinkIgnore),
		},
		{
			name: "a bad entry for another request is not read",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(cfg(`"sharing":{"isolaton":"MPS"}`), "other"),
			},
			request: "gpus",
			want:    merged(IsolationAdvisory, nil, "", NVLinkIgnore),
		},
		{
			name: "parameters given as an object by Go callers",
			configs: []resourceapi.DeviceAllocationConfiguration{{
				Source: resourceapi.AllocationConfigSourceClaim,
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver: GroupName,
					Parameters: runtime.RawExtension{Object: &GpuConfig{
						TypeMeta: metav1.TypeMeta{APIVersion: "gpu.tessera.dev/v1alpha1", Kind: "GpuConfig"},
						Sharing:  &SharingConfig{Isolation: IsolationHAMiCore},
					}},
				}},
			}},
			request: "gpus",
			want:    merged(IsolationHAMiCore, nil, "", NVLinkIgnore),
		},
		{
			name: "bad class entry is named",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"sharing":{"isolaton":"MPS"}`), "gpus", "gpus/nvlink"),
			},
			request: "gpus",
			wantErr: `config 0 (FromClass, requests "gpus", "gpus/nvlink"): invalid GpuConfig: sharing.isolaton: unknown field`,
		},
		{
			name: "bad claim entry is named by its index in the allocation",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"sharing":{"isolation":"MPS"}`), "gpus"),
				opaque(resourceapi.AllocationConfigSourceClaim, "gpu.nvidia.com", `{}`),
				fromClaim(`{"apiVersion":"gpu.tessera.dev/v1","kind":"GpuConfig"}`),
			},
			request: "gpus",
			wantErr: `config 2 (FromClaim, all requests): invalid GpuConfig: apiVersion "gpu.tessera.dev/v1" is not supported (supported: gpu.tessera.dev/v1alpha1)`,
		},
		{
			name: "invalid value in an entry is named, even if a later entry overrides it",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(cfg(`"sharing":{"computeLimit":0,"isolation":"mps"}`), "gpus"),
				fromClaim(cfg(`"sharing":{"computeLimit":50,"isolation":"MPS"}`), "gpus"),
			},
			request: "gpus",
			wantErr: `config 0 (FromClaim, requests "gpus"): invalid GpuConfig: ` +
				`sharing.isolation: Unsupported value: "mps": supported values: "Advisory", "MPS", "HAMiCore", "DriverMemory"; ` +
				`sharing.computeLimit: Invalid value: 0: must be between 1 and 100`,
		},
		{
			name: "empty parameters",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(``),
			},
			request: "gpus",
			wantErr: `config 0 (FromClaim, all requests): invalid GpuConfig: the input is empty; expected an object with apiVersion gpu.tessera.dev/v1alpha1 and kind GpuConfig`,
		},
		{
			name: "the class's allowedIsolations is kept; the claim's isolation is not checked against it here",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"sharing":{"isolation":"MPS","allowedIsolations":["MPS","HAMiCore"]}`), "gpus"),
				fromClaim(cfg(`"sharing":{"isolation":"Advisory"}`), "gpus"),
			},
			request: "gpus",
			want: func() *GpuConfig {
				c := merged(IsolationAdvisory, nil, "", NVLinkIgnore)
				c.Sharing.AllowedIsolations = []Isolation{IsolationMPS, IsolationHAMiCore}
				return c
			}(),
		},
		{
			name: "several class entries with allowedIsolations: what all of them allow",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"sharing":{"allowedIsolations":["HAMiCore","MPS"]}`), "gpus"),
				fromClass(cfg(`"sharing":{"computeLimit":50}`), "gpus"),
				fromClass(cfg(`"sharing":{"allowedIsolations":["MPS","Advisory"]}`), "gpus"),
			},
			request: "gpus",
			want: func() *GpuConfig {
				c := merged(IsolationAdvisory, ptr.To[int32](50), "", NVLinkIgnore)
				c.Sharing.AllowedIsolations = []Isolation{IsolationMPS}
				return c
			}(),
		},
		{
			name: "class entries with nothing in common",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"sharing":{"allowedIsolations":["MPS"]}`), "gpus"),
				fromClass(cfg(`"sharing":{"allowedIsolations":["HAMiCore"]}`), "gpus"),
			},
			request: "gpus",
			wantErr: `config 1 (FromClass, requests "gpus"): sharing.allowedIsolations (HAMiCore) has no isolation in common ` +
				`with the MPS that earlier class configs allow, so no share of the class could be prepared`,
		},
		{
			name: "a claim entry may not set allowedIsolations",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(cfg(`"sharing":{"isolation":"MPS","allowedIsolations":["MPS"]}`), "gpus"),
				fromClaim(cfg(`"sharing":{"isolation":"Advisory","allowedIsolations":["Advisory"]}`), "gpus"),
			},
			request: "gpus",
			wantErr: `config 1 (FromClaim, requests "gpus"): invalid GpuConfig: sharing.allowedIsolations: Forbidden: ` +
				`only a DeviceClass config may set it; a claim chooses sharing.isolation among the isolations its class allows`,
		},
		{
			name: "unknown source",
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaque("FromNamespace", GroupName, cfg(``)),
			},
			request: "gpus",
			wantErr: `config 0 (FromNamespace, all requests): unknown source "FromNamespace"; expected FromClass or FromClaim`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := make([]resourceapi.DeviceAllocationConfiguration, len(tc.configs))
			for i := range tc.configs {
				tc.configs[i].DeepCopyInto(&before[i])
			}
			got, err := ConfigForRequest(tc.configs, tc.request)
			if checkError(t, err, tc.wantErr, got) {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("merged config (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tc.configs, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("ConfigForRequest modified its input (-before +after):\n%s", diff)
			}
		})
	}
}

// The merged config must not alias the entries it came from, so a caller may
// change it (or the checkpoint may keep it) without touching another request.
func TestConfigForRequestResultsAreIndependent(t *testing.T) {
	configs := []resourceapi.DeviceAllocationConfiguration{
		fromClaim(cfg(`"sharing":{"computeLimit":40,"memoryLimit":"4Gi"}`)),
	}
	a, err := ConfigForRequest(configs, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := ConfigForRequest(configs, "b")
	if err != nil {
		t.Fatal(err)
	}
	*a.Sharing.ComputeLimit = 90
	a.Sharing.MemoryLimit.Set(1)
	if *b.Sharing.ComputeLimit != 40 || b.Sharing.MemoryLimit.String() != "4Gi" {
		t.Errorf("results share memory: b = %+v", b.Sharing)
	}
}

func TestAppliesTo(t *testing.T) {
	for _, tc := range []struct {
		requests []string
		request  string
		want     bool
	}{
		{nil, "gpus", true},
		{nil, "gpus/nvlink", true},
		{[]string{"gpus"}, "gpus", true},
		{[]string{"gpus"}, "gpus/nvlink", true},
		{[]string{"gpus/nvlink"}, "gpus/nvlink", true},
		{[]string{"gpus/nvlink"}, "gpus/any", false},
		{[]string{"gpus/nvlink"}, "gpus", false},
		{[]string{"other"}, "gpus", false},
		{[]string{"gpu"}, "gpus/nvlink", false},
	} {
		if got := AppliesTo(tc.requests, tc.request); got != tc.want {
			t.Errorf("AppliesTo(%q, %q) = %v, want %v", tc.requests, tc.request, got, tc.want)
		}
	}
}

func TestValidateForClaim(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config *GpuConfig
		want   string
	}{
		{name: "nil"},
		{name: "no sharing", config: &GpuConfig{}},
		{name: "isolation only", config: &GpuConfig{Sharing: &SharingConfig{Isolation: IsolationAdvisory}}},
		{
			name:   "allowedIsolations",
			config: &GpuConfig{Sharing: &SharingConfig{AllowedIsolations: []Isolation{IsolationMPS}}},
			want: `sharing.allowedIsolations: Forbidden: only a DeviceClass config may set it; ` +
				`a claim chooses sharing.isolation among the isolations its class allows`,
		},
		{
			name:   "even empty",
			config: &GpuConfig{Sharing: &SharingConfig{AllowedIsolations: []Isolation{}}},
			want: `sharing.allowedIsolations: Forbidden: only a DeviceClass config may set it; ` +
				`a claim chooses sharing.isolation among the isolations its class allows`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := joinErrors(tc.config.ValidateForClaim())
			if got != tc.want {
				t.Errorf("ValidateForClaim:\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

func TestSharingConfigAllows(t *testing.T) {
	var unset *SharingConfig
	for _, isolation := range SupportedIsolations {
		if !unset.Allows(isolation) || !(&SharingConfig{}).Allows(isolation) {
			t.Errorf("no allowedIsolations must allow %s", isolation)
		}
	}
	floor := &SharingConfig{AllowedIsolations: []Isolation{IsolationMPS, IsolationHAMiCore}}
	if floor.Allows(IsolationAdvisory) || !floor.Allows(IsolationMPS) || !floor.Allows(IsolationHAMiCore) {
		t.Errorf("[MPS, HAMiCore] allows Advisory %v, MPS %v, HAMiCore %v", floor.Allows(IsolationAdvisory),
			floor.Allows(IsolationMPS), floor.Allows(IsolationHAMiCore))
	}
	if got := FormatIsolations(floor.AllowedIsolations); got != "MPS, HAMiCore" {
		t.Errorf("FormatIsolations = %q", got)
	}
}
