package main

import (
	goflag "flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/lending"
	"github.com/tessera-dev/tessera/pkg/metricsserver"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/mpsdaemon"
	"github.com/tessera-dev/tessera/pkg/plugin"
	"github.com/tessera-dev/tessera/pkg/publish"
)

// flags are the plugin's command line, in groups. Each group registers its
// flags (register) and checks them, keeping what it parsed (validate).
type flags struct {
	node      nodeFlags
	kubelet   kubeletFlags
	isolation isolationFlags
	mps       mpsFlags
	health    healthFlags
	metrics   metricsFlags
	lending   lendingFlags
	mock      mockFlags
}

// register adds every group's flags, and klog's, to fs.
func (f *flags) register(fs *pflag.FlagSet) {
	f.node.register(fs)
	f.kubelet.register(fs)
	f.mock.register(fs)
	f.isolation.register(fs)
	f.mps.register(fs)
	f.health.register(fs)
	f.metrics.register(fs)
	f.lending.register(fs)
	klogFlags := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
}

// validate checks every group; the first error stops the plugin.
func (f *flags) validate() error {
	for _, g := range []interface{ validate() error }{&f.node, &f.kubelet, &f.isolation, &f.mps, &f.mock, &f.health, &f.metrics, &f.lending} {
		if err := g.validate(); err != nil {
			return err
		}
	}
	return nil
}

// nodeFlags describe the node and how its GPUs are published.
type nodeFlags struct {
	name           string
	driverRoot     string
	hostDriverRoot string
	hostRoot       string
	procRoot       string
	// rediscoverEvery is --rediscover-interval.
	rediscoverEvery time.Duration
	// expectedComputeMode is --expected-compute-mode.
	expectedComputeMode string
	// dynamicMIG is --dynamic-mig: the GPUs published with dynamic MIG.
	dynamicMIG       []string
	localityVerdicts bool
	// allowEnvvar is --allow-visible-devices-envvar.
	allowEnvvar bool

	// Set by validate.
	modes   gpu.ComputeModePolicy
	dynamic publish.DynamicMIG
}

func (g *nodeFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.name, "node-name", os.Getenv("NODE_NAME"), "name of this node (env NODE_NAME)")
	fs.StringVar(&g.driverRoot, "driver-root", "/", "root of the NVIDIA driver installation (libnvidia-ml.so.1, /dev/nvidia*)")
	fs.StringVar(&g.hostDriverRoot, "host-driver-root", "", "the host path of --driver-root, written into CDI specs (device nodes' hostPath, the DriverMemory hook's --driver-root); default: --driver-root")
	fs.StringVar(&g.hostRoot, "host-root", "/", "where the host's / is mounted in the plugin: DriverMemory detection reads the cgroups under <host-root>/sys/fs/cgroup and runs <host-root><nvidia-cdi-hook-path> --help; a claim in the way of a prepare that the API server no longer has is released only when no cgroup of its pods remains under <host-root>/sys/fs/cgroup")
	fs.DurationVar(&g.rediscoverEvery, "rediscover-interval", time.Minute, "how often to rediscover GPUs and republish when the inventory changed")
	fs.StringVar(&g.expectedComputeMode, "expected-compute-mode", string(gpu.ComputeModeDefault), "compute mode every GPU is expected in (Default, ExclusiveProcess, Prohibited, or Any to accept every mode); a GPU in another is published tainted "+health.TaintKey+"=ComputeMode<mode>:NoSchedule. The plugin only reads compute modes, never sets them")
	fs.StringVar(&g.procRoot, "proc-root", "/proc", "where /proc of the host's PID namespace is (NVML reports host PIDs; per-pod GPU memory reads <proc-root>/<pid>/cgroup)")
	fs.StringSliceVar(&g.dynamicMIG, "dynamic-mig", nil, "GPUs published with dynamic MIG while they are in MIG mode, by NVML index or UUID, or \"all\": every placement of every MIG profile is a device, and prepare creates the instance (docs/mig.md). Other GPUs in MIG mode publish their existing instances (static MIG); a named GPU not in MIG mode is published as usual and reported (event DynamicMIGNotApplied)")
	fs.BoolVar(&g.allowEnvvar, "allow-visible-devices-envvar", false, "publish the GPUs untainted even where the NVIDIA container toolkit's config.toml (under --host-root or <proc-root>/1/root: /etc/nvidia-container-runtime/config.toml, or the GPU Operator's /usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml) lets unprivileged containers ask for GPUs through NVIDIA_VISIBLE_DEVICES, its default: any pod without a claim then gets every GPU of the node. Without it such a node's GPUs are published tainted "+publish.UnclaimedAccessTaintKey+":NoSchedule (docs/security.md)")
	fs.BoolVar(&g.localityVerdicts, "locality-verdicts", false, "publish the shared devices with the binding conditions of the locality controller (GpuConfig locality): every share then waits for its verdict before its pod binds; on without a running controller, shares wait until the scheduler's binding timeout and are allocated again")
}

