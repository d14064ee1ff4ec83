// Package gpucheck is Tessera's real-GPU check: on a machine with an NVIDIA
// GPU and its driver, and no Kubernetes, it runs the plugin's own path —
// NVML discovery (pkg/gpu), the ResourceSlices the node would publish
// (pkg/model), PrepareResourceClaims (pkg/plugin, with a fake Kubernetes
// client) of two shares per isolation backend, the CDI spec read back and
// applied by the CDI library — and then runs probe processes in each
// prepared environment: one that allocates device memory until refused, and
// two at once (30 % and 70 % of the cores) that spin a PTX kernel for a
// fixed wall time. See docs/gpu-check.md.
package gpucheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	nvmlmock "github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/plugin"
)

// Namespace is where the check's claims live (in its fake API server).
const Namespace = "gpu-check"

// Prober runs the probe processes in a prepared environment.
type Prober interface {
	// Memory runs the memory probe with env and returns what it saw; uuid
	// is the GPU, for reading the process's memory from NVML.
	Memory(ctx context.Context, uuid string, env []string) (MemoryProbe, error)
	// Compute runs one compute probe per env, started together, each for d.
	Compute(ctx context.Context, envs [][]string, d time.Duration) ([]ComputeProbe, error)
}

// Config is one check.
type Config struct {
	// NodeName names the node's pool; it must be a DNS subdomain.
	NodeName string
	// NVML is the initialised NVML: the real library, or a mock profile
	// (then Mock is true and the plugin runs in mock mode).
	NVML nvml.Interface
	Mock bool
	// WorkDir holds the checkpoint, the CDI root, the MPS and HAMi-core
	// directories. Short paths matter: the MPS control socket lives under
	// it and a socket path has at most 107 bytes.
	WorkDir string
	// GPUMinor is the GPU to check; -1: the first one discovered.
	GPUMinor int
	// ShareMemory is each share's memory in bytes; 0: a quarter of the
	// GPU's memory, rounded down to a GiB (at least 1 GiB).
	ShareMemory int64
	// Cores are the two shares' cores in percent (issue 16: 30 and 70).
	Cores [2]int64
	// Isolations are the backends to check, in order.
	Isolations []configapi.Isolation
	// MPSControl is nvidia-cuda-mps-control (path or name in PATH); empty:
	// the name. Mock mode runs no daemon.
	MPSControl string
	// HAMiCoreLibrary is the host path of libvgpu.so; empty skips HAMiCore.
	HAMiCoreLibrary string
	// DriverRoot is the driver's root for device nodes and the
	// DriverMemory hook's --driver-root.
	DriverRoot string
	// NVIDIACDIHookPath is the toolkit's nvidia-cdi-hook (DriverMemory).
	NVIDIACDIHookPath string
	// NVIDIACDISpecDirs are where the toolkit's CDI spec is looked for.
	NVIDIACDISpecDirs []string
	// Prober runs the probes; nil prepares and reads the specs only.
	Prober Prober
	// ComputeTime is how long the compute probes run.
	ComputeTime time.Duration
	// AllowBusy runs the probes although NVML shows other compute processes
	// on the GPU (their work would distort the figures).
	AllowBusy bool
	// NvidiaSMI is nvidia-smi (path or name in PATH), for the ground
	// truth; empty: the name.
	NvidiaSMI string
	// ProcDriverNVIDIA is the kernel module's /proc directory; empty:
	// /proc/driver/nvidia.
	ProcDriverNVIDIA string
	// HAMiCoreSkipReason, when HAMiCoreLibrary is empty, is why there is
	// no library (the bundle's run.sh: no source archive, no cmake or
	// nvcc).
	HAMiCoreSkipReason string
	// HAMiCoreError, when HAMiCoreLibrary is empty, is why a HAMi-core
	// source that was given made no library (a failed build, with its
	// log's tail): the HAMiCore backend is then an ERROR, not a skip.
	HAMiCoreError string
	// Runc is the bundle's static runc; as root the container check runs
	// the container with it. Empty (or not root): the namespace fallback.
	Runc string
	// RootFS is the bundle's tiny root filesystem (bin/busybox), copied
	// for each container; empty: an empty one.
	RootFS string
	// HAMiCoreProcesses is N of "N processes of one claim share its
	// limit"; zero: DefaultHAMiCoreProcesses.
	HAMiCoreProcesses int
}

