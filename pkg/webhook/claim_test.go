package webhook

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// TestValidateDeviceClaim is the table of what admission (and `tessera
// claim-template`) refuses because prepare would: each row is spec.devices of a
// ResourceClaim as users write it (YAML), and the exact problems, each with its
// field path, or the warnings of a claim that is allowed.
func TestValidateDeviceClaim(t *testing.T) {
	const (
		// share is a request for a quarter of a GPU.
		share = `
- name: gpus
  exactly:
    deviceClassName: shared.gpu.tessera.dev
    capacity: {requests: {memory: 16Gi, cores: "25"}}`
		// more is a second request, for an eighth of a GPU.
		more = `
- name: more
  exactly: {deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 8Gi}}}`
		// nvlinkOrAny is a request for two GPUs of one NVLink domain or,
		// failing that, any two, up to the config list.
		nvlinkOrAny = `
requests:
- name: gpu
  firstAvailable:
  - {name: nvlink, deviceClassName: gpu.tessera.dev, count: 2}
  - {name: any, deviceClassName: gpu.tessera.dev, count: 2}
constraints:
- {requests: [gpu/nvlink], matchAttribute: gpu.tessera.dev/nvlinkDomain}
config:`
		// oneAndOne is two requests for a whole GPU each, up to the
		// constraints list.
		oneAndOne = `
requests:
- name: a
  exactly: {deviceClassName: gpu.tessera.dev}
- name: b
  exactly: {deviceClassName: gpu.tessera.dev}
constraints:`
		// overMiB is a request for a share of a byte more than 1Mi of
		// memory, up to the config list.
		overMiB = `
requests:
- name: gpus
  exactly:
    deviceClassName: shared.gpu.tessera.dev
    capacity: {requests: {memory: "1048577"}}
config:`
		// pair is a request for two whole GPUs.
		pair = `
- name: gpus
  exactly: {deviceClassName: gpu.tessera.dev, allocationMode: ExactCount, count: 2}`
		cfg     = `{apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, `
		params0 = "spec.devices.config[0].opaque.parameters"
	)
	mps := "an MPS claim must be exactly one share (a client talks to one MPS daemon, which serves one GPU), so prepare would refuse the claim"
	nvlinkRefused := ": the scheduler may pick GPUs of different NVLink domains, and prepare then refuses the claim"
	// secondDevice is the error for request more, which joins request gpus
	// of the given isolation backend.
	secondDevice := func(more, isolation string) string {
		return `spec.devices.requests[1]: request "` + more + `" adds a second gpu.tessera.dev device to a claim whose request "gpus" has isolation ` +
			isolation + ` (` + params0 + `.sharing.isolation); an ` + isolation + ` claim must be exactly one share, so prepare would refuse the claim ` +
			`(two shares are one GPU only when a matchAttribute gpu.tessera.dev/uuid constraint covers both requests)`
	}
	// nvlinkUncovered is the error for NVLink Required on a request (at
	// path) that may get 2 GPUs no constraint keeps in one NVLink domain.
	nvlinkUncovered := func(request, path string) string {
		return params0 + `.topology.nvlink: Invalid value: "Required": request "` + request + `" (` + path + `) may get 2 GPUs, ` +
			`and no matchAttribute gpu.tessera.dev/nvlinkDomain constraint in spec.devices.constraints covers it` + nvlinkRefused
	}
	// mpsConfig is the config asking isolation MPS for every request.
	mpsConfig := `
config:
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {isolation: MPS}}}`
	// configFor is a config entry for the given requests with the given
	// GpuConfig fields.
	configFor := func(requests, fields string) string {
		return `
- requests: [` + requests + `]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + fields + `}}`
	}
	// nvlinkRequired is the config asking NVLink Required.
	nvlinkRequired := `