func (g *nodeFlags) validate() error {
	if g.name == "" {
		return fmt.Errorf("--node-name (or env NODE_NAME) is required")
	}
	modes, err := g.computeModes()
	if err != nil {
		return err
	}
	dynamic, err := publish.ParseDynamicMIG(g.dynamicMIG)
	if err != nil {
		return fmt.Errorf("--dynamic-mig: %w", err)
	}
	g.modes, g.dynamic = modes, dynamic
	return nil
}

// computeModes is the compute mode policy of --expected-compute-mode; empty
// means Default.
func (g nodeFlags) computeModes() (gpu.ComputeModePolicy, error) {
	if g.expectedComputeMode == "" {
		return gpu.ComputeModePolicy{}, nil
	}
	mode, err := gpu.ParseComputeMode(g.expectedComputeMode)
	if err != nil {
		return gpu.ComputeModePolicy{}, fmt.Errorf("--expected-compute-mode: %w", err)
	}
	return gpu.ComputeModePolicy{Default: mode}, nil
}

// hostDriver is the host path of the driver root: --host-driver-root, else
// --driver-root.
func (g nodeFlags) hostDriver() string {
	if g.hostDriverRoot != "" {
		return g.hostDriverRoot
	}
	return g.driverRoot
}

// kubeletFlags are the API connection and the directories the kubelet and
// the container runtime share with the plugin.
type kubeletFlags struct {
	kubeconfig    string
	pluginDataDir string
	registrarDir  string
	cdiRoot       string
}

func (g *kubeletFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster configuration")
	fs.StringVar(&g.pluginDataDir, "plugin-data-dir", filepath.Join(kubeletplugin.KubeletPluginsDir, model.DriverName), "plugin data directory (DRA socket, checkpoint); created if missing")
	fs.StringVar(&g.registrarDir, "registrar-dir", kubeletplugin.KubeletRegistryDir, "directory the kubelet watches for plugin registration sockets")
	fs.StringVar(&g.cdiRoot, "cdi-root", cdi.DefaultRoot, "directory for the per-claim CDI specs (must be one the container runtime reads)")
}

func (g *kubeletFlags) validate() error { return nil }

// isolationFlags configure how shares are isolated and how containers get
// their GPUs (CDI, the NVIDIA container toolkit, HAMi-core).
type isolationFlags struct {
	defaultIsolation  string
	hamiCoreLibrary   string
	hamiClaimRoot     string
	nvidiaCDIHookPath string
	legacyRuntime     bool
	nvidiaCDISpecDirs []string
}

func (g *isolationFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.defaultIsolation, "default-isolation", string(configapi.IsolationAdvisory), "isolation of shares whose class and claim configs do not set one: Advisory, MPS or HAMiCore")
	fs.StringVar(&g.hamiCoreLibrary, "hami-core-library", "", "host path of HAMi-core's libvgpu.so (the chart's hamiCore.image installs it); empty: HAMiCore shares fail to prepare")
	fs.StringVar(&g.hamiClaimRoot, "hami-claim-root", isolation.DefaultHAMiCoreClaimRoot, "host directory for the HAMiCore claims' shared regions, one directory per claim (a tmpfs suits them); the plugin must see it at the same path")
	fs.StringVar(&g.nvidiaCDIHookPath, "nvidia-cdi-hook-path", isolation.DefaultNVIDIACDIHookPath, "host path of the NVIDIA container toolkit's nvidia-cdi-hook, which the container runtime runs to apply a DriverMemory share's limits")
	fs.BoolVar(&g.legacyRuntime, "legacy-nvidia-runtime", false, "the node's container runtime is the NVIDIA runtime in legacy mode with accept-nvidia-visible-devices-as-volume-mounts = true in the toolkit's config.toml: GPUs without a device in the toolkit's CDI spec get Tessera's device nodes and a /dev/null mount at /var/run/nvidia-container-devices/<uuid>, for which the runtime adds the driver's libraries, instead of failing to prepare (NVIDIA_VISIBLE_DEVICES stays void; see docs/security.md)")
	fs.StringSliceVar(&g.nvidiaCDISpecDirs, "nvidia-cdi-spec-dirs", []string{"/etc/cdi", "/var/run/cdi"}, "where to look for the NVIDIA container toolkit's CDI spec (nvidia.com/gpu)")
}

