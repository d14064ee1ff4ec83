package webhook

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
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
	tests := []struct {
		name         string
		file         string
		replacements []string
		// wantDenied lists the exact problems, in order; nil means allowed.
		wantDenied []string
		wantCode   int32
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
			name:         "v1 template with firstAvailable, config for the parent request: valid",
			file:         "template-v1-typo.json",
			replacements: []string{`{"isolaton": "MPS"}`, `{"isolation": "MPS"}`},
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
				`spec.devices.config[0].opaque.parameters.sharing.isolation: Unsupported value: "mps": supported values: "Advisory", "MPS", "HAMiCore"`,
				"spec.devices.config[0].opaque.parameters.sharing.computeLimit: Invalid value: 0: must be between 1 and 100",
			},
		},
		{
			name: "v1beta2 template: env, mounts and paths do not exist in GpuConfig",
			file: "template-v1beta2-inject.json",
			wantDenied: []string{
				"spec.spec.devices.config[0].opaque.parameters: invalid GpuConfig: env: unknown field; mounts: unknown field; sharing.libraryPath: unknown field",
			},
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
			resp := Review(req)
			if resp.UID != req.UID {
				t.Errorf("UID = %q, want the request's %q", resp.UID, req.UID)
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

func TestRequestNames(t *testing.T) {
	req := loadReview(t, "template-v1-typo.json")
	devices, err := claimDevices(req.Object, true)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(requestNames(devices), ",")
	if want := "gpu/nvlink,gpu/any"; got != want {
		t.Errorf("request names = %s, want %s", got, want)
	}
}
