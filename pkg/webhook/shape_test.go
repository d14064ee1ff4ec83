package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/tessera-dev/tessera/pkg/fraction"
)

func TestCheckShape(t *testing.T) {
	list := func(n int, elem string) string {
		return "[" + strings.TrimSuffix(strings.Repeat(elem+",", n), ",") + "]"
	}
	deep := func(n int) string { return strings.Repeat(`{"a":`, n-1) + "{}" + strings.Repeat("}", n-1) }
	tests := []struct {
		name, object string
		want         string // substring of the error; "" for none
	}{
		{name: "empty", object: `{}`},
		{name: "at the largest list", object: `{"status":{"reservedFor":` + list(maxShapeList, `{}`) + `}}`},
		{name: "one over", object: `{"spec":{"devices":{"requests":[{"name":"a"},{"firstAvailable":` + list(maxShapeList+1, `{}`) + `}]}}}`,
			want: "spec.devices.requests[1].firstAvailable: Too many: must have at most 256 items"},
		{name: "scalars count", object: `{"a":` + list(maxShapeList+1, `1`) + `}`, want: "a: Too many"},
		{name: "empty strings count", object: `{"a":` + list(maxShapeList+1, `""`) + `}`, want: "a: Too many"},
		{name: "brackets and commas in strings", object: `{"a":["` + strings.Repeat(`,[{\"],`, 1000) + `"]}`},
		{name: "metadata lists are not capped", object: `{"metadata":{"finalizers":` + list(1000, `"x"`) + `},"spec":{}}`},
		{name: "a key named metadata elsewhere is", object: `{"spec":{"metadata":` + list(maxShapeList+1, `0`) + `}}`, want: "spec.metadata: Too many"},
		{name: "elements in all", object: `{"metadata":{"finalizers":` + list(maxShapeElements+1, `0`) + `}}`,
			want: "metadata.finalizers: Forbidden: the object holds more than 65536 list elements in all"},
		{name: "nested lists in all", object: `{"spec":` + list(maxShapeList, list(maxShapeList, `0`)) + `}`,
			want: "list elements in all"},
		{name: "at the depth", object: deep(maxShapeDepth)},
		{name: "too deep", object: deep(maxShapeDepth + 1), want: "nested more than 64 levels deep"},
		{name: "too deep in arrays", object: `{"a":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, want: "a[0][0]"},
		{name: "unterminated", object: `{"a":["`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !json.Valid([]byte(tc.object)) && tc.name != "unterminated" {
				t.Fatalf("test object is not JSON")
			}
			err := checkShape([]byte(tc.object))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("checkShape: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("checkShape: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestCheckShapeSeeds: every object in testdata passes (they are within the
// API's limits; claim-over-limits is over checkLimits' sizes, not these).
func TestCheckShapeSeeds(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no seeds: %v", err)
	}
	for _, name := range files {
		body, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		var review admissionv1.AdmissionReview
		if json.Unmarshal(body, &review) != nil || review.Request == nil {
			continue
		}
		if err := checkShape(review.Request.Object.Raw); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	object := []byte(`{"metadata":{"name":"c"},"spec":{"devices":{"requests":[{"name":"a","firstAvailable":[{},{}]}]}}}`)
	if n := testing.AllocsPerRun(10, func() { _ = checkShape(object) }); n != 0 {
		t.Errorf("checkShape allocates %v times on a passing object", n)
	}
}

// amplifyingReview is a ResourceClaim review of about size bytes whose
// object is mostly `inner` elements, which cost far more decoded than their
// bytes. v1 CREATE with the fraction annotation, so that Mutate reads it too.
func amplifyingReview(size int, wrap func(elements string) string, elem string) []byte {
	head := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"amp",` +
		`"kind":{"group":"resource.k8s.io","version":"v1","kind":"ResourceClaim"},` +
		`"resource":{"group":"resource.k8s.io","version":"v1","resource":"resourceclaims"},` +
		`"name":"c","namespace":"ns","operation":"CREATE","userInfo":{"username":"u"},"object":` +
		`{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"c","namespace":"ns",` +
		`"annotations":{"` + fraction.Annotation + `":"1/2"}},"spec":{"devices":`
	tail := `}}}}`
	n := max((size-len(head)-len(tail)-64)/(len(elem)+1), 0)
	elements := strings.TrimSuffix(strings.Repeat(elem+",", n), ",")
	return []byte(head + wrap(elements) + tail)
}

// TestAmplifyingBodyRefused: a 4 MiB body whose lists decode to ~50× its
// size is denied (200, a denial naming the limit), and the review allocates
// a small multiple of the body, not of its decoded size.
func TestAmplifyingBodyRefused(t *testing.T) {
	flat := func(elements string) string {
		return `{"requests":[{"name":"r","firstAvailable":[` + elements + `]}]}`
	}
	// Lists within the per-list limit, nested: requests × firstAvailable ×
	// tolerations, ~3 MiB.
	nested := func(string) string {
		sub := `{"tolerations":[{},{},{},{},{},{},{},{}]}`
		req := `{"name":"r","firstAvailable":[` + strings.TrimSuffix(strings.Repeat(sub+",", maxShapeList), ",") + `]}`
		return `{"requests":[` + strings.TrimSuffix(strings.Repeat(req+",", maxShapeList), ",") + `]}`
	}
	bodies := map[string][]byte{
		"flat":   amplifyingReview(maxReviewBytes-8<<10, flat, `{}`),
		"nested": amplifyingReview(0, nested, ""),
	}
	handlers := map[string]http.Handler{
		ValidatePath: Handler{},
		MutatePath:   MutateHandler{Models: staticModels(mutateModels)},
	}
	for bodyName, body := range bodies {
		if !json.Valid(body) || len(body) > maxReviewBytes {
			t.Fatalf("%s: bad test body (%d bytes)", bodyName, len(body))
		}
		for path, h := range handlers {
			t.Run(bodyName+path, func(t *testing.T) {
				req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				h.ServeHTTP(rec, req)
				runtime.ReadMemStats(&after)
				allocated := after.TotalAlloc - before.TotalAlloc
				t.Logf("%d-byte body: %d MiB allocated", len(body), allocated>>20)
				if rec.Code != http.StatusOK {
					t.Fatalf("answered %d: %s", rec.Code, rec.Body)
				}
				var review admissionv1.AdmissionReview
				if err := json.Unmarshal(rec.Body.Bytes(), &review); err != nil || review.Response == nil {
					t.Fatalf("not a review: %v", err)
				}
				resp := review.Response
				if resp.Allowed || resp.Result == nil || resp.Result.Code != 422 {
					t.Fatalf("not denied as invalid: %+v", resp)
				}
				if msg := resp.Result.Message; !strings.Contains(msg, "must have at most 256 items") && !strings.Contains(msg, "list elements in all") {
					t.Errorf("message %q does not name the limit", msg)
				}
				// The body is read and its object copied (RawExtension):
				// a few times 4 MiB. Decoded, it would be ~200 MiB.
				if allocated > 64<<20 {
					t.Errorf("the review allocated %d MiB for a %d KiB body", allocated>>20, len(body)>>10)
				}
			})
		}
	}
}

type staticModels []fraction.Model

func (m staticModels) Models(context.Context) ([]fraction.Model, error) { return m, nil }

// BenchmarkCheckShape: the scan is O(bytes) and allocation-free.
func BenchmarkCheckShape(b *testing.B) {
	object := []byte(`{"spec":{"devices":{"requests":[` +
		strings.TrimSuffix(strings.Repeat(`{"name":"a","exactly":{"deviceClassName":"x","count":1}},`, 32), ",") + `]}}}`)
	b.SetBytes(int64(len(object)))
	b.ReportAllocs()
	for b.Loop() {
		if err := checkShape(object); err != nil {
			b.Fatal(err)
		}
	}
}
