package isolation

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// The DriverMemory backend: the NVIDIA driver enforces the share's memory
// through the cgroup v2 dmem controller (NVIDIA's "MPS v3 memory
// partitioning": the hard limit is dmem.max, allocations beyond it fail with
// out-of-memory; the soft limit is dmem.min). The NVIDIA container toolkit's
// CDI hook apply-cuda-memory-limits sets both on the container's cgroup
// through NVML (nvmlDeviceSetMemoryLimits_v1) before the container starts.
//
// What the hook does (nvidia-container-toolkit, cmd/nvidia-cdi-hook/
// apply-cuda-memory-limits, branch cuda-memory-limits, 2026-07):
//   - it is a createRuntime hook, run by the runtime on the host:
//     nvidia-cdi-hook apply-cuda-memory-limits --driver-root <root> --gpu-id <uuid>...
//   - it reads NVIDIA_GPU_MEMORY_REQUESTS (soft) and NVIDIA_GPU_MEMORY_LIMITS
//     (hard) from the container's environment, each one whole number of MiB
//     for the whole container (not per GPU), request <= limit, and applies
//     both to every --gpu-id;
//   - without either variable it does nothing and succeeds;
//   - it needs cgroup v2 and a cgroupsPath of the systemd form
//     ("slice:prefix:name"), that is, the systemd cgroup driver.
const (
	// DriverMemoryHookName is the nvidia-cdi-hook subcommand.
	DriverMemoryHookName = "apply-cuda-memory-limits"
	// DefaultNVIDIACDIHookPath is where the toolkit installs nvidia-cdi-hook.
	DefaultNVIDIACDIHookPath = "/usr/bin/nvidia-cdi-hook"
	// DriverMemoryMinDriverMajor is the first driver branch with
	// driver-enforced memory limits (r615, CUDA 13.4).
	DriverMemoryMinDriverMajor = 615
	// driverMemoryRequestsVar and driverMemoryLimitsVar are the hook's
	// variables (MiB).
	driverMemoryRequestsVar = "NVIDIA_GPU_MEMORY_REQUESTS"
	driverMemoryLimitsVar   = "NVIDIA_GPU_MEMORY_LIMITS"
)

// DriverMemory is the node's ability to have the driver enforce a share's
// memory, as [DriverMemoryProbe.Detect] found it at start.
type DriverMemory struct {
	// HookPath is the host path of nvidia-cdi-hook (flag
	// --nvidia-cdi-hook-path). The runtime runs it on the host.
	HookPath string
	// DriverRoot is the host path of the driver's root, the hook's
	// --driver-root (where it finds libnvidia-ml.so.1).
	DriverRoot string
	// Capable is true when the node can enforce driver memory limits;
	// otherwise Reason says why not.
	Capable bool
	Reason  string
}

// Check fails closed: a share that asks for DriverMemory on a node that
// cannot enforce it is refused, with the reason and how to select capable
// nodes.
func (d DriverMemory) Check() error {
	if d.Capable {
		if d.HookPath == "" || !filepath.IsAbs(d.HookPath) {
			return fmt.Errorf("isolation DriverMemory: the hook path %q (--nvidia-cdi-hook-path) is not an absolute path", d.HookPath)
		}
		return nil
	}
	reason := d.Reason
	if reason == "" {
		reason = "not detected"
	}
	return fmt.Errorf("isolation DriverMemory: this node cannot enforce driver memory limits (%s); refusing to run the share without them. "+
		`Select capable nodes with device.attributes["gpu.tessera.dev"].driverMemoryLimits == true`, reason)
}

// driverMemoryEdits are the DriverMemory edits of the claim's one share g:
//
//	NVIDIA_GPU_MEMORY_REQUESTS=<MiB>   soft limit (dmem.min): the share's memory limit
//	NVIDIA_GPU_MEMORY_LIMITS=<MiB>     hard limit (dmem.max): the same
//	hook createRuntime: <HookPath> apply-cuda-memory-limits --driver-root <DriverRoot> --gpu-id <uuid>
//
// Soft and hard are both the share's memory limit, rounded down to whole
// MiB: memory is never overcommitted, so the whole limit is also guaranteed.
// The variables are one value for the whole container, which is why a
// DriverMemory claim is exactly one share. The limit is per container
// cgroup, not per claim: each container that uses the claim gets its own
// dmem.max, so a claim used by two containers (or pods) gets twice the
// memory.
func driverMemoryEdits(g GPU, d DriverMemory) (cdispec.ContainerEdits, error) {
	if err := d.Check(); err != nil {
		return cdispec.ContainerEdits{}, err
	}
	if d.DriverRoot == "" || !filepath.IsAbs(d.DriverRoot) {
		return cdispec.ContainerEdits{}, fmt.Errorf("isolation DriverMemory: the driver root %q is not an absolute host path", d.DriverRoot)
	}
	mib := g.MemoryLimit >> 20
	if mib < 1 {
		return cdispec.ContainerEdits{}, fmt.Errorf("isolation DriverMemory: share on GPU %s: memory limit %d bytes is less than 1 MiB", g.UUID, g.MemoryLimit)
	}
	return cdispec.ContainerEdits{
		Env: []string{
			driverMemoryRequestsVar + "=" + itoa(mib),
			driverMemoryLimitsVar + "=" + itoa(mib),
		},
		Hooks: []*cdispec.Hook{{
			HookName: cdiapi.CreateRuntimeHook,
			Path:     d.HookPath,
			Args:     []string{"nvidia-cdi-hook", DriverMemoryHookName, "--driver-root", d.DriverRoot, "--gpu-id", g.UUID},
			Env:      []string{"NVIDIA_CTK_DEBUG=false"},
		}},
	}, nil
}