config:
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `topology: {nvlink: Required}}}`
	tests := []struct {
		name         string
		devices      string
		wantErrors   []string
		wantWarnings []string
	}{
		{
			name: "share with limits within its request",
			devices: `
requests:` + share + `
config:
- requests: [gpus]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {isolation: MPS, computeLimit: 25, memoryLimit: 16Gi}}}
- opaque: {driver: other.example.com, parameters: {sharing: {computeLimit: 1}}}`,
		},
		{
			name: "computeLimit below the request's cores",
			devices: `
requests:` + share + `
config:
- requests: [gpus]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {computeLimit: 20}}}`,
			wantErrors: []string{
				params0 + `.sharing.computeLimit: Invalid value: 20: is below the 25 cores request "gpus" is allocated ` +
					`(spec.devices.requests[0].exactly.capacity.requests[cores]: 25); the limit must be at least the guarantee, so prepare would refuse the claim`,
			},
		},
		{
			name: "fractional cores are allocated rounded up, as the scheduler does",
			devices: `
requests:
- name: gpus
  exactly:
    deviceClassName: shared.gpu.tessera.dev
    capacity: {requests: {memory: 1Gi, cores: 24500m}}
config:
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {computeLimit: 24}}}`,
			wantErrors: []string{
				params0 + `.sharing.computeLimit: Invalid value: 24: is below the 25 cores request "gpus" is allocated ` +
					`(spec.devices.requests[0].exactly.capacity.requests[cores]: 24500m); the limit must be at least the guarantee, so prepare would refuse the claim`,
			},
		},
		{
			name: "a later config entry wins field by field: the computeLimit prepare uses is the last one",
			devices: `
requests:` + share + `
config:
- requests: [gpus]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {computeLimit: 50}}}
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {computeLimit: 10, isolation: HAMiCore}}}`,
			wantErrors: []string{
				`spec.devices.config[1].opaque.parameters.sharing.computeLimit: Invalid value: 10: is below the 25 cores request "gpus" is allocated ` +
					`(spec.devices.requests[0].exactly.capacity.requests[cores]: 25); the limit must be at least the guarantee, so prepare would refuse the claim`,
			},
		},
		{
			name: "an earlier entry's low computeLimit is overridden by a later one",
			devices: `
requests:` + share + `
config:
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {computeLimit: 10}}}
- requests: [gpus]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {computeLimit: 50}}}`,
		},
		{
			name: "memoryLimit above the request's memory",
			devices: `
requests:` + share + `
config:
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {memoryLimit: 32Gi}}}`,
			wantErrors: []string{
				params0 + `.sharing.memoryLimit: Invalid value: "32Gi": is above the 16Gi of memory request "gpus" is allocated ` +
					`(spec.devices.requests[0].exactly.capacity.requests[memory]: 16Gi); memory cannot be overcommitted, so prepare would refuse the claim`,
			},
		},
		{
			name: "memory is allocated in whole MiB: a limit up to the rounded-up request is allowed",
			devices: overMiB + `
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {memoryLimit: 2Mi}}}`,
		},
		{
			name: "memory is allocated in whole MiB: a limit above the rounded-up request is refused",
			devices: overMiB + `
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {memoryLimit: "2097153"}}}`,
			wantErrors: []string{
				params0 + `.sharing.memoryLimit: Invalid value: "2097153": is above the 2Mi of memory request "gpus" is allocated ` +
					`(spec.devices.requests[0].exactly.capacity.requests[memory]: 1048577); memory cannot be overcommitted, so prepare would refuse the claim`,
			},
		},
		{
			name: "limits of whole GPUs are ignored, as at prepare",
			devices: `
requests:
- name: gpus
  exactly: {deviceClassName: gpu.tessera.dev}
config:
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {computeLimit: 1, memoryLimit: 1Mi, isolation: MPS}}}`,
		},
		{
			name: "an adminAccess share gets no limits and no backend at prepare: not checked, no warning",
			devices: `
requests:
- name: monitor
  exactly: {deviceClassName: shared.gpu.tessera.dev, adminAccess: true, count: 2, capacity: {requests: {cores: "50"}}}
config:
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {isolation: MPS, computeLimit: 10}}}`,
		},
		{
			name: "a config for another request does not apply",
			devices: `
requests:` + share + `
- name: big
  exactly: {deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 64Gi, cores: "80"}}}
config:
- requests: [big]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {computeLimit: 80, memoryLimit: 64Gi}}}`,
		},
		{
			name: "firstAvailable: each subrequest against its own capacity, config naming a subrequest",
			devices: `
requests:
- name: gpu
  firstAvailable:
  - {name: big, deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 40Gi, cores: "50"}}}
  - {name: small, deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 20Gi, cores: "25"}}}
config:
- requests: [gpu/small]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {memoryLimit: 30Gi}}}
- requests: [gpu]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {computeLimit: 40}}}`,
			wantErrors: []string{
				`spec.devices.config[1].opaque.parameters.sharing.computeLimit: Invalid value: 40: is below the 50 cores request "gpu/big" is allocated ` +
					`(spec.devices.requests[0].firstAvailable[0].capacity.requests[cores]: 50); the limit must be at least the guarantee, so prepare would refuse the claim`,
				params0 + `.sharing.memoryLimit: Invalid value: "30Gi": is above the 20Gi of memory request "gpu/small" is allocated ` +
					`(spec.devices.requests[0].firstAvailable[1].capacity.requests[memory]: 20Gi); memory cannot be overcommitted, so prepare would refuse the claim`,
			},
		},
		{
			name: "MPS on a request for two shares",
			devices: `
requests:
- name: gpus
  exactly: {deviceClassName: shared.gpu.tessera.dev, count: 2, capacity: {requests: {memory: 16Gi}}}` + mpsConfig,
			wantErrors: []string{
				`spec.devices.requests[0].exactly.count: Invalid value: 2: request "gpus" has isolation MPS (` + params0 + `.sharing.isolation) and may get 2 GPUs; ` + mps,
			},
		},
		{
			name: "MPS on a request for all matching shares",
			devices: `
requests:
- name: gpus
  exactly: {deviceClassName: shared.gpu.tessera.dev, allocationMode: All, capacity: {requests: {memory: 16Gi}}}
config:
- requests: [gpus]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {isolation: MPS}}}`,
			wantErrors: []string{
				`spec.devices.requests[0].exactly.allocationMode: Invalid value: "All": request "gpus" has isolation MPS (` + params0 +
					`.sharing.isolation) and may get all matching GPUs (allocationMode All); ` + mps,
			},
		},
		{
			name: "MPS on one firstAvailable alternative for two shares",
			devices: `
requests:
- name: gpu
  firstAvailable:
  - {name: one, deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 16Gi}}}
  - {name: two, deviceClassName: shared.gpu.tessera.dev, count: 2, capacity: {requests: {memory: 8Gi}}}
config:
- requests: [gpu]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {isolation: MPS}}}`,
			wantErrors: []string{
				`spec.devices.requests[0].firstAvailable[1].count: Invalid value: 2: request "gpu/two" has isolation MPS (` + params0 + `.sharing.isolation) and may get 2 GPUs; ` + mps,
			},
		},
		{
			name: "MPS on two requests, each with MPS config: two shares that may sit on two GPUs",
			devices: `
requests:` + share + more + `
config:` + configFor("gpus", "sharing: {isolation: MPS}") + configFor("more", "sharing: {isolation: MPS}"),
			wantErrors: []string{secondDevice("more", "MPS")},
		},
		{
			name: "a borrower (lent class) is a share: MPS on a borrower and a second share is refused",
			devices: `
requests:
- name: gpus
  exactly: {deviceClassName: lent.gpu.tessera.dev, capacity: {requests: {memory: 8Gi}}}` + more + mpsConfig,
			wantErrors: []string{secondDevice("more", "MPS")},
		},
		{
			name: "MPS on two requests whose shares a uuid constraint puts on one GPU",
			devices: `
requests:` + share + more + `
constraints:
- {requests: [gpus, more], matchAttribute: gpu.tessera.dev/uuid}` + mpsConfig,
		},
		{
			name: "an MPS share and a whole GPU",
			devices: `
requests:` + share + `
- name: whole
  exactly: {deviceClassName: gpu.tessera.dev}
- name: nic
  exactly: {deviceClassName: nic.example.com}
constraints:
- {matchAttribute: gpu.tessera.dev/uuid}` + mpsConfig,
			wantErrors: []string{secondDevice("whole", "MPS")},
		},
		{
			name: "MPS on two whole GPUs: isolation applies to shares only",
			devices: `
requests:` + pair + mpsConfig,
		},
		{
			name: "two shares with different isolation backends",
			devices: `
requests:` + share + more + `
config:` + configFor("gpus", "sharing: {isolation: HAMiCore}") + configFor("more", "sharing: {isolation: Advisory}"),
			wantErrors: []string{
				secondDevice("more", "HAMiCore"),
				`spec.devices.config[1].opaque.parameters.sharing.isolation: Invalid value: "Advisory": request "more" would use isolation Advisory, ` +
					`but request "gpus" uses HAMiCore (` + params0 + `.sharing.isolation); a claim uses one isolation backend, so prepare would refuse the claim`,
			},
		},
		{
			name: "NVLink Required on two GPUs without a constraint",
			devices: `
requests:` + pair + nvlinkRequired,
			wantErrors: []string{nvlinkUncovered("gpus", "spec.devices.requests[0].exactly")},
		},
		{
			name: "NVLink Required on two GPUs with a constraint on another request",
			devices: `
requests:` + pair + `
constraints:
- {requests: [other], matchAttribute: gpu.tessera.dev/nvlinkDomain}
- {requests: [gpus], matchAttribute: gpu.tessera.dev/uuid}` + nvlinkRequired,
			wantErrors: []string{nvlinkUncovered("gpus", "spec.devices.requests[0].exactly")},
		},
		{
			name: "NVLink Required on two GPUs with a constraint naming the request",
			devices: `
requests:` + pair + `
constraints:
- {requests: [gpus], matchAttribute: gpu.tessera.dev/nvlinkDomain}` + nvlinkRequired,
		},
		{
			name: "NVLink Required with a constraint for all requests",
			devices: `
requests:` + pair + `
constraints:
- {matchAttribute: gpu.tessera.dev/nvlinkDomain}` + nvlinkRequired,
		},
		{
			name: "NVLink Preferred on two GPUs without a constraint: prepare records a condition",
			devices: `
requests:` + pair + `
config:
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `topology: {nvlink: Preferred}}}`,
		},
		{
			name: "NVLink Required on one GPU",
			devices: `
