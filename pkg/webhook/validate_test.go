package webhook

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// loadReview reads an AdmissionReview as the API server sends it from testdata/,
// optionally rewriting its text first (to derive variants of one real review).
func loadReview(t *testing.T, name string, replacements ...string) *admissionv1.AdmissionRequest {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.NewReplacer(replacements...).Replace(string(data))
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal([]byte(text), &review); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if review.Request == nil {
		t.Fatalf("%s: no request", name)
	}
	return review.Request
}

func TestReview(t *testing.T) {
	// The request of claim-v1beta1-invalid.json names no memory.
	v1beta1Warning := noMemory("spec.devices.requests[0]", "gpu")
	tests := []struct {
		name         string
		file         string
		replacements []string
		// wantDenied lists the exact problems, in order; nil means allowed.
		wantDenied []string
		wantCode   int32
		// wantWarnings lists the exact warnings, in order.
		wantWarnings []string
	}{
		{
			name: "v1 claim, valid config; another driver's config is not read",
			file: "claim-v1-valid.json",
		},
		{
			name:         "v1 claim, computeLimit out of range",
			file:         "claim-v1-valid.json",
			replacements: []string{`"computeLimit": 50`, `"computeLimit": 101`},
			wantDenied: []string{
				"spec.devices.config[0].opaque.parameters.sharing.computeLimit: Invalid value: 101: must be between 1 and 100",
			},
		},
		{
			name:         "v1 claim, memoryLimit not a quantity",
			file:         "claim-v1-valid.json",
			replacements: []string{`"16Gi"`, `"lots"`},
			wantDenied: []string{
				"spec.devices.config[0].opaque.parameters: invalid GpuConfig: sharing.memoryLimit: must be a quantity such as 16Gi or 512Mi",
			},
		},
		{
			name:         "v1 claim, wrong kind",
			file:         "claim-v1-valid.json",
			replacements: []string{`"kind": "GpuConfig"`, `"kind": "GPUConfig"`},
			wantDenied: []string{
				`spec.devices.config[0].opaque.parameters: invalid GpuConfig: kind "GPUConfig" is not supported (supported: GpuConfig)`,
			},
		},
		{
			name:         "v1 claim, parameters that are not an object",
			file:         "claim-v1-valid.json",
			replacements: []string{`"other.example.com"`, `"gpu.tessera.dev"`},
			wantDenied: []string{
				"spec.devices.config[1].opaque.parameters: invalid GpuConfig: apiVersion is missing (supported: gpu.tessera.dev/v1alpha1); kind is missing (supported: GpuConfig)",
			},
		},
		{
			name: "v1 template with firstAvailable: unknown field, path under spec.spec",
			file: "template-v1-typo.json",
			wantDenied: []string{
				"spec.spec.devices.config[1].opaque.parameters: invalid GpuConfig: sharing.isolaton: unknown field",
			},
		},
		{
			// The config applies to both subrequests, for two whole GPUs
			// each; nothing keeps them in one NVLink domain.
			name:         "v1 template with firstAvailable, config for the parent request: NVLink Required without a constraint",
			file:         "template-v1-typo.json",
			replacements: []string{`{"isolaton": "MPS"}`, `{"isolation": "MPS"}`},
			wantDenied: []string{
				`spec.spec.devices.config[1].opaque.parameters.topology.nvlink: Invalid value: "Required": request "gpu/nvlink" (spec.spec.devices.requests[0].firstAvailable[0]) ` +
					`may get 2 GPUs, and no matchAttribute gpu.tessera.dev/nvlinkDomain constraint in spec.spec.devices.constraints covers it: ` +
					`the scheduler may pick GPUs of different NVLink domains, and prepare then refuses the claim`,
				`spec.spec.devices.config[1].opaque.parameters.topology.nvlink: Invalid value: "Required": request "gpu/any" (spec.spec.devices.requests[0].firstAvailable[1]) ` +
					`may get 2 GPUs, and no matchAttribute gpu.tessera.dev/nvlinkDomain constraint in spec.spec.devices.constraints covers it: ` +
					`the scheduler may pick GPUs of different NVLink domains, and prepare then refuses the claim`,
			},
		},
		{
			name: "v1 template with firstAvailable, config for the parent request, NVLink constraint: valid",
			file: "template-v1-typo.json",
			replacements: []string{`{"isolaton": "MPS"}`, `{"isolation": "MPS"}`,
				`"config": [`, `"constraints": [{"requests": ["gpu"], "matchAttribute": "gpu.tessera.dev/nvlinkDomain"}], "config": [`},
		},
		{
			name:         "v1 claim, computeLimit below the cores the share asks for",
			file:         "claim-v1-valid.json",
			replacements: []string{`"computeLimit": 50`, `"computeLimit": 20`},
			wantDenied: []string{
				`spec.devices.config[0].opaque.parameters.sharing.computeLimit: Invalid value: 20: is below the 25 cores request "gpus" is allocated ` +
					`(spec.devices.requests[0].exactly.capacity.requests[cores]: 25); the limit must be at least the guarantee, so prepare would refuse the claim`,
			},
		},
		{
			name:         "v1 claim, memoryLimit above the memory the share asks for",
			file:         "claim-v1-valid.json",
			replacements: []string{`"16Gi"`, `"21Gi"`},
			wantDenied: []string{
				`spec.devices.config[0].opaque.parameters.sharing.memoryLimit: Invalid value: "21Gi": is above the 20Gi of memory request "gpus" is allocated ` +
					`(spec.devices.requests[0].exactly.capacity.requests[memory]: 20Gi); memory cannot be overcommitted, so prepare would refuse the claim`,
			},
		},
		{
			name:         "v1 claim, MPS on two shares",
			file:         "claim-v1-valid.json",
			replacements: []string{`"count": 1`, `"count": 2`},
			wantDenied: []string{
				`spec.devices.requests[0].exactly.count: Invalid value: 2: request "gpus" has isolation MPS (spec.devices.config[0].opaque.parameters.sharing.isolation) ` +
					`and may get 2 GPUs; an MPS claim must be exactly one share (a client talks to one MPS daemon, which serves one GPU), so prepare would refuse the claim`,
			},
		},
		{
			name: "v1beta1 claim, MPS on three shares: the path of an exact request has no exactly; a warning for the missing memory",
			file: "claim-v1beta1-invalid.json",
			replacements: []string{`"sharing": {"isolation": "mps", "computeLimit": 0}`, `"sharing": {"isolation": "MPS"}`,
				`"deviceClassName": "shared.gpu.tessera.dev"}`, `"deviceClassName": "shared.gpu.tessera.dev", "count": 3}`},
			wantDenied: []string{
				`spec.devices.requests[0].count: Invalid value: 3: request "gpu" has isolation MPS (spec.devices.config[0].opaque.parameters.sharing.isolation) ` +
					`and may get 3 GPUs; an MPS claim must be exactly one share (a client talks to one MPS daemon, which serves one GPU), so prepare would refuse the claim`,
			},
			wantWarnings: []string{v1beta1Warning},
		},
		{
			name:         "v1 claim, a share without memory: allowed with a warning",
			file:         "claim-v1-valid.json",
			replacements: []string{`"memory": "20Gi", `, ``, `, "memoryLimit": "16Gi"`, ``},
			wantWarnings: []string{noMemory("spec.devices.requests[0].exactly", "gpus")},
		},
		{
			// The spec is immutable; an UPDATE changes metadata (finalizers),
			// which must work even for a claim created before the webhook.
			name:         "v1 template: UPDATE is not reviewed",
			file:         "template-v1-typo.json",
			replacements: []string{`"CREATE"`, `"UPDATE"`},
		},
		{
			name: "v1beta1 claim: every problem, each with its path",
			file: "claim-v1beta1-invalid.json",
			wantDenied: []string{
				`spec.devices.config[0].opaque.parameters.sharing.isolation: Unsupported value: "mps": supported values: "Advisory", "MPS", "HAMiCore", "DriverMemory"`,
				"spec.devices.config[0].opaque.parameters.sharing.computeLimit: Invalid value: 0: must be between 1 and 100",
			},
			wantWarnings: []string{v1beta1Warning},
		},
		{
			name: "v1beta2 template: env, mounts and paths do not exist in GpuConfig",
			file: "template-v1beta2-inject.json",
			wantDenied: []string{
				"spec.spec.devices.config[0].opaque.parameters: invalid GpuConfig: env: unknown field; mounts: unknown field; sharing.libraryPath: unknown field",
			},
			wantWarnings: []string{noMemory("spec.spec.devices.requests[0].exactly", "gpu")},
		},
		{
			name:         "DELETE is not reviewed",
			file:         "claim-v1beta1-invalid.json",
			replacements: []string{`"CREATE"`, `"DELETE"`},
		},
		{
			name:         "other kinds are not reviewed",
			file:         "claim-v1beta1-invalid.json",
			replacements: []string{`"kind": "ResourceClaim"}`, `"kind": "DeviceClass"}`},
		},
		{
			name:         "unknown versions are not reviewed",
			file:         "claim-v1beta1-invalid.json",
			replacements: []string{`"version": "v1beta1", "kind"`, `"version": "v9", "kind"`},
		},
		{
			name:         "an object that is not a claim is a bad request",
			file:         "claim-v1beta1-invalid.json",
			replacements: []string{`"devices": {`, `"devices": "none", "x": {`},
			wantDenied: []string{
				"ResourceClaim team-b/old-client: cannot read the object: json: cannot unmarshal string",
			},
			wantCode: 400,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := loadReview(t, tc.file, tc.replacements...)
			resp := Review(context.Background(), req, nil)
			if resp.UID != req.UID {
				t.Errorf("UID = %q, want the request's %q", resp.UID, req.UID)
			}
			if got, want := strings.Join(resp.Warnings, "\n"), strings.Join(tc.wantWarnings, "\n"); got != want {
				t.Errorf("warnings:\n got %s\nwant %s", got, want)
			}
			if tc.wantDenied == nil {
				if !resp.Allowed {
					t.Fatalf("denied: %s", resp.Result.Message)
				}
				return
			}
			if resp.Allowed {
				t.Fatalf("allowed, want denied with %q", tc.wantDenied)
			}
			if got, want := resp.Result.Message, strings.Join(tc.wantDenied, "; "); got != want && (tc.wantCode == 0 || !strings.HasPrefix(got, want)) {
				t.Errorf("message:\n got %s\nwant %s", got, want)
			}
			wantCode := tc.wantCode
			if wantCode == 0 {
				wantCode = 422
				if resp.Result.Reason != metav1.StatusReasonInvalid {
					t.Errorf("reason = %q, want Invalid", resp.Result.Reason)
				}
				if resp.Result.Details == nil || len(resp.Result.Details.Causes) != len(tc.wantDenied) {
					t.Fatalf("causes = %+v, want one per problem", resp.Result.Details)
				}
				// kubectl prints each cause as "field: message".
				for i, cause := range resp.Result.Details.Causes {
					if got := cause.Field + ": " + cause.Message; got != tc.wantDenied[i] {
						t.Errorf("cause %d as kubectl prints it:\n got %s\nwant %s", i, got, tc.wantDenied[i])
					}
				}
				if d := resp.Result.Details; d.Kind != req.Kind.Kind || d.Name != req.Name || d.Group != "resource.k8s.io" {
					t.Errorf("details name the object %s %s/%s, want %s %s", d.Group, d.Kind, d.Name, req.Kind.Kind, req.Name)
				}
			}
			if resp.Result.Code != wantCode {
				t.Errorf("code = %d, want %d", resp.Result.Code, wantCode)
			}
		})
	}
}

