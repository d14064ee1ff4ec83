// Package model turns a node's GPU inventory into what Tessera publishes to
// Kubernetes: the ResourceSlices of the node's pool (Resources, ResourceSlices) and
// the DeviceClasses users claim from (DeviceClasses).
//
// Everything here is pure: no NVML, no sysfs, no API server. Facts that need I/O
// (the PCIe root complex of a GPU) come in already resolved, through PCIeRoots.
//
// # The published shape
//
// Per physical GPU with minor number N that is not in MIG mode:
//
//   - counter set gpu-N with counters memory (bytes) and cores (100);
//   - device gpu-N, the whole GPU: capacity memory and cores, consuming all of gpu-N;
//   - device gpu-N-shared, fractions of the GPU: allowMultipleAllocations, capacity
//     memory (request policy: default all, min MinShareMemory, step 1Mi) and cores
//     (request policy: default 0, 0..100 in steps of 1), also consuming all of gpu-N.
//
// Memory is what workloads can use: NVML's total less the driver's reserved
// memory (gpu.GPU.MemoryBytes), in whole MiB. A share's memory includes the
// CUDA contexts of its processes, so no share is smaller than MinShareMemory.
//
// Because both devices consume the whole counter set and the scheduler charges a
// shared device's counters once while it holds any share, a GPU is either held
// whole by one claim or shared by many, never both; the sum of the shares of a GPU
// never exceeds its memory or cores. Counter sets sit in their own slices (the API
// requires it), at most ResourceSliceMaxCounterSets per slice, ahead of the device
// slices (at most ResourceSliceMaxDevicesWithAdvancedFeatures devices each).
//
// A GPU in MIG mode publishes MIG devices instead (type "mig", DeviceClass
// mig.gpu.tessera.dev; mig.go, docs/mig.md): statically, one exclusive device
// gpu-N-mig-<GI>-<CI> per existing compute instance; with dynamic MIG, one
// device gpu-N-mig-<profile>-<start> per placement of every profile, all
// consuming the counter set gpu-N-counters (memory-slice-0 … memory-slice-7
// of value 1, compute-slices, and the engines), so that the scheduler
// allocates only placements that do not overlap and fit the GPU's compute
// slices and engines together; placements that an instance held by a
// Tessera claim blocks are left out.
package model
