// Package publish keeps a node's ResourceSlices in line with its GPUs: an
// [Inventory] discovers the GPUs (through NVML, [NVMLDiscovery]), builds
// their devices with package model, adds the health tracker's taints and
// the taints of discovery failures and GPU conditions, and publishes them
// through a [Publisher] (kubeletplugin.Helper) whenever any of that changes.
// It reports what it finds on the Node (events), on /healthz
// ([Inventory.HealthzHandler]) and in the discovery metrics
// ([Inventory.DiscoverySnapshot]). [FollowHealth] and [HealthTaints] tie an
// Inventory to a health.Tracker; [DynamicMIG] names the GPUs published with
// dynamic MIG.
package publish
