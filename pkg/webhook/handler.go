package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
)

// maxReviewBytes bounds the body Handler reads: 4 MiB. The API server
// refuses request bodies over 3 MiB, so no claim, template or class it
// accepts is larger; the review adds the envelope (user info, kind,
// resource) and JSON re-encoding of a body sent as protobuf or YAML. Opaque
// parameters are 10 KiB at most each (the API server validates them before
// validating webhooks run) and a claim has at most 32 configs, so our part
// is at most 320 KiB; the rest of a large object (CEL selectors, annotations)
// must not turn a valid claim into a webhook failure, which failurePolicy
// Fail would make a denial. On UPDATE of a DeviceClass the review also holds
// the old object, a class being far below the limit.
const maxReviewBytes = 4 << 20

// Handler serves AdmissionReview v1 requests (POST, application/json) with
// [Review]'s decision. Malformed requests get HTTP 400 and no review; the API
// server then applies the webhook's failurePolicy.
type Handler struct {
	// Classes reads the DeviceClasses a claim's requests name, for their
	// sharing.allowedIsolations; reads are bounded by the request's context.
	// Nil reads none (the floor is then checked only at prepare).
	Classes DeviceClassReader
}

// DeviceClassReader reads a DeviceClass by name, as DeviceClassLookup does,
// within ctx. *DeviceClasses is the one the webhook runs with.
type DeviceClassReader interface {
	Get(ctx context.Context, name string) (*resourceapi.DeviceClass, error)
}

var _ http.Handler = Handler{}

// ServeHTTP reads the request and answers it. Server puts the handler behind
// a gate that reads the body under a deadline and a memory budget before
// the review takes a slot; served on its own, the body is read as it comes.
func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serveReview(w, r, h.review)
}

func (h Handler) review(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview) {
	answer(w, r, review, func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		logger := klog.FromContext(ctx)
		var classes DeviceClassLookup
		if h.Classes != nil {
			classes = func(name string) (*resourceapi.DeviceClass, error) {
				class, err := h.Classes.Get(ctx, name)
				if err != nil && !apierrors.IsNotFound(err) {
					logger.Error(err, "Cannot read a DeviceClass; allowing the claim with a warning",
						"deviceClass", name, "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name)
				}
				return class, err
			}
		}
		resp := Review(ctx, req, classes)
		if !resp.Allowed {
			logger.V(2).Info("Denied", "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name,
				"operation", req.Operation, "uid", req.UID, "reason", resp.Result.Message)
		} else {
			logger.V(5).Info("Allowed", "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name, "uid", req.UID)
		}
		return resp
	})
}

// answer writes respond's answer to review, under the request's deadline
// (reviewContext).
func answer(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview, respond func(context.Context, *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse) {
	ctx, cancel := reviewContext(r)
	defer cancel()
	writeReview(w, review, respond(ctx, review.Request))
}

// logDenied logs resp at V(2) if it refuses req.
func logDenied(ctx context.Context, req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
	if !resp.Allowed && resp.Result != nil {
		klog.FromContext(ctx).V(2).Info("Denied", "kind", req.Kind.Kind, "namespace", req.Namespace,
			"name", req.Name, "uid", req.UID, "reason", resp.Result.Message)
	}
}

// reviewContext is the request's context, bounded by the timeout the API
// server puts in the webhook URL's query (?timeout=5s): past it the API
// server no longer waits for the answer.
func reviewContext(r *http.Request) (context.Context, context.CancelFunc) {
	if timeout, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && timeout > 0 {
		return context.WithTimeout(r.Context(), timeout)
	}
	return context.WithCancel(r.Context())
}

// serveReview reads the AdmissionReview of r (readReview) and hands it to
// review.
func serveReview(w http.ResponseWriter, r *http.Request, review func(http.ResponseWriter, *http.Request, *admissionv1.AdmissionReview)) {
	if rv, ok := readReview(w, r); ok {
		review(w, r, rv)
	}
}

// readReview reads an AdmissionReview v1 request (POST, application/json, at
// most maxReviewBytes). On a malformed request it answers with the HTTP error
// and returns false; the API server then applies the webhook's failurePolicy.
func readReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, bool) {
	if !checkRequest(w, r) {
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes+1))
	if err != nil {
		http.Error(w, fmt.Sprintf("read the request: %v", err), http.StatusBadRequest)
		return nil, false
	}
	if len(body) > maxReviewBytes {
		http.Error(w, errTooLarge.Error(), http.StatusRequestEntityTooLarge)
		return nil, false
	}
	return decodeReview(w, body)
}

// checkRequest answers a request that is not a POST of application/json
// with the HTTP error and returns false.
func checkRequest(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "only POST is served", http.StatusMethodNotAllowed)
		return false
	}
	if mediaType, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mediaType != "application/json" {
		http.Error(w, "Content-Type must be application/json", http.StatusUnsupportedMediaType)
		return false
	}
	return true
}

// decodeReview decodes an AdmissionReview v1 with a request, or answers 400
// and returns false.
func decodeReview(w http.ResponseWriter, body []byte) (*admissionv1.AdmissionReview, bool) {
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		http.Error(w, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
		return nil, false
	}
	if gvk := review.GroupVersionKind(); gvk != admissionv1.SchemeGroupVersion.WithKind("AdmissionReview") || review.Request == nil {
		http.Error(w, "expected an admission.k8s.io/v1 AdmissionReview with a request", http.StatusBadRequest)
		return nil, false
	}
	return &review, true
}

// writeReview answers review with resp.
func writeReview(w http.ResponseWriter, review *admissionv1.AdmissionReview, resp *admissionv1.AdmissionResponse) {
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		http.Error(w, fmt.Sprintf("encode the review: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}
