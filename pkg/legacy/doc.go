// Package legacy translates pod specs written for other GPU-sharing systems
// into Tessera's: the extended resources and annotations of HAMi, Alibaba's
// gpushare, Koordinator and NVIDIA's device plugin become references to
// ResourceClaimTemplates of gpu.tessera.dev, so that a workload moves to
// Tessera without rewriting its manifests by hand.
//
// [Translate] is the whole translation, a pure function of one pod template
// (a Pod's metadata and spec, or a workload's spec.template) and [Options]:
// no I/O, nothing read from a cluster, no clock. A mutating admission webhook
// calls it on Pod CREATE; `tessera convert` calls it on manifests. What a
// caller may assume:
//
//   - The input is never modified; the result is a rewritten copy.
//   - Plain nvidia.com/gpu (NVIDIA's device plugin, and HAMi's and
//     Koordinator's whole-GPU form) is kept: the DeviceClass of [DeviceClass],
//     whose extendedResourceName is nvidia.com/gpu, serves it, and
//     ResourceQuotas on requests.nvidia.com/gpu keep counting it. Every other
//     legacy name, and the GPU-type annotations, are removed after
//     translation, because the scheduler would look for a node that offers
//     them.
//   - Each container that had legacy names gets one entry in
//     spec.resourceClaims (named [ClaimName]) pointing at a template, and one
//     in its resources.claims. Templates are named by a hash of their content
//     ([TemplateName]) and labelled as Tessera's ([LabelTranslated]): equal
//     shapes share one template, and the same input always yields the same
//     names.
//   - Translating a translated template changes nothing (Changed is false):
//     no legacy name is left to translate.
//   - Contradictory or unsupported input is an error naming the field
//     (spec.containers[1].resources.limits[nvidia.com/gpumem]); nothing is
//     dropped silently. The errors are a field.ErrorList, as an admission
//     webhook reports them.
//   - Every template passes webhook.ValidateDeviceClaim, the check of
//     Tessera's validating webhook.
//
// The meaning of each legacy name is taken from its system's own code and
// documentation, cited beside the constants in names.go; docs/migration.md
// has the tables.
package legacy
