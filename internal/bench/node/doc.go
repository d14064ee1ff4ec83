// Package node measures the node side of Tessera: what the kubelet plugin
// of pkg/plugin costs per claim, in memory, and in API writes. It backs the
// "Node side" section of the fleet benchmark report (cmd/tessera-bench).
//
// [Run] builds one plugin in mock mode through pkg/plugin's exported API, over
// the GPUs of a mock NVML profile (hgx-h100 by default), with a real
// checkpoint file in a temporary directory (on a node it is on the root
// disk), real CDI specs and HAMiCore claim directories in another, on a tmpfs
// when /dev/shm is one (on a node they are under /var/run, on the /run
// tmpfs), MPS over the fake daemon runner that mock nodes use, and HAMi-core
// over a dummy library file. The report names both filesystems. Every
// context it passes (to checkpoint.Open, plugin.New, prepare, unprepare, the
// ResourceSlice controller) discards logs, so formatting log lines is not
// timed.
//
// What the caller may assume:
//
//   - Latencies are wall-clock times of one PrepareResourceClaims call plus one
//     UnprepareResourceClaims call for one claim, measured in-process (no gRPC,
//     no kubelet). Claims are shaped like kube-scheduler's allocator writes
//     them: a share of gpu-N-shared with a ShareID (a fresh UUID) and
//     ConsumedCapacity {memory, cores}, and an opaque GpuConfig from the claim
//     choosing the isolation backend.
//   - The concurrent rounds start Options.Concurrent goroutines at once, each
//     preparing and then unpreparing its own claim; the shares are spread round
//     robin over the GPUs' shared devices and fit on them together, as the
//     scheduler would have placed them. Every claim is unprepared before the
//     next round, so every round starts from an empty node.
//   - Memory figures come from /proc/self/status and are therefore about the
//     whole calling process: run Run in a process of its own (cmd/tessera-bench
//     re-executes itself for this) to get the plugin's footprint. On systems
//     without /proc they are zero.
//   - API writes are counted on client-go's fake clientset driven by
//     k8s.io/dynamic-resource-allocation/resourceslice's controller, the one
//     kubeletplugin.Helper.PublishResources runs, fed by [publish.Inventory] as
//     in the kubelet plugin. Only create, update, patch and delete of
//     resourceslices count; reads (the node lookup, list and watch) do not.
//   - Run returns an error, and no report, if any prepare or unprepare fails
//     or the slices do not appear within a few seconds. It cleans up its
//     temporary directory.
//   - Nothing in the result is asserted by tests except its shape: timings
//     depend on the machine.
package node