// DriverMemoryProbe finds out whether this node can enforce driver memory
// limits. Its paths are as the plugin sees them (HostRoot is where the
// host's / is mounted); Detect only reads files.
type DriverMemoryProbe struct {
	// HostRoot is the host's root directory as the plugin sees it ("/"
	// outside a container; the chart mounts it at /host).
	HostRoot string
	// HookPath is the host path of nvidia-cdi-hook; it is looked for under
	// HostRoot.
	HookPath string
	// DriverVersion is the driver's version as NVML reports it
	// ("615.12.03"); empty when no GPU was discovered.
	DriverVersion string
}

// Detect checks, in order: the driver branch is at least r615; the host's
// root cgroup is cgroup v2 and offers the dmem controller
// (<HostRoot>/sys/fs/cgroup/cgroup.controllers names "dmem"); the hook is
// an executable regular file. The first check that fails is the reason.
func (p DriverMemoryProbe) Detect() DriverMemory {
	out := DriverMemory{HookPath: p.HookPath}
	fail := func(format string, args ...any) DriverMemory {
		out.Reason = fmt.Sprintf(format, args...)
		return out
	}
	if p.DriverVersion == "" {
		return fail("no NVIDIA driver version (no GPU discovered)")
	}
	major, err := driverMajor(p.DriverVersion)
	if err != nil {
		return fail("driver version %q: %v", p.DriverVersion, err)
	}
	if major < DriverMemoryMinDriverMajor {
		return fail("driver %s is older than r%d (CUDA 13.4), the first with driver-enforced memory limits", p.DriverVersion, DriverMemoryMinDriverMajor)
	}
	root := p.HostRoot
	if root == "" {
		root = "/"
	}
	controllers := filepath.Join(root, "sys/fs/cgroup/cgroup.controllers")
	data, err := os.ReadFile(controllers)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fail("%s not found: the host does not run cgroup v2", controllers)
		}
		return fail("read %s: %v", controllers, err)
	}
	if !hasWord(data, "dmem") {
		return fail("the host's cgroup v2 has no dmem controller (%s: %q; it needs Linux 6.14 or newer with CONFIG_CGROUP_DMEM)", controllers, strings.TrimSpace(string(data)))
	}
	// The hook resolves a container's cgroup from the systemd driver's
	// "slice:prefix:name" cgroupsPath, and dmem.max exists in a pod's
	// cgroup only when dmem is delegated down to the kubelet's slice.
	pods := filepath.Join(root, "sys/fs/cgroup/kubepods.slice/cgroup.controllers")
	data, err = os.ReadFile(pods)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fail("%s not found: the kubelet does not use the systemd cgroup driver, which the toolkit's hook needs", pods)
	case err != nil:
		return fail("read %s: %v", pods, err)
	case !hasWord(data, "dmem"):
		return fail("dmem is not delegated to the kubelet's pods (%s: %q): enable it in the subtree_control of the slices above kubepods.slice", pods, strings.TrimSpace(string(data)))
	}
	if p.HookPath == "" || !filepath.IsAbs(p.HookPath) {
		return fail("the hook path %q (--nvidia-cdi-hook-path) is not an absolute path", p.HookPath)
	}
	hook := filepath.Join(root, p.HookPath)
	fi, err := os.Stat(hook)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fail("the NVIDIA container toolkit's hook %s is not installed (looked at %s)", p.HookPath, hook)
	case err != nil:
		return fail("the NVIDIA container toolkit's hook %s: %v", hook, err)
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return fail("the NVIDIA container toolkit's hook %s is not an executable file (mode %s)", hook, fi.Mode())
	}
	// nvidia-cdi-hook exits 0 on a subcommand it does not know ("Unsupported
	// CDI hook"), so a toolkit without apply-cuda-memory-limits would run
	// every share unlimited: the binary must name the subcommand.
	if ok, err := fileContains(hook, []byte(DriverMemoryHookName)); err != nil {
		return fail("read the hook %s: %v", hook, err)
	} else if !ok {
		return fail("the NVIDIA container toolkit's hook %s has no %s subcommand (a toolkit release without driver-enforced memory limits; it would accept the hook and apply nothing)", hook, DriverMemoryHookName)
	}
	out.Capable = true
	return out
}

// fileContains reports whether the file holds needle, reading it in chunks.
func fileContains(path string, needle []byte) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20+len(needle))
	carry := 0
	for {
		n, err := f.Read(buf[carry:])
		if bytes.Contains(buf[:carry+n], needle) {
			return true, nil
		}
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		// Keep the tail, in case the needle spans two reads.
		keep := min(len(needle)-1, carry+n)
		copy(buf, buf[carry+n-keep:carry+n])
		carry = keep
	}
}

// driverMajor is the major number of an NVIDIA driver version ("615.12.03").
func driverMajor(version string) (int, error) {
	head, _, _ := strings.Cut(strings.TrimSpace(version), ".")
	n, err := strconv.Atoi(head)
	if err != nil || n < 0 {
		return 0, errors.New("not a driver version")
	}
	return n, nil
}

func hasWord(data []byte, word string) bool {
	for _, f := range bytes.Fields(data) {
		if string(f) == word {
			return true
		}
	}
	return false
}
