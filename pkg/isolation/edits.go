package isolation

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// Container paths the backends use.
const (
	// MPSPipeContainerDir is where a container finds its MPS daemon's pipes.
	MPSPipeContainerDir = "/tmp/nvidia-mps"
	// MPSLogContainerDir is where a container finds its MPS daemon's logs.
	MPSLogContainerDir = "/var/log/nvidia-mps"
	// HAMiCoreContainerLibrary is where HAMi-core's library is mounted.
	HAMiCoreContainerLibrary = "/usr/local/vgpu/libvgpu.so"
	// PreloadContainerFile is the dynamic loader's preload list.
	PreloadContainerFile = "/etc/ld.so.preload"
)

// GPU is one allocated GPU of a claim as its containers see it.
type GPU struct {
	UUID string
	// Shared is true for a share (device gpu-N-shared); limits apply only then.
	Shared bool
	// MemoryLimit is the share's memory limit in bytes.
	MemoryLimit int64
	// CoresLimit is the share's compute limit in percent (1..100).
	CoresLimit int64
}

// Claim is the input of [ClaimEdits]: the claim's GPUs in device order
// (the order of CUDA indices in the container) and how its shares are
// isolated.
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
}

// ClaimEdits returns the edits every device of the claim carries: the
// visible-device and limit environment and the isolation backend's edits.
// They are identical for all devices of a claim, so a container that gets
// several of them sees each variable and mount once.
func ClaimEdits(c Claim) (cdispec.ContainerEdits, error) {
	if len(c.GPUs) == 0 {
		return cdispec.ContainerEdits{}, errors.New("no GPUs")
	}
	uuids := make([]string, len(c.GPUs))
	var shares []int
	for i, g := range c.GPUs {
		if g.UUID == "" {
			return cdispec.ContainerEdits{}, fmt.Errorf("GPU at index %d has no UUID", i)
		}
		uuids[i] = g.UUID
		if g.Shared {
			if g.MemoryLimit <= 0 || g.CoresLimit <= 0 || g.CoresLimit > 100 {
				return cdispec.ContainerEdits{}, fmt.Errorf("share on GPU %s: invalid limits (memory %d bytes, cores %d%%)", g.UUID, g.MemoryLimit, g.CoresLimit)
			}
			shares = append(shares, i)
		}
	}
	visible := strings.Join(uuids, ",")
	env := []string{
		"NVIDIA_VISIBLE_DEVICES=" + visible,
		"CUDA_VISIBLE_DEVICES=" + visible,
	}
	if len(shares) == 1 {
		g := c.GPUs[shares[0]]
		env = append(env,
			"TESSERA_MEMORY_LIMIT="+itoa(g.MemoryLimit),
			"TESSERA_CORES_LIMIT="+itoa(g.CoresLimit))
	}
	for _, i := range shares {
		g := c.GPUs[i]
		env = append(env,
			"TESSERA_MEMORY_LIMIT_"+strconv.Itoa(i)+"="+itoa(g.MemoryLimit),
			"TESSERA_CORES_LIMIT_"+strconv.Itoa(i)+"="+itoa(g.CoresLimit))
	}
	edits := cdispec.ContainerEdits{Env: env}
	if len(shares) == 0 {
		return edits, nil
	}

	switch c.Isolation {
	case configapi.IsolationAdvisory, "":
		edits.Env = append(edits.Env, "TF_FORCE_GPU_ALLOW_GROWTH=true")
	case configapi.IsolationMPS:
		if len(c.GPUs) != 1 {
			return cdispec.ContainerEdits{}, fmt.Errorf("isolation MPS: the claim has %d GPUs; an MPS claim must be exactly one share (a client talks to one MPS daemon, which serves one GPU)", len(c.GPUs))
		}
		if c.MPS.PipeDir == "" || c.MPS.LogDir == "" {
			return cdispec.ContainerEdits{}, errors.New("isolation MPS: no MPS daemon for the share")
		}
		g := c.GPUs[0]
		edits.Env = append(edits.Env,
			"CUDA_MPS_PIPE_DIRECTORY="+MPSPipeContainerDir,
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0="+itoa(g.MemoryLimit>>20)+"M",
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+itoa(g.CoresLimit))
		edits.Mounts = append(edits.Mounts,
			bindMount(c.MPS.PipeDir, MPSPipeContainerDir, "rw"),
			bindMount(c.MPS.LogDir, MPSLogContainerDir, "rw"))
	case configapi.IsolationHAMiCore:
		if c.HAMiCore.Library == "" || c.HAMiCore.PreloadFile == "" {
			return cdispec.ContainerEdits{}, errors.New("isolation HAMiCore: HAMi-core is not configured on this node (--hami-core-library is empty)")
		}
		smLimit := int64(100)
		for _, i := range shares {
			g := c.GPUs[i]
			edits.Env = append(edits.Env, "CUDA_DEVICE_MEMORY_LIMIT_"+strconv.Itoa(i)+"="+itoa(g.MemoryLimit>>20)+"m")
			smLimit = min(smLimit, g.CoresLimit)
		}
		edits.Env = append(edits.Env, "CUDA_DEVICE_SM_LIMIT="+itoa(smLimit))
		edits.Mounts = append(edits.Mounts,
			bindMount(c.HAMiCore.Library, HAMiCoreContainerLibrary, "ro"),
			bindMount(c.HAMiCore.PreloadFile, PreloadContainerFile, "ro"))
	default:
		return cdispec.ContainerEdits{}, fmt.Errorf("unknown isolation %q (want %s, %s or %s)", c.Isolation,
			configapi.IsolationAdvisory, configapi.IsolationMPS, configapi.IsolationHAMiCore)
	}
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
