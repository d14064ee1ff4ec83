package plugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/isolation"
)

// TestContainerSeesClaim prepares each kind of claim, loads the produced CDI
// spec with the CDI library, injects the returned devices into an OCI spec as
// the runtime does, and asserts the container's env, mounts and device nodes
// exactly.
func TestContainerSeesClaim(t *testing.T) {
	nvlinkRequired := `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","topology":{"nvlink":"Required"}}`
	base := []string{"PATH=/usr/bin"}

	for name, tc := range map[string]struct {
		claim       *resourceapi.ResourceClaim
		realGPUs    bool
		wantDevices []string // pool/device in order
		wantEnv     func(e *env) []string
		wantMounts  func(e *env) []oci.Mount
		wantNodes   []oci.LinuxDevice
		wantHooks   *oci.Hooks
		wantDaemons []string
	}{
		"whole GPU (mock: env only)": {
			claim:       newClaim("uid-whole", []result{whole("gpu", "gpu-2")}),
			wantDevices: []string{"gpu-2"},
			wantEnv: func(*env) []string {
				return append(base, "NVIDIA_VISIBLE_DEVICES=void", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "TESSERA_GPU_2=GPU-00000002")
			},
		},
		"whole GPU on a real node without the toolkit: device nodes, a volume-mount request for a legacy NVIDIA runtime": {
			claim:       newClaim("uid-whole-real", []result{whole("gpu", "gpu-2")}),
			realGPUs:    true,
			wantDevices: []string{"gpu-2"},
			wantEnv: func(*env) []string {
				// void: the node can refuse the variable from
				// unprivileged containers (docs/security.md).
				return append(base, "NVIDIA_VISIBLE_DEVICES=void", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "TESSERA_GPU_2=GPU-00000002")
			},
			wantMounts: func(*env) []oci.Mount {
				return []oci.Mount{
					{Destination: "/var/run/nvidia-container-devices/GPU-00000002", Type: "bind", Source: "/dev/null", Options: []string{"bind", "ro", "nosuid", "nodev"}},
				}
			},
			wantNodes: []oci.LinuxDevice{
				{Path: "/dev/nvidia2", Type: "c", Major: 195, Minor: 2},
				{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
				{Path: "/dev/nvidia-uvm", Type: "c", Major: 508, Minor: 0},
				{Path: "/dev/nvidia-uvm-tools", Type: "c", Major: 508, Minor: 1},
			},
		},
		"share, Advisory": {
			claim:       newClaim("uid-advisory", []result{share("gpu", "gpu-0-shared", "share-a", "20Gi", "25")}),
			wantDevices: []string{"gpu-0-shared"},
			wantEnv: func(*env) []string {
				return append(base,
					"NVIDIA_VISIBLE_DEVICES=void", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "TESSERA_GPU_0=GPU-00000000",
					"TESSERA_GPU_0_MEMORY_LIMIT=21474836480", "TESSERA_GPU_0_CORES_LIMIT=25",
					"TF_FORCE_GPU_ALLOW_GROWTH=true")
			},
		},
		"share, MPS": {
			claim: newClaim("uid-mps", []result{share("gpu", "gpu-1-shared", "share-b", "10Gi", "50")},
				claimConfig(isolationConfig(configapi.IsolationMPS))),
			wantDevices: []string{"gpu-1-shared"},
			wantEnv: func(*env) []string {
				return append(base,
					"NVIDIA_VISIBLE_DEVICES=void", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "TESSERA_GPU_1=GPU-00000001",
					"TESSERA_GPU_1_MEMORY_LIMIT=10737418240", "TESSERA_GPU_1_CORES_LIMIT=50",
					"CUDA_VISIBLE_DEVICES=GPU-00000001",
					"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
					"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
					"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50")
			},
			wantMounts: func(e *env) []oci.Mount {
				return []oci.Mount{
					// The pipe directory read-only, the shared memory, never the logs.
					{Destination: "/tmp/nvidia-mps", Type: "bind", Source: filepath.Join(e.mpsRoot, "GPU-00000001", "domains", "default", "pipe"), Options: []string{"bind", "ro", "nosuid", "nodev"}},
					{Destination: "/dev/shm", Type: "bind", Source: filepath.Join(e.mpsRoot, "GPU-00000001", "domains", "default", "shm"), Options: []string{"bind", "rw", "nosuid", "nodev"}},
				}
			},
			wantDaemons: []string{"GPU-00000001"},
		},
		"share, HAMiCore": {
			claim: newClaim("uid-hami", []result{share("gpu", "gpu-3-shared", "share-c", "16Gi", "30")},
				claimConfig(isolationConfig(configapi.IsolationHAMiCore))),
			wantDevices: []string{"gpu-3-shared"},
			wantEnv: func(*env) []string {
				return append(base,
					"NVIDIA_VISIBLE_DEVICES=void", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "TESSERA_GPU_3=GPU-00000003",
					"TESSERA_GPU_3_MEMORY_LIMIT=17179869184", "TESSERA_GPU_3_CORES_LIMIT=30",
					"CUDA_VISIBLE_DEVICES=GPU-00000003",
					"CUDA_DEVICE_MEMORY_LIMIT_0=16384m", "CUDA_DEVICE_SM_LIMIT_0=30",
					"CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpulock/cudevshr.cache")
			},
			wantMounts: func(e *env) []oci.Mount {
				// Files only, and the claim's own directory (in the
				// order the CDI library sorts them: by depth).
				return []oci.Mount{
					{Destination: "/etc/ld.so.preload", Type: "bind", Source: e.preload, Options: []string{"bind", "ro", "nosuid", "nodev"}},
					{Destination: "/tmp/vgpulock", Type: "bind", Source: filepath.Join(e.hamiClaims(), "uid-hami"), Options: []string{"bind", "rw", "nosuid", "nodev"}},
					{Destination: "/usr/local/vgpu/libvgpu.so", Type: "bind", Source: e.hamiLib, Options: []string{"bind", "ro", "nosuid", "nodev"}},
				}
			},
		},
		"share, DriverMemory: the toolkit's hook and its MiB variables": {
			claim: newClaim("uid-dmem", []result{share("gpu", "gpu-2-shared", "share-d", "12Gi", "20")},
				claimConfig(isolationConfig(configapi.IsolationDriverMemory))),
			wantDevices: []string{"gpu-2-shared"},
			wantEnv: func(*env) []string {
				return append(base,
					"NVIDIA_VISIBLE_DEVICES=void", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "TESSERA_GPU_2=GPU-00000002",
					"TESSERA_GPU_2_MEMORY_LIMIT=12884901888", "TESSERA_GPU_2_CORES_LIMIT=20",
					"CUDA_VISIBLE_DEVICES=GPU-00000002",
					"NVIDIA_GPU_MEMORY_REQUEST=12288", "NVIDIA_GPU_MEMORY_LIMIT=12288")
			},
			wantHooks: &oci.Hooks{CreateRuntime: []oci.Hook{{
				Path: "/usr/bin/nvidia-cdi-hook",
				Args: []string{"nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", "GPU-00000002"},
				Env:  []string{"NVIDIA_CTK_DEBUG=false"},
			}}},
		},
		"two GPUs over NVLink, in PCI order": {
			// The allocator lists gpu-0 first; gpu-1 has the lower PCI bus id.
			claim: newClaim("uid-nvlink", []result{whole("gpus/nvlink", "gpu-0"), whole("gpus/nvlink", "gpu-1")},
				claimConfig(nvlinkRequired)),
			wantDevices: []string{"gpu-1", "gpu-0"},
			wantEnv: func(*env) []string {
				return append(base,
					"NVIDIA_VISIBLE_DEVICES=void", "CUDA_DEVICE_ORDER=PCI_BUS_ID",
					"TESSERA_GPU_1=GPU-00000001", "TESSERA_GPU_0=GPU-00000000")
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			p := e.start(func(o *Options) {
				if tc.realGPUs {
					o.Mock = false
					o.DevNodes = isolation.StaticDevNodes{UVMMajor: 508}
					o.LegacyRuntime = true
				}
				o.DriverMemory = isolation.DriverMemory{Capable: true, HookPath: "/usr/bin/nvidia-cdi-hook", DriverRoot: "/"}
			})
			devs := mustPrepare(t, p.Plugin, tc.claim)

			var gotDevices []string
			for _, d := range devs {
				gotDevices = append(gotDevices, d.DeviceName)
				if d.PoolName != testNode {
					t.Errorf("device %s: pool %q, want %q", d.DeviceName, d.PoolName, testNode)
				}
				if len(d.CDIDeviceIDs) != 1 {
					t.Errorf("device %s: want one CDI device, got %v", d.DeviceName, d.CDIDeviceIDs)
				}
			}
			if diff := cmp.Diff(tc.wantDevices, gotDevices); diff != "" {
				t.Errorf("devices (-want +got):\n%s", diff)
			}

			spec := inject(t, cdiIDs(devs), e.cdiRoot)
			if diff := cmp.Diff(tc.wantEnv(e), spec.Process.Env); diff != "" {
				t.Errorf("container env (-want +got):\n%s", diff)
			}
			var wantMounts []oci.Mount
			if tc.wantMounts != nil {
				wantMounts = tc.wantMounts(e)
			}
			if diff := cmp.Diff(wantMounts, spec.Mounts, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("container mounts (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantNodes, spec.Linux.Devices, cmpopts.EquateEmpty(),
				cmpopts.IgnoreFields(oci.LinuxDevice{}, "FileMode", "UID", "GID")); diff != "" {
				t.Errorf("container device nodes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantHooks, spec.Hooks, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("container hooks (-want +got):\n%s", diff)
			}
			running, _ := e.runner.Running(ctxFor(t))
			if diff := cmp.Diff(tc.wantDaemons, gpusOf(running), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("MPS daemons (-want +got):\n%s", diff)
			}

			// Idempotent: the same IDs again, nothing new started, and the
			// spec replayed from the record is the one prepare wrote.
			again := mustPrepare(t, p.Plugin, tc.claim)
			if diff := cmp.Diff(devs, again); diff != "" {
				t.Errorf("second prepare differs (-first +second):\n%s", diff)
			}
			for _, ev := range e.events.List() {
				if strings.Contains(ev, "CDISpecRewritten") {
					t.Errorf("the spec replayed from the record differs from the prepared one: %s", ev)
				}
			}

			mustUnprepare(t, p.Plugin, tc.claim.UID)
			e.assertClean(p)
		})
	}
}

// TestToolkitDeviceFirst: on a real node with the NVIDIA container toolkit's
// spec, the GPU comes from nvidia.com/gpu=<uuid> (listed first) and Tessera's
// device adds only env.
func TestToolkitDeviceFirst(t *testing.T) {
	e := newEnv(t)
	toolkitDir := t.TempDir()
	toolkitSpec := `{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"GPU-00000002","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia2","type":"c","major":195,"minor":2}]}}],` +
		`"containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=void"]}}`
	if err := os.WriteFile(filepath.Join(toolkitDir, "nvidia.json"), []byte(toolkitSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	toolkit, err := cdi.NewToolkitSpecs(toolkitDir)
	if err != nil {
		t.Fatal(err)
	}
	p := e.start(func(o *Options) {
		o.Mock = false
		o.Toolkit = toolkit
		o.DevNodes = isolation.StaticDevNodes{UVMMajor: 508}
	})
	c := newClaim("uid-toolkit", []result{whole("gpu", "gpu-2")})
	devs := mustPrepare(t, p.Plugin, c)
	want := []kubeletplugin.Device{{
		Requests: []string{"gpu"}, PoolName: testNode, DeviceName: "gpu-2",
		CDIDeviceIDs: []string{"nvidia.com/gpu=GPU-00000002", "k8s.gpu.tessera.dev/claim=uid-toolkit-gpu-2"},
	}}
	if diff := cmp.Diff(want, devs); diff != "" {
		t.Fatalf("devices (-want +got):\n%s", diff)
	}
	spec := inject(t, cdiIDs(devs), toolkitDir, e.cdiRoot)
	wantEnv := []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=void", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "TESSERA_GPU_2=GPU-00000002"}
	if diff := cmp.Diff(wantEnv, spec.Process.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	if again := mustPrepare(t, p.Plugin, c); !cmp.Equal(again, devs) {
		t.Errorf("second prepare = %v, want %v", again, devs)
	}
	for _, ev := range e.events.List() {
		if strings.Contains(ev, "CDISpecRewritten") {
			t.Errorf("the spec replayed from the record differs from the prepared one: %s", ev)
		}
	}
	wantNodes := []oci.LinuxDevice{{Path: "/dev/nvidia2", Type: "c", Major: 195, Minor: 2}}
	if diff := cmp.Diff(wantNodes, spec.Linux.Devices, cmpopts.IgnoreFields(oci.LinuxDevice{}, "FileMode", "UID", "GID")); diff != "" {
		t.Errorf("device nodes (-want +got):\n%s", diff)
	}
	mustUnprepare(t, p.Plugin, c.UID)
	e.assertClean(p)
}
