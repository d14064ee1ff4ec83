package webhook

import (
	"context"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// AdmitFunc answers one AdmissionRequest. ctx ends when the API server
// stops waiting for the answer (the timeout in the webhook's URL). Server
// serves such functions on further paths (Server.Admitters), behind the same
// gate as its own; pkg/webhook/legacypods is one.
type AdmitFunc func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse

var _ http.Handler = AdmitFunc(nil)

// ServeHTTP reads the AdmissionReview and answers it with f's response,
// without the Server's gate (tests, or a caller with its own).
func (f AdmitFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serveReview(w, r, f.review)
}

func (f AdmitFunc) review(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview) {
	answer(w, r, review, func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		resp := f(ctx, req)
		resp.UID = req.UID
		logDenied(ctx, req, resp)
		return resp
	})
}

// Denial is the Status of a review refused for errs: 422 Invalid, the
// errors' messages joined, one cause per error naming its field, as the
// validating webhook answers.
func Denial(req *admissionv1.AdmissionRequest, errs field.ErrorList) *metav1.Status {
	return denial(req, errs)
}
