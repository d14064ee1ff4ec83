package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// A claim over resource.k8s.io/v1's own list sizes is denied with the field
// and the limit, before any config is decoded; one at the limits is reviewed.
func TestReviewRefusesOverAPILimits(t *testing.T) {
	tests := []struct {
		name                                     string
		requests, subs, configs, constraints, pb int
		want                                     string // "" means allowed
	}{
		{name: "at the limits", requests: 32, subs: 8, configs: 32, constraints: 32, pb: 10 << 10},
		{name: "requests", requests: 33, want: "spec.devices.requests: Too many: 33: must have at most 32 items"},
		{name: "250 requests and configs", requests: 250, configs: 250,
			want: "spec.devices.requests: Too many: 250: must have at most 32 items; spec.devices.config: Too many: 250: must have at most 32 items"},
		// Lists longer than any the API allows are refused before decoding
		// (checkShape), at the first one in the body.
		{name: "1000 requests and configs", requests: 1000, configs: 1000,
			want: "spec.devices.config[0].requests: Too many: must have at most 256 items"},
		{name: "subrequests", requests: 1, subs: 9, want: "spec.devices.requests[0].firstAvailable: Too many: 9: must have at most 8 items"},
		{name: "configs", requests: 1, configs: 33, want: "spec.devices.config: Too many: 33: must have at most 32 items"},
		{name: "constraints", requests: 1, constraints: 33, want: "spec.devices.constraints: Too many: 33: must have at most 32 items"},
		{name: "parameters", requests: 1, configs: 1, pb: 10<<10 + 1,
			want: "spec.devices.config[0].opaque.parameters: Too long: may not be more than 10240 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := Review(context.Background(), worstClaim(tc.requests, tc.subs, tc.configs, tc.constraints, tc.pb), nil)
			if tc.want == "" {
				if !resp.Allowed {
					t.Fatalf("denied: %s", resp.Result.Message)
				}
				return
			}
			if resp.Allowed {
				t.Fatal("allowed")
			}
			if resp.Result.Code != 422 || resp.Result.Message != tc.want {
				t.Errorf("denial = %d %q, want 422 %q", resp.Result.Code, resp.Result.Message, tc.want)
			}
		})
	}
}

// Constraint and config request lists are held to the API's size too.
func TestReviewRefusesLongRequestLists(t *testing.T) {
	req := worstClaim(1, 0, 1, 1, 0)
	var claim map[string]any
	if err := json.Unmarshal(req.Object.Raw, &claim); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 33)
	for i := range names {
		names[i] = fmt.Sprintf("n%d", i)
	}
	devices := claim["spec"].(map[string]any)["devices"].(map[string]any)
	devices["config"].([]any)[0].(map[string]any)["requests"] = names
	devices["constraints"].([]any)[0].(map[string]any)["requests"] = names
	raw, err := json.Marshal(claim)
	if err != nil {
		t.Fatal(err)
	}
	req.Object.Raw = raw
	resp := Review(context.Background(), req, nil)
	want := "spec.devices.constraints[0].requests: Too many: 33: must have at most 32 items; " +
		"spec.devices.config[0].requests: Too many: 33: must have at most 32 items"
	if resp.Allowed || resp.Result.Message != want {
		t.Fatalf("got allowed=%v %v, want %q", resp.Allowed, resp.Result, want)
	}
}

// A DeviceClass with more configs than the API allows, or parameters over
// its limit, is denied without decoding them.
func TestReviewDeviceClassLimits(t *testing.T) {
	config := `{"opaque": {"driver": "gpu.tessera.dev", "parameters": {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig"}}}`
	many := strings.TrimSuffix(strings.Repeat(config+",", 33), ",")
	resp := Review(context.Background(), classReview(admissionv1.Create, "v1", `{"spec": {"config": [`+many+`]}}`), nil)
	if want := "spec.config: Too many: 33: must have at most 32 items"; resp.Allowed || resp.Result.Message != want {
		t.Errorf("33 configs: allowed=%v %v, want %q", resp.Allowed, resp.Result, want)
	}
	long := `{"opaque": {"driver": "gpu.tessera.dev", "parameters": {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig"` +
		strings.Repeat(" ", 10<<10) + `}}}`
	resp = Review(context.Background(), classReview(admissionv1.Update, "v1", `{"spec": {"config": [`+long+`]}}`), nil)
	if want := "spec.config[0].opaque.parameters: Too long: may not be more than 10240 bytes"; resp.Allowed || resp.Result.Message != want {
		t.Errorf("long parameters: allowed=%v %v, want %q", resp.Allowed, resp.Result, want)
	}
}

// Mutation runs before the API server validates a claim, so it holds the
// claim to the API's sizes before expanding a fraction.
func TestMutateRefusesOverAPILimits(t *testing.T) {
	requests := make([]map[string]any, 33)
	for i := range requests {
		requests[i] = map[string]any{"name": fmt.Sprintf("r%d", i), "exactly": map[string]any{"deviceClassName": modelnames.SharedClassName}}
	}
	raw, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"name": "c", "annotations": map[string]string{fraction.Annotation: "1/2"}},
		"spec":     map[string]any{"devices": map[string]any{"requests": requests}},
	})
	if err != nil {
		t.Fatal(err)
	}
	modelsRead := false
	resp := Mutate(&admissionv1.AdmissionRequest{
		UID: "u", Kind: metav1.GroupVersionKind{Group: ResourceGroup, Version: "v1", Kind: "ResourceClaim"},
		Name: "c", Namespace: "ns", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
	}, func() ([]fraction.Model, error) { modelsRead = true; return nil, nil })
	if want := "spec.devices.requests: Too many: 33: must have at most 32 items"; resp.Allowed || resp.Result.Message != want {
		t.Fatalf("allowed=%v %v, want %q", resp.Allowed, resp.Result, want)
	}
	if modelsRead {
		t.Error("the models were read for a claim over the limits")
	}
}

// A review whose context has ended is abandoned with a Timeout status, and
// one whose context ends while it reads a DeviceClass stops there.
func TestReviewHonoursContext(t *testing.T) {
	req := worstClaim(4, 2, 4, 1, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	resp := Review(ctx, req, nil)
	if resp.Allowed || resp.Result.Reason != metav1.StatusReasonTimeout || !strings.Contains(resp.Result.Message, "review abandoned: context canceled") {
		t.Fatalf("cancelled review: allowed=%v %+v, want a Timeout denial", resp.Allowed, resp.Result)
	}
	if resp.UID != req.UID {
		t.Errorf("UID = %q, want %q", resp.UID, req.UID)
	}

	// The class lookup cancels the context, as the API server giving up
	// does; the review must not go on to the next step.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	lookups := 0
	resp = Review(ctx, req, func(string) (*resourceapi.DeviceClass, error) {
		lookups++
		cancel()
		return nil, ctx.Err()
	})
	if resp.Allowed || resp.Result.Reason != metav1.StatusReasonTimeout {
		t.Fatalf("review cancelled during the class lookup: allowed=%v %+v, want a Timeout denial", resp.Allowed, resp.Result)
	}
	if lookups != 1 {
		t.Errorf("%d class lookups, want 1 (one class)", lookups)
	}
}