// DefaultIsolations are the backends checked by default.
var DefaultIsolations = []configapi.Isolation{configapi.IsolationAdvisory, configapi.IsolationMPS, configapi.IsolationHAMiCore, IsolationDriverMemory}

// Run runs the check and returns its report, evaluated against t. An error
// means the check could not run at all (no GPU, a broken plugin setup);
// failures of single backends are in the report.
func Run(ctx context.Context, cfg Config, t Targets) (*Report, error) {
	if cfg.NVML == nil {
		return nil, errors.New("gpu check: no NVML")
	}
	if cfg.WorkDir == "" {
		return nil, errors.New("gpu check: no work directory")
	}
	for _, c := range cfg.Cores {
		if c < 1 || c > 100 {
			return nil, fmt.Errorf("gpu check: cores %d%%: want 1 to 100", c)
		}
	}
	if cfg.Cores[0]+cfg.Cores[1] > 100 {
		return nil, fmt.Errorf("gpu check: cores %d%% + %d%% exceed the GPU's 100%%", cfg.Cores[0], cfg.Cores[1])
	}
	for _, iso := range cfg.Isolations {
		if _, ok := Enforces[iso]; !ok {
			return nil, fmt.Errorf("gpu check: unknown isolation %q (want one of %s)", iso, formatIsolations(DefaultIsolations))
		}
	}

	disc, err := gpu.DiscoverNode(cfg.NVML)
	if err != nil {
		return nil, fmt.Errorf("gpu check: discovery: %w", err)
	}
	if len(disc.GPUs) == 0 {
		return nil, fmt.Errorf("gpu check: NVML found no usable GPU (%d failed discovery: %v)", len(disc.Failed), disc.Failed)
	}
	r := &Report{Node: NodeSummary{Name: cfg.NodeName, DriverVersion: disc.GPUs[0].DriverVersion, CUDAVersion: disc.GPUs[0].CUDADriverVersion}}
	for _, f := range disc.Failed {
		r.Node.FailedGPUs = append(r.Node.FailedGPUs, f.Error())
	}
	target, err := pickGPU(disc.GPUs, cfg.GPUMinor)
	noShares := ""
	if errors.Is(err, errEveryGPUMIG) && cfg.GPUMinor < 0 {
		// A node of MIG GPUs only: no shares to check, the MIG checks
		// still run. The first GPU stands for the node.
		target, err = disc.GPUs[0], nil
		noShares = "every GPU is in MIG mode: shares (and their backends) need a GPU that is not (the check never changes MIG mode); only the MIG checks run"
	}
	if err != nil {
		if len(disc.Failed) > 0 {
			// A GPU discovery refused (no usable memory size, …) is
			// not among the discovered: say why.
			return nil, fmt.Errorf("gpu check: %w; discovery failed for %v", err, disc.Failed)
		}
		return nil, fmt.Errorf("gpu check: %w", err)
	}
	for _, g := range disc.GPUs {
		r.Node.GPUs = append(r.Node.GPUs, summarize(g))
	}
	r.GPU = summarize(target)

	// The mock's driver version is real input too: a mock node is refused
	// DriverMemory for the reason a node with that driver would be.
	driverMemory := isolation.DriverMemoryProbe{HostRoot: "/", HookPath: cfg.NVIDIACDIHookPath, DriverVersion: target.DriverVersion}.Detect()
	driverMemory.DriverRoot = cfg.DriverRoot
	r.Mock = cfg.Mock
	r.Checks = append(r.Checks, groundTruthChecks(ctx, cfg, disc)...)
	modeCheck, mode, modeKnown := computeModeCheck(cfg, target)
	r.Checks = append(r.Checks, modeCheck)
	if err := summarizeSlices(&r.Node, cfg, disc.GPUs, driverMemory.Capable); err != nil {
		return nil, err
	}

	if cfg.Prober != nil && !cfg.AllowBusy {
		n, err := gpu.ComputeProcesses(cfg.NVML, target.UUID)
		if err != nil {
			return nil, fmt.Errorf("gpu check: %w", err)
		}
		if n > 0 {
			return nil, fmt.Errorf("gpu check: %d compute process(es) already run on GPU gpu-%d (%s); their work would distort the figures (stop them, pick another GPU with --gpu, or pass --allow-busy)", n, target.Minor, target.UUID)
		}
	}

	memory := cfg.ShareMemory
	if memory <= 0 {
		memory = max(int64(target.MemoryBytes/4)>>30<<30, 1<<30)
	}
	if noShares == "" && 2*memory > int64(target.MemoryBytes) {
		return nil, fmt.Errorf("gpu check: two shares of %d MiB do not fit GPU gpu-%d's %d MiB", memory>>20, target.Minor, target.MemoryBytes>>20)
	}

	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("gpu check: %w", err)
	}
	if ep, ok := cfg.Prober.(ExecProber); ok && cfg.Mock {
		// The mock plays the driver's part: NVML lists each simulated
		// probe as a process on the checked GPU while it runs, and the
		// simulated clients register where the check can see them.
		if mock, ok := cfg.NVML.(*gpu.MockNode); ok && ep.Observe == nil {
			ep.Observe = mockDriverObserver(mock, target.Index, filepath.Join(cfg.WorkDir, SimRegistryDir))
			ep.ProcessMemory = NVMLProcessMemory(cfg.NVML)
			cfg.Prober = ep
		}
		if err := os.MkdirAll(filepath.Join(cfg.WorkDir, SimRegistryDir), 0o755); err != nil {
			return nil, fmt.Errorf("gpu check: %w", err)
		}
		if err := os.Chmod(filepath.Join(cfg.WorkDir, SimRegistryDir), 0o1777); err != nil {
			return nil, fmt.Errorf("gpu check: %w", err)
		}
	}
	n := &node{cfg: cfg, gpu: target, allGPUs: disc.GPUs, memory: memory, driverMemory: driverMemory, targets: t, noShares: noShares}
	if modeKnown && mode == nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		n.oneContext = fmt.Sprintf("gpu-%d is in compute mode EXCLUSIVE_PROCESS: one CUDA context at a time (an MPS server's, shared by its clients), so steps that need two contexts at once are skipped; the check reads the compute mode and never changes it", target.Minor)
	}
	if err := n.start(ctx); err != nil {
		return nil, err
	}
	defer n.stop(ctx)
	// The lending sampler watches every GPU while the probes run.
	var watch *samplerWatch
	if ep, ok := n.cfg.Prober.(ExecProber); ok {
		watch = n.startSampler(ctx, disc.GPUs)
		prev := ep.Observe
		ep.Observe = func(pid int, m probeMessage, gone bool) {
			if prev != nil {
				prev(pid, m, gone)
			}
			watch.observe(pid, m, gone)
		}
		n.cfg.Prober = ep
	}
	// A check told to stop (SIGINT or SIGTERM: run.sh's trap, a timeout)
	// takes no further step; the deferred stop still ends its daemons.
	interrupted := func() error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("gpu check: interrupted (%w): the steps from here on were not taken", context.Cause(ctx))
		}
		return nil
	}
	for _, iso := range cfg.Isolations {
		if err := interrupted(); err != nil {
			return nil, err
		}
		watch.setPhase("backend " + string(iso))
		r.Backends = append(r.Backends, n.check(ctx, iso))
	}
	for _, step := range []struct {
		phase string
		run   func() []Check
	}{
		{"CDI spec in containers", func() []Check { return n.containerChecks(ctx) }},
		{"MPS checks", func() []Check { return n.mpsChecks(ctx) }},
		{"HAMi-core checks", func() []Check { return n.hamiChecks(ctx) }},
		{"health-event registration", func() []Check { return []Check{n.healthCheck(ctx)} }},
		{"MIG checks", func() []Check { return n.migChecks(ctx) }},
	} {
		if err := interrupted(); err != nil {
			return nil, err
		}
		watch.setPhase(step.phase)
		r.Checks = append(r.Checks, step.run()...)
	}
	if err := interrupted(); err != nil {
		return nil, err
	}
	if watch != nil {
		r.Checks = append(r.Checks, watch.finish(n))
	} else {
		r.Checks = append(r.Checks, Check{Name: "lending sampler readings during the probes", Status: StatusSkipped, Detail: "no probe processes ran (--no-probes, or a stand-in prober): nothing for the sampler to see"})
	}
	r.Evaluate(t)
	r.finish(cfg)
	return r, nil
}

