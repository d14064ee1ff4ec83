// Package scale measures how fast the real kube-scheduler places pods with
// Tessera claims on a large simulated cluster: fake nodes (kept Ready by kwok,
// no kubelet) that each carry exactly the ResourceSlices Tessera's kubelet plugin
// publishes for a mock node profile, and the real API server, controller manager
// and scheduler (hack/scale/cluster.sh starts them). For each cluster size and
// workload (plain pods, whole GPUs by claim or by extended resource, shares with
// and without a CEL selector, NVLink pairs) it creates a burst of pods, watches
// each one until it is bound, and reports pods/s and create→bound latency
// percentiles as Markdown and a PNG (results/scale.md, results/scale.png).
//
// The parts that need no cluster — the slices of a fake node, the workloads'
// objects, the aggregation of samples and the report — are pure and tested here;
// Bench and EnsureNodes need a cluster.
package scale