func (g *isolationFlags) validate() error {
	if !slices.Contains(configapi.SupportedIsolations, configapi.Isolation(g.defaultIsolation)) {
		return fmt.Errorf("--default-isolation %q: want %s", g.defaultIsolation, configapi.FormatIsolations(configapi.SupportedIsolations))
	}
	return nil
}

// mpsFlags configure the MPS control daemon pods (pkg/mpsdaemon).
type mpsFlags struct {
	// root is --mps-root; empty: <plugin-data-dir>/mps (see dir).
	root                                                        string
	image, pullPolicy, namespace, hostDriverRoot, priorityClass string
	pullSecrets                                                 []string
	readyTimeout                                                time.Duration
	requests, limits                                            map[string]string
	// resources are requests and limits, set by validate.
	resources corev1.ResourceRequirements
}

func (g *mpsFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.root, "mps-root", "", "host directory for the MPS daemons' pipe, shared-memory and log directories (default <plugin-data-dir>/mps); the plugin must see it at the same path")
	fs.StringVar(&g.image, "mps-image", "", "image of the MPS control daemon pods (the plugin's image: it runs this binary's mps-daemon command); empty: MPS shares fail to prepare")
	fs.StringVar(&g.pullPolicy, "mps-image-pull-policy", string(corev1.PullIfNotPresent), "image pull policy of the MPS control daemon pods")
	fs.StringSliceVar(&g.pullSecrets, "mps-image-pull-secrets", nil, "image pull secrets (in --mps-namespace) of the MPS control daemon pods")
	fs.StringVar(&g.namespace, "mps-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the MPS control daemon pods (env POD_NAMESPACE)")
	fs.StringVar(&g.hostDriverRoot, "mps-host-driver-root", "", "host path of the NVIDIA driver root, mounted into the MPS control daemon pods (default --driver-root)")
	fs.StringVar(&g.priorityClass, "mps-priority-class", "", "priority class of the MPS control daemon pods")
	fs.DurationVar(&g.readyTimeout, "mps-ready-timeout", mpsdaemon.DefaultReadyTimeout, "how long a prepare waits for its GPU's MPS control daemon pod to be Ready")
	fs.StringToStringVar(&g.requests, "mps-requests", nil, "resource requests of the MPS control daemon pods, as cpu=QUANTITY,memory=QUANTITY (also ephemeral-storage); with neither this nor --mps-limits: cpu=100m,memory=128Mi")
	fs.StringToStringVar(&g.limits, "mps-limits", nil, "resource limits of the MPS control daemon pods, as cpu=QUANTITY,memory=QUANTITY; empty: none. Equal to --mps-requests gives the pods Guaranteed QoS (docs/mps.md)")
}

func (g *mpsFlags) validate() error {
	requests, err := mpsdaemon.ParseResourceList(g.requests)
	if err != nil {
		return fmt.Errorf("--mps-requests: %w", err)
	}
	limits, err := mpsdaemon.ParseResourceList(g.limits)
	if err != nil {
		return fmt.Errorf("--mps-limits: %w", err)
	}
	g.resources = corev1.ResourceRequirements{Requests: requests, Limits: limits}
	return nil
}

// dir is --mps-root, by default under the plugin data directory.
func (g mpsFlags) dir(pluginDataDir string) string {
	if g.root == "" {
		return filepath.Join(pluginDataDir, "mps")
	}
	return g.root
}

// healthFlags configure the GPU health watch (pkg/health).
type healthFlags struct {
	enabled        bool
	ignoredXIDs    []uint
	fatalXIDs      []uint
	fatalEffect    string
	recoveryPeriod time.Duration

	// policy is set by validate.
	policy health.Policy
}