// pickGPU is the GPU to check: the one with minor (when minor >= 0), else
// the first not in MIG mode. A MIG GPU has no whole-GPU memory or SMs to
// share, so it is never checked; a node of MIG GPUs only is an error that
// names them.
func pickGPU(gpus []gpu.GPU, minor int) (gpu.GPU, error) {
	var mig []string
	for _, g := range gpus {
		if minor >= 0 && g.Minor != minor {
			continue
		}
		if g.MIGEnabled {
			mig = append(mig, fmt.Sprintf("gpu-%d (%s)", g.Minor, g.UUID))
			continue
		}
		if g.MemoryBytes == 0 || g.MemoryBytes == nvmlValueNotAvailable {
			return gpu.GPU{}, fmt.Errorf("GPU gpu-%d (%s): NVML reports no usable memory size (%d)", g.Minor, g.UUID, g.MemoryBytes)
		}
		return g, nil
	}
	switch {
	case minor >= 0 && len(mig) > 0:
		return gpu.GPU{}, fmt.Errorf("--gpu %d: GPU %s has MIG enabled; Tessera does not share MIG GPUs (pick another with --gpu)", minor, mig[0])
	case minor >= 0:
		return gpu.GPU{}, fmt.Errorf("--gpu %d: no such GPU (discovered minors %v)", minor, minors(gpus))
	case len(mig) > 0:
		return gpu.GPU{}, fmt.Errorf("%w (%s); Tessera does not share MIG GPUs", errEveryGPUMIG, strings.Join(mig, ", "))
	}
	return gpu.GPU{}, errors.New("no GPU discovered")
}

