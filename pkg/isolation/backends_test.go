package isolation

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// TestBackendEditsPerBackend: the exact edits each enforcing backend adds to
// a share's device: variables, mounts (files only, and HAMi-core's
// per-claim directory) and hooks.
func TestBackendEditsPerBackend(t *testing.T) {
	share := GPU{UUID: "GPU-7", Minor: 3, Shared: true, MemoryLimit: 10<<30 + 512<<10, CoresLimit: 30}
	hami := HAMiCore{Library: "/var/lib/tessera/hami-core/libvgpu.so", PreloadFile: "/p/hami/ld.so.preload", ClaimRoot: "/p/hami/claims"}
	dm := DriverMemory{HookPath: "/usr/local/nvidia/toolkit/nvidia-cdi-hook", DriverRoot: "/run/nvidia/driver", Capable: true}
	ro := []string{"bind", "ro", "nosuid", "nodev"}
	for name, tc := range map[string]struct {
		in   Claim
		want cdispec.ContainerEdits
	}{
		"Advisory": {
			in:   Claim{GPUs: []GPU{share}, Isolation: configapi.IsolationAdvisory},
			want: cdispec.ContainerEdits{Env: []string{"TF_FORCE_GPU_ALLOW_GROWTH=true"}},
		},
		"HAMiCore: per-device variables of CUDA index 0, one region per claim": {
			in: Claim{GPUs: []GPU{share}, Isolation: configapi.IsolationHAMiCore, HAMiCore: hami, HAMiCoreClaimDir: hami.ClaimDir("uid-1")},
			want: cdispec.ContainerEdits{
				Env: []string{
					"CUDA_VISIBLE_DEVICES=GPU-7",
					"CUDA_DEVICE_MEMORY_LIMIT_0=10240m", // rounded down to whole MiB
					"CUDA_DEVICE_SM_LIMIT_0=30",
					"CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpulock/cudevshr.cache",
				},
				Mounts: []*cdispec.Mount{
					{HostPath: "/var/lib/tessera/hami-core/libvgpu.so", ContainerPath: "/usr/local/vgpu/libvgpu.so", Type: "bind", Options: ro},
					{HostPath: "/p/hami/ld.so.preload", ContainerPath: "/etc/ld.so.preload", Type: "bind", Options: ro},
					{HostPath: "/p/hami/claims/uid-1", ContainerPath: "/tmp/vgpulock", Type: "bind", Options: []string{"bind", "rw", "nosuid", "nodev"}},
				},
			},
		},
		"DriverMemory: the toolkit's createRuntime hook and MiB variables": {
			in: Claim{GPUs: []GPU{share}, Isolation: configapi.IsolationDriverMemory, DriverMemory: dm},
			want: cdispec.ContainerEdits{
				Env: []string{
					"CUDA_VISIBLE_DEVICES=GPU-7",
					"NVIDIA_GPU_MEMORY_REQUEST=10240",
					"NVIDIA_GPU_MEMORY_LIMIT=10240",
				},
				Hooks: []*cdispec.Hook{{
					HookName: "createRuntime",
					Path:     "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
					Args:     []string{"nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/run/nvidia/driver", "--gpu-id", "GPU-7"},
					Env:      []string{"NVIDIA_CTK_DEBUG=false"},
				}},
			},
		},
		"a whole GPU gets no backend edits": {
			in: Claim{GPUs: []GPU{{UUID: "GPU-8", Minor: 4}}, Isolation: configapi.IsolationDriverMemory},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := BackendEdits(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("edits (-want +got):\n%s", diff)
			}
			for _, m := range got.Mounts {
				if m.ContainerPath != HAMiCoreContainerSharedDir && !strings.Contains(filepath.Base(m.HostPath), ".") {
					t.Errorf("mount %s → %s is not a file", m.HostPath, m.ContainerPath)
				}
			}
		})
	}
}