requests:
- name: gpus
  exactly: {deviceClassName: gpu.tessera.dev}` + nvlinkRequired,
		},
		{
			name:       "NVLink Required on a firstAvailable fallback the constraint does not cover",
			devices:    nvlinkOrAny + configFor("gpu", "topology: {nvlink: Required}"),
			wantErrors: []string{nvlinkUncovered("gpu/any", "spec.devices.requests[0].firstAvailable[1]")},
		},
		{
			name:    "NVLink Required only on the constrained firstAvailable alternative",
			devices: nvlinkOrAny + configFor("gpu/nvlink", "topology: {nvlink: Required}"),
		},
		{
			name: "NVLink Required on two requests of one GPU each, not tied together",
			devices: oneAndOne + `
- {requests: [a], matchAttribute: gpu.tessera.dev/nvlinkDomain}` + nvlinkRequired,
			wantErrors: []string{
				params0 + `.topology.nvlink: Invalid value: "Required": requests "a" and "b" may get different GPUs, ` +
					`and no matchAttribute gpu.tessera.dev/nvlinkDomain constraint in spec.devices.constraints covers both` + nvlinkRefused,
			},
		},
		{
			name: "NVLink Required on two requests tied by a constraint",
			devices: oneAndOne + `
- {requests: [a, b], matchAttribute: gpu.tessera.dev/nvlinkDomain}
config:` + configFor("a", "topology: {nvlink: Required}"),
		},
		{
			name: "a share that names no memory is allowed, with a warning",
			devices: `
