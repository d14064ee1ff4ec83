// Package webhooktest holds what the tests of the admission webhook and of
// the packages whose claims it mutates share: the admission request that
// creates a ResourceClaim and the requests that a mutation's JSON patch sets.
// It does not import package webhook, so that webhook's own tests can use it.
// Only tests import it.
package webhooktest

import (
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// ClaimCreate is the admission request, of UID "u", that creates claim
// through resource.k8s.io/v1.
func ClaimCreate(t testing.TB, claim resourceapi.ResourceClaim) *admissionv1.AdmissionRequest {
	t.Helper()
	raw, err := json.Marshal(claim)
	if err != nil {
		t.Fatal(err)
	}
	return &admissionv1.AdmissionRequest{
		UID: "u", Kind: metav1.GroupVersionKind{Group: resourceapi.GroupName, Version: "v1", Kind: "ResourceClaim"},
		Operation: admissionv1.Create, Namespace: claim.Namespace, Name: claim.Name, Object: runtime.RawExtension{Raw: raw},
	}
}

// PatchedRequests is the requests of the claim after resp, which must allow
// it with a JSON patch of one replace of /spec/devices/requests.
func PatchedRequests(t testing.TB, resp *admissionv1.AdmissionResponse) []resourceapi.DeviceRequest {
	t.Helper()
	if !resp.Allowed {
		var msg string
		if resp.Result != nil {
			msg = resp.Result.Message
		}
		t.Fatalf("the webhook refuses the claim: %s", msg)
	}
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("response %+v: want allowed with a JSON patch", resp)
	}
	var patch []struct {
		Op, Path string
		Value    []resourceapi.DeviceRequest
	}
	if err := json.Unmarshal(resp.Patch, &patch); err != nil {
		t.Fatal(err)
	}
	if len(patch) != 1 || patch[0].Op != "replace" || patch[0].Path != "/spec/devices/requests" {
		t.Fatalf("patch %s: want one replace of /spec/devices/requests", resp.Patch)
	}
	return patch[0].Value
}
