// Package webhook is Tessera's validating admission webhook: it rejects
// ResourceClaims and ResourceClaimTemplates whose opaque config for driver
// gpu.tessera.dev would fail when the kubelet plugin prepares the claim, at the
// moment they are written and with the field path of each problem.
//
// [ValidateDeviceClaim] is the check, on the resource.k8s.io/v1 types, shared
// with `tessera claim-template` (pkg/claimtemplate) so that the CLI never prints
// a template the webhook refuses. [Review] is the decision, a pure function of
// one AdmissionRequest. [Handler] serves it as AdmissionReview v1 over HTTP.
// [Server] runs the handler with TLS (certificates reloaded from disk when they
// change, as cert-manager rotates them), health endpoints and a graceful
// shutdown.
//
// The webhook is an early, friendlier copy of checks the plugin makes anyway
// (configapi.ConfigForRequest, GpuConfig.ShareLimits, the MPS and NVLink checks
// at prepare), not a security boundary: a claim that slipped past it (webhook
// not installed, failurePolicy changed) still fails at prepare. It sees only
// the claim: a DeviceClass config or the node's --default-isolation can still
// make prepare refuse a claim it allowed.
package webhook
