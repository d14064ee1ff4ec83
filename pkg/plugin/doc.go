// Package plugin is Tessera's kubelet plugin: the implementation of
// kubeletplugin.DRAPlugin that prepares and unprepares the resource claims of
// driver gpu.tessera.dev on one node. It also reports device health to the
// kubelet ([Plugin.WatchHealthStatus]) and lends idle GPUs (lending.go);
// publishing the node's ResourceSlices is package publish's.
//
// # What the kubelet may assume
//
// PrepareResourceClaims, for each claim, either returns the CDI device IDs of
// every device of this driver in the claim's allocation, or a per-claim error
// of the form
//
//	claim <namespace>/<name> (uid <uid>): device gpu-3-shared: <what is wrong>
//
// and then has left nothing behind for that claim (no CDI spec, no MPS daemon
// reference, no checkpoint entry, no reservation of its GPUs). Other claims of
// the same call are unaffected. Preparing a prepared claim again returns the
// same CDI device IDs and changes nothing. The kubelet retries failed claims.
//
// UnprepareResourceClaims undoes a prepare using the checkpoint alone (the
// claim object may be gone, and the prepare may have happened in an earlier
// process). Unpreparing a claim that is not prepared succeeds.
//
// Both are safe for concurrent use, also for the same claim; the helper
// serializes calls by default anyway.
//
// # Two instances (rolling updates)
//
// During a surge rolling update the old and the new plugin pod share the plugin
// data directory, and the kubelet may call either. The helper serializes their
// calls with a file lock; each call first refreshes the checkpoint from disk and,
// when the other instance changed it, rebuilds the double-grant index and the MPS
// holders from it. So neither instance writes back a stale copy, hands out a GPU
// the other just prepared, or forgets to unprepare the other's claims. This
// relies on the helper's serialization: do not turn it off with rolling updates.
//
// # Order of effects, and what a crash leaves
//
// Prepare checks everything that can be checked without side effects first
// (driver, pool == node, known device, consumedCapacity of shares, config,
// limits, NVLink policy, HAMi-core library, double grants). It then records the
// claim as PrepareStarted in the checkpoint, acquires MPS daemons, writes the
// CDI spec, and records PrepareCompleted with the CDI device IDs. A failure
// in between is rolled back at once. A crash in between leaves a
// PrepareStarted entry (or none, if the crash came first), and [New] rolls
// such entries back at the next start and removes CDI specs that no
// checkpoint entry owns; the kubelet's retry then prepares from scratch.
//
// A dynamic MIG device adds a side effect the hardware keeps: its instance.
// The PrepareStarted entry records the intent (GPU, profile, placement)
// before the instance is created, and the instance's IDs and MIG UUID are
// recorded (still PrepareStarted) before the CDI spec is written. Rolling
// back, and unpreparing, destroy the compute instance and then the GPU
// instance, found by placement and profile (the driver reuses IDs); an
// instance a process still runs on is not destroyed, and the entry stays
// for a retry. At start, instances of recorded claims are adopted, and
// instances no entry holds on dynamic-MIG GPUs are destroyed when idle, or
// kept and reported (see mig.go).
//
// # Double grants
//
// The scheduler should never hand one GPU to two claims, but the plugin is the
// last line of defence: a whole GPU already prepared for another claim, or a
// whole GPU and a share of the same GPU in different claims, fail prepare with
// an error naming both claims. Shares of one GPU in many claims are fine, as
// are admin-access results (they observe, they do not own).
//
// # Claim status
//
// After a successful prepare the plugin applies (server-side apply, field
// manager "gpu.tessera.dev/<node>") one status.devices entry per prepared
// device, with a GpuAttestation (api/gpu.tessera.dev/v1alpha1) as data: the
// node, the GPU's UUID and, for a share, the isolation backend, what the
// share holds, the limits it applies and which of them it enforces, and the
// backend's CDI edits, computed from what was applied; and a Ready
// condition (plus an NVLink condition when topology.nvlink is Preferred and not
// met). A failure to write status is logged and does not fail prepare: the
// container runs the same with or without it, and failing would make the
// kubelet retry a prepare that succeeded. Unprepare does not touch the status
// (the claim is usually deallocated or deleted by then).
package plugin
