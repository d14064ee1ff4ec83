// Package isolation turns the GPUs of one prepared claim, their limits and the
// claim's isolation backend into the container edits of its CDI spec, and runs
// the MPS control daemons that the MPS backend needs.
//
// The edits are pure functions ([ClaimEdits], [DeviceNodeEdits]) of their
// input: same input, same edits, no I/O. Everything with an external effect
// sits behind a small interface with a real and a fake implementation:
// [DaemonRunner] (the MPS control daemon), [DevNodes] (the host's
// /dev/nvidia* nodes) and the HAMi-core library check ([HAMiCore.Check]).
//
// # Environment of a container
//
// Always:
//
//	NVIDIA_VISIBLE_DEVICES=<uuid>[,<uuid>…]   the claim's GPUs, in device order
//	CUDA_VISIBLE_DEVICES=<uuid>[,<uuid>…]     the same
//
// For each share at CUDA index i (its position in the lists above):
//
//	TESSERA_MEMORY_LIMIT_<i>=<bytes>   TESSERA_CORES_LIMIT_<i>=<percent>
//
// and, when the claim has exactly one share (the usual case), the same
// without the suffix: TESSERA_MEMORY_LIMIT, TESSERA_CORES_LIMIT.
//
// Per backend, when the claim has shares:
//   - Advisory: TF_FORCE_GPU_ALLOW_GROWTH=true (nothing enforces the limit).
//   - MPS: CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps,
//     CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M,
//     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<percent>, and the GPU's daemon pipe
//     and log directories mounted at /tmp/nvidia-mps and /var/log/nvidia-mps.
//     An MPS claim must consist of exactly one share: a client talks to one
//     control daemon, and the daemons are per GPU.
//   - HAMiCore: CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m for each share,
//     CUDA_DEVICE_SM_LIMIT=<percent> (the smallest core limit of the claim's
//     shares, since HAMi-core takes one value), the host's libvgpu.so mounted
//     read-only at /usr/local/vgpu/libvgpu.so and an /etc/ld.so.preload naming
//     it. Fails closed: without the library, preparation fails.
//
// A claim uses one isolation backend for all its shares.
package isolation
