// Package caller carries, in a request's context, whether the webhook
// server verified who sent an AdmissionReview (a client certificate that
// the configured CA signed, for a name the server allows). Admission
// functions read it to decide what an answer may say: a review whose
// caller is not verified may come from any pod that reaches the Service,
// not from the API server.
//
// It is a leaf package so that admission code outside pkg/webhook
// (pkg/budget) can read it without importing the server.
package caller

import "context"

type key struct{}

// WithVerified returns ctx recording that the request came from the
// verified client name (the certificate's subject common name or the
// first of its DNS names that the server allows).
func WithVerified(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, key{}, name)
}

// Verified returns the verified client name of the request whose context
// is ctx, and whether there is one.
func Verified(ctx context.Context) (string, bool) {
	name, ok := ctx.Value(key{}).(string)
	return name, ok
}
