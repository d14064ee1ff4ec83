package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

func TestHandler(t *testing.T) {
	valid, err := os.ReadFile(filepath.Join("testdata", "claim-v1-valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	typo, err := os.ReadFile(filepath.Join("testdata", "template-v1-typo.json"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		method      string
		contentType string
		body        []byte
		wantStatus  int
		wantAllowed *bool
		wantMessage string
		wantWarning string
	}{
		{name: "allowed", body: valid, wantStatus: 200, wantAllowed: ptr(true)},
		{name: "denied", body: typo, wantStatus: 200, wantAllowed: ptr(false),
			wantMessage: "spec.spec.devices.config[1].opaque.parameters: invalid GpuConfig: sharing.isolaton: unknown field"},
		{name: "allowed with a warning", body: bytes.Replace(valid, []byte(`"memory": "20Gi", `), nil, 1), wantStatus: 200, wantAllowed: ptr(true),
			wantWarning: noMemory("spec.devices.requests[0].exactly", "gpus")},
		{name: "charset in content type", contentType: "application/json; charset=utf-8", body: valid, wantStatus: 200, wantAllowed: ptr(true)},
		{name: "GET", method: http.MethodGet, wantStatus: http.StatusMethodNotAllowed},
		{name: "not JSON", contentType: "text/plain", body: valid, wantStatus: http.StatusUnsupportedMediaType},
		{name: "garbage", body: []byte("{"), wantStatus: http.StatusBadRequest},
		{name: "v1beta1 review", body: bytes.Replace(valid, []byte(`"admission.k8s.io/v1"`), []byte(`"admission.k8s.io/v1beta1"`), 1),
			wantStatus: http.StatusBadRequest},
		{name: "no request", body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), wantStatus: http.StatusBadRequest},
		{name: "too large", body: append([]byte(`{"x":"`), bytes.Repeat([]byte("a"), maxReviewBytes)...), wantStatus: http.StatusRequestEntityTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req := httptest.NewRequest(method, ValidatePath, bytes.NewReader(tc.body))
			contentType := tc.contentType
			if contentType == "" {
				contentType = "application/json"
			}
			req.Header.Set("Content-Type", contentType)
			rec := httptest.NewRecorder()
			Handler{}.ServeHTTP(rec, req)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d (%s)", rec.Code, tc.wantStatus, strings.TrimSpace(rec.Body.String()))
			}
			if tc.wantAllowed == nil {
				return
			}
			var review admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &review); err != nil {
				t.Fatal(err)
			}
			if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" || review.Response == nil {
				t.Fatalf("not an AdmissionReview v1 with a response: %s", rec.Body.String())
			}
			if review.Request != nil {
				t.Error("the response echoes the request")
			}
			if review.Response.Allowed != *tc.wantAllowed {
				t.Fatalf("allowed = %v, want %v", review.Response.Allowed, *tc.wantAllowed)
			}
			if tc.wantMessage != "" && review.Response.Result.Message != tc.wantMessage {
				t.Errorf("message = %q, want %q", review.Response.Result.Message, tc.wantMessage)
			}
			if got := strings.Join(review.Response.Warnings, "\n"); got != tc.wantWarning {
				t.Errorf("warnings = %q, want %q", got, tc.wantWarning)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
