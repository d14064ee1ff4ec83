// Command tessera-kubelet-plugin is the node daemon of the gpu.tessera.dev DRA
// driver: it discovers the node's GPUs, publishes them as ResourceSlices and
// prepares and unprepares resource claims for the kubelet. It only parses
// flags and wires packages; the logic lives in pkg/plugin and below.
package main

import (
	"context"
	"errors"
	goflag "flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/lending"
	"github.com/tessera-dev/tessera/pkg/metrics"
	"github.com/tessera-dev/tessera/pkg/metricsserver"
	"github.com/tessera-dev/tessera/pkg/mig"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/mpsdaemon"
	"github.com/tessera-dev/tessera/pkg/plugin"
)

type flags struct {
	nodeName          string
	kubeconfig        string
	pluginDataDir     string
	registrarDir      string
	cdiRoot           string
	driverRoot        string
	mockProfile       string
	defaultIsolation  string
	hamiCoreLibrary   string
	hamiClaimRoot     string
	hostDriverRoot    string
	hostRoot          string
	nvidiaCDIHookPath string
	legacyRuntime     bool
	mpsRoot           string
	mps               mpsFlags
	nvidiaCDISpecDirs []string
	rediscoverEvery   time.Duration
	// expectedComputeMode is --expected-compute-mode.
	expectedComputeMode string

	health               bool
	healthIgnoredXIDs    []uint
	healthFatalXIDs      []uint
	healthFatalEffect    string
	healthRecoveryPeriod time.Duration

	metricsAddress     string
	metricsTLSCert     string
	metricsTLSKey      string
	metricsTimeout     time.Duration
	metricsMaxInFlight int
	procRoot           string
	mockFaultInjection bool
	mockKnobAddress    string
	mockFailDiscovery  []string
	mockDriverMemory   bool
	mockMIGStateFile   string

	// dynamicMIG is --dynamic-mig: the GPUs published with dynamic MIG.
	dynamicMIG []string

	lending               bool
	localityVerdicts      bool
	lendingIdlePeriod     time.Duration
	lendingSampleInterval time.Duration
	lendingBusyThreshold  uint
	lendingReserve        string
	lendingMin            string
	lendingKillMargin     time.Duration
	lendingCgroupRoot     string
	lendingProcRoot       string
}