requests:
- name: gpus
  exactly: {deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {cores: "30"}}}
- name: whole
  exactly: {deviceClassName: gpu.tessera.dev}
- name: fallback
  firstAvailable:
  - {name: small, deviceClassName: shared.gpu.tessera.dev}
config:
- requests: [gpus]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {memoryLimit: 1Ti, computeLimit: 30}}}`,
			wantWarnings: []string{
				noMemory("spec.devices.requests[0].exactly", "gpus"),
				noMemory("spec.devices.requests[2].firstAvailable[0]", "fallback/small"),
			},
		},
		{
			name: "a config that fails validation is reported alone, with the warnings",
			devices: `
requests:
- name: gpus
  exactly: {deviceClassName: shared.gpu.tessera.dev, count: 2}
config:
- opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + `sharing: {isolation: MPS, computeLimit: 0}}}`,
			wantErrors: []string{
				params0 + ".sharing.computeLimit: Invalid value: 0: must be between 1 and 100",
			},
			wantWarnings: []string{
				noMemory("spec.devices.requests[0].exactly", "gpus"),
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs, warnings := ValidateDeviceClaim(decodeDevices(t, tc.devices), field.NewPath("spec", "devices"))
			checkErrors(t, errs, tc.wantErrors)
			checkWarnings(t, warnings, tc.wantWarnings)
		})
	}
}

// noMemory is the warning for a share request (at path) that names no memory.
func noMemory(path, request string) string {
	return path + `.capacity.requests[memory]: not set, so request "` + request + `" of class shared.gpu.tessera.dev ` +
		`is allocated all of a GPU's memory and no other share fits on that GPU`
}

// decodeDevices reads spec.devices of a ResourceClaim, as users write it
// (YAML), strictly.
func decodeDevices(t *testing.T, devices string) *resourceapi.DeviceClaim {
	t.Helper()
	var claim resourceapi.DeviceClaim
	if err := yaml.UnmarshalStrict([]byte(devices), &claim); err != nil {
		t.Fatalf("test devices: %v\n%s", err, devices)
	}
	return &claim
}

// checkErrors compares the errors of a validation, as describe writes them,
// with the wanted ones.
func checkErrors(t *testing.T, errs field.ErrorList, want []string) {
	t.Helper()
	var got []string
	for _, e := range errs {
		got = append(got, describe(e))
	}
	if g, w := strings.Join(got, "\n"), strings.Join(want, "\n"); g != w {
		t.Errorf("errors:\n got %s\nwant %s", g, w)
	}
}

// checkWarnings compares the warnings of a validation with the wanted ones,
// and checks that none is longer than the 256 characters the API server keeps.
func checkWarnings(t *testing.T, warnings, want []string) {
	t.Helper()
	if g, w := strings.Join(warnings, "\n"), strings.Join(want, "\n"); g != w {
		t.Errorf("warnings:\n got %s\nwant %s", g, w)
	}
	for _, w := range warnings {
		if len(w) > 256 {
			t.Errorf("warning of %d characters, more than 256 (the API server truncates): %s", len(w), w)
		}
	}
}
