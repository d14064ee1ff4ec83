// Package health turns NVML's error events into per-GPU health, the input of
// the device taints Tessera publishes and of the health stream the kubelet
// shows as a pod's allocatedResourcesStatus.
//
// It has two halves:
//
//   - [Tracker] is a pure state machine: [Event]s in, one [Status] per GPU out.
//     A [Policy] classifies each event (ignored, NoSchedule, NoExecute); a GPU
//     becomes healthy again once it has seen no counting event for
//     Policy.RecoveryPeriod, measured on an injectable clock. No I/O.
//   - [Watcher] reads the events from an nvml.Interface (EventSetCreate,
//     RegisterEvents, EventSetWait): the real NVML on GPU nodes, and the mock
//     node profiles of pkg/gpu, which can inject events, everywhere else.
//
// # Classification
//
// The default policy follows the resolution buckets of NVIDIA's Xid catalog:
//
//   - XIDs that report an application's own fault (13, 31, 43, 45, 68, 109:
//     graphics exception, MMU fault, channel stopped/torn down, video
//     processor exception, context switch timeout) are ignored. The GPU is
//     fine; the process that caused them is not ours to judge.
//   - XIDs after which the GPU needs a reset or the node a reboot, and whose
//     running work is lost or its results suspect (48 double-bit ECC, 64 row
//     remap failure, 79 fallen off the bus, 95 uncontained ECC, 119/120 GSP
//     errors, 140 unrecovered ECC), a double-bit ECC event, and a lost GPU
//     are fatal: NoExecute, so pods using the GPU are evicted.
//   - Every other critical XID (for example 94, a contained ECC error: the
//     affected process was killed, others keep running, and 74, an NVLink
//     error) taints NoSchedule: running pods stay, new ones go elsewhere.
//
// Every list and the fatal effect are configurable (Policy), and so are the
// flags of the kubelet plugin that fill it.
//
// # MIG
//
// On a GPU in MIG mode the driver puts the GPU and compute instance IDs of
// an XID into the event data. Such an event marks only that MIG device
// (Event.MIG): the compute instance, every compute instance of the GPU
// instance when it names none, or on a dynamic-MIG GPU the placement of the
// GPU instance. Tracker.Taints stays per GPU (model.WithTaints);
// Tracker.MIGTaints and TaintDevices taint the MIG devices, and
// Tracker.MIGDeviceStatuses says which are unhealthy. A fatal event marks
// the whole GPU even when it names an instance: the reset it needs destroys
// every instance.
//
// # Persistence
//
// A [Tracker] with a [Store] (Tracker.Persist; the kubelet plugin's is
// <plugin-data-dir>/health.json) keeps its unhealthy GPUs there: per GPU
// UUID the effect, the reason, when it turned unhealthy and the time of its
// last fault. A restarted plugin loads it, so a GPU tainted for a fatal XID
// stays tainted until the recovery period has passed since that fault, and
// the two instances of a surge rolling update, which share the directory,
// publish the same taints: each saves (read, merge, write, under a file
// lock) after every change and re-reads at every inventory sync. The file is
// written atomically (temporary file, fsync, rename); a corrupt one is
// logged, ignored and replaced.
package health
