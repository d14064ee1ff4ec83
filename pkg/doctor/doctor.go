package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/mpsdaemon"
)

// Config is what to check: the kubelet plugin's settings (its flags) and
// the seams to the world outside the file system. Paths are as the checking
// process sees them; inside the plugin's pod that is the chart's mounts
// (the driver root at /driver-root, the host's / under /host).
type Config struct {
	// Node is the node's name, for the report.
	Node string
	// MockProfile is the plugin's --mock-profile: the node has mock GPUs,
	// and the checks of what only a real GPU node has are skipped.
	MockProfile string
	// DriverRoot is where the NVIDIA driver is (--driver-root): NVML and
	// nvidia-cuda-mps-control are looked for there.
	DriverRoot string
	// HostRoot is where the host's / is mounted (--host-root): the cgroup
	// files, the toolkit's hook and containerd's config are read under it.
	HostRoot string
	// RegistrarDir is the kubelet's plugin registration directory
	// (--registrar-dir); PluginDataDir holds the DRA socket
	// (--plugin-data-dir).
	RegistrarDir, PluginDataDir string
	// CDIRoot is where the plugin writes the claims' CDI specs (--cdi-root);
	// containerd must read it.
	CDIRoot string
	// ToolkitSpecDirs is where the NVIDIA container toolkit's CDI spec is
	// looked for (--nvidia-cdi-spec-dirs).
	ToolkitSpecDirs []string
	// LegacyRuntime is --legacy-nvidia-runtime: GPUs without a toolkit CDI
	// device are asked of the NVIDIA runtime through a volume mount.
	LegacyRuntime bool
	// ContainerdConfig is containerd's config.toml as seen here; empty:
	// <HostRoot>/etc/containerd/config.toml.
	ContainerdConfig string
	// ToolkitConfig is the NVIDIA container toolkit's config.toml as seen
	// here; empty: /etc/nvidia-container-runtime/config.toml, else the GPU
	// Operator's under /usr/local/nvidia/toolkit, each looked for under
	// HostRoot and then under HostProc's 1/root.
	ToolkitConfig string
	// HostProc is the host's /proc as seen here (the plugin's
	// --proc-root); empty: not available.
	HostProc string
	// NVIDIACDIHookPath is the host path of nvidia-cdi-hook
	// (--nvidia-cdi-hook-path), for driver-enforced memory limits.
	NVIDIACDIHookPath string
	// HAMiCoreLibrary is --hami-core-library; empty: not configured.
	HAMiCoreLibrary string
	// MPSImage is --mps-image, the image of the MPS control daemon pods.
	MPSImage string
	// DefaultIsolation is --default-isolation: a backend the node default
	// needs is a FAIL when missing, any other a WARN.
	DefaultIsolation configapi.Isolation
	// ComputeModes is the compute mode the plugin expects of each GPU
	// (--expected-compute-mode); the zero value expects Default.
	ComputeModes gpu.ComputeModePolicy

	// OpenNVML opens and initialises NVML (the mock's on mock profiles);
	// nil: gpu.OpenNVML(DriverRoot). The caller's library is shut down
	// after the checks.
	OpenNVML func() (nvml.Interface, error)
	// Toolkit looks GPUs up in the toolkit's CDI spec; nil:
	// cdi.NewToolkitSpecs(ToolkitSpecDirs...).
	Toolkit ToolkitLookup
	// APIServer tells the API server's time; nil: the clock check says it
	// cannot be done.
	APIServer ServerClock
	// Now is the local clock; nil: time.Now.
	Now func() time.Time
}

// ToolkitLookup finds a GPU's device in the NVIDIA container toolkit's CDI
// spec; *cdi.ToolkitSpecs implements it.
type ToolkitLookup interface {
	DeviceID(uuid string, index, minor int) (id string, ok bool, err error)
}

// Clock skew bounds: the API server's Date header has whole seconds, so
// less than okSkew is noise; beyond failSkew service account tokens and
// certificates are judged by clocks that disagree, and leases and the
// plugin's timed decisions (health recovery, lending) go wrong.
const (
	okSkew   = 5 * time.Second
	failSkew = time.Minute
)