// TestBackendEditsRefuse: enforcing backends fail closed, naming why.
func TestBackendEditsRefuse(t *testing.T) {
	share := GPU{UUID: "GPU-1", Shared: true, MemoryLimit: 1 << 30, CoresLimit: 10}
	tiny := GPU{UUID: "GPU-1", Shared: true, MemoryLimit: 1 << 19, CoresLimit: 10}
	hami := HAMiCore{Library: "/l/libvgpu.so", PreloadFile: "/l/ld.so.preload", ClaimRoot: "/c"}
	capable := DriverMemory{HookPath: "/usr/bin/nvidia-cdi-hook", DriverRoot: "/", Capable: true}
	for name, tc := range map[string]struct {
		in   Claim
		want string
	}{
		"DriverMemory on an incapable node": {Claim{GPUs: []GPU{share}, Isolation: configapi.IsolationDriverMemory, DriverMemory: DriverMemory{Reason: "driver 580.65 is older than r615"}},
			"cannot enforce driver memory limits (driver 580.65 is older than r615)"},
		"DriverMemory, relative hook path": {Claim{GPUs: []GPU{share}, Isolation: configapi.IsolationDriverMemory, DriverMemory: DriverMemory{Capable: true, HookPath: "nvidia-cdi-hook", DriverRoot: "/"}},
			"--nvidia-cdi-hook-path"},
		"DriverMemory, no driver root": {Claim{GPUs: []GPU{share}, Isolation: configapi.IsolationDriverMemory, DriverMemory: DriverMemory{Capable: true, HookPath: "/h"}},
			"driver root"},
		"DriverMemory, two GPUs": {Claim{GPUs: []GPU{share, {UUID: "GPU-2", Minor: 1, Shared: true, MemoryLimit: 1 << 30, CoresLimit: 10}}, Isolation: configapi.IsolationDriverMemory, DriverMemory: capable},
			"must be exactly one share"},
		"DriverMemory, under 1 MiB":          {Claim{GPUs: []GPU{tiny}, Isolation: configapi.IsolationDriverMemory, DriverMemory: capable}, "less than 1 MiB"},
		"HAMiCore without a claim directory": {Claim{GPUs: []GPU{share}, Isolation: configapi.IsolationHAMiCore, HAMiCore: hami}, "no directory for the claim's shared region"},
		"HAMiCore unconfigured":              {Claim{GPUs: []GPU{share}, Isolation: configapi.IsolationHAMiCore, HAMiCoreClaimDir: "/c/x"}, "--hami-core-library is empty"},
	} {
		if _, err := BackendEdits(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", name, err, tc.want)
		}
	}
}

// hookHelp is nvidia-cdi-hook --help as urfave/cli prints it, with the
// subcommands of a toolkit release that has apply-cuda-memory-limits.
const hookHelp = `NAME:
   NVIDIA CDI Hook - Command to structure files for usage inside a container, called as hooks from a container runtime, defined in a CDI yaml file

USAGE:
   NVIDIA CDI Hook [global options] [command [command options]]

VERSION:
   1.21.0
commit: 0123456

COMMANDS:
   update-ldcache                    Update ldcache in a container by running ldconfig
   create-symlinks                   A hook to create symlinks in the container.
   chmod                             Set the permissions of folders in the container by running chmod. The container root is prefixed to the specified paths.
   enable-cuda-compat                This hook ensures that the folder containing the CUDA compat libraries is added to the ldconfig search path if required.
   disable-device-node-modification  Ensure that the /proc/driver/nvidia/params file present in the container does not allow device node modifications.
   apply-cuda-memory-limits          Set the soft and hard limits of CUDA memory usage on a GPU device in the container.
   help, h                           Shows a list of commands or help for one command

GLOBAL OPTIONS:
   --debug, -d  Enable debug-level logging (default: false) [$NVIDIA_CTK_DEBUG, $NVIDIA_CDI_DEBUG]
   --help, -h   show help
`

// hookScript is an executable stand-in for nvidia-cdi-hook that prints help
// (with printf, a shell builtin: the probe runs the hook with an empty
// environment) and exits with code.
func hookScript(help string, code int) string {
	return "#!/bin/sh\nprintf '%s' '" + strings.ReplaceAll(help, "'", `'\''`) + "'\nexit " + strconv.Itoa(code) + "\n"
}

