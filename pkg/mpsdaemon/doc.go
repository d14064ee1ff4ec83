// Package mpsdaemon runs the MPS control daemon of each (GPU, trust domain)
// in a pod of its own, outside the kubelet plugin's lifecycle, and is the
// program that runs inside that pod.
//
// # The daemon pods ([Pods], an isolation.DaemonRunner)
//
// The plugin creates one pod per GPU and trust domain (namespace) through the
// API: on its own node (spec.nodeName), in its own namespace, owned by
// nothing (so deleting or upgrading the plugin's DaemonSet cascades to none of
// them), named after the node, the GPU and the domain and labelled and
// annotated so that the next plugin instance finds it.
// What the plugin may assume:
//
//   - Start returns only once the pod is Ready (the daemon's control socket
//     exists), within [Config.ReadyTimeout]; a prepare that waits on it
//     fails with the pod's state otherwise, and the kubelet's retry finds
//     the pod again.
//   - A running pod is adopted, never restarted: a new plugin instance
//     (restart, surge upgrade) gets the same pod, the same UID. A pod whose
//     spec hash differs from what this plugin would create (a changed image
//     or driver root) is replaced only while no client uses it; while one
//     may, it is kept and the difference logged.
//   - A pod that ended (Failed or Succeeded) or was deleted is created
//     again; a terminating pod is waited for first.
//   - Stop deletes the pod and does not wait: its daemon gets SIGTERM and
//     sends itself "quit".
//
// # The program in the pod ([Run], [Ready])
//
// On a real node the pod runs "tessera-kubelet-plugin mps-daemon run", which
// starts the driver's "nvidia-cuda-mps-control -f" from the read-only driver
// root, with CUDA_VISIBLE_DEVICES set to the GPU. The domain's pipe, log and
// shared-memory directories are the pod's own mounts (/mps/pipe, /mps/log,
// /dev/shm; never MPS's default /tmp/nvidia-mps, which NVIDIA's tooling
// mounts into every GPU container when the host has it). A driver root that
// is a whole root filesystem is chrooted into (so the daemon uses the host's
// libraries), with /mps bound over its /tmp and /dev/shm over its /dev/shm in
// the pod's mount namespace; one without a dynamic loader (COS) is not, and
// the binary runs with its libraries on LD_LIBRARY_PATH (planLaunch). With
// a mock GPU profile the same program runs a fake daemon that creates the
// control socket and pid file in the pipe directory, so the whole pod
// lifecycle runs in CI. Readiness is a probe ("mps-daemon ready") that
// checks the ready file the program writes once the control socket exists.
package mpsdaemon
