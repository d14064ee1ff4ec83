// Package v1alpha1 is the opaque device configuration of the gpu.tessera.dev DRA
// driver: apiVersion gpu.tessera.dev/v1alpha1, kind GpuConfig.
//
// Scheduling never reads it. It carries only what the node does when it prepares
// a claim: the isolation backend of a share, the share's compute and memory limits,
// and what a multi-GPU claim needs from NVLink. Users put it into a ResourceClaim
// (spec.devices.config[].opaque.parameters with driver gpu.tessera.dev); admins put
// it into a DeviceClass (spec.config[]).
//
// A GpuConfig in YAML:
//
//	apiVersion: gpu.tessera.dev/v1alpha1
//	kind: GpuConfig
//	sharing:
//	  isolation: MPS      # Advisory | MPS | HAMiCore | DriverMemory; default: the node's --default-isolation
//	  computeLimit: 50    # percent, 1..100, at least the cores the share was allocated
//	  memoryLimit: 16Gi   # at most the memory the share was allocated
//	topology:
//	  nvlink: Required    # Required | Preferred | Ignore (default)
//
// The life of a config, and which function does each step:
//
//   - DecodeStrict reads user input (a claim, a class, the admission webhook, the
//     CLI): unknown or duplicate fields and unknown kinds are errors that name the
//     field path.
//   - DecodeLenient reads back what another version of the plugin wrote (the
//     checkpoint): unknown fields are ignored.
//   - Validate checks the values of one config; Default fills what does not depend
//     on the allocation.
//   - ConfigForRequest merges the configs of an allocation (class configs, then
//     claim configs, later entries winning field by field) into the one config of
//     a request, decoded strictly, defaulted and validated.
//   - ShareLimits turns a config and the capacity a share was allocated into the
//     limits the isolation backend enforces.
//
// Everything here is pure: no I/O, no clock, no globals that change after init.
//
// The configuration is plain typed fields only. There is deliberately no field that
// injects environment variables, mounts, hooks or host paths into the container:
// what a GpuConfig can cause on the node is fixed by the driver, so an admin who
// allows users to write GpuConfigs does not allow them to write CDI edits.
package v1alpha1
