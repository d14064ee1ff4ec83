// Package cdi writes and removes the transient CDI spec files through which the
// container runtime applies a prepared claim to its containers, and finds the
// NVIDIA container toolkit's own CDI devices on the node.
//
// # Spec shape
//
// Every prepared claim gets exactly one spec file in the CDI root (by default
// /var/run/cdi), named "k8s.gpu.tessera.dev-claim_<claim uid>.json", of kind
// "k8s.gpu.tessera.dev/claim". It holds one CDI device per allocated device of
// the claim, named "<claim uid>-<device>" for a whole GPU ("…-gpu-3") and
// "<claim uid>-<device>-<share id>" for a share ("…-gpu-3-shared-<share id>").
// The claim UID in every device name means a name is never reused by a later
// claim, so a runtime's spec cache can never return stale edits for it.
//
// # Guarantees
//
//   - [Dir.Write] validates the spec with the CDI library before anything
//     touches the disk and replaces the file atomically (temporary file and
//     rename, done by the library): a reader sees the old spec or the new one.
//     Writing the same claim twice with the same devices yields the same file
//     and the same CDI device IDs.
//   - [Dir.Remove] is idempotent: removing a claim without a spec succeeds.
//   - [Dir.List] returns the claim UIDs of every spec this package wrote into
//     the root, and nothing else: files of other vendors, and the device
//     metadata specs that the kubeletplugin helper writes for this driver, are
//     never listed and so never garbage-collected by the plugin.
package cdi
