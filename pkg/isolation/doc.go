// Package isolation turns the GPUs of one prepared claim, their limits and the
// claim's isolation backend into the container edits of its CDI spec, and
// keeps count of who holds the MPS control daemons that the MPS backend needs.
//
// The edits are pure functions ([DeviceEdits], [BackendEdits],
// [DeviceNodeEdits]) of their input: same input, same edits, no I/O.
// Everything with an external effect sits behind a small interface with a real
// and a fake implementation: [DaemonRunner] (the MPS control daemon),
// [DevNodes] (the host's /dev/nvidia* nodes) and the HAMi-core library check
// ([HAMiCore.Check]).
//
// # Environment of a container
//
// Each allocated device (one CDI device per allocation result) carries only
// what is true of its own GPU, and every variable is either named after that
// GPU or has the same value on every device. The kubelet gives a container the
// CDI devices of the claims and requests it references and the runtime merges
// their edits, so a container sees exactly its GPUs whatever it combines (one
// request of a claim, several claims, init and main containers with different
// claims):
//
//	NVIDIA_VISIBLE_DEVICES=void              GPUs come through CDI device nodes only
//	CUDA_DEVICE_ORDER=PCI_BUS_ID             CUDA indices follow the PCI bus order
//	TESSERA_GPU_<minor>=<uuid>               per GPU (minor: the N of gpu-N)
//	TESSERA_GPU_<minor>_MEMORY_LIMIT=<bytes> per share
//	TESSERA_GPU_<minor>_CORES_LIMIT=<percent>
//
// No list variable (CUDA_VISIBLE_DEVICES, a UUID list) is set: two devices
// would set it to two values and the runtime keeps the last.
//
// A MIG device ([MIGDeviceEdits]) is named after its GPU and instances
// instead, and never gets TESSERA_GPU_<minor> (the container does not get
// the GPU):
//
//	TESSERA_MIG_<minor>_<gi>_<ci>=MIG-<uuid>
//	TESSERA_MIG_<minor>_<gi>_<ci>_PROFILE=<profile>
//	TESSERA_MIG_<minor>_<gi>_<ci>_CAPS=/dev/nvidia-caps/nvidia-cap<G>,/dev/nvidia-caps/nvidia-cap<C>
//
// Its device nodes (the parent's and the two capability nodes, made on the
// host when missing: [DevNodes]) decide what CUDA sees. The plugin adds
// CUDA_VISIBLE_DEVICES=<MIG UUIDs> only to a claim made of MIG devices
// alone, with the same value on each of them.
//
// A GPU without a device in the NVIDIA container toolkit's CDI spec, on a
// node whose runtime is the NVIDIA runtime in legacy mode
// (--legacy-nvidia-runtime), gets its device nodes from [DevNodes] and a
// read-only mount of /dev/null at /var/run/nvidia-container-devices/<uuid>:
// the runtime's request for that GPU's driver libraries, one mount per GPU,
// so they compose too. NVIDIA_VISIBLE_DEVICES stays void there as well,
// which lets the node refuse the variable from unprivileged containers
// (docs/security.md, "The NVIDIA_VISIBLE_DEVICES escape").
//
// Per backend, on every share device of the claim:
//   - Advisory: TF_FORCE_GPU_ALLOW_GROWTH=true (nothing enforces the limit).
//   - MPS: CUDA_VISIBLE_DEVICES=<uuid>, CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps,
//     CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M,
//     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<percent>, the pipe directory of the
//     daemon of the GPU and the claim's namespace mounted read-only at
//     /tmp/nvidia-mps and that daemon's shared memory at /dev/shm (never its
//     logs). The daemon runs in a pod of its own (pkg/mpsdaemon); see
//     docs/mps.md.
//   - HAMiCore: CUDA_VISIBLE_DEVICES=<uuid>, CUDA_DEVICE_MEMORY_LIMIT_0=<MiB>m,
//     CUDA_DEVICE_SM_LIMIT=<percent>, the host's libvgpu.so mounted read-only
//     at /usr/local/vgpu/libvgpu.so and an /etc/ld.so.preload naming it.
//     Fails closed: without the library, preparation fails.
//
// MPS and HAMi-core read per-process variables keyed by CUDA index, so an MPS
// or HAMiCore claim must be exactly one share, and CUDA_VISIBLE_DEVICES makes
// it the one GPU CUDA uses in any container that references it (index 0): the
// limits never apply to another GPU. Other GPUs of such a container keep their
// device nodes and TESSERA_GPU_* variables but are hidden from CUDA.
//
// A claim uses one isolation backend for all its shares.
package isolation
