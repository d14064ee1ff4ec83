package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
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
	"github.com/tessera-dev/tessera/pkg/publish"
	"github.com/tessera-dev/tessera/pkg/toolkitconfig"
)

// daemon is what run wires together, filled in step by step.
type daemon struct {
	f    flags
	mock bool

	// lib is the node's NVML, nil where none is usable (nvmlErr says why).
	lib      nvml.Interface
	nvmlErr  error
	discover func() (gpu.Discovery, error)
	// gpus are the GPUs discovered at start.
	gpus []gpu.GPU

	config *rest.Config
	client kubernetes.Interface
	events *plugin.NodeEvents

	bootID string
	// lockPath is the node lock of surge rolling updates; empty without.
	lockPath   string
	mpsDaemons isolation.DaemonRunner
	// driverMemory is what the node can do for DriverMemory shares.
	driverMemory isolation.DriverMemory
	tracker      *health.Tracker
	metrics      *metrics.Metrics

	plugin *plugin.Plugin
	inv    *publish.Inventory

	// sockets and publisher are /healthz's checks of the kubelet plugin's
	// gRPC servers and of the inventory loop.
	sockets   metricsserver.Sockets
	publisher metricsserver.Alive
	healthz   *metricsserver.Health
}

// openGPUs opens NVML (a mock profile only when asked for) and discovers
// the GPUs. Without usable NVML the plugin runs without GPUs; any other
// NVML error stops it.
func (d *daemon) openGPUs(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	d.lib, d.nvmlErr = openNVML(d.f)
	if d.nvmlErr != nil {
		if d.mock || !errors.Is(d.nvmlErr, gpu.ErrUnavailable) {
			return d.nvmlErr
		}
		logger.Error(d.nvmlErr, "NVML is not available: running without GPUs; claims prepared earlier can still be unprepared. The plugin restarts once NVML can be opened.")
	}
	d.discover = publish.NVMLDiscovery(d.lib, d.nvmlErr)
	discovered, err := d.discover()
	if err == nil {
		logger.Info("Discovered GPUs", "count", len(discovered.GPUs), "failed", len(discovered.Failed), "mock", d.mock, "profile", d.f.mock.profile)
	}
	d.gpus = discovered.GPUs
	return nil
}

// closeNVML shuts NVML down, if it was opened.
func (d *daemon) closeNVML() {
	if d.lib != nil {
		d.lib.Shutdown()
	}
}