// errEveryGPUMIG is pickGPU's error when every GPU is in MIG mode.
var errEveryGPUMIG = errors.New("every GPU has MIG enabled")

// nvmlValueNotAvailable is NVML_VALUE_NOT_AVAILABLE for unsigned long long:
// what NVML puts in a memory field it cannot fill (a process's memory under
// MPS or without permission). It is never a figure.
const nvmlValueNotAvailable = ^uint64(0)

// computeModeCheck reads the checked GPU's compute mode (known is false
// when it could not). The check never sets it (nor MIG mode, nor resets a
// GPU): it says what it found, and in EXCLUSIVE_PROCESS skips the steps
// that need two contexts at once.
func computeModeCheck(cfg Config, g gpu.GPU) (c Check, mode nvml.ComputeMode, known bool) {
	c = Check{Name: "compute mode (read only)"}
	dev, ret := cfg.NVML.DeviceGetHandleByUUID(g.UUID)
	if ret != nvml.SUCCESS {
		c.Status, c.Detail = StatusError, fmt.Sprintf("gpu-%d: nvmlDeviceGetHandleByUUID: %v", g.Minor, ret)
		return c, 0, false
	}
	if m, ok := dev.(*nvmlmock.Device); ok && m.GetComputeModeFunc == nil {
		// go-nvml's mock panics on a method it was not given.
		c.Status, c.Detail = StatusSkipped, fmt.Sprintf("gpu-%d: this mock NVML reports no compute mode", g.Minor)
		return c, 0, false
	}
	mode, ret = dev.GetComputeMode()
	if ret != nvml.SUCCESS {
		c.Status, c.Detail = StatusError, fmt.Sprintf("gpu-%d: nvmlDeviceGetComputeMode: %v", g.Minor, ret)
		return c, 0, false
	}
	c.Status = StatusMeasured
	if cfg.Mock {
		c.Status = StatusSimulated
	}
	switch mode {
	case nvml.COMPUTEMODE_DEFAULT:
		c.Detail = fmt.Sprintf("gpu-%d: Default (what Tessera expects: MPS and non-MPS shares both work)", g.Minor)
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		c.Detail = fmt.Sprintf("gpu-%d: EXCLUSIVE_PROCESS: one context at a time; shares other than MPS and whole GPUs used by two processes fail (the check skips its steps that need two contexts at once)", g.Minor)
	case nvml.COMPUTEMODE_PROHIBITED:
		c.Status, c.Detail = StatusMismatch, fmt.Sprintf("gpu-%d: PROHIBITED: no CUDA context can be created; the probes will fail", g.Minor)
	default:
		c.Detail = fmt.Sprintf("gpu-%d: compute mode %d", g.Minor, mode)
	}
	return c, mode, true
}

func summarize(g gpu.GPU) GPUSummary {
	return GPUSummary{Minor: g.Minor, UUID: g.UUID, Product: g.ProductName, MemoryMiB: g.MemoryBytes >> 20, SMs: g.MultiprocessorCount, NVLinkDomain: g.NVLinkDomain}
}

func minors(gpus []gpu.GPU) []int {
	out := make([]int, len(gpus))
	for i, g := range gpus {
		out[i] = g.Minor
	}
	return out
}

