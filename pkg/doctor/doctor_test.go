package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/isolation"
)

// node is a fake node: a temporary root with the plugin's directories, its
// sockets listening, and an API server.
type node struct {
	root   string
	config Config
}

func newNode(t *testing.T, mockProfile string) *node {
	t.Helper()
	// Short: a unix socket's path has at most 107 bytes.
	root, err := os.MkdirTemp("", "doc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	n := &node{root: root}
	registrar := n.mkdir(t, "reg")
	data := n.mkdir(t, "data")
	listen(t, filepath.Join(registrar, "gpu.tessera.dev-reg.sock"))
	listen(t, filepath.Join(data, "dra.sock"))
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "{}") }))
	t.Cleanup(api.Close)
	n.config = Config{
		Node:              "node-a",
		MockProfile:       mockProfile,
		DriverRoot:        n.mkdir(t, "driver-root"),
		HostRoot:          n.mkdir(t, "host"),
		RegistrarDir:      registrar,
		PluginDataDir:     data,
		CDIRoot:           "/var/run/cdi",
		ToolkitSpecDirs:   []string{n.mkdir(t, "etc/cdi")},
		NVIDIACDIHookPath: "/usr/bin/nvidia-cdi-hook",
		MPSImage:          "registry.example/tessera-kubelet-plugin:v1",
		DefaultIsolation:  configapi.IsolationAdvisory,
		OpenNVML:          mockNVML(t, "hgx-h100"),
		APIServer:         HTTPServerClock{Client: api.Client(), URL: api.URL + "/version"},
	}
	return n
}