// connect makes the API client and the recorder of Node events.
func (d *daemon) connect(ctx context.Context) error {
	config, err := clientcmd.BuildConfigFromFlags("", d.f.kubelet.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	d.config, d.client = config, client
	d.events = plugin.NewNodeEvents(ctx, client, d.f.node.name)
	return nil
}

// pluginOptions wires the plugin's options: CDI, MIG, the isolation
// backends, health tracking and metrics.
func (d *daemon) pluginOptions(ctx context.Context) (plugin.Options, error) {
	logger := klog.FromContext(ctx)
	f := d.f
	var err error
	if d.bootID, err = checkpoint.BootID(); err != nil {
		logger.Error(err, "Reading the boot id failed; reboot detection is off")
	}
	specs, err := cdi.NewDir(f.kubelet.cdiRoot)
	if err != nil {
		return plugin.Options{}, err
	}
	opts := plugin.Options{
		NodeName:         f.node.name,
		GPUs:             d.gpus,
		Specs:            specs,
		Mock:             d.mock,
		DefaultIsolation: configapi.Isolation(f.isolation.defaultIsolation),
		Client:           d.client,
		DynamicMIG:       f.node.dynamic,
	}
	if d.lib != nil {
		// MIG instances are created, adopted and destroyed through NVML.
		opts.MIG = &mig.NVML{Lib: d.lib}
	}
	if err := d.isolationOptions(ctx, &opts); err != nil {
		return plugin.Options{}, err
	}
	opts.Events = d.events
	if f.health.enabled {
		d.tracker = health.NewTracker(f.health.policy, nil)
		// Health survives restarts and is shared with the other pod of a
		// surge update (see health.Tracker.Persist).
		d.tracker.Persist(ctx, health.Store{Path: filepath.Join(f.kubelet.pluginDataDir, health.StateFile)})
		opts.Health = d.tracker
	}
	d.metrics = metrics.New(f.node.name)
	opts.Metrics = d.metrics
	if d.lib != nil {
		lib := d.lib
		opts.Processes = func(uuid string) (int, error) { return gpu.ComputeProcesses(lib, uuid) }
	}
	opts.PodCgroupRoot = filepath.Join(f.node.hostRoot, "sys/fs/cgroup")
	return opts, nil
}

// isolationOptions sets the options of the isolation backends: MPS, the
// device nodes and toolkit of real GPUs, DriverMemory and HAMi-core.
func (d *daemon) isolationOptions(ctx context.Context, opts *plugin.Options) error {
	logger := klog.FromContext(ctx)
	f := d.f
	mpsRoot := f.mps.dir(f.kubelet.pluginDataDir)
	d.mpsDaemons = mpsRunner(ctx, f, d.client, d.mock)
	if d.mock {
		// The mock plugin may not mount: each domain's shared memory is a
		// plain directory, and mock GPUs hold no MPS server context.
		opts.MPS = isolation.NewMPS(mpsRoot, d.mpsDaemons)
	} else {
		opts.MPS = isolation.NewMPSWith(mpsRoot, d.mpsDaemons, isolation.MPSOptions{
			Shm:           isolation.HostShm{},
			ServerReserve: isolation.DefaultMPSServerReserve,
		})
	}
	if !d.mock {
		opts.DevNodes = isolation.HostDevNodes{DriverRoot: f.node.driverRoot, HostDriverRoot: f.node.hostDriverRoot}
		opts.ToolkitSpecDirs = f.isolation.nvidiaCDISpecDirs
		opts.LegacyRuntime = f.isolation.legacyRuntime
		var err error
		if opts.Toolkit, err = cdi.NewToolkitSpecs(f.isolation.nvidiaCDISpecDirs...); err != nil {
			return err
		}
	}
	d.driverMemory = driverMemory(f, d.mock, d.gpus)
	opts.DriverMemory = d.driverMemory
	logger.Info("Driver-enforced memory limits (isolation DriverMemory)", "capable", opts.DriverMemory.Capable, "reason", opts.DriverMemory.Reason)
	hami, err := hamiCore(ctx, f)
	if !d.mock {
		// Each claim's directory is a size-bounded tmpfs of its own: its
		// containers write it, and must not fill the host's /run.
		hami.Mounter = isolation.HostShm{}
	}
	opts.HAMiCore = hami
	return err
}

// hamiCore is HAMi-core as the flags configure it. The claims'
// shared-region directories are known even without HAMi-core, so that
// HAMiCore claims prepared before it was turned off are cleaned up at
// unprepare (their prepare still fails closed: no library). Claims
// prepared by releases before --hami-claim-root keep their directory under
// the plugin data directory, and claims prepared under an earlier
// --hami-claim-root keep theirs there.
func hamiCore(ctx context.Context, f flags) (isolation.HAMiCore, error) {
	logger := klog.FromContext(ctx)
	dataDir := f.kubelet.pluginDataDir
	h := isolation.HAMiCore{ClaimRoot: f.isolation.hamiClaimRoot, OldClaimRoots: []string{filepath.Join(dataDir, "hami", "claims")}}
	if f.isolation.hamiClaimRoot != "" {
		used, err := isolation.RememberClaimRoots(filepath.Join(dataDir, "hami-claim-roots"), f.isolation.hamiClaimRoot)
		if err != nil {
			logger.Error(err, "Claims prepared under an earlier --hami-claim-root may lose their directory")
		}
		h.OldClaimRoots = append(h.OldClaimRoots, used...)
	}
	if err := h.EnsureClaimRoot(); err != nil {
		logger.Error(err, "HAMiCore shares will fail to prepare until this is fixed")
	}
	if f.isolation.hamiCoreLibrary != "" {
		preload, err := isolation.WritePreloadFile(filepath.Join(dataDir, "hami"))
		if err != nil {
			return h, err
		}
		h.Library, h.PreloadFile = f.isolation.hamiCoreLibrary, preload
		if err := h.Check(); err != nil {
			logger.Error(err, "HAMiCore shares will fail to prepare until this is fixed")
		}
	}
	return h, nil
}

// driverMemory is what the node can do for DriverMemory shares: detected on
// real GPUs, the test knob's answer on mock ones.
func driverMemory(f flags, mock bool, gpus []gpu.GPU) isolation.DriverMemory {
	var d isolation.DriverMemory
	if mock {
		d = isolation.DriverMemory{HookPath: f.isolation.nvidiaCDIHookPath, Capable: f.mock.driverMemory}
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
		d = isolation.DriverMemoryProbe{HostRoot: f.node.hostRoot, HookPath: f.isolation.nvidiaCDIHookPath, DriverVersion: version}.Detect()
	}
	d.DriverRoot = f.node.hostDriver()
	return d
}

// mpsRunner runs the MPS control daemons in pods (a fake daemon in them on
// mock nodes). A configuration that cannot work is logged and makes every
// MPS share fail to prepare with the reason.
func mpsRunner(ctx context.Context, f flags, client kubernetes.Interface, mock bool) isolation.DaemonRunner {
	hostRoot := f.mps.hostDriverRoot
	if hostRoot == "" {
		hostRoot = f.node.driverRoot
	}
	pods, err := mpsdaemon.NewPods(client, mpsdaemon.Config{
		Namespace:         f.mps.namespace,
		NodeName:          f.node.name,
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

// openPlugin opens the plugin on its checkpoint, recovering the claims
// prepared before. With rolling updates the helper serializes prepare and
// unprepare across the two pods with a lock; opening the checkpoint and
// recovering hold it too.
func (d *daemon) openPlugin(ctx context.Context, opts plugin.Options) error {
	if os.Getenv("POD_UID") != "" {
		d.lockPath = filepath.Join(d.f.kubelet.pluginDataDir, "serialize.lock")
	}
	p, err := plugin.Open(ctx, d.lockPath, filepath.Join(d.f.kubelet.pluginDataDir, "checkpoint.json"), d.bootID, opts)
	if err != nil {
		return err
	}
	d.plugin = p
	return nil
}

// buildInventory makes the inventory that publishes the GPUs, with their
// taints and the model's options.
func (d *daemon) buildInventory(ctx context.Context) {
	p := d.plugin
	inv := &publish.Inventory{NodeName: d.f.node.name, DiscoverNode: d.discover, OnChange: p.SetGPUs, Events: d.events, ComputeModes: d.f.node.modes,
		DynamicMIG: d.f.node.dynamic, MIGHeld: p.MIGHeld}
	// A created or destroyed MIG instance is republished soon, not at the
	// next --rediscover-interval.
	p.OnMIGChange(inv.Trigger)
	if !d.mock {
		// Mock GPUs' bus ids exist in no sysfs (their profile gives their
		// roots); real ones get the standard resource.kubernetes.io/pcieRoot
		// attribute from sysfs, or are logged and published without it.
		inv.Model = append(inv.Model, model.WithPCIeRoots(gpu.NewSysfsPCIeRoots(klog.FromContext(ctx))))
		// Fail-closed toolkit requirement: say so at start, not only at
		// the first prepare.
		p.CheckToolkit(ctx)
		// Pods without a claim must not reach the GPUs through the NVIDIA
		// runtime; mock GPUs have no runtime to ask.
		access := &publish.UnclaimedAccess{Places: toolkitconfig.Places("", d.f.node.hostRoot, d.f.node.procRoot), Allow: d.f.node.allowEnvvar, Events: d.events}
		inv.NodeTaints = access.Taints
	}
	inv.Model = append(inv.Model, model.WithDriverMemoryLimits(d.driverMemory.Capable))
	if d.f.node.localityVerdicts {
		inv.Model = append(inv.Model, model.WithLocalityVerdicts())
	}
	if d.tracker != nil {
		inv.Taints = publish.HealthTaints(d.tracker)
		// XIDs that name one MIG device taint that device only.
		inv.DeviceTaints = d.tracker.MIGTaints
	}
	d.inv = inv
}

// startLending starts the lender with --lending, and publishes the
// lending devices: the lender's, or without it those of borrowers prepared
// while lending was on (to be evicted).
func (d *daemon) startLending(ctx context.Context) error {
	var lender *plugin.Lender
	if d.f.lending.enabled {
		var err error
		if lender, err = d.newLender(ctx); err != nil {
			return err
		}
	}
	if lender == nil {
		// Borrowers prepared while lending was on are evicted.
		d.inv.Lending = d.plugin.StrandedBorrowers
		return nil
	}
	d.inv.Lending = lender.Lent
	d.metrics.AddLending(lender)
	go lender.Run(ctx, d.f.lending.sampleInterval)
	return nil
}

// newLender starts lending on the node's GPUs; nil (and a log line) where
// NVML cannot be read: owner activity cannot be seen, so nothing is lent.
func (d *daemon) newLender(ctx context.Context) (*plugin.Lender, error) {
	f := d.f
	if d.lib == nil {
		klog.FromContext(ctx).Info("Lending is on but NVML is not usable: no GPU is lent")
		return nil, nil
	}
	podOf := lending.ProcPods(f.node.procRoot)
	if node, ok := d.lib.(*gpu.MockNode); ok {
		podOf = node.PodOfProcess
	}
	sampler := &lending.Sampler{Lib: d.lib, PodOf: podOf, Threshold: uint32(f.lending.busyThreshold)}
	var service func(context.Context) (map[types.UID]bool, error)
	if pods, ok := d.mpsDaemons.(*mpsdaemon.Pods); ok {
		service = pods.PodUIDs
	}
	var kill func(types.UID, []uint32) ([]string, error)
	if f.lending.cgroupRoot != "" {
		procRoot := f.lending.procRoot
		if procRoot == "" {
			procRoot = f.node.procRoot
		}
		kill = lending.Cgroups{Root: f.lending.cgroupRoot, ProcRoot: procRoot}.KillPod
	}
	return plugin.NewLender(ctx, d.plugin, plugin.LenderOptions{
		Kill:          kill,
		KillMargin:    f.lending.killMargin,
		ServicePods:   service,
		LockPath:      d.lockPath,
		Policy:        f.lending.policy,
		BusyThreshold: uint32(f.lending.busyThreshold),
		Sample:        sampler.Sample,
		Store:         lending.Store{Path: filepath.Join(f.kubelet.pluginDataDir, lending.StateFile)},
		BootID:        d.bootID,
		Republish:     d.inv.Trigger,
	})
}