func main() {
	if err := newCommand().Execute(); err != nil {
		// cobra has printed the error already.
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	f := flags{}
	cmd := &cobra.Command{
		Use:           "tessera-kubelet-plugin",
		Short:         "Kubelet plugin of the gpu.tessera.dev DRA driver",
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return run(ctx, f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node (env NODE_NAME)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster configuration")
	fs.StringVar(&f.pluginDataDir, "plugin-data-dir", filepath.Join(kubeletplugin.KubeletPluginsDir, model.DriverName), "plugin data directory (DRA socket, checkpoint); created if missing")
	fs.StringVar(&f.registrarDir, "registrar-dir", kubeletplugin.KubeletRegistryDir, "directory the kubelet watches for plugin registration sockets")
	fs.StringVar(&f.cdiRoot, "cdi-root", cdi.DefaultRoot, "directory for the per-claim CDI specs (must be one the container runtime reads)")
	fs.StringVar(&f.driverRoot, "driver-root", "/", "root of the NVIDIA driver installation (libnvidia-ml.so.1, /dev/nvidia*)")
	fs.StringVar(&f.mockProfile, "mock-profile", "", "use this mock node profile instead of real GPUs (one of: "+strings.Join(gpu.Profiles(), ", ")+"); never chosen implicitly")
	fs.StringVar(&f.defaultIsolation, "default-isolation", string(configapi.IsolationAdvisory), "isolation of shares whose class and claim configs do not set one: Advisory, MPS or HAMiCore")
	fs.StringVar(&f.hamiCoreLibrary, "hami-core-library", "", "host path of HAMi-core's libvgpu.so (the chart's hamiCore.image installs it); empty: HAMiCore shares fail to prepare")
	fs.StringVar(&f.hamiClaimRoot, "hami-claim-root", isolation.DefaultHAMiCoreClaimRoot, "host directory for the HAMiCore claims' shared regions, one directory per claim (a tmpfs suits them); the plugin must see it at the same path")
	fs.StringVar(&f.hostDriverRoot, "host-driver-root", "", "the host path of --driver-root, written into CDI specs (device nodes' hostPath, the DriverMemory hook's --driver-root); default: --driver-root")
	fs.StringVar(&f.hostRoot, "host-root", "/", "where the host's / is mounted in the plugin: DriverMemory detection reads the cgroups under <host-root>/sys/fs/cgroup and runs <host-root><nvidia-cdi-hook-path> --help")
	fs.StringVar(&f.nvidiaCDIHookPath, "nvidia-cdi-hook-path", isolation.DefaultNVIDIACDIHookPath, "host path of the NVIDIA container toolkit's nvidia-cdi-hook, which the container runtime runs to apply a DriverMemory share's limits")
	fs.BoolVar(&f.legacyRuntime, "legacy-nvidia-runtime", false, "the node's container runtime is the NVIDIA runtime in legacy mode with accept-nvidia-visible-devices-as-volume-mounts = true in the toolkit's config.toml: GPUs without a device in the toolkit's CDI spec get Tessera's device nodes and a /dev/null mount at /var/run/nvidia-container-devices/<uuid>, for which the runtime adds the driver's libraries, instead of failing to prepare (NVIDIA_VISIBLE_DEVICES stays void; see docs/security.md)")
	fs.StringVar(&f.mpsRoot, "mps-root", "", "host directory for the MPS daemons' pipe, shared-memory and log directories (default <plugin-data-dir>/mps); the plugin must see it at the same path")
	fs.StringVar(&f.mps.image, "mps-image", "", "image of the MPS control daemon pods (the plugin's image: it runs this binary's mps-daemon command); empty: MPS shares fail to prepare")
	fs.StringVar(&f.mps.pullPolicy, "mps-image-pull-policy", string(corev1.PullIfNotPresent), "image pull policy of the MPS control daemon pods")
	fs.StringSliceVar(&f.mps.pullSecrets, "mps-image-pull-secrets", nil, "image pull secrets (in --mps-namespace) of the MPS control daemon pods")
	fs.StringVar(&f.mps.namespace, "mps-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the MPS control daemon pods (env POD_NAMESPACE)")
	fs.StringVar(&f.mps.hostDriverRoot, "mps-host-driver-root", "", "host path of the NVIDIA driver root, mounted into the MPS control daemon pods (default --driver-root)")
	fs.StringVar(&f.mps.priorityClass, "mps-priority-class", "", "priority class of the MPS control daemon pods")
	fs.DurationVar(&f.mps.readyTimeout, "mps-ready-timeout", mpsdaemon.DefaultReadyTimeout, "how long a prepare waits for its GPU's MPS control daemon pod to be Ready")
	fs.StringToStringVar(&f.mps.requests, "mps-requests", nil, "resource requests of the MPS control daemon pods, as cpu=QUANTITY,memory=QUANTITY (also ephemeral-storage); with neither this nor --mps-limits: cpu=100m,memory=128Mi")
	fs.StringToStringVar(&f.mps.limits, "mps-limits", nil, "resource limits of the MPS control daemon pods, as cpu=QUANTITY,memory=QUANTITY; empty: none. Equal to --mps-requests gives the pods Guaranteed QoS (docs/mps.md)")
	fs.StringSliceVar(&f.nvidiaCDISpecDirs, "nvidia-cdi-spec-dirs", []string{"/etc/cdi", "/var/run/cdi"}, "where to look for the NVIDIA container toolkit's CDI spec (nvidia.com/gpu)")
	fs.DurationVar(&f.rediscoverEvery, "rediscover-interval", time.Minute, "how often to rediscover GPUs and republish when the inventory changed")
	fs.StringVar(&f.expectedComputeMode, "expected-compute-mode", string(gpu.ComputeModeDefault), "compute mode every GPU is expected in (Default, ExclusiveProcess, Prohibited, or Any to accept every mode); a GPU in another is published tainted "+health.TaintKey+"=ComputeMode<mode>:NoSchedule. The plugin only reads compute modes, never sets them")
	fs.BoolVar(&f.health, "health", true, "watch NVML error events: taint unhealthy GPUs' devices ("+health.TaintKey+") and report device health to the kubelet")
	fs.UintSliceVar(&f.healthIgnoredXIDs, "health-ignored-xids", toUint(health.DefaultIgnoredXIDs), "XIDs that never make a GPU unhealthy (application faults)")
	fs.UintSliceVar(&f.healthFatalXIDs, "health-fatal-xids", toUint(health.DefaultFatalXIDs), "XIDs that taint with --health-fatal-effect; other critical XIDs taint NoSchedule")
	fs.StringVar(&f.healthFatalEffect, "health-fatal-effect", string(resourceapi.DeviceTaintEffectNoExecute), "taint effect of fatal XIDs, double-bit ECC errors and lost GPUs: NoExecute (evict), NoSchedule or None")
	fs.DurationVar(&f.healthRecoveryPeriod, "health-recovery-period", health.DefaultRecoveryPeriod, "how long an unhealthy GPU must go without a counted error before its taint is removed")
	fs.StringVar(&f.metricsAddress, "metrics-address", ":9477", "host:port of the HTTPS server for /metrics (Prometheus; needs a bearer token allowed to get the non-resource URL /metrics) and /healthz (unauthenticated); empty host: every interface; empty: no server")
	fs.StringVar(&f.metricsTLSCert, "metrics-tls-cert-file", "", "PEM certificate of the metrics server (re-read when it changes); empty: a self-signed certificate generated at start")
	fs.StringVar(&f.metricsTLSKey, "metrics-tls-key-file", "", "PEM private key of --metrics-tls-cert-file")
	fs.DurationVar(&f.metricsTimeout, "metrics-request-timeout", metricsserver.DefaultRequestTimeout, "the longest a /metrics or /healthz request may take")
	fs.IntVar(&f.metricsMaxInFlight, "metrics-max-in-flight", metricsserver.DefaultMaxInFlight, "how many /metrics requests are served at once (each reads NVML and /proc); more get 429")
	fs.StringVar(&f.procRoot, "proc-root", "/proc", "where /proc of the host's PID namespace is (NVML reports host PIDs; per-pod GPU memory reads <proc-root>/<pid>/cgroup)")
	fs.BoolVar(&f.mockFaultInjection, "mock-fault-injection", false, "TEST KNOB, mock profiles only: serve POST /mock/xid, /mock/dbe, /mock/lost, /mock/discovery and /mock/process (plain HTTP, no authentication) on --mock-fault-injection-address to inject NVML events, discovery failures and GPU processes")
	fs.StringVar(&f.mockKnobAddress, "mock-fault-injection-address", "127.0.0.1:9476", "TEST KNOB: address of the --mock-fault-injection server (it also serves /healthz)")
	fs.BoolVar(&f.mockDriverMemory, "mock-driver-memory-limits", false, "TEST KNOB, mock profiles only: report the node able to enforce DriverMemory shares (publish driverMemoryLimits=true; the spec carries the --nvidia-cdi-hook-path hook, which the runtime runs)")
	fs.StringVar(&f.mockMIGStateFile, "mock-mig-state-file", "", "TEST KNOB, mock profiles only: keep the mock GPUs' MIG modes and instances in this file, so that instances outlive a plugin restart as they do on a real node (the chart puts it in the plugin data directory)")
	fs.StringSliceVar(&f.dynamicMIG, "dynamic-mig", nil, "GPUs published with dynamic MIG while they are in MIG mode, by NVML index or UUID, or \"all\": every placement of every MIG profile is a device, and prepare creates the instance (docs/mig.md). Other GPUs in MIG mode publish their existing instances (static MIG); a named GPU not in MIG mode is published as usual and reported (event DynamicMIGNotApplied)")
	fs.StringSliceVar(&f.mockFailDiscovery, "mock-fail-discovery", nil, "TEST KNOB, mock profiles only: GPUs that fail discovery, as INDEX[:CALL] with CALL one of "+strings.Join(gpu.MockDiscoveryCalls, ", ")+" (default "+gpu.DefaultMockDiscoveryCall+")")
	fs.BoolVar(&f.localityVerdicts, "locality-verdicts", false, "publish the shared devices with the binding conditions of the locality controller (GpuConfig locality): every share then waits for its verdict before its pod binds; on without a running controller, shares wait until the scheduler's binding timeout and are allocated again")
	fs.BoolVar(&f.lending, "lending", false, "publish a lending device gpu-N-lent per GPU and lend GPUs whose owners consent (GpuConfig lending.lendWhenIdle) while they idle")
	fs.DurationVar(&f.lendingIdlePeriod, "lending-idle-period", lending.DefaultPolicy().IdlePeriod, "how long a GPU's owners must be idle before it is lent")
	fs.DurationVar(&f.lendingSampleInterval, "lending-sample-interval", 2*time.Second, "how often owner activity is sampled (NVML per-process utilization); a busy owner is seen within this")
	fs.UintVar(&f.lendingBusyThreshold, "lending-busy-threshold", 5, "SM utilization (percent) at or above which an owner's process is busy")
	fs.StringVar(&f.lendingReserve, "lending-reserve", "1Gi", "GPU memory kept back for the owners when lending")
	fs.StringVar(&f.lendingMin, "lending-min", "1Gi", "least GPU memory worth lending")
	fs.DurationVar(&f.lendingKillMargin, "lending-kill-margin", plugin.DefaultKillMargin, "how long after its reclaim grace a borrower that still holds its GPU is killed (cgroup.kill of its pod's cgroups)")
	fs.StringVar(&f.lendingCgroupRoot, "lending-cgroup-root", "/sys/fs/cgroup", "where the host's cgroup filesystem is mounted (read-write), to kill borrowers that outstay a reclaim; empty: borrowers are only reported")
	fs.StringVar(&f.lendingProcRoot, "lending-proc-root", "", "the host's /proc for finding an outstaying borrower's containers from its GPU processes where the kubelet makes no pod cgroups; empty: --proc-root")
	klogFlags := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	cmd.AddCommand(newMPSDaemonCommand(), newDoctorCommand(&f, fs))
	return cmd
}

// mpsFlags configure the MPS control daemon pods (pkg/mpsdaemon).
type mpsFlags struct {
	image, pullPolicy, namespace, hostDriverRoot, priorityClass string
	pullSecrets                                                 []string
	readyTimeout                                                time.Duration
	requests, limits                                            map[string]string
	resources                                                   corev1.ResourceRequirements
}

// newMPSDaemonCommand is the program of the MPS control daemon pods that
// the plugin creates: "mps-daemon run" runs the daemon, "mps-daemon ready"
// is their readiness probe.
func newMPSDaemonCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mps-daemon",
		Short: "Run a GPU's MPS control daemon (in the daemon pods the plugin creates)",
	}
	o := mpsdaemon.Options{Log: os.Stdout}
	run := &cobra.Command{
		Use:          "run",
		Short:        "Run the MPS control daemon of one GPU until SIGTERM",
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return mpsdaemon.Run(ctx, o)
		},
	}
	run.Flags().StringVar(&o.GPU, "gpu", "", "UUID of the GPU (CUDA_VISIBLE_DEVICES of the daemon)")
	run.Flags().StringVar(&o.DriverRoot, "driver-root", "", "container path of the driver root to run nvidia-cuda-mps-control in (chroot)")
	run.Flags().BoolVar(&o.Fake, "fake", false, "run a fake daemon (mock GPU profiles): a control socket and pid file, no GPU")
	run.Flags().StringVar(&o.ReadyFile, "ready-file", "", "file written once the daemon accepts clients")
	run.Flags().BoolVar(&o.ShmTmpfs, strings.TrimPrefix(mpsdaemon.ShmTmpfsFlag, "--"), false, "refuse to start unless /dev/shm (the domain's shared memory the plugin mounts) is a tmpfs")
	var readyFile string
	ready := &cobra.Command{
		Use:          "ready",
		Short:        "Exit 0 when the daemon of --ready-file runs and accepts clients (the pod's probe)",
		SilenceUsage: true,
		RunE:         func(*cobra.Command, []string) error { return mpsdaemon.Ready(readyFile) },
	}
	ready.Flags().StringVar(&readyFile, "ready-file", "", "the daemon's --ready-file")
	cmd.AddCommand(run, ready)
	return cmd
}