func formatIsolations(isos []configapi.Isolation) string {
	s := make([]string, len(isos))
	for i, iso := range isos {
		s[i] = string(iso)
	}
	return strings.Join(s, ", ")
}

// summarizeSlices builds the ResourceSlices the kubelet plugin would publish
// for gpus, exactly as it does, and summarizes them.
func summarizeSlices(n *NodeSummary, cfg Config, gpus []gpu.GPU, driverMemory bool) error {
	opts := []model.Option{model.WithDriverMemoryLimits(driverMemory)}
	if !cfg.Mock {
		opts = append(opts, model.WithPCIeRoots(gpu.SysfsPCIeRoots{}))
	}
	res, err := model.Resources(cfg.NodeName, gpus, opts...)
	if err != nil {
		return fmt.Errorf("gpu check: model: %w", err)
	}
	if err := model.Validate(res); err != nil {
		return fmt.Errorf("gpu check: the model is not valid: %w", err)
	}
	slices, err := model.ResourceSlices(cfg.NodeName, res)
	if err != nil {
		return fmt.Errorf("gpu check: slices: %w", err)
	}
	n.ResourceSlices = len(slices)
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			desc := d.Name
			if m, ok := d.Capacity["memory"]; ok {
				cores := d.Capacity["cores"]
				desc += fmt.Sprintf(" (memory %s, cores %s)", m.Value.String(), cores.Value.String())
			}
			n.Devices = append(n.Devices, desc)
		}
	}
	return nil
}

// node is the check's plugin instance and what it needs.
type node struct {
	cfg          Config
	gpu          gpu.GPU
	allGPUs      []gpu.GPU // every GPU discovery found (the MIG checks look for one in MIG mode)
	memory       int64
	driverMemory isolation.DriverMemory
	targets      Targets

	// oneContext, when set, is why steps that need two CUDA contexts at
	// once are skipped (the GPU's compute mode is EXCLUSIVE_PROCESS).
	oneContext string
	// noShares, when set, is why no share is checked (every GPU is in MIG
	// mode).
	noShares string

	plugin  *plugin.Plugin
	client  kubernetes.Interface
	cdiDirs []string
	mps     *LocalMPS
	mpsLife *isolation.MPS
}

func (n *node) start(ctx context.Context) error {
	dir := n.cfg.WorkDir
	store, rec, err := checkpoint.Open(ctx, filepath.Join(dir, "plugin", "checkpoint.json"), "gpu-check")
	if err != nil {
		return fmt.Errorf("gpu check: %w", err)
	}
	specs, err := cdi.NewDir(filepath.Join(dir, "cdi"))
	if err != nil {
		return fmt.Errorf("gpu check: %w", err)
	}
	n.client = fake.NewClientset()
	n.cdiDirs = []string{specs.Root()}
	opts := plugin.Options{
		NodeName:     n.cfg.NodeName,
		GPUs:         []gpu.GPU{n.gpu},
		Store:        store,
		Recovery:     rec,
		Specs:        specs,
		Mock:         n.cfg.Mock,
		Client:       n.client,
		DriverMemory: n.driverMemory,
	}
	mpsRoot := filepath.Join(dir, "mps")
	if n.cfg.Mock {
		opts.MPS = isolation.NewMPS(mpsRoot, mockMPSRunner{isolation.NewFakeRunner()})
	} else {
		binary := n.cfg.MPSControl
		if binary == "" {
			binary = "nvidia-cuda-mps-control"
		}
		n.mps = &LocalMPS{Binary: binary, Root: mpsRoot}
		if os.Geteuid() == 0 {
			if self, err := os.Executable(); err == nil {
				n.mps.Self, n.mps.ShmDomains = self, map[string]bool{ContainerNamespace: true}
			}
		}
		opts.MPS = isolation.NewMPS(mpsRoot, n.mps)
		opts.DevNodes = isolation.HostDevNodes{DriverRoot: n.cfg.DriverRoot}
		toolkit, err := cdi.NewToolkitSpecs(n.cfg.NVIDIACDISpecDirs...)
		if err != nil {
			return fmt.Errorf("gpu check: %w", err)
		}
		opts.Toolkit, opts.ToolkitSpecDirs = toolkit, n.cfg.NVIDIACDISpecDirs
		// No container runtime will read the spec; without a toolkit
		// device the plugin writes device nodes and the GPU's UUID as for
		// a legacy-mode runtime, which the check applies by hand.
		opts.LegacyRuntime = true
		n.cdiDirs = append(n.cdiDirs, n.cfg.NVIDIACDISpecDirs...)
	}
	if n.cfg.HAMiCoreLibrary != "" {
		preload, err := isolation.WritePreloadFile(filepath.Join(dir, "hami"))
		if err != nil {
			return fmt.Errorf("gpu check: %w", err)
		}
		opts.HAMiCore = isolation.HAMiCore{Library: n.cfg.HAMiCoreLibrary, PreloadFile: preload, ClaimRoot: filepath.Join(dir, "hami", "claims")}
	}
	p, err := plugin.New(ctx, opts)
	if err != nil {
		return fmt.Errorf("gpu check: %w", err)
	}
	n.plugin, n.mpsLife = p, opts.MPS
	return nil
}

