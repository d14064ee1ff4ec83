package webhook

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func classReview(op admissionv1.Operation, version, object string) *admissionv1.AdmissionRequest {
	return &admissionv1.AdmissionRequest{
		UID:       "uid-1",
		Kind:      metav1.GroupVersionKind{Group: ResourceGroup, Version: version, Kind: "DeviceClass"},
		Name:      "shared.gpu.tessera.dev",
		Operation: op,
		Object:    runtime.RawExtension{Raw: []byte(object)},
	}
}

func classWith(params string) string {
	return `{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"shared.gpu.tessera.dev"},"spec":{"config":[` +
		`{"opaque":{"driver":"other.example.com","parameters":{"anything":1}}},` +
		`{"opaque":{"driver":"gpu.tessera.dev","parameters":` + params + `}}]}}`
}

func TestReviewDeviceClass(t *testing.T) {
	const head = `"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig"`
	tests := []struct {
		name    string
		op      admissionv1.Operation
		version string
		object  string
		want    string // "" allowed, else a part of the denial
	}{
		{name: "class floor allowed", op: admissionv1.Create, version: "v1",
			object: classWith(`{` + head + `,"sharing":{"isolation":"MPS","allowedIsolations":["MPS","HAMiCore"]}}`)},
		{name: "typo on create", op: admissionv1.Create, version: "v1",
			object: classWith(`{` + head + `,"sharing":{"isolaton":"MPS"}}`),
			want:   "spec.config[1].opaque.parameters: invalid GpuConfig: sharing.isolaton: unknown field"},
		{name: "bad value on update", op: admissionv1.Update, version: "v1beta2",
			object: classWith(`{` + head + `,"sharing":{"computeLimit":0}}`),
			want:   "spec.config[1].opaque.parameters.sharing.computeLimit: Invalid value: 0"},
		{name: "unsupported isolation in the floor", op: admissionv1.Create, version: "v1beta1",
			object: classWith(`{` + head + `,"sharing":{"allowedIsolations":["Magic"]}}`),
			want:   "spec.config[1].opaque.parameters.sharing.allowedIsolations[0]: Unsupported value: \"Magic\""},
		{name: "control characters in a key are quoted", op: admissionv1.Create, version: "v1",
			object: classWith(`{` + head + `,"x\u0007\n":1}`),
			want:   `"x\a\n": unknown field`},
		{name: "an isolation its own floor does not allow", op: admissionv1.Create, version: "v1",
			object: classWith(`{` + head + `,"sharing":{"isolation":"Advisory","allowedIsolations":["MPS","HAMiCore"]}}`),
			want: "spec.config[1].opaque.parameters.sharing.isolation: Invalid value: \"Advisory\": is not among the isolations the class allows (MPS, HAMiCore, " +
				"sharing.allowedIsolations at spec.config[1].opaque.parameters.sharing.allowedIsolations): prepare would refuse every share of the class that does not set another isolation itself"},
		{name: "floors of two configs without an isolation in common", op: admissionv1.Update, version: "v1",
			object: `{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"c"},"spec":{"config":[` +
				`{"opaque":{"driver":"gpu.tessera.dev","parameters":{` + head + `,"sharing":{"allowedIsolations":["MPS","HAMiCore"]}}}},` +
				`{"opaque":{"driver":"gpu.tessera.dev","parameters":{` + head + `,"sharing":{"isolation":"DriverMemory","allowedIsolations":["DriverMemory"]}}}}]}}`,
			want: "spec.config[1].opaque.parameters.sharing.allowedIsolations: Invalid value: \"DriverMemory\": has no isolation in common with " +
				"spec.config[0].opaque.parameters.sharing.allowedIsolations (MPS, HAMiCore): a share must have an isolation every one of them allows, so prepare would refuse every share of the class"},
		{name: "a later config narrows the floor to the class's isolation", op: admissionv1.Create, version: "v1",
			object: `{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"c"},"spec":{"config":[` +
				`{"opaque":{"driver":"gpu.tessera.dev","parameters":{` + head + `,"sharing":{"isolation":"MPS","allowedIsolations":["MPS","HAMiCore"]}}}},` +
				`{"opaque":{"driver":"gpu.tessera.dev","parameters":{` + head + `,"sharing":{"allowedIsolations":["HAMiCore","MPS"]}}}}]}}`},
		{name: "delete is not reviewed", op: admissionv1.Delete, version: "v1", object: classWith(`{"bad":1}`)},
		{name: "no config of ours", op: admissionv1.Create, version: "v1",
			object: `{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","spec":{"selectors":[{"cel":{"expression":"true"}}]}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := Review(context.Background(), classReview(tc.op, tc.version, tc.object), nil)
			if tc.want == "" {
				if !resp.Allowed {
					t.Fatalf("denied: %s", resp.Result.Message)
				}
				return
			}
			if resp.Allowed {
				t.Fatalf("allowed, want a denial with %q", tc.want)
			}
			if !strings.Contains(resp.Result.Message, tc.want) {
				t.Errorf("message %q, want %q in it", resp.Result.Message, tc.want)
			}
			if strings.ContainsAny(resp.Result.Message, "\a\n") {
				t.Errorf("raw control character in %q", resp.Result.Message)
			}
		})
	}
}

// reviewerFunc is a reviewer from a function.
type reviewerFunc func(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview)

func (f reviewerFunc) review(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview) {
	f(w, r, review)
}

func TestLimitInFlight(t *testing.T) {
	valid, err := os.ReadFile(filepath.Join("testdata", "claim-v1-valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	post := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, ValidatePath, bytes.NewReader(valid))
		r.Header.Set("Content-Type", "application/json")
		return r
	}
	release := make(chan struct{})
	var mu sync.Mutex
	running, most := 0, 0
	h := newGate(2, 2, 200*time.Millisecond, DefaultBodyTimeout, DefaultBodyBudget).serve(reviewerFunc(func(http.ResponseWriter, *http.Request, *admissionv1.AdmissionReview) {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		<-release
		mu.Lock()
		running--
		mu.Unlock()
	}))
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, post())
			codes <- rec.Code
		}()
	}
	// Wait until both hold a slot.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		r := running
		mu.Unlock()
		if r == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d handlers running, want 2", r)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, post())
	if rec.Code != http.StatusTooManyRequests {
		t.Errorf("third review while two are in flight: %d, want 429 after the wait", rec.Code)
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("served review: %d", c)
		}
	}
	if most != 2 {
		t.Errorf("at most %d handlers at once, want 2", most)
	}
}