func (g *healthFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&g.enabled, "health", true, "watch NVML error events: taint unhealthy GPUs' devices ("+health.TaintKey+") and report device health to the kubelet")
	fs.UintSliceVar(&g.ignoredXIDs, "health-ignored-xids", toUint(health.DefaultIgnoredXIDs), "XIDs that never make a GPU unhealthy (application faults)")
	fs.UintSliceVar(&g.fatalXIDs, "health-fatal-xids", toUint(health.DefaultFatalXIDs), "XIDs that taint with --health-fatal-effect; other critical XIDs taint NoSchedule")
	fs.StringVar(&g.fatalEffect, "health-fatal-effect", string(resourceapi.DeviceTaintEffectNoExecute), "taint effect of fatal XIDs, double-bit ECC errors and lost GPUs: NoExecute (evict), NoSchedule or None")
	fs.DurationVar(&g.recoveryPeriod, "health-recovery-period", health.DefaultRecoveryPeriod, "how long an unhealthy GPU must go without a counted error before its taint is removed")
}

func (g *healthFlags) validate() error {
	if !g.enabled {
		return nil
	}
	g.policy = health.Policy{
		IgnoredXIDs:    toUint64(g.ignoredXIDs),
		FatalXIDs:      toUint64(g.fatalXIDs),
		FatalEffect:    resourceapi.DeviceTaintEffect(g.fatalEffect),
		RecoveryPeriod: g.recoveryPeriod,
	}
	if err := g.policy.Validate(); err != nil {
		return fmt.Errorf("--health-*: %w", err)
	}
	return nil
}

// metricsFlags configure the HTTPS server of /metrics and /healthz.
type metricsFlags struct {
	address     string
	tlsCert     string
	tlsKey      string
	timeout     time.Duration
	maxInFlight int
}

func (g *metricsFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.address, "metrics-address", ":9477", "host:port of the HTTPS server for /metrics (Prometheus; needs a bearer token allowed to get the non-resource URL /metrics) and /healthz (unauthenticated); empty host: every interface; empty: no server")
	fs.StringVar(&g.tlsCert, "metrics-tls-cert-file", "", "PEM certificate of the metrics server (re-read when it changes); empty: a self-signed certificate generated at start")
	fs.StringVar(&g.tlsKey, "metrics-tls-key-file", "", "PEM private key of --metrics-tls-cert-file")
	fs.DurationVar(&g.timeout, "metrics-request-timeout", metricsserver.DefaultRequestTimeout, "the longest a /metrics or /healthz request may take")
	fs.IntVar(&g.maxInFlight, "metrics-max-in-flight", metricsserver.DefaultMaxInFlight, "how many /metrics requests are served at once (each reads NVML and /proc); more get 429")
}

func (g *metricsFlags) validate() error { return nil }

// lendingFlags configure lending idle GPUs (pkg/lending).
type lendingFlags struct {
	enabled        bool
	idlePeriod     time.Duration
	sampleInterval time.Duration
	busyThreshold  uint
	reserve        string
	min            string
	killMargin     time.Duration
	cgroupRoot     string
	procRoot       string

	// policy is set by validate.
	policy lending.Policy
}

func (g *lendingFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&g.enabled, "lending", false, "publish a lending device gpu-N-lent per GPU and lend GPUs whose owners consent (GpuConfig lending.lendWhenIdle) while they idle")
	fs.DurationVar(&g.idlePeriod, "lending-idle-period", lending.DefaultPolicy().IdlePeriod, "how long a GPU's owners must be idle before it is lent")
	fs.DurationVar(&g.sampleInterval, "lending-sample-interval", 2*time.Second, "how often owner activity is sampled (NVML per-process utilization); a busy owner is seen within this")
	fs.UintVar(&g.busyThreshold, "lending-busy-threshold", 5, "SM utilization (percent) at or above which an owner's process is busy")
	fs.StringVar(&g.reserve, "lending-reserve", "1Gi", "GPU memory kept back for the owners when lending")
	fs.StringVar(&g.min, "lending-min", "1Gi", "least GPU memory worth lending")
	fs.DurationVar(&g.killMargin, "lending-kill-margin", plugin.DefaultKillMargin, "how long after its reclaim grace a borrower that still holds its GPU is killed (cgroup.kill of its pod's cgroups)")
	fs.StringVar(&g.cgroupRoot, "lending-cgroup-root", "/sys/fs/cgroup", "where the host's cgroup filesystem is mounted (read-write), to kill borrowers that outstay a reclaim; empty: borrowers are only reported")
	fs.StringVar(&g.procRoot, "lending-proc-root", "", "the host's /proc for finding an outstaying borrower's containers from its GPU processes where the kubelet makes no pod cgroups; empty: --proc-root")
}