func (n *node) mkdir(t *testing.T, rel string) string {
	t.Helper()
	p := filepath.Join(n.root, rel)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func (n *node) write(t *testing.T, rel, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(n.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// listen serves a unix socket at path until the test ends.
func listen(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
}

// mockNVML opens a mock node of profile as it is.
func mockNVML(t *testing.T, profile string) func() (nvml.Interface, error) {
	return mockNode(t, profile, func(*gpu.MockNode) error { return nil })
}

func result(t *testing.T, r Report, check string) Result {
	t.Helper()
	for _, res := range r.Results {
		if res.Check == check {
			return res
		}
	}
	t.Fatalf("no %s check in the report: %+v", check, r.Results)
	return Result{}
}

func want(t *testing.T, r Report, check string, status Status, contains ...string) Result {
	t.Helper()
	res := result(t, r, check)
	if res.Status != status {
		t.Errorf("%s: status %s, want %s (%s; fix: %s)", check, res.Status, status, res.Message, res.Fix)
	}
	for _, s := range contains {
		if !strings.Contains(res.Message+" fix: "+res.Fix, s) {
			t.Errorf("%s: %q (fix %q) does not say %q", check, res.Message, res.Fix, s)
		}
	}
	if (status == Warn || status == Fail) && res.Fix == "" && !strings.Contains(res.Message, "cannot be checked") {
		t.Errorf("%s: %s without a fix: %s", check, status, res.Message)
	}
	return res
}

func TestMockProfileNodeIsHealthy(t *testing.T) {
	n := newNode(t, "hgx-h100")
	r := Run(context.Background(), n.config)
	if err := r.Err(); err != nil {
		var buf bytes.Buffer
		_ = r.WriteTable(&buf)
		t.Fatalf("%v\n%s", err, buf.String())
	}
	want(t, r, "nvml", OK, "mock of profile hgx-h100", "driver 580.95.05", "8 GPUs")
	for _, check := range []string{"toolkit-cdi", "containerd-cdi", "toolkit-envvar", "mps-binary", "cgroup-v2", "driver-memory"} {
		want(t, r, check, Skip, "skipped (mock profile hgx-h100)")
	}
	want(t, r, "kubelet-registration", OK, "gpu.tessera.dev-reg.sock accepts connections")
	want(t, r, "dra-socket", OK, "dra.sock accepts connections")
	want(t, r, "mps-image", OK, n.config.MPSImage)
	want(t, r, "hami-core", Skip, "not configured")
	want(t, r, "clock-skew", OK, "the API server's")

	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"Node node-a", "OK    nvml", "SKIP  toolkit-cdi", "0 FAIL"} {
		if !strings.Contains(buf.String(), line) {
			t.Errorf("table does not have %q:\n%s", line, buf.String())
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || len(back.Results) != len(r.Results) || back.Results[0].Status != OK {
		t.Errorf("JSON round trip: %v, %s", err, b)
	}
}

func TestNVMLUnavailable(t *testing.T) {
	n := newNode(t, "")
	n.config.OpenNVML = func() (nvml.Interface, error) {
		return nil, fmt.Errorf("libnvidia-ml.so.1 not found: %w", gpu.ErrUnavailable)
	}
	r := Run(context.Background(), n.config)
	want(t, r, "nvml", Fail, "cannot be opened", "libnvidia-ml.so.1 not found", "kubeletPlugin.driverRoot")
	want(t, r, "toolkit-cdi", Skip, "NVML failed")
	if r.Err() == nil || !strings.Contains(r.Err().Error(), "checks failed") {
		t.Errorf("Err() = %v, want the failed count", r.Err())
	}
	// The real OpenNVML on a driver root without the library.
	n.config.OpenNVML = nil
	r = Run(context.Background(), n.config)
	want(t, r, "nvml", Fail, n.config.DriverRoot)
}

// toolkitSpec writes a CDI spec like "nvidia-ctk cdi generate
// --device-name-strategy=uuid" for these UUIDs.
func toolkitSpec(t *testing.T, dir string, uuids ...string) {
	t.Helper()
	var devs []string
	for i, u := range uuids {
		devs = append(devs, fmt.Sprintf("  - name: %s\n    containerEdits:\n      deviceNodes:\n      - path: /dev/nvidia%d\n", u, i))
	}
	spec := "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n" + strings.Join(devs, "") +
		"containerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mockUUIDs(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, g := range gputest.GPUs(t, "hgx-h100") {
		out = append(out, g.UUID)
	}
	return out
}

func TestToolkitSpec(t *testing.T) {
	uuids := mockUUIDs(t)
	t.Run("every GPU in the spec", func(t *testing.T) {
		n := newNode(t, "")
		toolkitSpec(t, n.config.ToolkitSpecDirs[0], uuids...)
		r := Run(context.Background(), n.config)
		want(t, r, "toolkit-cdi", OK, "every GPU", "nvidia.com/gpu="+uuids[7])
	})
	t.Run("two GPUs missing", func(t *testing.T) {
		n := newNode(t, "")
		toolkitSpec(t, n.config.ToolkitSpecDirs[0], uuids[:6]...)
		r := Run(context.Background(), n.config)
		want(t, r, "toolkit-cdi", Fail, "2 of 8 GPUs", uuids[6], uuids[7], "fail to prepare", "nvidia-ctk cdi generate")
		n.config.LegacyRuntime = true
		r = Run(context.Background(), n.config)
		want(t, r, "toolkit-cdi", Warn, "--legacy-nvidia-runtime")
	})
	t.Run("no spec at all", func(t *testing.T) {
		n := newNode(t, "")
		r := Run(context.Background(), n.config)
		want(t, r, "toolkit-cdi", Fail, "8 of 8 GPUs")
	})
	t.Run("lookup error", func(t *testing.T) {
		n := newNode(t, "")
		n.config.Toolkit = failingToolkit{}
		r := Run(context.Background(), n.config)
		want(t, r, "toolkit-cdi", Fail, "permission denied")
	})
	t.Run("static toolkit", func(t *testing.T) {
		n := newNode(t, "")
		all := cdi.StaticToolkit{}
		for _, u := range uuids {
			all[u] = true
		}
		n.config.Toolkit = all
		want(t, Run(context.Background(), n.config), "toolkit-cdi", OK)
	})
}

type failingToolkit struct{}

func (failingToolkit) DeviceID(string, int, int) (string, bool, error) {
	return "", false, os.ErrPermission
}

func TestSockets(t *testing.T) {
	t.Run("rolling update names", func(t *testing.T) {
		n := newNode(t, "hgx-h100")
		n.config.RegistrarDir = n.mkdir(t, "reg2")
		n.config.PluginDataDir = n.mkdir(t, "data2")
		listen(t, filepath.Join(n.config.RegistrarDir, "gpu.tessera.dev-0b7c1e0a-reg.sock"))
		listen(t, filepath.Join(n.config.PluginDataDir, "dra-0b7c1e0a.sock"))
		// Another driver's socket is not ours.
		listen(t, filepath.Join(n.config.RegistrarDir, "gpu.nvidia.com-reg.sock"))
		r := Run(context.Background(), n.config)
		want(t, r, "kubelet-registration", OK, "gpu.tessera.dev-0b7c1e0a-reg.sock")
		want(t, r, "dra-socket", OK, "dra-0b7c1e0a.sock")
	})
	t.Run("stale socket", func(t *testing.T) {
		n := newNode(t, "hgx-h100")
		n.config.RegistrarDir = n.mkdir(t, "reg2")
		l, err := net.Listen("unix", filepath.Join(n.config.RegistrarDir, "gpu.tessera.dev-reg.sock"))
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		_ = l.Close()
		r := Run(context.Background(), n.config)
		want(t, r, "kubelet-registration", Fail, "no plugin listens on", "kubeletPlugin.kubeletDir")
	})
	t.Run("only another driver", func(t *testing.T) {
		n := newNode(t, "hgx-h100")
		n.config.RegistrarDir = n.mkdir(t, "reg2")
		listen(t, filepath.Join(n.config.RegistrarDir, "gpu.nvidia.com-reg.sock"))
		want(t, Run(context.Background(), n.config), "kubelet-registration", Fail, "no socket of gpu.tessera.dev")
	})
	t.Run("missing directory", func(t *testing.T) {
		n := newNode(t, "hgx-h100")
		n.config.PluginDataDir = filepath.Join(n.root, "nowhere")
		want(t, Run(context.Background(), n.config), "dra-socket", Fail, "nowhere", "--plugin-data-dir")
	})
}

func TestMPS(t *testing.T) {
	n := newNode(t, "")
	r := Run(context.Background(), n.config)
	want(t, r, "mps-binary", Warn, "nvidia-cuda-mps-control not found in the driver root "+n.config.DriverRoot, "MPS shares fail to prepare")
	n.config.DefaultIsolation = configapi.IsolationMPS
	want(t, Run(context.Background(), n.config), "mps-binary", Fail)

	n.write(t, "driver-root/usr/bin/nvidia-cuda-mps-control", "#!/bin/sh\n", 0o755)
	r = Run(context.Background(), n.config)
	want(t, r, "mps-binary", OK, "/usr/bin/nvidia-cuda-mps-control")

	n.config.MPSImage = ""
	want(t, Run(context.Background(), n.config), "mps-image", Fail, "--mps-image is empty", "kubeletPlugin.mps.image")
	n.config.DefaultIsolation = configapi.IsolationAdvisory
	want(t, Run(context.Background(), n.config), "mps-image", Warn)
}

func TestHAMiCore(t *testing.T) {
	n := newNode(t, "hgx-h100")
	n.config.DefaultIsolation = configapi.IsolationHAMiCore
	want(t, Run(context.Background(), n.config), "hami-core", Fail, "not configured", "kubeletPlugin.hamiCore.image")

	n.config.HAMiCoreLibrary = filepath.Join(n.root, "hami/libvgpu.so")
	want(t, Run(context.Background(), n.config), "hami-core", Fail, "no such file")
	n.config.DefaultIsolation = configapi.IsolationAdvisory
	want(t, Run(context.Background(), n.config), "hami-core", Warn, "HAMiCore shares fail to prepare")
	n.write(t, "hami/libvgpu.so", "", 0o644)
	want(t, Run(context.Background(), n.config), "hami-core", Warn, "0 bytes")
	n.write(t, "hami/libvgpu.so", "\x7fELF....", 0o644)
	want(t, Run(context.Background(), n.config), "hami-core", OK, "8 bytes")
}

func TestCgroupAndDriverMemory(t *testing.T) {
	n := newNode(t, "")
	r := Run(context.Background(), n.config)
	want(t, r, "cgroup-v2", Warn, "does not run cgroup v2")
	want(t, r, "driver-memory", Warn, "older than r615")

	n.write(t, "host/sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n", 0o444)
	r = Run(context.Background(), n.config)
	want(t, r, "cgroup-v2", OK, "cpuset cpu io memory pids")

	// The capable node, as isolation.DriverMemoryProbe wants it; the
	// version comes from NVML, so call the check with a newer driver.
	n.write(t, "host/sys/fs/cgroup/cgroup.controllers", "cpu memory dmem\n", 0o444)
	n.write(t, "host/sys/fs/cgroup/kubepods.slice/cgroup.controllers", "cpu memory dmem\n", 0o444)
	// The hook is run for its help, which lists its subcommands.
	n.write(t, "host/usr/bin/nvidia-cdi-hook", "#!/bin/sh\nprintf 'COMMANDS:\\n   chmod  Set permissions\\n   "+isolation.DriverMemoryHookName+"  Set the soft and hard limits\\n'\n", 0o755)
	newer := []gpu.GPU{{DriverVersion: "615.12.03"}}
	res := n.config.checkDriverMemory(newer)
	if res.Status != OK || !strings.Contains(res.Message, "615.12.03") {
		t.Errorf("driver-memory on a capable node: %+v", res)
	}
	n.config.DefaultIsolation = configapi.IsolationDriverMemory
	n.write(t, "host/sys/fs/cgroup/kubepods.slice/cgroup.controllers", "cpu memory\n", 0o444)
	res = n.config.checkDriverMemory(newer)
	if res.Status != Fail || !strings.Contains(res.Message, "dmem is not delegated") {
		t.Errorf("driver-memory without dmem delegated, node default DriverMemory: %+v", res)
	}
}

// TestToolkitEnvvar: the check of the NVIDIA runtime's settings for device
// requests says whether a pod can take every GPU with NVIDIA_VISIBLE_DEVICES
// and whether --legacy-nvidia-runtime's volume-mount requests are read.
func TestToolkitEnvvar(t *testing.T) {
	const file = "host/etc/nvidia-container-runtime/config.toml"
	fixed := "accept-nvidia-visible-devices-envvar-when-unprivileged = false\naccept-nvidia-visible-devices-as-volume-mounts = true\n"
	for _, tc := range []struct {
		name, config string
		legacy       bool
		path         string // where the config is; "" means file
		status       Status
		says         []string
	}{
		{"the toolkit's defaults", "[nvidia-container-runtime]\nmode = \"auto\"\n", false, "", Warn,
			[]string{"envvar-when-unprivileged is not set (the toolkit's default is true)", "NVIDIA_VISIBLE_DEVICES=all", "other tenants' whole GPUs"}},
		{"the toolkit's defaults, legacy runtime", "", true, "", Fail,
			[]string{"envvar-when-unprivileged is not set", "as-volume-mounts is not set (the toolkit's default is false)", "start without the driver's libraries"}},
		{"envvar accepted explicitly", "accept-nvidia-visible-devices-envvar-when-unprivileged = true\n", false, "", Warn,
			[]string{"envvar-when-unprivileged is true:"}},
		{"fixed", fixed, true, "", OK, []string{"= false: the NVIDIA runtime ignores NVIDIA_VISIBLE_DEVICES", "as-volume-mounts = true"}},
		{"envvar refused, no legacy runtime", "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", false, "", OK, []string{"ignores NVIDIA_VISIBLE_DEVICES"}},
		{"envvar refused, legacy runtime without mounts", "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", true, "", Fail,
			[]string{"as-volume-mounts is not set", "--legacy-nvidia-runtime asks the NVIDIA runtime for a GPU through a volume mount"}},
		{"GPU Operator's toolkit", fixed, true, "host/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml", OK,
			[]string{"/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"}},
		{"not TOML", "accept = = 1", false, "", Warn, []string{"not a TOML file"}},
		{"wrong type", "accept-nvidia-visible-devices-envvar-when-unprivileged = \"no\"\n", false, "", Warn, []string{"= no: want true or false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, "")
			path := tc.path
			if path == "" {
				path = file
			}
			n.write(t, path, tc.config, 0o644)
			n.config.LegacyRuntime = tc.legacy
			r := Run(context.Background(), n.config)
			res := want(t, r, "toolkit-envvar", tc.status, tc.says...)
			if strings.Contains(res.Message, "-when-unprivileged is") && !strings.Contains(res.Fix, "accept-nvidia-visible-devices-envvar-when-unprivileged=false") {
				t.Errorf("fix %q does not say how to turn the variable off", res.Fix)
			}
			// The fix names the file as the admin finds it on the node.
			if strings.Contains(res.Fix, n.root) {
				t.Errorf("fix %q names the path inside the plugin's pod", res.Fix)
			}
		})
	}
	t.Run("not mounted", func(t *testing.T) {
		n := newNode(t, "")
		want(t, Run(context.Background(), n.config), "toolkit-envvar", Warn, "cannot be checked", "etc/nvidia-container-runtime/config.toml")
		n.config.LegacyRuntime = true
		want(t, Run(context.Background(), n.config), "toolkit-envvar", Warn, "as-volume-mounts must be true")
		n.config.MockProfile = "hgx-h100"
		want(t, Run(context.Background(), n.config), "toolkit-envvar", Skip, "skipped (mock profile hgx-h100)")
	})
	t.Run("through the host's /proc", func(t *testing.T) {
		n := newNode(t, "")
		n.config.HostProc = n.mkdir(t, "hostproc")
		n.write(t, "hostproc/1/root/etc/nvidia-container-runtime/config.toml", fixed, 0o644)
		n.config.LegacyRuntime = true
		want(t, Run(context.Background(), n.config), "toolkit-envvar", OK, "hostproc/1/root/etc/nvidia-container-runtime/config.toml")
	})
	t.Run("--toolkit-config", func(t *testing.T) {
		n := newNode(t, "")
		n.config.ToolkitConfig = n.write(t, "elsewhere/config.toml", fixed, 0o644)
		want(t, Run(context.Background(), n.config), "toolkit-envvar", OK, "elsewhere/config.toml")
	})
}

func TestContainerd(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		status       Status
		says         []string
	}{
		{"containerd 1.7 with CDI", `version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
`, OK, []string{"enable_cdi = true", "io.containerd.grpc.v1.cri"}},
		{"containerd 1.7 without CDI", `version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = false
`, Fail, []string{"enable_cdi = false", "containers start without their GPUs", "restart containerd"}},
		{"containerd 2 default", `version = 3
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
`, OK, []string{"on by default", "(default)"}},
		{"containerd 2 turned off", `version = 3
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = false
`, Fail, []string{"io.containerd.cri.v1.runtime"}},
		{"version 2 without the setting", "version = 2\n", Warn, []string{"off with 1.7"}},
		{"spec dirs without the CDI root", `version = 3
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["/etc/cdi"]
`, Fail, []string{"does not include the plugin's --cdi-root /var/run/cdi", "kubeletPlugin.cdiRoot"}},
		{"not TOML", "version = = 2", Warn, []string{"not a containerd config"}},
		{"wrong type", `[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = "yes"
`, Warn, []string{`enable_cdi = yes: want true or false`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, "")
			n.write(t, "host/etc/containerd/config.toml", tc.config, 0o644)
			r := Run(context.Background(), n.config)
			want(t, r, "containerd-cdi", tc.status, tc.says...)
		})
	}
	t.Run("not mounted", func(t *testing.T) {
		n := newNode(t, "")
		want(t, Run(context.Background(), n.config), "containerd-cdi", Warn, "cannot be checked", "enable_cdi = true")
		n.config.MockProfile = "hgx-h100"
		want(t, Run(context.Background(), n.config), "containerd-cdi", Skip, "skipped (mock profile hgx-h100)")
	})
	t.Run("explicit path", func(t *testing.T) {
		n := newNode(t, "")
		n.config.ContainerdConfig = n.write(t, "elsewhere/config.toml", "version = 3\n", 0o644)
		want(t, Run(context.Background(), n.config), "containerd-cdi", OK, "elsewhere/config.toml")
	})
}

func TestClockSkew(t *testing.T) {
	for _, tc := range []struct {
		name   string
		offset time.Duration
		status Status
		says   string
	}{
		{"in sync", 0, OK, "round trip"},
		{"local behind by 20s", 20 * time.Second, Warn, "behind the API server's by"},
		{"local ahead by 3m", -3 * time.Minute, Fail, "ahead of the API server's by"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Date", time.Now().Add(tc.offset).UTC().Format(http.TimeFormat))
				w.WriteHeader(http.StatusUnauthorized) // any status: only Date counts
			}))
			defer api.Close()
			n := newNode(t, "hgx-h100")
			n.config.APIServer = HTTPServerClock{Client: api.Client(), URL: api.URL + "/version"}
			want(t, Run(context.Background(), n.config), "clock-skew", tc.status, tc.says)
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		api := httptest.NewServer(http.NotFoundHandler())
		url := api.URL
		api.Close()
		n := newNode(t, "hgx-h100")
		n.config.APIServer = HTTPServerClock{URL: url + "/version"}
		want(t, Run(context.Background(), n.config), "clock-skew", Fail, "connection refused", "reach the API server")
	})
	t.Run("no API server", func(t *testing.T) {
		n := newNode(t, "hgx-h100")
		n.config.APIServer = nil
		want(t, Run(context.Background(), n.config), "clock-skew", Warn, "cannot be checked")
	})
	t.Run("no Date header", func(t *testing.T) {
		clock := HTTPServerClock{Client: &http.Client{Transport: noDate{}}, URL: "http://api.invalid/version"}
		if _, err := clock.ServerTime(context.Background()); err == nil || !strings.Contains(err.Error(), "without a Date header") {
			t.Errorf("ServerTime without Date: %v", err)
		}
	})
}