func run(ctx context.Context, f flags) error {
	logger := klog.FromContext(ctx)
	if f.nodeName == "" {
		return fmt.Errorf("--node-name (or env NODE_NAME) is required")
	}
	computeModes, err := f.computeModes()
	if err != nil {
		return err
	}
	iso := configapi.Isolation(f.defaultIsolation)
	if !slices.Contains(configapi.SupportedIsolations, iso) {
		return fmt.Errorf("--default-isolation %q: want %s", f.defaultIsolation, configapi.FormatIsolations(configapi.SupportedIsolations))
	}
	if err := os.MkdirAll(f.pluginDataDir, 0o750); err != nil {
		return fmt.Errorf("create --plugin-data-dir: %w", err)
	}
	if f.mpsRoot == "" {
		f.mpsRoot = filepath.Join(f.pluginDataDir, "mps")
	}
	mpsRequests, err := mpsdaemon.ParseResourceList(f.mps.requests)
	if err != nil {
		return fmt.Errorf("--mps-requests: %w", err)
	}
	mpsLimits, err := mpsdaemon.ParseResourceList(f.mps.limits)
	if err != nil {
		return fmt.Errorf("--mps-limits: %w", err)
	}
	f.mps.resources = corev1.ResourceRequirements{Requests: mpsRequests, Limits: mpsLimits}

	// GPUs: a mock profile only when asked for. A node without usable NVML
	// (no library, no kernel module) runs without GPUs: it publishes an empty
	// pool, says why (log, Node event, /healthz) and can still unprepare the
	// claims prepared before; once NVML can be opened the plugin restarts.
	mock := f.mockProfile != ""
	if (f.mockFaultInjection || len(f.mockFailDiscovery) > 0 || f.mockDriverMemory || f.mockMIGStateFile != "") && !mock {
		return fmt.Errorf("--mock-fault-injection, --mock-fail-discovery, --mock-driver-memory-limits and --mock-mig-state-file need --mock-profile: they are test knobs for mock GPUs")
	}
	dynamicMIG, err := plugin.ParseDynamicMIG(f.dynamicMIG)
	if err != nil {
		return fmt.Errorf("--dynamic-mig: %w", err)
	}
	ctx, restart := context.WithCancelCause(ctx)
	defer restart(nil)
	nvmlLib, nvmlErr := openNVML(f)
	if nvmlErr != nil {
		if mock || !errors.Is(nvmlErr, gpu.ErrUnavailable) {
			return nvmlErr
		}
		logger.Error(nvmlErr, "NVML is not available: running without GPUs; claims prepared earlier can still be unprepared. The plugin restarts once NVML can be opened.")
	} else {
		defer nvmlLib.Shutdown()
	}
	discover := plugin.NVMLDiscovery(nvmlLib, nvmlErr)
	discovered, err := discover()
	if err == nil {
		logger.Info("Discovered GPUs", "count", len(discovered.GPUs), "failed", len(discovered.Failed), "mock", mock, "profile", f.mockProfile)
	}

	config, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}

	bootID, err := checkpoint.BootID()
	if err != nil {
		logger.Error(err, "Reading the boot id failed; reboot detection is off")
	}
	specs, err := cdi.NewDir(f.cdiRoot)
	if err != nil {
		return err
	}

	opts := plugin.Options{
		NodeName:         f.nodeName,
		GPUs:             discovered.GPUs,
		Specs:            specs,
		Mock:             mock,
		DefaultIsolation: iso,
		Client:           client,
		DynamicMIG:       dynamicMIG,
	}
	if nvmlLib != nil {
		// MIG instances are created, adopted and destroyed through NVML.
		opts.MIG = &mig.NVML{Lib: nvmlLib}
	}
	mpsDaemons := mpsRunner(ctx, f, client, mock)
	if mock {
		// The mock plugin may not mount: each domain's shared memory is a
		// plain directory, and mock GPUs hold no MPS server context.
		opts.MPS = isolation.NewMPS(f.mpsRoot, mpsDaemons)
	} else {
		opts.MPS = isolation.NewMPSWith(f.mpsRoot, mpsDaemons, isolation.MPSOptions{
			Shm:           isolation.HostShm{},
			ServerReserve: isolation.DefaultMPSServerReserve,
		})
	}
	if !mock {
		opts.DevNodes = isolation.HostDevNodes{DriverRoot: f.driverRoot, HostDriverRoot: f.hostDriverRoot}
		opts.ToolkitSpecDirs = f.nvidiaCDISpecDirs
		opts.LegacyRuntime = f.legacyRuntime
		if opts.Toolkit, err = cdi.NewToolkitSpecs(f.nvidiaCDISpecDirs...); err != nil {
			return err
		}
	}
	opts.DriverMemory = driverMemory(f, mock, discovered.GPUs)
	logger.Info("Driver-enforced memory limits (isolation DriverMemory)", "capable", opts.DriverMemory.Capable, "reason", opts.DriverMemory.Reason)
	// The claims' shared-region directories are known even without HAMi-core,
	// so that HAMiCore claims prepared before it was turned off are cleaned
	// up at unprepare (their prepare still fails closed: no library).
	// Claims prepared by releases before --hami-claim-root keep their
	// directory under the plugin data directory, and claims prepared under
	// an earlier --hami-claim-root keep theirs there.
	opts.HAMiCore = isolation.HAMiCore{ClaimRoot: f.hamiClaimRoot, OldClaimRoots: []string{filepath.Join(f.pluginDataDir, "hami", "claims")}}
	if f.hamiClaimRoot != "" {
		used, err := isolation.RememberClaimRoots(filepath.Join(f.pluginDataDir, "hami-claim-roots"), f.hamiClaimRoot)
		if err != nil {
			logger.Error(err, "Claims prepared under an earlier --hami-claim-root may lose their directory")
		}
		opts.HAMiCore.OldClaimRoots = append(opts.HAMiCore.OldClaimRoots, used...)
	}
	if err := opts.HAMiCore.EnsureClaimRoot(); err != nil {
		logger.Error(err, "HAMiCore shares will fail to prepare until this is fixed")
	}
	if f.hamiCoreLibrary != "" {
		preload, err := isolation.WritePreloadFile(filepath.Join(f.pluginDataDir, "hami"))
		if err != nil {
			return err
		}
		opts.HAMiCore.Library, opts.HAMiCore.PreloadFile = f.hamiCoreLibrary, preload
		if err := opts.HAMiCore.Check(); err != nil {
			logger.Error(err, "HAMiCore shares will fail to prepare until this is fixed")
		}
	}
	events := plugin.NewNodeEvents(ctx, client, f.nodeName)
	defer events.Shutdown()
	opts.Events = events

	var tracker *health.Tracker
	if f.health {
		policy := health.Policy{
			IgnoredXIDs:    toUint64(f.healthIgnoredXIDs),
			FatalXIDs:      toUint64(f.healthFatalXIDs),
			FatalEffect:    resourceapi.DeviceTaintEffect(f.healthFatalEffect),
			RecoveryPeriod: f.healthRecoveryPeriod,
		}
		if err := policy.Validate(); err != nil {
			return fmt.Errorf("--health-*: %w", err)
		}
		tracker = health.NewTracker(policy, nil)
		// Health survives restarts and is shared with the other pod of a
		// surge update (see health.Tracker.Persist).
		tracker.Persist(ctx, health.Store{Path: filepath.Join(f.pluginDataDir, health.StateFile)})
		opts.Health = tracker
	}

	m := metrics.New(f.nodeName)
	opts.Metrics = m
	if nvmlLib != nil {
		opts.Processes = func(uuid string) (int, error) { return gpu.ComputeProcesses(nvmlLib, uuid) }
	}

	// With rolling updates the helper serializes prepare and unprepare
	// across the two pods with this lock; opening the checkpoint and
	// recovering hold it too.
	lockPath := ""
	if os.Getenv("POD_UID") != "" {
		lockPath = filepath.Join(f.pluginDataDir, "serialize.lock")
	}
	p, err := plugin.Open(ctx, lockPath, filepath.Join(f.pluginDataDir, "checkpoint.json"), bootID, opts)
	if err != nil {
		return err
	}
	inv := &plugin.Inventory{NodeName: f.nodeName, DiscoverNode: discover, OnChange: p.SetGPUs, Events: events, ComputeModes: computeModes,
		DynamicMIG: dynamicMIG, MIGHeld: p.MIGHeld}
	// A created or destroyed MIG instance is republished soon, not at the
	// next --rediscover-interval.
	p.OnMIGChange(inv.Trigger)
	if !mock {
		// Mock GPUs' bus ids exist in no sysfs (their profile gives their
		// roots); real ones get the standard resource.kubernetes.io/pcieRoot
		// attribute from sysfs, or are logged and published without it.
		inv.Model = append(inv.Model, model.WithPCIeRoots(gpu.NewSysfsPCIeRoots(logger)))
		// Fail-closed toolkit requirement: say so at start, not only at
		// the first prepare.
		p.CheckToolkit(ctx)
	}
	inv.Model = append(inv.Model, model.WithDriverMemoryLimits(opts.DriverMemory.Capable))
	if f.localityVerdicts {
		inv.Model = append(inv.Model, model.WithLocalityVerdicts())
	}
	if tracker != nil {
		inv.Taints = plugin.HealthTaints(tracker)
		// XIDs that name one MIG device taint that device only.
		inv.DeviceTaints = tracker.MIGTaints
	}
	var usage *metrics.Usage
	if nvmlLib != nil {
		usage = &metrics.Usage{Lib: nvmlLib, ProcRoot: f.procRoot, Pods: p}
	}
	m.AddState(p, usage)
	m.AddDiscovery(inv)
	// /healthz fails when the helper's gRPC servers stop answering or the
	// inventory loop that publishes the slices has stopped; a node without
	// GPUs is reported, not failed (see plugin.Inventory.HealthzHandler).
	var sockets metricsserver.Sockets
	var publisher metricsserver.Alive
	healthz := &metricsserver.Health{Status: inv.Status}
	healthz.Add("kubelet-plugin-grpc", sockets.Check)
	healthz.Add("slice-publisher", publisher.Check)
	if f.metricsAddress != "" {
		// Reviews of scrapers' tokens use a client of their own, limited
		// to metricsserver.DelegatedQPS.
		auth, err := metricsserver.NewDelegatedForConfig(config)
		if err != nil {
			return err
		}
		srv := &metricsserver.Server{
			Address:        f.metricsAddress,
			Certificate:    &metricsserver.Certificate{CertFile: f.metricsTLSCert, KeyFile: f.metricsTLSKey, Host: f.nodeName},
			Auth:           auth,
			Metrics:        m.Handler(),
			Health:         healthz,
			RequestTimeout: f.metricsTimeout,
			MaxInFlight:    f.metricsMaxInFlight,
		}
		if _, err := srv.Handler(); err != nil {
			return err
		}
		if _, err := srv.Certificate.Load(); err != nil {
			return fmt.Errorf("--metrics-tls-cert-file/--metrics-tls-key-file: %w", err)
		}
		go func() {
			if err := srv.Run(ctx); err != nil {
				logger.Error(err, "Metrics server stopped", "address", f.metricsAddress)
			}
		}()
	}
	if node, ok := nvmlLib.(*gpu.MockNode); ok && f.mockFaultInjection {
		logger.Info("TEST KNOB: NVML fault injection served without authentication", "address", f.mockKnobAddress, "paths", "/mock/xid, /mock/dbe, /mock/lost, /mock/discovery, /mock/process, /healthz")
		mux := http.NewServeMux()
		mux.Handle("/mock/", node.FaultHandler())
		mux.Handle("/healthz", healthz)
		go serveMockKnob(ctx, f.mockKnobAddress, mux)
	}
	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(model.DriverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(f.nodeName),
		kubeletplugin.PluginDataDirectoryPath(f.pluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(f.registrarDir),
		kubeletplugin.PluginListener(sockets.Listen),
		kubeletplugin.RegistrarListener(sockets.Listen),
	}
	if uid := os.Getenv("POD_UID"); uid != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(types.UID(uid)))
	}
	helper, err := kubeletplugin.Start(ctx, p, helperOpts...)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()

	var lender *plugin.Lender
	if f.lending {
		if lender, err = newLender(ctx, f, p, nvmlLib, bootID, lockPath, inv.Trigger, mpsDaemons); err != nil {
			return err
		}
	}
	if lender != nil {
		inv.Lending = lender.Lent
		m.AddLending(lender)
		go lender.Run(ctx, f.lendingSampleInterval)
	} else {
		// Borrowers prepared while lending was on are evicted.
		inv.Lending = p.StrandedBorrowers
	}
	inv.Publisher = helper
	if _, err := inv.Sync(ctx); err != nil && !errors.Is(err, plugin.ErrDiscovery) {
		// Publishing failed; discovery errors are reported by the inventory.
		return err
	}
	go publisher.Run(func() { inv.Run(ctx, f.rediscoverEvery) })
	if tracker != nil {
		go plugin.FollowHealth(ctx, tracker, inv)
	}
	if tracker != nil && nvmlLib != nil {
		watcherDone := make(chan struct{})
		// NVML is shut down after the watcher's last wait.
		defer func() { <-watcherDone }()
		go func() {
			defer close(watcherDone)
			w := &health.Watcher{Lib: nvmlLib, Tracker: tracker}
			if err := w.Run(ctx); err != nil {
				// Health stays "healthy" for every GPU; the plugin keeps serving.
				logger.Error(err, "GPU error events cannot be watched; device health is not monitored")
			}
		}()
	}
	if nvmlLib == nil {
		go func() {
			open := func() (nvml.Interface, error) { return gpu.OpenNVML(f.driverRoot) }
			if gpu.WaitForNVML(ctx, f.rediscoverEvery, open) {
				events.Event(corev1.EventTypeNormal, "NVMLAvailable", "NVML can be opened now: the kubelet plugin restarts to publish the GPUs.")
				restart(errNVMLAvailable)
			}
		}()
	}

	logger.Info("Kubelet plugin running", "node", f.nodeName, "driver", model.DriverName, "gpus", inv.Status())
	<-ctx.Done()
	if errors.Is(context.Cause(ctx), errNVMLAvailable) {
		// Exiting lets the kubelet start the plugin again, now with NVML
		// and everything that needs it (health watch, per-pod memory).
		logger.Info("NVML can be opened now; exiting so that the restarted plugin publishes the GPUs")
		return nil
	}
	logger.Info("Shutting down")
	return nil
}

