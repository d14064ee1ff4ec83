// Package webhook is Tessera's admission webhook: it rejects ResourceClaims
// and ResourceClaimTemplates whose opaque config for driver gpu.tessera.dev
// would fail when the kubelet plugin prepares the claim, at the moment they
// are written and with the field path of each problem, and [Mutate] expands a
// ResourceClaim annotated with a GPU fraction into a request for that
// fraction of each GPU model (pkg/fraction).
//
// [ValidateDeviceClaim] is the check, on the resource.k8s.io/v1 types, shared
// with `tessera claim-template` (internal/cli/claimtemplate) so that the CLI never prints
// a template the webhook refuses. [Review] is the decision, a pure function of
// one AdmissionRequest. [Handler] serves it as AdmissionReview v1 over HTTP.
// [Server] runs the handler with TLS (certificates reloaded from disk when they
// change, as cert-manager rotates them), health endpoints and a graceful
// shutdown.
//
// The webhook is an early, friendlier copy of checks the plugin makes anyway
// (configapi.ConfigForRequest, GpuConfig.ShareLimits, the MPS, NVLink and
// isolation-floor checks at prepare), not a security boundary: a claim that
// slipped past it (webhook not installed, failurePolicy changed) still fails
// at prepare.
//
// Besides the claim it reads the DeviceClasses the claim's requests name
// ([DeviceClasses]: an informer's cache, a GET for what the cache does not
// hold), for two things: a class's sharing.allowedIsolations, the floor
// that a claim's sharing.isolation must stay within
// ([ValidateDeviceClaimWithClasses]), and whether a class other than
// mig.gpu.tessera.dev selects MIG devices (its selector compares type with
// "mig"), on which HAMiCore, DriverMemory and lending are refused. A class
// that cannot be read does not block the claim: it is allowed with a
// warning, and prepare checks the floor.
// The rest of a DeviceClass config and the node's --default-isolation can
// still make prepare refuse a claim it allowed.
package webhook
