package webhook

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// FuzzReview feeds arbitrary bytes to what the webhook does with a request
// body: the AdmissionReview decoder, then Review (with a DeviceClass that
// sets a floor) and Mutate. Whatever the input, nothing panics, every
// answer carries the request's UID, and every denial says why. The seed
// corpus is the reviews in testdata and testdata/fuzz/FuzzReview.
func FuzzReview(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		seed, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(seed)
	}
	floor := &resourceapi.DeviceClass{Spec: resourceapi.DeviceClassSpec{Config: []resourceapi.DeviceClassConfiguration{{
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: modelnames.DriverName,
		}},
	}}}}
	floor.Spec.Config[0].Opaque.Parameters.Raw = []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"allowedIsolations":["MPS","HAMiCore"]}}`)
	classes := DeviceClassMap(map[string]*resourceapi.DeviceClass{modelnames.SharedClassName: floor})
	models := func() ([]fraction.Model, error) { return mutateModels, nil }
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		review, ok := decodeReview(rec, body)
		if !ok {
			if rec.Code != http.StatusBadRequest {
				t.Fatalf("undecodable body answered %d, want 400", rec.Code)
			}
			return
		}
		check := func(what string, resp *admissionv1.AdmissionResponse) {
			if resp == nil {
				t.Fatalf("%s: no response", what)
			}
			if resp.UID != review.Request.UID {
				t.Fatalf("%s: UID %q, want %q", what, resp.UID, review.Request.UID)
			}
			if !resp.Allowed && (resp.Result == nil || resp.Result.Message == "") {
				t.Fatalf("%s: denied without a message", what)
			}
		}
		check("Review", Review(context.Background(), review.Request, classes))
		check("Mutate", Mutate(review.Request, models))
		// The whole handler too: it must answer with an AdmissionReview.
		rec = httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, ValidatePath, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		Handler{}.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("handler answered %d for a body the decoder took", rec.Code)
		}
	})
}