type noDate struct{}

func (noDate) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Status: "200 OK", Header: http.Header{}, Body: http.NoBody}, nil
}

func TestFindPlugin(t *testing.T) {
	proc := t.TempDir()
	process := func(pid int, argv ...string) {
		dir := filepath.Join(proc, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	subcommands := []string{"doctor", "mps-daemon"}
	process(7, "/pause")
	process(12, "/usr/bin/tessera-kubelet-plugin", "mps-daemon", "run", "--gpu=GPU-1")
	process(30, "/usr/bin/tessera-kubelet-plugin", "doctor", "-o", "json")
	if _, err := FindPlugin(proc, "tessera-kubelet-plugin", 30, subcommands); err == nil || !strings.Contains(err.Error(), "no tessera-kubelet-plugin process") {
		t.Errorf("without a plugin: %v", err)
	}
	process(1, "/usr/bin/tessera-kubelet-plugin", "--node-name=node-a", "--mock-profile=hgx-h100", "--v=2")
	p, err := FindPlugin(proc, "tessera-kubelet-plugin", 30, subcommands)
	if err != nil || p.PID != 1 || strings.Join(p.Args, " ") != "--node-name=node-a --mock-profile=hgx-h100 --v=2" {
		t.Errorf("FindPlugin = %+v, %v; want pid 1 and its flags", p, err)
	}
	process(40, "tessera-kubelet-plugin", "--node-name=node-b")
	if _, err := FindPlugin(proc, "tessera-kubelet-plugin", 30, subcommands); err == nil || !strings.Contains(err.Error(), "pids 1, 40") {
		t.Errorf("two plugins: %v", err)
	}
	// Seen through the host's PID namespace: the plugin in doctor's own
	// container (mount namespace) is the one.
	mntNS := func(pid int, ns string) {
		dir := filepath.Join(proc, fmt.Sprint(pid), "ns")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(ns, filepath.Join(dir, "mnt")); err != nil {
			t.Fatal(err)
		}
	}
	mntNS(30, "mnt:[4026532900]")
	mntNS(1, "mnt:[4026531841]")
	mntNS(40, "mnt:[4026532900]")
	if p, err := FindPlugin(proc, "tessera-kubelet-plugin", 30, subcommands); err != nil || p.PID != 40 {
		t.Errorf("two plugins, one in doctor's mount namespace: %+v, %v; want pid 40", p, err)
	}
	if _, err := FindPlugin(filepath.Join(proc, "none"), "tessera-kubelet-plugin", 30, subcommands); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no proc: %v", err)
	}
}