func (n *node) stop(ctx context.Context) {
	if n.mps != nil {
		if err := n.mps.StopAll(context.WithoutCancel(ctx)); err != nil {
			klog.FromContext(ctx).Error(err, "Stopping the check's MPS daemons failed")
		}
	}
}

// share is one claim of the check.
type share struct {
	claim *resourceapi.ResourceClaim
	cores int64
}

func (n *node) claims(iso configapi.Isolation) []share {
	return n.claimsFor(Namespace, "gpucheck-"+strings.ToLower(string(iso)), iso, n.cfg.Cores[:])
}

// claimsFor builds one allocated claim per entry of cores, in namespace ns
// (the MPS trust domain), named name-a, name-b, …: each a share of the
// checked GPU with the check's memory and that many cores, choosing iso.
func (n *node) claimsFor(ns, name string, iso configapi.Isolation, cores []int64) []share {
	cfg, _ := json.Marshal(map[string]any{
		"apiVersion": configapi.SchemeGroupVersion.String(), "kind": configapi.GpuConfigKind,
		"sharing": map[string]any{"isolation": iso},
	})
	var out []share
	for i, c := range cores {
		uid := fmt.Sprintf("%s-%c", name, 'a'+i)
		shareID := types.UID(fmt.Sprintf("share-%c", 'a'+i))
		if ns != Namespace {
			shareID = types.UID("share-" + uid)
		}
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: uid, UID: types.UID(uid)},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{
					Request: "gpu", Driver: model.DriverName, Pool: n.cfg.NodeName, Device: model.SharedDeviceName(n.gpu.Minor), ShareID: &shareID,
					ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
						"memory": *resource.NewQuantity(n.memory, resource.BinarySI),
						"cores":  *resource.NewQuantity(c, resource.DecimalSI),
					},
				}},
				Config: []resourceapi.DeviceAllocationConfiguration{{
					Source: resourceapi.AllocationConfigSourceClaim,
					DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
						Driver: model.DriverName, Parameters: runtime.RawExtension{Raw: cfg},
					}},
				}},
			}}},
		}
		out = append(out, share{claim: claim, cores: c})
	}
	return out
}

// prepared is a set of claims the plugin prepared for one of the checks
// beyond the backends' own; release unprepares them and removes them from
// the fake API.
type prepared struct {
	shares  []share
	results map[types.UID]kubeletplugin.PrepareResult
	release func()
}

// prepareShares creates the shares' claims in the fake API and prepares
// them through the plugin; a claim the plugin refuses is an error.
func (n *node) prepareShares(ctx context.Context, shares []share) (*prepared, error) {
	claims := make([]*resourceapi.ResourceClaim, len(shares))
	var created []*resourceapi.ResourceClaim
	cleanup := func() {
		for _, c := range created {
			_ = n.client.ResourceV1().ResourceClaims(c.Namespace).Delete(context.WithoutCancel(ctx), c.Name, metav1.DeleteOptions{})
		}
	}
	for i, s := range shares {
		claims[i] = s.claim
		if _, err := n.client.ResourceV1().ResourceClaims(s.claim.Namespace).Create(ctx, s.claim, metav1.CreateOptions{}); err != nil {
			cleanup()
			return nil, fmt.Errorf("create claim %s/%s in the fake API: %w", s.claim.Namespace, s.claim.Name, err)
		}
		created = append(created, s.claim)
	}
	results, err := n.plugin.PrepareResourceClaims(ctx, claims)
	release := func() {
		if err := n.unprepare(ctx, claims); err != nil {
			klog.FromContext(ctx).Error(err, "Unpreparing the check's claims failed")
		}
		cleanup()
	}
	if err != nil {
		release()
		return nil, fmt.Errorf("prepare: %w", err)
	}
	var errs []string
	for _, c := range claims {
		if err := results[c.UID].Err; err != nil {
			errs = append(errs, fmt.Sprintf("%s/%s: %v", c.Namespace, c.Name, err))
		}
	}
	if len(errs) > 0 {
		release()
		return nil, fmt.Errorf("prepare: %s", strings.Join(errs, "; "))
	}
	return &prepared{shares: shares, results: results, release: release}, nil
}

