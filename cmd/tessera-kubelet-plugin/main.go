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
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
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
	"github.com/tessera-dev/tessera/pkg/metrics"
	"github.com/tessera-dev/tessera/pkg/model"
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
	mpsRoot           string
	nvidiaCDISpecDirs []string
	rediscoverEvery   time.Duration

	health               bool
	healthIgnoredXIDs    []uint
	healthFatalXIDs      []uint
	healthFatalEffect    string
	healthRecoveryPeriod time.Duration

	metricsAddress     string
	procRoot           string
	mockFaultInjection bool
	mockFailDiscovery  []string
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
	fs.StringVar(&f.hamiCoreLibrary, "hami-core-library", "", "host path of HAMi-core's libvgpu.so; empty: HAMiCore shares fail to prepare")
	fs.StringVar(&f.mpsRoot, "mps-root", "", "host directory for the MPS daemons' pipe and log directories (default <plugin-data-dir>/mps)")
	fs.StringSliceVar(&f.nvidiaCDISpecDirs, "nvidia-cdi-spec-dirs", []string{"/etc/cdi", "/var/run/cdi"}, "where to look for the NVIDIA container toolkit's CDI spec (nvidia.com/gpu)")
	fs.DurationVar(&f.rediscoverEvery, "rediscover-interval", time.Minute, "how often to rediscover GPUs and republish when the inventory changed")
	fs.BoolVar(&f.health, "health", true, "watch NVML error events: taint unhealthy GPUs' devices ("+health.TaintKey+") and report device health to the kubelet")
	fs.UintSliceVar(&f.healthIgnoredXIDs, "health-ignored-xids", toUint(health.DefaultIgnoredXIDs), "XIDs that never make a GPU unhealthy (application faults)")
	fs.UintSliceVar(&f.healthFatalXIDs, "health-fatal-xids", toUint(health.DefaultFatalXIDs), "XIDs that taint with --health-fatal-effect; other critical XIDs taint NoSchedule")
	fs.StringVar(&f.healthFatalEffect, "health-fatal-effect", string(resourceapi.DeviceTaintEffectNoExecute), "taint effect of fatal XIDs, double-bit ECC errors and lost GPUs: NoExecute (evict), NoSchedule or None")
	fs.DurationVar(&f.healthRecoveryPeriod, "health-recovery-period", health.DefaultRecoveryPeriod, "how long an unhealthy GPU must go without a counted error before its taint is removed")
	fs.StringVar(&f.metricsAddress, "metrics-address", ":9477", "address of the HTTP server for /metrics (Prometheus) and /healthz; empty: no server")
	fs.StringVar(&f.procRoot, "proc-root", "/proc", "where /proc of the host's PID namespace is (NVML reports host PIDs; per-pod GPU memory reads <proc-root>/<pid>/cgroup)")
	fs.BoolVar(&f.mockFaultInjection, "mock-fault-injection", false, "TEST KNOB, mock profiles only: serve POST /mock/xid, /mock/dbe, /mock/lost and /mock/discovery on the metrics server to inject NVML events and discovery failures")
	fs.StringSliceVar(&f.mockFailDiscovery, "mock-fail-discovery", nil, "TEST KNOB, mock profiles only: GPUs that fail discovery, as INDEX[:CALL] with CALL one of "+strings.Join(gpu.MockDiscoveryCalls, ", ")+" (default "+gpu.DefaultMockDiscoveryCall+")")
	klogFlags := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	return cmd
}