// driverMemory is what the node can do for DriverMemory shares: detected on
// real GPUs, the test knob's answer on mock ones.
func driverMemory(f flags, mock bool, gpus []gpu.GPU) isolation.DriverMemory {
	var d isolation.DriverMemory
	if mock {
		d = isolation.DriverMemory{HookPath: f.nvidiaCDIHookPath, Capable: f.mockDriverMemory}
		if !d.Capable {
			d.Reason = "mock GPUs (the test knob --mock-driver-memory-limits is off)"
		}
	} else {
		version := ""
		for _, g := range gpus {
			if g.DriverVersion != "" {
				version = g.DriverVersion
				break
			}
		}
		d = isolation.DriverMemoryProbe{HostRoot: f.hostRoot, HookPath: f.nvidiaCDIHookPath, DriverVersion: version}.Detect()
	}
	d.DriverRoot = f.hostDriverRoot
	if d.DriverRoot == "" {
		d.DriverRoot = f.driverRoot
	}
	return d
}

// computeModes is the compute mode policy of --expected-compute-mode; empty
// means Default.
func (f flags) computeModes() (gpu.ComputeModePolicy, error) {
	if f.expectedComputeMode == "" {
		return gpu.ComputeModePolicy{}, nil
	}
	mode, err := gpu.ParseComputeMode(f.expectedComputeMode)
	if err != nil {
		return gpu.ComputeModePolicy{}, fmt.Errorf("--expected-compute-mode: %w", err)
	}
	return gpu.ComputeModePolicy{Default: mode}, nil
}

