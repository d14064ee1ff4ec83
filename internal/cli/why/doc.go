// Package why explains why a pod's or claim's GPU devices cannot be allocated
// (`tessera why`).
//
// It answers with kube-scheduler's own allocator
// (k8s.io/dynamic-resource-allocation/structured, the feature set of the 1.37
// scheduler, see model.SchedulerFeatures) run node by node over the live
// ResourceSlices, DeviceClasses and allocated claims, so "fits" and "does not
// fit" are the scheduler's verdict, not a reimplementation of it. Where the
// allocator says no, the package then looks at every gpu.tessera.dev device of
// the node the way the allocator does and names what fails:
//
//   - the request's CEL selectors, evaluated per device with the same CEL
//     library and cache the allocator uses (k8s.io/dynamic-resource-allocation/cel);
//     a device the DeviceClass's selectors reject is not a candidate and is
//     not listed;
//   - device taints the request does not tolerate (gpu.tessera.dev/unhealthy,
//     the lending taints gpu.tessera.dev/not-lent and gpu.tessera.dev/reclaim),
//     also those a DeviceTaintRule adds (the locality controller's fences
//     gpu.tessera.dev/locality-fence, an admin's maintenance rule), named by
//     the rule. The rules are applied to the slices before anything else, as
//     the scheduler's ResourceSlice tracker does, so the allocator's verdict
//     and what fits now count them too;
//   - a share's memory or cores: asked (after the device's request policy:
//     default and rounding up to the step) against what the allocated shares of
//     that device leave, with the claims that hold it;
//   - the GPU's counters (the whole GPU blocked by shares, the shares blocked by
//     a whole-GPU claim), with the claims that hold them;
//   - for a MIG placement (dynamic MIG, docs/mig.md): the memory slices,
//     compute slices and engines it needs, which claim's MIG device holds
//     each taken memory slice (or that an instance no claim holds uses it),
//     which totals are short, and once per GPU who uses them. MIG devices the
//     request's selectors reject (other profiles) are counted once per GPU;
//     a held MIG device names the claim and the memory slices it covers;
//   - too few fitting devices for the count, or for a matchAttribute constraint
//     (an NVLink domain too small);
//   - a matchAttribute constraint across requests that no value satisfies: the
//     values the fitting devices of each request have (a GPU and a NIC under
//     different PCIe roots, resource.kubernetes.io/pcieRoot).
//
// A request for another driver's devices (a NIC beside a GPU) is looked at on
// that driver's devices of the node for what the allocator checks of any
// device: the DeviceClass, the selectors, taints and other claims holding it.
// The explanation says so; that driver's own rules are not known here.
//
// It ends each node with what would fit now: the largest share (memory and
// cores of the emptiest shareable GPU), the number of free whole GPUs and,
// per GPU in MIG mode, the MIG profiles free now.
//
// What the caller may assume: Explain is a pure function of its Input; Get only
// reads the API (pods, claims, slices, classes, nodes, DeviceTaintRules) and
// never writes. Without permission to list DeviceTaintRules, or where the API
// server does not serve them, Get goes on without them and a note says so. A node
// the allocator accepts is reported as fitting even when the pod is pending for
// another reason (CPU, node taints, affinity), which the explanation then says.
package why