// TestClaimDevices reads a v1beta1 claim, whose exact requests carry their
// fields in the request itself, into the v1 types.
func TestClaimDevices(t *testing.T) {
	req := loadReview(t, "claim-v1beta1-invalid.json",
		`"deviceClassName": "shared.gpu.tessera.dev"}`,
		`"deviceClassName": "shared.gpu.tessera.dev", "allocationMode": "ExactCount", "count": 3, "capacity": {"requests": {"memory": "2Gi"}}}`)
	devices, inline, err := claimDevices(req.Object, false)
	if err != nil {
		t.Fatal(err)
	}
	if !inline {
		t.Error("a v1beta1 request is not read as inline")
	}
	ex := devices.Requests[0].Exactly
	if ex == nil || ex.DeviceClassName != "shared.gpu.tessera.dev" || ex.AllocationMode != "ExactCount" || ex.Count != 3 ||
		ex.Capacity == nil || ex.Capacity.Requests["memory"] != resource.MustParse("2Gi") {
		t.Errorf("request = %+v, want the v1beta1 fields under exactly", devices.Requests[0])
	}

	req = loadReview(t, "template-v1-typo.json")
	devices, inline, err = claimDevices(req.Object, true)
	if err != nil {
		t.Fatal(err)
	}
	if inline {
		t.Error("a v1 request is read as inline")
	}
	var names []string
	for _, r := range devices.Requests {
		for _, sub := range r.FirstAvailable {
			names = append(names, r.Name+"/"+sub.Name+":"+sub.DeviceClassName)
		}
	}
	if got, want := strings.Join(names, ","), "gpu/nvlink:gpu.tessera.dev,gpu/any:gpu.tessera.dev"; got != want {
		t.Errorf("subrequests = %s, want %s", got, want)
	}
}