// TestDriverMemoryDetect runs detection against fake host roots: cgroup
// layouts of the kubelet's systemd and cgroupfs drivers, and hooks that are
// run for their help.
func TestDriverMemoryDetect(t *testing.T) {
	const hook = "/usr/bin/nvidia-cdi-hook"
	oldHelp := strings.Replace(hookHelp, "   apply-cuda-memory-limits          Set the soft and hard limits of CUDA memory usage on a GPU device in the container.\n", "", 1)
	type host struct {
		controllers *string // nil: no cgroup v2
		// pods is the cgroup.controllers of the kubelet's pods cgroup,
		// podsDir (default kubepods.slice); nil: the same as controllers
		// (systemd driver, delegated).
		pods    *string
		podsDir string
		noPods  bool // no pods cgroup at all
		// hook: the hook file's content; "" with hookMode set: hookHelp.
		hook     string
		hookMode os.FileMode
		hookDir  bool
	}
	str := func(s string) *string { return &s }
	dmem := str("cpuset cpu io memory hugetlb pids rdma misc dmem\n")
	for name, tc := range map[string]struct {
		driver  string
		host    host
		capable bool
		reason  string
	}{
		"capable":                             {"615.10.02", host{controllers: dmem, hookMode: 0o755}, true, ""},
		"newer branch":                        {"620.1", host{controllers: str("dmem memory"), hookMode: 0o755}, true, ""},
		"kubelet --cgroup-root=/custom.slice": {"615.10.02", host{controllers: dmem, podsDir: "custom.slice/custom-kubepods.slice", hookMode: 0o755}, true, ""},
		"kind node (kubelet.slice/kubelet-kubepods.slice)": {"615.10.02", host{controllers: dmem, podsDir: "kubelet.slice/kubelet-kubepods.slice", hookMode: 0o755}, true, ""},
		"driver too old":                  {"580.95.05", host{controllers: str("dmem"), hookMode: 0o755}, false, "driver 580.95.05 is older than r615"},
		"no driver version":               {"", host{controllers: str("dmem"), hookMode: 0o755}, false, "no GPU discovered"},
		"garbage driver version":          {"r615", host{controllers: str("dmem"), hookMode: 0o755}, false, `driver version "r615"`},
		"cgroup v1":                       {"615.10.02", host{hookMode: 0o755}, false, "does not run cgroup v2"},
		"no dmem controller":              {"615.10.02", host{controllers: str("cpuset cpu io memory pids misc"), hookMode: 0o755}, false, "no dmem controller"},
		"dmem only as part of a word":     {"615.10.02", host{controllers: str("cpu dmemx"), hookMode: 0o755}, false, "no dmem controller"},
		"cgroupfs driver":                 {"615.10.02", host{controllers: dmem, podsDir: "kubepods", hookMode: 0o755}, false, "uses the cgroupfs cgroup driver"},
		"cgroupfs driver, custom root":    {"615.10.02", host{controllers: dmem, podsDir: "custom/kubepods", hookMode: 0o755}, false, "uses the cgroupfs cgroup driver"},
		"no pods cgroup":                  {"615.10.02", host{controllers: dmem, noPods: true, hookMode: 0o755}, false, "no cgroup of the kubelet's pods"},
		"dmem not delegated to pods":      {"615.10.02", host{controllers: str("dmem memory"), pods: str("memory pids"), hookMode: 0o755}, false, "not delegated"},
		"dmem not delegated, custom root": {"615.10.02", host{controllers: dmem, pods: str("memory"), podsDir: "custom.slice/custom-kubepods.slice", hookMode: 0o755}, false, "custom-kubepods.slice/cgroup.controllers"},
		"hook missing":                    {"615.10.02", host{controllers: str("dmem")}, false, "hook /usr/bin/nvidia-cdi-hook is not installed"},
		"hook not executable":             {"615.10.02", host{controllers: str("dmem"), hookMode: 0o644}, false, "not an executable file"},
		"hook path is a directory":        {"615.10.02", host{controllers: str("dmem"), hookDir: true}, false, "not an executable file"},
		"driver checked before cgroups":   {"550.54.15", host{}, false, "older than r615"},
		"a toolkit without the subcommand": {"615.10.02", host{controllers: dmem, hookMode: 0o755, hook: hookScript(oldHelp, 0)}, false,
			"has no apply-cuda-memory-limits subcommand (it lists update-ldcache, create-symlinks, chmod, enable-cuda-compat, disable-device-node-modification, help, h"},
		"the name in the binary is not a subcommand": {"615.10.02", host{controllers: dmem, hookMode: 0o755, hook: hookScript(oldHelp+"\n"+DriverMemoryHookName+"\n", 0)}, false,
			"has no apply-cuda-memory-limits subcommand"},
		"the hook fails": {"615.10.02", host{controllers: dmem, hookMode: 0o755, hook: hookScript("cannot open shared object file", 127)}, false,
			`could not list its subcommands`},
		"not nvidia-cdi-hook": {"615.10.02", host{controllers: dmem, hookMode: 0o755, hook: hookScript("usage: true", 0)}, false,
			"lists no subcommands in its help"},
		"not runnable (no interpreter)": {"615.10.02", host{controllers: dmem, hookMode: 0o755, hook: "\x7fELF apply-cuda-memory-limits"}, false,
			"could not list its subcommands"},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if tc.host.controllers != nil {
				mustWrite(t, filepath.Join(root, "sys/fs/cgroup/cgroup.controllers"), *tc.host.controllers, 0o444)
				// The cgroups of a node that are not the kubelet's.
				mustWrite(t, filepath.Join(root, "sys/fs/cgroup/system.slice/containerd.service/cgroup.controllers"), "memory", 0o444)
				mustWrite(t, filepath.Join(root, "sys/fs/cgroup/init.scope/cgroup.controllers"), "memory", 0o444)
				pods := tc.host.controllers
				if tc.host.pods != nil {
					pods = tc.host.pods
				}
				dir := tc.host.podsDir
				if dir == "" {
					dir = "kubepods.slice"
				}
				if !tc.host.noPods {
					mustWrite(t, filepath.Join(root, "sys/fs/cgroup", dir, "cgroup.controllers"), *pods, 0o444)
				}
			}
			switch {
			case tc.host.hookDir:
				if err := os.MkdirAll(filepath.Join(root, hook), 0o755); err != nil {
					t.Fatal(err)
				}
			case tc.host.hookMode != 0:
				body := tc.host.hook
				if body == "" {
					body = hookScript(hookHelp, 0)
				}
				mustWrite(t, filepath.Join(root, hook), body, tc.host.hookMode)
			}
			got := DriverMemoryProbe{HostRoot: root, HookPath: hook, DriverVersion: tc.driver}.Detect()
			if got.Capable != tc.capable || !strings.Contains(got.Reason, tc.reason) || (tc.capable && got.Reason != "") {
				t.Errorf("Detect = %+v, want capable %v, reason containing %q", got, tc.capable, tc.reason)
			}
			if got.HookPath != hook {
				t.Errorf("HookPath = %q, want the host path %q (not under the host root)", got.HookPath, hook)
			}
			err := got.Check()
			if tc.capable != (err == nil) {
				t.Errorf("Check = %v, want an error iff incapable", err)
			}
			if err != nil && !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Check = %v, want the reason %q", err, tc.reason)
			}
		})
	}
}

