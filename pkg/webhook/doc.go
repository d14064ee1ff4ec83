// Package webhook is Tessera's validating admission webhook: it rejects
// ResourceClaims and ResourceClaimTemplates whose opaque config for driver
// gpu.tessera.dev would fail when the kubelet plugin prepares the claim, at the
// moment they are written and with the field path of each problem.
//
// [Review] is the decision, a pure function of one AdmissionRequest. [Handler]
// serves it as AdmissionReview v1 over HTTP. [Server] runs the handler with
// TLS (certificates reloaded from disk when they change, as cert-manager
// rotates them), health endpoints and a graceful shutdown.
//
// The webhook is an early, friendlier copy of a check the plugin makes anyway
// (configapi.ConfigForRequest at prepare), not a security boundary: a claim
// that slipped past it (webhook not installed, failurePolicy changed) still
// fails at prepare with the same message.
package webhook
