// Package budget enforces namespace GPU budgets (GPUBudget,
// api/gpu.tessera.dev/v1alpha1): a cap on the GPU memory, compute and whole
// GPUs the ResourceClaims of a namespace may ask for, which ResourceQuota
// cannot express (it counts devices, and a 1Gi share is one device as an
// 80Gi one is).
//
//   - [Pricer] computes what a claim takes (a pure function of the claim,
//     the DeviceClasses and the devices the cluster publishes): worst case
//     over the devices a request may get, as the quota evaluator charges.
//   - [Charger] is the admission: a compare-and-swap charge on each budget
//     before the claim is allowed, refusals with used and hard, dry runs
//     checked but not written, and a pending entry per admitted claim.
//   - [Reconciler] recomputes status.used from the claims that exist plus
//     the pending entries whose claim is not seen yet, so used never falls
//     below a charge in flight; [Controller] runs it on informers.
//
// It is built into tessera-webhook without cgo: it must not import
// pkg/model (its names are spelled out in charge.go and held equal by a
// test).
package budget
