package isolation

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

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
// What the hook does (nvidia-container-toolkit pull request #2075, merged
// 2026-09-10; the merged source was not available to read, so this follows
// its description and review and the earlier branch cuda-memory-limits,
// whose code was read):
//   - it is a createRuntime hook, run by the runtime on the host:
//     nvidia-cdi-hook apply-cuda-memory-limits --driver-root <root> --gpu-id <uuid>...
//   - it reads NVIDIA_GPU_MEMORY_REQUEST (soft) and NVIDIA_GPU_MEMORY_LIMIT
//     (hard), singular, from the container's environment, each one whole
//     number of MiB for the whole container (not per GPU), request <= limit,
//     and applies both to every --gpu-id. The plural spellings of the
//     earlier, closed pull request #1995 are not read: a container with
//     them would run unlimited;
//   - without the variables it does nothing and succeeds;
//   - it needs cgroup v2 and a cgroupsPath of the systemd form
//     ("slice:prefix:name"), that is, the systemd cgroup driver: with
//     cgroupfs the container fails to start (the reviewers chose systemd
//     only, for now).
const (
	// DriverMemoryHookName is the nvidia-cdi-hook subcommand.
	DriverMemoryHookName = "apply-cuda-memory-limits"
	// DefaultNVIDIACDIHookPath is where the toolkit installs nvidia-cdi-hook.
	DefaultNVIDIACDIHookPath = "/usr/bin/nvidia-cdi-hook"
	// DriverMemoryMinDriverMajor is the first driver branch with
	// driver-enforced memory limits (r615, CUDA 13.4).
	DriverMemoryMinDriverMajor = 615
	// DriverMemoryRequestVar and DriverMemoryLimitVar are the hook's
	// variables (MiB).
	DriverMemoryRequestVar = "NVIDIA_GPU_MEMORY_REQUEST"
	DriverMemoryLimitVar   = "NVIDIA_GPU_MEMORY_LIMIT"
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
//	NVIDIA_GPU_MEMORY_REQUEST=<MiB>   soft limit (dmem.min): the share's memory limit
//	NVIDIA_GPU_MEMORY_LIMIT=<MiB>     hard limit (dmem.max): the same
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
			DriverMemoryRequestVar + "=" + itoa(mib),
			DriverMemoryLimitVar + "=" + itoa(mib),
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
// limits. Its paths are as the plugin sees them: HostRoot is where the
// host's / is mounted, as far as the plugin needs it (the chart mounts the
// host's cgroup file system and the hook's directory under /host).
type DriverMemoryProbe struct {
	// HostRoot is the host's root directory as the plugin sees it ("/"
	// outside a container; the chart mounts what is needed under /host).
	HostRoot string
	// HookPath is the host path of nvidia-cdi-hook; it is looked for under
	// HostRoot.
	HookPath string
	// DriverVersion is the driver's version as NVML reports it
	// ("615.12.03"); empty when no GPU was discovered.
	DriverVersion string
	// RunHook runs the hook (its path as the plugin sees it) with args and
	// returns what it printed, stdout and stderr together; nil runs it as a
	// child process that gets hookProbeTimeout to answer.
	RunHook func(ctx context.Context, path string, args ...string) ([]byte, error)
}

// hookProbeTimeout bounds the hook's answer to --help: a start of the plugin
// never waits longer for it.
const hookProbeTimeout = 10 * time.Second

// Detect checks, in order, and the first check that fails is the reason:
//   - the driver branch is at least r615;
//   - the host runs cgroup v2 with the dmem controller
//     (<HostRoot>/sys/fs/cgroup/cgroup.controllers names "dmem");
//   - the kubelet's pods cgroup is a systemd slice with dmem enabled in it.
//     It is found under the cgroup root, not assumed at /kubepods.slice: a
//     kubelet --cgroup-root of /custom.slice puts it at
//     /custom.slice/custom-kubepods.slice (systemd names a slice after its
//     path). A cgroupfs kubelet's kubepods directory is found too, and
//     refused with that reason: the toolkit's hook resolves a container's
//     cgroup only from the systemd driver's cgroupsPath, and the container
//     would fail to start;
//   - the hook is an executable regular file whose own help
//     (nvidia-cdi-hook --help, the COMMANDS: list) names
//     apply-cuda-memory-limits. nvidia-cdi-hook exits 0 on a subcommand it
//     does not know ("Unsupported CDI hook", so that new specs run on old
//     toolkits), so a toolkit without the subcommand would run every share
//     unlimited; its help is what the toolkit documents a hook by. Running
//     it needs the C library the hook links against, which the plugin's
//     image has.
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
	cgroupRoot := filepath.Join(root, "sys/fs/cgroup")
	controllers := filepath.Join(cgroupRoot, "cgroup.controllers")
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
	if reason := checkPodsCgroup(cgroupRoot); reason != "" {
		return fail("%s", reason)
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
	run := p.RunHook
	if run == nil {
		run = runHook
	}
	help, err := run(context.Background(), hook, "--help")
	if err != nil {
		return fail("the NVIDIA container toolkit's hook %s could not list its subcommands (%s --help: %v%s)", p.HookPath, hook, err, outputTail(help))
	}
	commands := hookCommands(help)
	if len(commands) == 0 {
		return fail("the NVIDIA container toolkit's hook %s lists no subcommands in its help (%s --help printed no COMMANDS: list%s): is it nvidia-cdi-hook?", p.HookPath, hook, outputTail(help))
	}
	if !slices.Contains(commands, DriverMemoryHookName) {
		return fail("the NVIDIA container toolkit's hook %s has no %s subcommand (it lists %s: a toolkit release without driver-enforced memory limits, which would accept the hook and apply nothing)", p.HookPath, DriverMemoryHookName, strings.Join(commands, ", "))
	}
	out.Capable = true
	return out
}

// checkPodsCgroup finds the kubelet's pods cgroup under the cgroup v2 root
// and returns why the hook cannot limit its containers, or "".
//
// The walk goes through systemd slices only (a slice's children are
// slices, scopes and services, and pods live in slices), plus the
// top-level directories that are not slices (a cgroupfs kubelet's
// --cgroup-root), to a bounded depth; it never lists a pod's own cgroups.
func checkPodsCgroup(cgroupRoot string) string {
	const maxDepth = 4
	var systemd, cgroupfs []string
	dirs := []string{cgroupRoot}
	for depth := 0; depth < maxDepth && len(dirs) > 0; depth++ {
		var next []string
		for _, dir := range dirs {
			entries, err := os.ReadDir(dir)
			if err != nil {
				if dir == cgroupRoot {
					return fmt.Sprintf("list %s: %v", dir, err)
				}
				continue
			}
			for _, e := range entries {
				if !e.IsDir() {
					continue
				}
				name, path := e.Name(), filepath.Join(dir, e.Name())
				switch {
				case name == "kubepods.slice" || strings.HasSuffix(name, "-kubepods.slice"):
					systemd = append(systemd, path)
				case name == "kubepods":
					cgroupfs = append(cgroupfs, path)
				case strings.HasSuffix(name, ".slice"):
					next = append(next, path)
				case depth == 0 && !strings.HasSuffix(name, ".scope") && !strings.HasSuffix(name, ".service"):
					next = append(next, path)
				}
			}
		}
		dirs = next
	}
	if len(systemd) == 0 {
		if len(cgroupfs) > 0 {
			return fmt.Sprintf("the kubelet uses the cgroupfs cgroup driver (its pods are under %s): the toolkit's hook finds a container's cgroup only from the systemd driver's \"slice:prefix:name\" cgroupsPath, and such a container would fail to start; use the systemd cgroup driver (kubelet and containerd)", strings.Join(cgroupfs, ", "))
		}
		return fmt.Sprintf("no cgroup of the kubelet's pods under %s (kubepods.slice, <root>-kubepods.slice or kubepods): is the host's cgroup file system mounted there?", cgroupRoot)
	}
	for _, pods := range systemd {
		controllers := filepath.Join(pods, "cgroup.controllers")
		data, err := os.ReadFile(controllers)
		switch {
		case err != nil:
			return fmt.Sprintf("read %s: %v", controllers, err)
		case !hasWord(data, "dmem"):
			return fmt.Sprintf("dmem is not delegated to the kubelet's pods (%s: %q): enable it in the subtree_control of every slice above %s", controllers, strings.TrimSpace(string(data)), filepath.Base(pods))
		}
	}
	return ""
}

// hookCommands returns the subcommands (and their aliases) that a command
// line program built with urfave/cli, as nvidia-cdi-hook is, lists in its
// help: the first words of the lines of its COMMANDS: section, up to the
// next section.
func hookCommands(help []byte) []string {
	var out []string
	in := false
	for _, line := range strings.Split(string(help), "\n") {
		trimmed := strings.TrimSpace(line)
		if !in {
			in = trimmed == "COMMANDS:"
			continue
		}
		if trimmed == "" {
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			break // the next section (GLOBAL OPTIONS:)
		}
		for _, f := range strings.Fields(trimmed) {
			out = append(out, strings.TrimSuffix(f, ","))
			if !strings.HasSuffix(f, ",") {
				break
			}
		}
	}
	return out
}

// runHook runs the hook as a child process with an empty environment.
func runHook(ctx context.Context, path string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, hookProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = []string{}
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return out, fmt.Errorf("no answer within %v", hookProbeTimeout)
	}
	return out, err
}

// outputTail is the end of a program's output for an error message.
func outputTail(out []byte) string {
	s := strings.TrimSpace(string(out))
	if s == "" {
		return ""
	}
	if len(s) > 200 {
		s = "…" + s[len(s)-200:]
	}
	return fmt.Sprintf("; it printed %q", s)
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
