package isolation

import (
	"errors"
	"fmt"
	"strconv"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// Container paths the backends use.
const (
	// HAMiCoreContainerLibrary is where HAMi-core's library is mounted.
	HAMiCoreContainerLibrary = "/usr/local/vgpu/libvgpu.so"
	// PreloadContainerFile is the dynamic loader's preload list.
	PreloadContainerFile = "/etc/ld.so.preload"
)

// GPU is one allocated GPU of a claim as its containers see it.
type GPU struct {
	UUID string
	// Minor is the GPU's device minor (the N of gpu-N); the per-GPU
	// variables are named after it.
	Minor int
	// Shared is true for a share (device gpu-N-shared or gpu-N-lent);
	// limits apply only then.
	Shared bool
	// Preemptible is true for a borrower's share of a lent GPU
	// (gpu-N-lent): the container sees TESSERA_PREEMPTIBLE=true.
	Preemptible bool
	// MemoryLimit is the share's memory limit in bytes.
	MemoryLimit int64
	// CoresLimit is the share's compute limit in percent (1..100).
	CoresLimit int64
}

func (g GPU) check() error {
	if g.UUID == "" {
		return fmt.Errorf("GPU gpu-%d has no UUID", g.Minor)
	}
	if g.Shared && (g.MemoryLimit <= 0 || g.CoresLimit <= 0 || g.CoresLimit > 100) {
		return fmt.Errorf("share on GPU %s: invalid limits (memory %d bytes, cores %d%%)", g.UUID, g.MemoryLimit, g.CoresLimit)
	}
	return nil
}

// DeviceEdits returns the environment of one allocated device (one CDI
// device): which GPU it is and, for a share, its limits. Every variable is
// either named after the GPU's minor or has the same value on every device,
// so the runtime can merge the edits of any set of devices (one request of a
// claim, several claims, init and main containers with different claims)
// without one device's value replacing another's: a container sees exactly
// the GPUs of the devices it references.
//
//	NVIDIA_VISIBLE_DEVICES=void       the container gets GPUs through CDI devices only
//	CUDA_DEVICE_ORDER=PCI_BUS_ID      CUDA indices follow the PCI bus order
//	TESSERA_GPU_<minor>=<uuid>
//	TESSERA_GPU_<minor>_MEMORY_LIMIT=<bytes>   shares only
//	TESSERA_GPU_<minor>_CORES_LIMIT=<percent>  shares only
//	TESSERA_PREEMPTIBLE=true          a borrower's share of a lent GPU: it is
//	                                  evicted when the GPU's owner needs it
//
// With legacyRuntime (a real node without the NVIDIA toolkit's CDI device
// for the GPU) the device also mounts the host's /dev/null at
// /var/run/nvidia-container-devices/<uuid>: a legacy-mode NVIDIA runtime
// configured with accept-nvidia-visible-devices-as-volume-mounts = true
// reads the GPUs a container asks for from such mounts (source /dev/null,
// one per GPU, so any set of devices merges into exactly their GPUs) and
// adds the driver's libraries for them. NVIDIA_VISIBLE_DEVICES stays void,
// so a node may set accept-nvidia-visible-devices-envvar-when-unprivileged
// = false: then a pod without a claim that sets NVIDIA_VISIBLE_DEVICES=all
// itself (every CUDA base image does) gets no GPU from the runtime. A pod
// can ask for such a mount only with a hostPath volume of /dev/null, which
// Pod Security's baseline level refuses; a variable it can always set.
// docs/security.md has the node settings.
func DeviceEdits(g GPU, legacyRuntime bool) (cdispec.ContainerEdits, error) {
	if err := g.check(); err != nil {
		return cdispec.ContainerEdits{}, err
	}
	var edits cdispec.ContainerEdits
	if legacyRuntime {
		edits.Mounts = []*cdispec.Mount{bindMount("/dev/null", LegacyDeviceMount(g.UUID), "ro")}
	}
	prefix := GPUVariable(g.Minor)
	env := []string{
		"NVIDIA_VISIBLE_DEVICES=void",
		"CUDA_DEVICE_ORDER=PCI_BUS_ID",
		prefix + "=" + g.UUID,
	}
	if g.Shared {
		env = append(env,
			prefix+"_MEMORY_LIMIT="+itoa(g.MemoryLimit),
			prefix+"_CORES_LIMIT="+itoa(g.CoresLimit))
	}
	if g.Preemptible {
		// The same value on every device, so it composes.
		env = append(env, "TESSERA_PREEMPTIBLE=true")
	}
	edits.Env = env
	return edits, nil
}

// LegacyDeviceListRoot is where the NVIDIA container runtime reads device
// requests made as volume mounts (the toolkit's
// DeviceListAsVolumeMountsRoot).
const LegacyDeviceListRoot = "/var/run/nvidia-container-devices"

// LegacyDeviceMount is the container path whose /dev/null mount asks a
// legacy-mode NVIDIA runtime for the GPU with this UUID.
func LegacyDeviceMount(uuid string) string { return LegacyDeviceListRoot + "/" + uuid }

// GPUVariable is the name of the variable that holds the UUID of GPU minor
// in a container, and the prefix of its limit variables.
func GPUVariable(minor int) string { return "TESSERA_GPU_" + strconv.Itoa(minor) }

// Claim is the input of [BackendEdits]: the claim's distinct GPUs and how its
// shares are isolated.
type Claim struct {
	GPUs []GPU
	// Isolation is the backend of the claim's shares; ignored without shares.
	Isolation configapi.Isolation
	// MPS is the daemon serving the claim's share (MPS only), from
	// [MPS.Acquire].
	MPS Daemon
	// HAMiCore is the node's HAMi-core installation (HAMiCore only). It must
	// have passed [HAMiCore.Check].
	HAMiCore HAMiCore
	// HAMiCoreClaimDir is the host directory of the claim's HAMi-core shared
	// region, [HAMiCore.ClaimDir] (HAMiCore only).
	HAMiCoreClaimDir string
	// DriverMemory is the node's driver-enforced memory limits
	// (DriverMemory only); [DriverMemory.Check] must pass.
	DriverMemory DriverMemory
}

// BackendEdits returns the isolation backend's edits for the claim's shares;
// the plugin adds them to every share device of the claim. They are empty for
// a claim without shares.
//
// MPS and HAMi-core read per-process variables keyed by CUDA index, which no
// per-device scheme can compose, so an MPS or HAMiCore claim must be exactly
// one share, and its device also sets CUDA_VISIBLE_DEVICES to that GPU: in
// any container it is then the one GPU CUDA uses (index 0), with its limits.
// A container that references other GPUs besides still gets their device
// nodes and TESSERA_GPU_* variables, but CUDA hides them; two enforced shares
// in one container leave CUDA the last one, whose variables all win together.
// The limits never apply to the wrong GPU, with one exception that is
// HAMi-core's: it takes CUDA device 0 for NVML index 0 (the UUID in
// CUDA_VISIBLE_DEVICES parses as 0), and NVML in the container enumerates
// all of its GPUs in PCI bus order, so in a container that also holds a GPU
// with a lower bus id HAMi-core's utilization watcher (its compute
// throttling) reads that GPU. Admission sees claims, not pods, and cannot
// warn; docs/ARCHITECTURE.md says what to do.
//
// What the limits cover is per process or per container, not per claim:
// MPS limits each client process (N CUDA processes may pin N times the
// memory), DriverMemory each container's cgroup (a claim used by two
// containers gets twice the memory), and HAMi-core counts a claim's usage
// per PID namespace (processes of two pods, or of two containers without
// shareProcessNamespace, overwrite each other's slots).
func BackendEdits(c Claim) (cdispec.ContainerEdits, error) {
	if len(c.GPUs) == 0 {
		return cdispec.ContainerEdits{}, errors.New("no GPUs")
	}
	var shares []int
	for i, g := range c.GPUs {
		if err := g.check(); err != nil {
			return cdispec.ContainerEdits{}, err
		}
		if g.Shared {
			shares = append(shares, i)
		}
	}
	var edits cdispec.ContainerEdits
	if len(shares) == 0 {
		return edits, nil
	}

	switch c.Isolation {
	case configapi.IsolationAdvisory, "":
		edits.Env = append(edits.Env, "TF_FORCE_GPU_ALLOW_GROWTH=true")
		return edits, nil
	case configapi.IsolationMPS, configapi.IsolationHAMiCore, configapi.IsolationDriverMemory:
	default:
		return cdispec.ContainerEdits{}, fmt.Errorf("unknown isolation %q (want %s)", c.Isolation,
			configapi.FormatIsolations(configapi.SupportedIsolations))
	}
	if len(c.GPUs) != 1 {
		return cdispec.ContainerEdits{}, fmt.Errorf("isolation %s: the claim has %d GPUs; an %s claim must be exactly one share (its limits are per process, for the one GPU CUDA uses)", c.Isolation, len(c.GPUs), c.Isolation)
	}
	g := c.GPUs[0]
	edits.Env = append(edits.Env, "CUDA_VISIBLE_DEVICES="+g.UUID)
	if c.Isolation == configapi.IsolationMPS {
		mps, err := mpsEdits(g, c.MPS)
		if err != nil {
			return cdispec.ContainerEdits{}, err
		}
		edits.Env = append(edits.Env, mps.Env...)
		edits.Mounts = append(edits.Mounts, mps.Mounts...)
		return edits, nil
	}
	var backend cdispec.ContainerEdits
	var err error
	switch c.Isolation {
	case configapi.IsolationHAMiCore:
		backend, err = hamiCoreEdits(g, c.HAMiCore, c.HAMiCoreClaimDir)
	case configapi.IsolationDriverMemory:
		backend, err = driverMemoryEdits(g, c.DriverMemory)
	}
	if err != nil {
		return cdispec.ContainerEdits{}, err
	}
	edits.Env = append(edits.Env, backend.Env...)
	edits.Mounts = append(edits.Mounts, backend.Mounts...)
	edits.Hooks = append(edits.Hooks, backend.Hooks...)
	return edits, nil
}

func bindMount(host, container, mode string) *cdispec.Mount {
	return &cdispec.Mount{
		HostPath:      host,
		ContainerPath: container,
		Type:          "bind",
		Options:       []string{"bind", mode, "nosuid", "nodev"},
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