// Run runs every check and returns the report. It never fails as a whole:
// a check that cannot be done is a line saying so.
func Run(ctx context.Context, c Config) Report {
	r := Report{Node: c.Node}
	add := func(res ...Result) { r.Results = append(r.Results, res...) }

	gpus, nvmlResult, closeNVML := c.checkNVML()
	add(nvmlResult)
	defer closeNVML()
	add(c.checkToolkitSpec(gpus, nvmlResult.Status == Fail))
	add(c.checkGPUConditions(gpus, nvmlResult.Status == Fail)...)
	add(c.checkContainerd())
	add(c.checkToolkitEnvvar())
	add(c.checkSocket("kubelet-registration", c.RegistrarDir, "--registrar-dir", registrationSocket,
		"the kubelet finds the plugin through this socket",
		"Is the plugin running on this node? kubeletPlugin.kubeletDir must be the kubelet's root directory (its plugins_registry is where the kubelet looks)."))
	add(c.checkSocket("dra-socket", c.PluginDataDir, "--plugin-data-dir", draSocket,
		"the kubelet calls NodePrepareResources on this socket",
		"Is the plugin running on this node? Its logs (kubectl logs) say why it did not start serving."))
	add(c.checkMPSBinary(), c.checkMPSImage(), c.checkHAMiCore())
	add(c.checkCgroup())
	add(c.checkDriverMemory(gpus))
	add(c.checkClock(ctx))
	return r
}

// severity is Fail when the node default isolation is iso (every share
// without its own setting fails to prepare), else Warn.
func (c Config) severity(iso configapi.Isolation) Status {
	if c.DefaultIsolation == iso {
		return Fail
	}
	return Warn
}

func (c Config) mock() bool { return c.MockProfile != "" }

func (c Config) skipMock(check, what string) Result {
	return Result{Check: check, Status: Skip, Message: fmt.Sprintf("skipped (mock profile %s): %s", c.MockProfile, what)}
}

// checkNVML opens NVML and discovers the GPUs as the plugin does.
func (c Config) checkNVML() ([]gpu.GPU, Result, func()) {
	const check = "nvml"
	open := c.OpenNVML
	if open == nil {
		open = func() (nvml.Interface, error) { return gpu.OpenNVML(c.DriverRoot) }
	}
	noop := func() {}
	where := "the driver root " + c.DriverRoot
	if c.mock() {
		where = "the mock of profile " + c.MockProfile
	}
	lib, err := open()
	if err != nil {
		res := Result{Check: check, Status: Fail, Message: fmt.Sprintf("NVML from %s cannot be opened: %v", where, err)}
		if errors.Is(err, gpu.ErrUnavailable) {
			res.Fix = "Install the NVIDIA driver on the node, or point kubeletPlugin.driverRoot at the directory that holds it " +
				"(libnvidia-ml.so.1 under it; the GPU Operator's driver container: /run/nvidia/driver). Without NVML the plugin publishes no GPU."
		} else {
			res.Fix = "Check the plugin's --driver-root (kubeletPlugin.driverRoot)."
		}
		return nil, res, noop
	}
	closeLib := func() { _ = lib.Shutdown() }
	d, err := gpu.DiscoverNode(lib)
	if err != nil {
		return nil, Result{Check: check, Status: Fail, Message: fmt.Sprintf("NVML from %s opened, but discovery failed: %v", where, err),
			Fix: "Run nvidia-smi on the node; a driver that cannot list its GPUs needs a reboot or a reinstall."}, closeLib
	}
	version := "unknown"
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		version = v
	}
	res := Result{Check: check, Status: OK, Message: fmt.Sprintf("NVML from %s: driver %s, %d GPUs", where, version, len(d.GPUs))}
	if len(d.GPUs) > 0 {
		res.Message += fmt.Sprintf(" (%s)", d.GPUs[0].ProductName)
	}
	switch {
	case len(d.Failed) > 0:
		var failed []string
		for _, f := range d.Failed {
			failed = append(failed, f.Error())
		}
		res.Status = Warn
		res.Message += fmt.Sprintf("; %d GPUs failed discovery and are not published: %s", len(d.Failed), strings.Join(failed, "; "))
		res.Fix = "Run nvidia-smi -q on the node for those GPUs; a GPU that fell off the bus needs a reset or a reboot."
	case len(d.GPUs) == 0:
		res.Status = Warn
		res.Fix = "NVML sees no GPU: check nvidia-smi on the node, and that this node is meant to run the plugin (kubeletPlugin.nodeSelector/affinity)."
	}
	return d.GPUs, res, closeLib
}