// cdiIDs are the CDI device IDs the plugin returned for the claim.
func (p *prepared) cdiIDs(claim *resourceapi.ResourceClaim) []string {
	var ids []string
	for _, d := range p.results[claim.UID].Devices {
		ids = append(ids, d.CDIDeviceIDs...)
	}
	return ids
}

// check prepares the backend's two shares, reads their specs back, probes
// them and unprepares them.
func (n *node) check(ctx context.Context, iso configapi.Isolation) BackendReport {
	b := BackendReport{Isolation: iso, Enforces: Enforces[iso]}
	switch iso {
	case configapi.IsolationMPS:
		if n.mps != nil {
			if _, err := exec.LookPath(n.mps.Binary); err != nil {
				b.Skipped = fmt.Sprintf("%s not found (%v): install the driver's MPS binaries or pass --mps-control", n.mps.Binary, err)
				return b
			}
		}
	case configapi.IsolationHAMiCore:
		if n.cfg.HAMiCoreLibrary == "" && n.cfg.HAMiCoreError != "" {
			b.Error = "HAMi-core: " + n.cfg.HAMiCoreError
			return b
		}
		if n.cfg.HAMiCoreLibrary == "" {
			b.Skipped = "no HAMi-core library given (--hami-core-library=/path/to/libvgpu.so)"
			if n.cfg.HAMiCoreSkipReason != "" {
				b.Skipped = n.cfg.HAMiCoreSkipReason
			}
			return b
		}
	}

	if n.noShares != "" {
		b.Skipped = n.noShares
		return b
	}
	shares := n.claims(iso)
	claims := make([]*resourceapi.ResourceClaim, len(shares))
	for i, s := range shares {
		claims[i] = s.claim
		if _, err := n.client.ResourceV1().ResourceClaims(Namespace).Create(ctx, s.claim, metav1.CreateOptions{}); err != nil {
			b.Error = fmt.Sprintf("create claim %s in the fake API: %v", s.claim.Name, err)
			return b
		}
	}
	defer func() {
		for _, c := range claims {
			_ = n.client.ResourceV1().ResourceClaims(Namespace).Delete(context.WithoutCancel(ctx), c.Name, metav1.DeleteOptions{})
		}
	}()
	results, err := n.plugin.PrepareResourceClaims(ctx, claims)
	if err != nil {
		b.Error = fmt.Sprintf("prepare: %v", err)
		return b
	}
	defer func() {
		if err := n.unprepare(ctx, claims); err != nil && b.Error == "" {
			b.Error = err.Error()
		}
	}()
	var prepareErrs []string
	for _, c := range claims {
		if err := results[c.UID].Err; err != nil {
			prepareErrs = append(prepareErrs, err.Error())
		}
	}
	if iso == IsolationDriverMemory && !n.driverMemory.Capable {
		// The node says it cannot: the plugin must refuse (fail closed).
		if len(prepareErrs) < len(claims) {
			b.Error = fmt.Sprintf("the node cannot enforce driver memory limits (%s), yet the plugin prepared a DriverMemory share: it must fail closed", n.driverMemory.Reason)
			return b
		}
		b.Skipped = "the node cannot enforce driver memory limits: " + n.driverMemory.Reason + " (the plugin refused the shares, as it must)"
		return b
	}
	if len(prepareErrs) > 0 {
		b.Error = "prepare: " + strings.Join(prepareErrs, "; ")
		return b
	}

	envs := make([][]string, len(shares))
	for i, s := range shares {
		sr, env, err := n.readBack(ctx, s, results[s.claim.UID].Devices)
		b.Shares = append(b.Shares, sr)
		if err != nil {
			b.Error = err.Error()
			return b
		}
		envs[i] = env
	}
	if n.cfg.Prober == nil {
		return b
	}
	if iso == IsolationDriverMemory {
		b.Skipped = "prepared with the driver's hook and NVIDIA_GPU_MEMORY_LIMIT in the spec, but the limit is set by the runtime running the createRuntime hook on the container's cgroup, which needs a container runtime; measure it in a pod (docs/gpu-check.md)"
		return b
	}
	for i := range b.Shares {
		p, err := n.cfg.Prober.Memory(ctx, n.gpu.UUID, envs[i])
		if err != nil {
			b.Error = fmt.Sprintf("memory probe of %s: %v", b.Shares[i].Claim, err)
			return b
		}
		b.Shares[i].MemoryProbe = &p
		m := memoryFigures(b.Shares[i].MemoryLimitBytes, p)
		b.Shares[i].Memory = &m
	}
	if n.oneContext != "" && iso != configapi.IsolationMPS {
		// Two compute probes are two contexts (an MPS backend's clients
		// share their server's one).
		b.ComputeSkipped = n.oneContext
		return b
	}
	probes, err := n.cfg.Prober.Compute(ctx, envs, n.cfg.ComputeTime)
	if err != nil {
		b.Error = fmt.Sprintf("compute probes: %v", err)
		return b
	}
	if len(probes) != 2 {
		b.Error = fmt.Sprintf("compute probes: %d results, want 2", len(probes))
		return b
	}
	for i := range b.Shares {
		b.Shares[i].ComputeProbe = &probes[i]
	}
	c := computeFigures([2]int64{shares[0].cores, shares[1].cores}, [2]ComputeProbe{probes[0], probes[1]})
	b.Compute = &c
	return b
}