func (g *lendingFlags) validate() error {
	if !g.enabled {
		return nil
	}
	policy := lending.DefaultPolicy()
	policy.IdlePeriod = g.idlePeriod
	for _, q := range []struct {
		flag, value string
		into        *int64
	}{{"--lending-reserve", g.reserve, &policy.Reserve}, {"--lending-min", g.min, &policy.MinLend}} {
		v, err := resource.ParseQuantity(q.value)
		if err != nil {
			return fmt.Errorf("%s %q: %w", q.flag, q.value, err)
		}
		*q.into = v.Value()
	}
	if err := policy.Validate(); err != nil {
		return fmt.Errorf("--lending-*: %w", err)
	}
	if g.killMargin < 0 {
		return fmt.Errorf("--lending-kill-margin %s: must not be negative", g.killMargin)
	}
	if g.sampleInterval <= 0 || g.busyThreshold > 100 {
		return fmt.Errorf("--lending-sample-interval %s, --lending-busy-threshold %d: want a positive interval and a threshold of at most 100", g.sampleInterval, g.busyThreshold)
	}
	g.policy = policy
	return nil
}

// mockFlags are the test knobs of mock GPU profiles.
type mockFlags struct {
	profile        string
	faultInjection bool
	knobAddress    string
	failDiscovery  []string
	driverMemory   bool
	migStateFile   string
}

func (g *mockFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.profile, "mock-profile", "", "use this mock node profile instead of real GPUs (one of: "+strings.Join(gpu.Profiles(), ", ")+"); never chosen implicitly")
	fs.BoolVar(&g.faultInjection, "mock-fault-injection", false, "TEST KNOB, mock profiles only: serve POST /mock/xid, /mock/dbe, /mock/lost, /mock/discovery and /mock/process (plain HTTP, no authentication) on --mock-fault-injection-address to inject NVML events, discovery failures and GPU processes")
	fs.StringVar(&g.knobAddress, "mock-fault-injection-address", "127.0.0.1:9476", "TEST KNOB: address of the --mock-fault-injection server (it also serves /healthz)")
	fs.BoolVar(&g.driverMemory, "mock-driver-memory-limits", false, "TEST KNOB, mock profiles only: report the node able to enforce DriverMemory shares (publish driverMemoryLimits=true; the spec carries the --nvidia-cdi-hook-path hook, which the runtime runs)")
	fs.StringVar(&g.migStateFile, "mock-mig-state-file", "", "TEST KNOB, mock profiles only: keep the mock GPUs' MIG modes and instances in this file, so that instances outlive a plugin restart as they do on a real node (the chart puts it in the plugin data directory)")
	fs.StringSliceVar(&g.failDiscovery, "mock-fail-discovery", nil, "TEST KNOB, mock profiles only: GPUs that fail discovery, as INDEX[:CALL] with CALL one of "+strings.Join(gpu.MockDiscoveryCalls, ", ")+" (default "+gpu.DefaultMockDiscoveryCall+")")
}

// validate refuses the test knobs without a mock profile.
func (g *mockFlags) validate() error {
	if (g.faultInjection || len(g.failDiscovery) > 0 || g.driverMemory || g.migStateFile != "") && g.profile == "" {
		return fmt.Errorf("--mock-fault-injection, --mock-fail-discovery, --mock-driver-memory-limits and --mock-mig-state-file need --mock-profile: they are test knobs for mock GPUs")
	}
	return nil
}

func toUint(in []uint64) []uint {
	out := make([]uint, len(in))
	for i, v := range in {
		out[i] = uint(v)
	}
	return out
}

func toUint64(in []uint) []uint64 {
	out := make([]uint64, len(in))
	for i, v := range in {
		out[i] = uint64(v)
	}
	return out
}