// checkToolkitSpec looks every GPU up in the toolkit's CDI spec, which the
// plugin's CDI devices build on (libraries, device nodes, hooks).
func (c Config) checkToolkitSpec(gpus []gpu.GPU, nvmlFailed bool) Result {
	const check = "toolkit-cdi"
	switch {
	case c.mock():
		return c.skipMock(check, "mock GPUs get Tessera's own device entries, no toolkit spec")
	case nvmlFailed:
		return Result{Check: check, Status: Skip, Message: "skipped: no GPU to look up (NVML failed)"}
	case len(gpus) == 0:
		return Result{Check: check, Status: Skip, Message: "skipped: no GPU to look up"}
	}
	lookup := c.Toolkit
	if lookup == nil {
		specs, err := cdi.NewToolkitSpecs(c.ToolkitSpecDirs...)
		if err != nil {
			return Result{Check: check, Status: Fail, Message: err.Error(), Fix: "Set --nvidia-cdi-spec-dirs (kubeletPlugin.nvidiaCDISpecDirs) to the directories the toolkit writes its spec to."}
		}
		lookup = specs
	}
	var missing, found []string
	for _, g := range gpus {
		id, ok, err := lookup.DeviceID(g.UUID, g.Index, g.Minor)
		if err != nil {
			fix := "Make the directories of kubeletPlugin.nvidiaCDISpecDirs readable by the plugin."
			if errors.Is(err, cdi.ErrStaleIndexDevice) {
				fix = "Generate the spec again on the node, by UUID: nvidia-ctk cdi generate --device-name-strategy=uuid --output=/var/run/cdi/nvidia.yaml."
			}
			return Result{Check: check, Status: Fail, Message: fmt.Sprintf("looking up GPU %d (%s): %v", g.Index, g.UUID, err), Fix: fix}
		}
		if !ok {
			missing = append(missing, fmt.Sprintf("%d (%s)", g.Index, g.UUID))
			continue
		}
		found = append(found, id)
	}
	dirs := strings.Join(c.ToolkitSpecDirs, ", ")
	if len(missing) == 0 {
		return Result{Check: check, Status: OK, Message: fmt.Sprintf("every GPU has a device in the toolkit's CDI spec (%s; in %s)", strings.Join(found, ", "), dirs)}
	}
	res := Result{Check: check, Status: Fail,
		Message: fmt.Sprintf("%d of %d GPUs have no %s device in the CDI specs in %s: GPU %s; their claims fail to prepare", len(missing), len(gpus), cdi.ToolkitKind, dirs, strings.Join(missing, ", ")),
		Fix: "Generate the spec on the node: nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml (toolkit >= 1.14; the toolkit's nvidia-cdi-refresh " +
			"service or the GPU Operator's cdi.enabled=true keep it current), and check kubeletPlugin.nvidiaCDISpecDirs names its directory."}
	if c.LegacyRuntime {
		res.Status = Warn
		res.Message = strings.TrimSuffix(res.Message, "; their claims fail to prepare") + "; --legacy-nvidia-runtime asks the NVIDIA runtime for them through volume mounts instead (check toolkit-envvar)"
	}
	return res
}

// Socket names of k8s.io/dynamic-resource-allocation/kubeletplugin: the
// registration socket is <driver>-reg.sock, or with rolling updates
// <driver>-<pod UID or hash>-reg.sock (or dra-<hash>-reg.sock when that path
// is too long); the DRA socket is dra.sock or dra-<pod UID>.sock.
func registrationSocket(name string) bool {
	return name == model.DriverName+"-reg.sock" ||
		(strings.HasPrefix(name, model.DriverName+"-") && strings.HasSuffix(name, "-reg.sock"))
}

func draSocket(name string) bool {
	return name == "dra.sock" || (strings.HasPrefix(name, "dra-") && strings.HasSuffix(name, ".sock") && !strings.HasSuffix(name, "-reg.sock"))
}