// TestDriverMemoryDetectRunsTheHookOnce: the hook is asked for its help with
// --help, at its path under the host root, and a hook that does not answer
// in time is a reason, not a hang.
func TestDriverMemoryDetectRunsTheHookOnce(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, filepath.Join(root, "sys/fs/cgroup/cgroup.controllers"), "dmem", 0o444)
	mustWrite(t, filepath.Join(root, "sys/fs/cgroup/kubepods.slice/cgroup.controllers"), "dmem", 0o444)
	mustWrite(t, filepath.Join(root, "opt/toolkit/nvidia-cdi-hook"), "", 0o755)
	var calls [][]string
	probe := DriverMemoryProbe{HostRoot: root, HookPath: "/opt/toolkit/nvidia-cdi-hook", DriverVersion: "615.1",
		RunHook: func(_ context.Context, path string, args ...string) ([]byte, error) {
			calls = append(calls, append([]string{path}, args...))
			return []byte(hookHelp), nil
		}}
	if got := probe.Detect(); !got.Capable {
		t.Fatalf("Detect = %+v, want capable", got)
	}
	want := [][]string{{filepath.Join(root, "opt/toolkit/nvidia-cdi-hook"), "--help"}}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("hook runs (-want +got):\n%s", diff)
	}
	probe.RunHook = func(context.Context, string, ...string) ([]byte, error) {
		return nil, errors.New("no answer within 10s")
	}
	if got := probe.Detect(); got.Capable || !strings.Contains(got.Reason, "no answer within 10s") {
		t.Errorf("Detect with a hook that hangs = %+v", got)
	}
}