func run(ctx context.Context, f flags) error {
	logger := klog.FromContext(ctx)
	if f.nodeName == "" {
		return fmt.Errorf("--node-name (or env NODE_NAME) is required")
	}
	iso := configapi.Isolation(f.defaultIsolation)
	switch iso {
	case configapi.IsolationAdvisory, configapi.IsolationMPS, configapi.IsolationHAMiCore:
	default:
		return fmt.Errorf("--default-isolation %q: want Advisory, MPS or HAMiCore", f.defaultIsolation)
	}
	if err := os.MkdirAll(f.pluginDataDir, 0o750); err != nil {
		return fmt.Errorf("create --plugin-data-dir: %w", err)
	}
	if f.mpsRoot == "" {
		f.mpsRoot = filepath.Join(f.pluginDataDir, "mps")
	}

	// GPUs: a mock profile only when asked for. A node without usable NVML
	// (no library, no kernel module) runs without GPUs: it publishes an empty
	// pool, says why (log, Node event, /healthz) and can still unprepare the
	// claims prepared before; once NVML can be opened the plugin restarts.
	mock := f.mockProfile != ""
	if (f.mockFaultInjection || len(f.mockFailDiscovery) > 0) && !mock {
		return fmt.Errorf("--mock-fault-injection and --mock-fail-discovery need --mock-profile: they are test knobs for mock GPUs")
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
	}
	if mock {
		// No GPU, so no MPS daemon can run: the fake keeps the bookkeeping.
		opts.MPS = isolation.NewMPS(f.mpsRoot, mockMPSRunner{isolation.NewFakeRunner()})
	} else {
		opts.MPS = isolation.NewMPS(f.mpsRoot, isolation.ExecRunner{Root: f.mpsRoot})
		opts.DevNodes = isolation.HostDevNodes{DriverRoot: f.driverRoot}
		if opts.Toolkit, err = cdi.NewToolkitSpecs(f.nvidiaCDISpecDirs...); err != nil {
			return err
		}
	}
	if f.hamiCoreLibrary != "" {
		preload, err := isolation.WritePreloadFile(filepath.Join(f.pluginDataDir, "hami"))
		if err != nil {
			return err
		}
		opts.HAMiCore = isolation.HAMiCore{Library: f.hamiCoreLibrary, PreloadFile: preload}
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
	inv := &plugin.Inventory{NodeName: f.nodeName, DiscoverNode: discover, OnChange: p.SetGPUs, Events: events}
	if !mock {
		// Mock GPUs' bus ids exist in no sysfs; real ones get the standard
		// resource.kubernetes.io/pcieRoot attribute.
		inv.Model = append(inv.Model, model.WithPCIeRoots(gpu.SysfsPCIeRoots{}))
	}
	if tracker != nil {
		inv.Taints = plugin.HealthTaints(tracker)
	}
	var usage *metrics.Usage
	if nvmlLib != nil {
		usage = &metrics.Usage{Lib: nvmlLib, ProcRoot: f.procRoot, Pods: p}
	}
	m.AddState(p, usage)
	m.AddDiscovery(inv)
	if f.metricsAddress != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", m.Handler())
		mux.Handle("/healthz", inv.HealthzHandler())
		if node, ok := nvmlLib.(*gpu.MockNode); ok && f.mockFaultInjection {
			logger.Info("TEST KNOB: NVML fault injection served on the metrics address", "paths", "/mock/xid, /mock/dbe, /mock/lost, /mock/discovery")
			mux.Handle("/mock/", node.FaultHandler())
		}
		go serveMetrics(ctx, f.metricsAddress, mux)
	}
	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(model.DriverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(f.nodeName),
		kubeletplugin.PluginDataDirectoryPath(f.pluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(f.registrarDir),
	}
	if uid := os.Getenv("POD_UID"); uid != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(types.UID(uid)))
	}
	helper, err := kubeletplugin.Start(ctx, p, helperOpts...)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()

	inv.Publisher = helper
	if _, err := inv.Sync(ctx); err != nil && !errors.Is(err, plugin.ErrDiscovery) {
		// Publishing failed; discovery errors are reported by the inventory.
		return err
	}
	go inv.Run(ctx, f.rediscoverEvery)
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

// errNVMLAvailable ends a plugin that started without NVML once NVML can be
// opened.
var errNVMLAvailable = errors.New("NVML became available")

// mockMPSRunner keeps the fake runner's bookkeeping and creates the daemon's
// pipe and log directories, which the CDI spec of an MPS share mounts into
// the container: without them the runtime refuses to start it.
type mockMPSRunner struct{ *isolation.FakeRunner }

func (r mockMPSRunner) Start(ctx context.Context, d isolation.Daemon) error {
	for _, dir := range []string{d.PipeDir, d.LogDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("mock MPS daemon for %s: %w", d.UUID, err)
		}
	}
	return r.FakeRunner.Start(ctx, d)
}

// serveMetrics serves mux on addr until ctx is done. A busy address (the
// other pod of a surge rolling update on the host network still holds it) is
// retried every few seconds instead of failing the plugin.
func serveMetrics(ctx context.Context, addr string, mux *http.ServeMux) {
	logger := klog.FromContext(ctx)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	for {
		logger.Info("Serving metrics", "address", addr)
		err := srv.ListenAndServe()
		if errors.Is(err, http.ErrServerClosed) || ctx.Err() != nil {
			return
		}
		logger.Error(err, "Metrics server failed; retrying", "address", addr)
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
	node, err := gpu.NewMockNode(f.mockProfile)
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