// checkSocket finds the plugin's socket in dir and connects to it: a socket
// file nobody listens on is what a crashed plugin leaves behind.
func (c Config) checkSocket(check, dir, flag string, match func(string) bool, role, fix string) Result {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Result{Check: check, Status: Fail, Message: fmt.Sprintf("%s (%s): %v", dir, flag, err), Fix: fix}
	}
	var listening, stale []string
	for _, e := range entries {
		if !match(e.Name()) || e.Type()&os.ModeSocket == 0 {
			continue
		}
		path := filepath.Join(dir, e.Name())
		conn, err := net.DialTimeout("unix", path, 2*time.Second)
		if err != nil {
			stale = append(stale, fmt.Sprintf("%s (%v)", path, err))
			continue
		}
		_ = conn.Close()
		listening = append(listening, path)
	}
	switch {
	case len(listening) > 0:
		msg := fmt.Sprintf("%s accepts connections; %s", strings.Join(listening, ", "), role)
		if len(stale) > 0 {
			msg += fmt.Sprintf("; stale: %s", strings.Join(stale, ", "))
		}
		return Result{Check: check, Status: OK, Message: msg}
	case len(stale) > 0:
		return Result{Check: check, Status: Fail, Message: fmt.Sprintf("no plugin listens on %s; %s", strings.Join(stale, ", "), role), Fix: fix}
	}
	return Result{Check: check, Status: Fail, Message: fmt.Sprintf("no socket of %s in %s (%s); %s", model.DriverName, dir, flag, role), Fix: fix}
}

// checkMPSBinary looks for nvidia-cuda-mps-control where the MPS daemon
// pods run it.
func (c Config) checkMPSBinary() Result {
	const check = "mps-binary"
	if c.mock() {
		return c.skipMock(check, "the MPS daemon pods run a fake daemon")
	}
	path, err := mpsdaemon.ControlBinary(c.DriverRoot)
	if err != nil {
		return Result{Check: check, Status: c.severity(configapi.IsolationMPS), Message: err.Error() + "; MPS shares fail to prepare",
			Fix: "Install the driver's MPS tools (nvidia-cuda-mps-control ships with the driver; distributions split it into a package such as nvidia-compute-utils)."}
	}
	return Result{Check: check, Status: OK, Message: fmt.Sprintf("%s in the driver root %s", path, c.DriverRoot)}
}

func (c Config) checkMPSImage() Result {
	const check = "mps-image"
	if c.MPSImage == "" {
		return Result{Check: check, Status: c.severity(configapi.IsolationMPS), Message: "--mps-image is empty: MPS shares fail to prepare",
			Fix: "Set kubeletPlugin.mps.image (default: the plugin's image) and upgrade the release."}
	}
	return Result{Check: check, Status: OK, Message: "MPS control daemon pods run " + c.MPSImage}
}

// checkHAMiCore checks the library file that HAMiCore shares preload.
func (c Config) checkHAMiCore() Result {
	const check = "hami-core"
	fix := "Set kubeletPlugin.hamiCore.image (the chart installs libvgpu.so from it) or kubeletPlugin.hamiCore.libraryPath."
	if c.HAMiCoreLibrary == "" {
		status := Skip
		if c.DefaultIsolation == configapi.IsolationHAMiCore {
			status = Fail
		}
		res := Result{Check: check, Status: status, Message: "not configured (--hami-core-library is empty): HAMiCore shares fail to prepare"}
		if status == Fail {
			res.Fix = fix
		}
		return res
	}
	fi, err := os.Stat(c.HAMiCoreLibrary)
	switch {
	case err != nil:
		return Result{Check: check, Status: c.severity(configapi.IsolationHAMiCore), Message: fmt.Sprintf("library %s (--hami-core-library): %v; HAMiCore shares fail to prepare", c.HAMiCoreLibrary, err), Fix: fix}
	case !fi.Mode().IsRegular() || fi.Size() == 0:
		return Result{Check: check, Status: c.severity(configapi.IsolationHAMiCore), Message: fmt.Sprintf("library %s is not a non-empty regular file (mode %s, %d bytes)", c.HAMiCoreLibrary, fi.Mode(), fi.Size()), Fix: fix}
	}
	return Result{Check: check, Status: OK, Message: fmt.Sprintf("library %s (%d bytes)", c.HAMiCoreLibrary, fi.Size())}
}

func (c Config) hostPath(p string) string {
	root := c.HostRoot
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, p)
}