// TestDriverMemoryVariables: the variables are the singular names the
// merged toolkit hook reads; the plural ones of the closed pull request
// would leave the container unlimited.
func TestDriverMemoryVariables(t *testing.T) {
	edits, err := BackendEdits(Claim{GPUs: []GPU{{UUID: "GPU-1", Shared: true, MemoryLimit: 3 << 30, CoresLimit: 10}},
		Isolation: configapi.IsolationDriverMemory, DriverMemory: DriverMemory{Capable: true, HookPath: DefaultNVIDIACDIHookPath, DriverRoot: "/"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NVIDIA_GPU_MEMORY_REQUEST=3072", "NVIDIA_GPU_MEMORY_LIMIT=3072"} {
		if !slices.Contains(edits.Env, want) {
			t.Errorf("env %q lacks %s", edits.Env, want)
		}
	}
	for _, kv := range edits.Env {
		if strings.HasPrefix(kv, "NVIDIA_GPU_MEMORY_REQUESTS=") || strings.HasPrefix(kv, "NVIDIA_GPU_MEMORY_LIMITS=") {
			t.Errorf("env has %s, a name the hook does not read", kv)
		}
	}
}

// TestHostDevNodesWriteHostPaths: nodes read under the plugin's mount of
// the driver root are written with the host's path, which the runtime
// resolves, and the device numbers of the real node.
func TestHostDevNodesWriteHostPaths(t *testing.T) {
	dir := t.TempDir()
	// /dev/null stands in for the NVIDIA nodes: a character device the
	// test can point at without a GPU.
	var null unix.Stat_t
	if err := unix.Stat("/dev/null", &null); err != nil {
		t.Skipf("no /dev/null: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range nodeNames(1) {
		if err := unix.Mknod(filepath.Join(dir, "dev", name), unix.S_IFCHR|0o666, int(null.Rdev)); err != nil {
			t.Skipf("cannot create a character device here (%v); the host path rule is still covered by TestHostDevNodesMissingNode", err)
		}
	}
	nodes, err := HostDevNodes{DriverRoot: dir, HostDriverRoot: "/run/nvidia/driver", HostDev: t.TempDir()}.Nodes(1)
	if err != nil {
		t.Fatal(err)
	}
	var hostPaths []string
	for _, n := range nodes {
		hostPaths = append(hostPaths, n.HostPath)
		if n.Major != int64(unix.Major(uint64(null.Rdev))) || n.Minor != int64(unix.Minor(uint64(null.Rdev))) || n.Type != "c" {
			t.Errorf("node %s: %s %d:%d, want the numbers of the file read", n.Path, n.Type, n.Major, n.Minor)
		}
	}
	want := []string{"/run/nvidia/driver/dev/nvidia1", "/run/nvidia/driver/dev/nvidiactl", "/run/nvidia/driver/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm-tools"}
	if diff := cmp.Diff(want, hostPaths); diff != "" {
		t.Errorf("host paths (-want +got):\n%s", diff)
	}
}

// TestHostDevNodesMissingNode: a missing node names the path read.
func TestHostDevNodesMissingNode(t *testing.T) {
	dir := t.TempDir()
	_, err := HostDevNodes{DriverRoot: dir, HostDriverRoot: "/", HostDev: t.TempDir()}.Nodes(0)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "dev", "nvidia0")) {
		t.Errorf("Nodes = %v, want an error naming %s", err, filepath.Join(dir, "dev", "nvidia0"))
	}
}

func mustWrite(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