// readBack loads the claim's prepared devices with the CDI library, as the
// runtime would, and turns them into a probe environment; it also reads
// what the plugin attested in the claim's status.
func (n *node) readBack(ctx context.Context, s share, devices []kubeletplugin.Device) (ShareReport, []string, error) {
	sr := ShareReport{Claim: s.claim.Name, CoresPercent: s.cores, MemoryLimitBytes: n.memory}
	var ids []string
	for _, d := range devices {
		sr.Device = d.DeviceName
		ids = append(ids, d.CDIDeviceIDs...)
	}
	sr.CDIDeviceIDs = ids
	if len(ids) == 0 {
		return sr, nil, fmt.Errorf("claim %s: prepare returned no CDI device", s.claim.Name)
	}
	spec, err := Inject(ids, n.cdiDirs...)
	if err != nil {
		return sr, nil, fmt.Errorf("claim %s: %w", s.claim.Name, err)
	}
	pe := HostProcessEnv(spec, os.Environ())
	sr.Env = specOnly(pe.Env, spec)
	sr.Emulated, sr.NotApplied = pe.Emulated, pe.NotApplied
	if c, err := n.client.ResourceV1().ResourceClaims(Namespace).Get(ctx, s.claim.Name, metav1.GetOptions{}); err == nil {
		for _, d := range c.Status.Devices {
			if d.Data != nil {
				sr.Attested = json.RawMessage(d.Data.Raw)
			}
		}
	}
	return sr, pe.Env, nil
}

// specOnly is the part of env that the spec set (for the report).
func specOnly(env []string, spec *oci.Spec) []string {
	keys := map[string]bool{"CUDA_VISIBLE_DEVICES": true, "LD_PRELOAD": true}
	if spec.Process != nil {
		for _, kv := range spec.Process.Env {
			k, _, _ := strings.Cut(kv, "=")
			keys[k] = true
		}
	}
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if keys[k] {
			out = append(out, kv)
		}
	}
	slices.Sort(out)
	return out
}

// Inject does what the container runtime does with the kubelet's CDI device
// IDs: it loads the specs in dirs with the CDI library and applies the
// devices to an empty OCI spec.
func Inject(ids []string, dirs ...string) (*oci.Spec, error) {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dirs...), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI: %w", err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		return nil, fmt.Errorf("CDI: inject %v: %w (unresolved %v; spec errors %v)", ids, err, unresolved, cache.GetErrors())
	}
	return spec, nil
}

func (n *node) unprepare(ctx context.Context, claims []*resourceapi.ResourceClaim) error {
	refs := make([]kubeletplugin.NamespacedObject, len(claims))
	for i, c := range claims {
		refs[i] = kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}
	}
	res, err := n.plugin.UnprepareResourceClaims(context.WithoutCancel(ctx), refs)
	if err != nil {
		return fmt.Errorf("unprepare: %w", err)
	}
	var errs []error
	for _, c := range claims {
		if err := res[c.UID]; err != nil {
			errs = append(errs, fmt.Errorf("unprepare %s: %w", c.Name, err))
		}
	}
	return errors.Join(errs...)
}