// checkCgroup: the kubelet needs cgroup v2 (v1 is unsupported since
// Kubernetes 1.35), and driver-enforced memory limits need its dmem
// controller.
func (c Config) checkCgroup() Result {
	const check = "cgroup-v2"
	path := c.hostPath("sys/fs/cgroup/cgroup.controllers")
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist) && c.mock():
		return c.skipMock(check, "the host's cgroup file system is not mounted into the plugin ("+path+" not found)")
	case errors.Is(err, os.ErrNotExist):
		return Result{Check: check, Status: Warn, Message: path + " not found: the host does not run cgroup v2 (or /sys/fs/cgroup is not mounted at " + c.hostPath("sys/fs/cgroup") + ")",
			Fix: "Boot the node with the unified cgroup hierarchy (systemd.unified_cgroup_hierarchy=1); the kubelet of Kubernetes 1.35 and later needs it, and DriverMemory shares need its dmem controller."}
	case err != nil:
		return Result{Check: check, Status: Warn, Message: fmt.Sprintf("read %s: %v", path, err)}
	}
	return Result{Check: check, Status: OK, Message: fmt.Sprintf("cgroup v2, controllers: %s", strings.TrimSpace(string(data)))}
}

// checkDriverMemory runs the plugin's own detection of driver-enforced
// memory limits (isolation DriverMemory).
func (c Config) checkDriverMemory(gpus []gpu.GPU) Result {
	const check = "driver-memory"
	if c.mock() {
		return c.skipMock(check, "mock GPUs have no driver to enforce memory (the test knob --mock-driver-memory-limits stands in)")
	}
	version := ""
	for _, g := range gpus {
		if g.DriverVersion != "" {
			version = g.DriverVersion
			break
		}
	}
	d := isolation.DriverMemoryProbe{HostRoot: c.HostRoot, HookPath: c.NVIDIACDIHookPath, DriverVersion: version}.Detect()
	if d.Capable {
		return Result{Check: check, Status: OK, Message: fmt.Sprintf("the node can enforce DriverMemory shares (driver %s, cgroup dmem delegated to the kubelet's pods, %s lists %s)", version, c.NVIDIACDIHookPath, isolation.DriverMemoryHookName)}
	}
	return Result{Check: check, Status: c.severity(configapi.IsolationDriverMemory), Message: "DriverMemory shares fail to prepare: " + d.Reason,
		Fix: "Only needed for isolation DriverMemory: NVIDIA driver r615+, Linux 6.14+ with the dmem cgroup controller delegated to the kubelet's pods slice (the systemd cgroup driver: the toolkit's hook does not support cgroupfs), and an NVIDIA container toolkit whose nvidia-cdi-hook --help lists apply-cuda-memory-limits. Other backends are unaffected."}
}

// checkClock compares the local clock with the API server's.
func (c Config) checkClock(ctx context.Context) Result {
	const check = "clock-skew"
	if c.APIServer == nil {
		return Result{Check: check, Status: Warn, Message: "cannot be checked: no API server configuration (in-cluster or --kubeconfig)"}
	}
	now := c.Now
	if now == nil {
		now = time.Now
	}
	sent := now()
	server, err := c.APIServer.ServerTime(ctx)
	received := now()
	if err != nil {
		return Result{Check: check, Status: Fail, Message: fmt.Sprintf("the API server's time: %v", err),
			Fix: "The plugin must reach the API server (kubeletPlugin.apiServer, network policies); its logs show the same error."}
	}
	// The server stamped its Date somewhere between sent and received;
	// compare with the middle, and allow for the Date's whole seconds.
	local := sent.Add(received.Sub(sent) / 2)
	skew := local.Sub(server)
	abs := skew.Abs()
	rtt := received.Sub(sent).Round(time.Millisecond)
	msg := fmt.Sprintf("local clock %s the API server's by %v (round trip %v)", aheadBehind(skew), abs.Round(100*time.Millisecond), rtt)
	if abs < time.Second {
		msg = fmt.Sprintf("local clock agrees with the API server's to the second of its Date header (round trip %v)", rtt)
	}
	switch {
	case abs < okSkew:
		return Result{Check: check, Status: OK, Message: msg}
	case abs < failSkew:
		return Result{Check: check, Status: Warn, Message: msg, Fix: "Synchronise the node's clock (chrony or systemd-timesyncd)."}
	}
	return Result{Check: check, Status: Fail, Message: msg + ": tokens, certificates, leases and the plugin's timers are judged by clocks that disagree",
		Fix: "Synchronise the node's clock (chrony or systemd-timesyncd) and the API server's."}
}

