package isolation

import (
	"os"
	"path/filepath"
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
					"NVIDIA_GPU_MEMORY_REQUESTS=10240",
					"NVIDIA_GPU_MEMORY_LIMITS=10240",
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

// TestDriverMemoryDetect runs detection against fake host roots.
func TestDriverMemoryDetect(t *testing.T) {
	const hook = "/usr/bin/nvidia-cdi-hook"
	type host struct {
		controllers *string // nil: no cgroup v2
		// pods is kubepods.slice's cgroup.controllers; nil: the same as
		// controllers (systemd driver, delegated).
		pods     *string
		noSlice  bool // no kubepods.slice (cgroupfs driver)
		hookMode os.FileMode
		hookDir  bool
		// oldHook: a toolkit hook without the subcommand.
		oldHook bool
	}
	str := func(s string) *string { return &s }
	for name, tc := range map[string]struct {
		driver  string
		host    host
		capable bool
		reason  string
	}{
		"capable":                       {"615.10.02", host{controllers: str("cpuset cpu io memory hugetlb pids rdma misc dmem\n"), hookMode: 0o755}, true, ""},
		"newer branch":                  {"620.1", host{controllers: str("dmem memory"), hookMode: 0o755}, true, ""},
		"driver too old":                {"580.95.05", host{controllers: str("dmem"), hookMode: 0o755}, false, "driver 580.95.05 is older than r615"},
		"no driver version":             {"", host{controllers: str("dmem"), hookMode: 0o755}, false, "no GPU discovered"},
		"garbage driver version":        {"r615", host{controllers: str("dmem"), hookMode: 0o755}, false, `driver version "r615"`},
		"cgroup v1":                     {"615.10.02", host{hookMode: 0o755}, false, "does not run cgroup v2"},
		"no dmem controller":            {"615.10.02", host{controllers: str("cpuset cpu io memory pids misc"), hookMode: 0o755}, false, "no dmem controller"},
		"dmem only as part of a word":   {"615.10.02", host{controllers: str("cpu dmemx"), hookMode: 0o755}, false, "no dmem controller"},
		"hook missing":                  {"615.10.02", host{controllers: str("dmem")}, false, "hook /usr/bin/nvidia-cdi-hook is not installed"},
		"hook not executable":           {"615.10.02", host{controllers: str("dmem"), hookMode: 0o644}, false, "not an executable file"},
		"hook path is a directory":      {"615.10.02", host{controllers: str("dmem"), hookDir: true}, false, "not an executable file"},
		"driver checked before cgroups": {"550.54.15", host{}, false, "older than r615"},
		"cgroupfs driver":               {"615.10.02", host{controllers: str("dmem"), noSlice: true, hookMode: 0o755}, false, "does not use the systemd cgroup driver"},
		"dmem not delegated to pods":    {"615.10.02", host{controllers: str("dmem memory"), pods: str("memory pids"), hookMode: 0o755}, false, "not delegated"},
		"a toolkit without the hook":    {"615.10.02", host{controllers: str("dmem"), hookMode: 0o755, oldHook: true}, false, "has no apply-cuda-memory-limits subcommand"},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if tc.host.controllers != nil {
				mustWrite(t, filepath.Join(root, "sys/fs/cgroup/cgroup.controllers"), *tc.host.controllers, 0o444)
				pods := tc.host.controllers
				if tc.host.pods != nil {
					pods = tc.host.pods
				}
				if !tc.host.noSlice {
					mustWrite(t, filepath.Join(root, "sys/fs/cgroup/kubepods.slice/cgroup.controllers"), *pods, 0o444)
				}
			}
			switch {
			case tc.host.hookDir:
				if err := os.MkdirAll(filepath.Join(root, hook), 0o755); err != nil {
					t.Fatal(err)
				}
			case tc.host.hookMode != 0:
				// A binary naming its subcommands, as nvidia-cdi-hook's
				// cobra command table does; the name spans the 1 MiB
				// read boundary to test the chunked search.
				body := strings.Repeat("x", 1<<20-10) + "apply-cuda-memory-limits" + "\n"
				if tc.host.oldHook {
					body = "update-ldcache create-symlinks chmod\n"
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
	nodes, err := HostDevNodes{DriverRoot: dir, HostDriverRoot: "/run/nvidia/driver"}.Nodes(1)
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
	_, err := HostDevNodes{DriverRoot: dir, HostDriverRoot: "/"}.Nodes(0)
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