// errNVMLAvailable ends a plugin that started without NVML once NVML can be
// opened.
var errNVMLAvailable = errors.New("NVML became available")

// mpsRunner runs the MPS control daemons in pods (a fake daemon in them on
// mock nodes). A configuration that cannot work is logged and makes every
// MPS share fail to prepare with the reason.
func mpsRunner(ctx context.Context, f flags, client kubernetes.Interface, mock bool) isolation.DaemonRunner {
	hostRoot := f.mps.hostDriverRoot
	if hostRoot == "" {
		hostRoot = f.driverRoot
	}
	pods, err := mpsdaemon.NewPods(client, mpsdaemon.Config{
		Namespace:         f.mps.namespace,
		NodeName:          f.nodeName,
		Image:             f.mps.image,
		ImagePullPolicy:   corev1.PullPolicy(f.mps.pullPolicy),
		ImagePullSecrets:  f.mps.pullSecrets,
		PriorityClassName: f.mps.priorityClass,
		Mock:              mock,
		DriverRoot:        hostRoot,
		ReadyTimeout:      f.mps.readyTimeout,
		Resources:         f.mps.resources,
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "MPS shares will fail to prepare until this is fixed")
		return mpsdaemon.Unavailable{Err: err}
	}
	return pods
}

// serveMockKnob serves the test knob's mux on addr until ctx is done. A busy
// address (the other pod of a surge rolling update on the host network still
// holds it) is retried every few seconds instead of failing the plugin.
func serveMockKnob(ctx context.Context, addr string, mux *http.ServeMux) {
	logger := klog.FromContext(ctx)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	for {
		logger.Info("Serving the mock fault-injection knob", "address", addr)
		err := srv.ListenAndServe()
		if errors.Is(err, http.ErrServerClosed) || ctx.Err() != nil {
			return
		}
		logger.Error(err, "Mock fault-injection server failed; retrying", "address", addr)
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
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

// openNVML returns the initialised NVML of the real driver, or of the mock
// profile when --mock-profile is set (with the GPUs of --mock-fail-discovery
// failing discovery). An error wrapping gpu.ErrUnavailable means the node has
// no usable NVML; any other is a configuration error.
func openNVML(f flags) (nvml.Interface, error) {
	if f.mockProfile == "" {
		return gpu.OpenNVML(f.driverRoot)
	}
	node, err := gpu.NewMockNodeWith(f.mockProfile, gpu.MockOptions{MIGStateFile: f.mockMIGStateFile})
	if err != nil {
		return nil, err
	}
	for _, spec := range f.mockFailDiscovery {
		if err := node.FailDiscoverySpec(spec); err != nil {
			return nil, fmt.Errorf("--mock-fail-discovery: %w", err)
		}
	}
	if err := gpu.Open(node); err != nil {
		return nil, err
	}
	return node, nil
}

// newLender starts lending on the node's GPUs; nil (and a log line) where
// NVML cannot be read: owner activity cannot be seen, so nothing is lent.
func newLender(ctx context.Context, f flags, p *plugin.Plugin, lib nvml.Interface, bootID, lockPath string, republish func(), mpsDaemons isolation.DaemonRunner) (*plugin.Lender, error) {
	policy := lending.DefaultPolicy()
	policy.IdlePeriod = f.lendingIdlePeriod
	for _, q := range []struct {
		flag, value string
		into        *int64
	}{{"--lending-reserve", f.lendingReserve, &policy.Reserve}, {"--lending-min", f.lendingMin, &policy.MinLend}} {
		v, err := resource.ParseQuantity(q.value)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", q.flag, q.value, err)
		}
		*q.into = v.Value()
	}
	if err := policy.Validate(); err != nil {
		return nil, fmt.Errorf("--lending-*: %w", err)
	}
	if f.lendingKillMargin < 0 {
		return nil, fmt.Errorf("--lending-kill-margin %s: must not be negative", f.lendingKillMargin)
	}
	if f.lendingSampleInterval <= 0 || f.lendingBusyThreshold > 100 {
		return nil, fmt.Errorf("--lending-sample-interval %s, --lending-busy-threshold %d: want a positive interval and a threshold of at most 100", f.lendingSampleInterval, f.lendingBusyThreshold)
	}
	if lib == nil {
		klog.FromContext(ctx).Info("Lending is on but NVML is not usable: no GPU is lent")
		return nil, nil
	}
	podOf := lending.ProcPods(f.procRoot)
	if node, ok := lib.(*gpu.MockNode); ok {
		podOf = node.PodOfProcess
	}
	sampler := &lending.Sampler{Lib: lib, PodOf: podOf, Threshold: uint32(f.lendingBusyThreshold)}
	var service func(context.Context) (map[types.UID]bool, error)
	if pods, ok := mpsDaemons.(*mpsdaemon.Pods); ok {
		service = pods.PodUIDs
	}
	var kill func(types.UID, []uint32) ([]string, error)
	if f.lendingCgroupRoot != "" {
		procRoot := f.lendingProcRoot
		if procRoot == "" {
			procRoot = f.procRoot
		}
		kill = lending.Cgroups{Root: f.lendingCgroupRoot, ProcRoot: procRoot}.KillPod
	}
	return plugin.NewLender(ctx, p, plugin.LenderOptions{
		Kill:          kill,
		KillMargin:    f.lendingKillMargin,
		ServicePods:   service,
		LockPath:      lockPath,
		Policy:        policy,
		BusyThreshold: uint32(f.lendingBusyThreshold),
		Sample:        sampler.Sample,
		Store:         lending.Store{Path: filepath.Join(f.pluginDataDir, lending.StateFile)},
		BootID:        bootID,
		Republish:     republish,
	})
}