func aheadBehind(skew time.Duration) string {
	if skew < 0 {
		return "behind"
	}
	return "ahead of"
}

// checkContainerd reads containerd's config for its CDI setting: without
// CDI, containerd ignores the CDI devices the kubelet hands it, and a claim's
// container starts without its GPU.
func (c Config) checkContainerd() Result {
	const check = "containerd-cdi"
	path := c.ContainerdConfig
	if path == "" {
		path = c.hostPath("etc/containerd/config.toml")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if c.mock() {
			return c.skipMock(check, fmt.Sprintf("containerd's config cannot be read (%v)", err))
		}
		msg := fmt.Sprintf("cannot be checked: %v (the plugin's pod does not mount containerd's config)", err)
		return Result{Check: check, Status: Warn, Message: msg,
			Fix: "On the node: containerd 2.x enables CDI by default; containerd 1.7 needs enable_cdi = true and cdi_spec_dirs including " + c.CDIRoot + ` under [plugins."io.containerd.grpc.v1.cri"]. (CRI-O enables CDI by default.)`}
	}
	cfg, err := ParseContainerdCDI(data)
	if err != nil {
		return Result{Check: check, Status: Warn, Message: fmt.Sprintf("%s: %v", path, err),
			Fix: "containerd reads the same file: correct it (containerd config dump shows what containerd makes of it)."}
	}
	return cfg.result(check, path, c.CDIRoot)
}

// ContainerdCDI is what containerd's config says about CDI.
type ContainerdCDI struct {
	// Version is the config's version (1, 2 or 3; 0 when unset).
	Version int
	// Section is the CRI plugin table that holds the setting.
	Section string
	// EnableCDI is enable_cdi; nil when the config does not set it.
	EnableCDI *bool
	// SpecDirs is cdi_spec_dirs; nil when not set.
	SpecDirs []string
}

// Defaults of containerd's CRI plugin.
var defaultCDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

func (cc ContainerdCDI) result(check, path, cdiRoot string) Result {
	fixEnable := fmt.Sprintf("Set enable_cdi = true under [plugins.%q] in %s (containerd 2.x: [plugins.'io.containerd.cri.v1.runtime']) and restart containerd.", cc.section(), path)
	dirs := cc.SpecDirs
	dirsNote := ""
	if dirs == nil {
		dirs, dirsNote = defaultCDISpecDirs, " (default)"
	}
	if cdiRoot != "" && !slices.Contains(dirs, filepath.Clean(cdiRoot)) && !slices.Contains(dirs, cdiRoot) {
		return Result{Check: check, Status: Fail,
			Message: fmt.Sprintf("%s: cdi_spec_dirs %v%s does not include the plugin's --cdi-root %s: containers start without their GPUs", path, dirs, dirsNote, cdiRoot),
			Fix:     fmt.Sprintf("Add %s to cdi_spec_dirs, or set kubeletPlugin.cdiRoot to one of %v.", cdiRoot, dirs)}
	}
	switch {
	case cc.EnableCDI != nil && *cc.EnableCDI:
		return Result{Check: check, Status: OK, Message: fmt.Sprintf("%s: enable_cdi = true in [plugins.%q], spec dirs %v%s", path, cc.Section, dirs, dirsNote)}
	case cc.EnableCDI != nil:
		return Result{Check: check, Status: Fail, Message: fmt.Sprintf("%s: enable_cdi = false in [plugins.%q]: containers start without their GPUs", path, cc.Section), Fix: fixEnable}
	case cc.Version >= 3:
		return Result{Check: check, Status: OK, Message: fmt.Sprintf("%s: version %d config (containerd 2.x), enable_cdi not set: on by default; spec dirs %v%s", path, cc.Version, dirs, dirsNote)}
	}
	return Result{Check: check, Status: Warn,
		Message: fmt.Sprintf("%s: version %d config without enable_cdi: on with containerd 2.x, off with 1.7", path, cc.Version),
		Fix:     "With containerd 1.7: " + fixEnable}
}

func (cc ContainerdCDI) section() string {
	if cc.Section != "" {
		return cc.Section
	}
	return criSectionV2
}

// The CRI plugin's tables: config version 2 (containerd 1.x) and version 3
// (containerd 2.x, runtime settings).
const (
	criSectionV2 = "io.containerd.grpc.v1.cri"
	criSectionV3 = "io.containerd.cri.v1.runtime"
)
