// Command tessera-gpu-probe is Tessera's real-GPU check (make gpu-check):
// "check" runs the plugin's path on this machine's GPU without Kubernetes and
// measures each backend's limits with probe processes; "probe" is such a
// process. It only parses flags and wires internal/gpucheck; see
// docs/gpu-check.md.
package main

import (
	"errors"
	goflag "flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/internal/gpucheck"
	"github.com/tessera-dev/tessera/internal/gpucheck/cuda"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/isolation"
)

// Exit codes of "check".
const (
	exitMissed = 1 // a target was missed or a step failed
	exitNoGPU  = 2 // the check could not run (no GPU, driver, bad flags)
)

func main() {
	os.Exit(run())
}

func run() int {
	code := 0
	root := &cobra.Command{
		Use:           "tessera-gpu-probe",
		Short:         "Real-GPU check of Tessera's isolation backends (docs/gpu-check.md)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(checkCommand(&code), probeCommand(), mockGroundTruthCommand(), nsexecCommand())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tessera-gpu-probe:", err)
		if code == 0 {
			code = exitNoGPU
		}
	}
	return code
}

type checkFlags struct {
	node, workDir, mockProfile, driverRoot string
	gpuMinor                               int
	shareMemory                            string
	cores                                  []int
	isolations                             []string
	mpsControl, hamiCoreLibrary, hookPath  string
	cdiSpecDirs                            []string
	computeTime                            time.Duration
	memoryTolerance, splitTolerance        float64
	reportOnly, allowBusy, noProbes        bool
	jsonOnly                               bool
	resultsDir, notesFile                  string
	hamiCoreSkipReason, hamiCoreError      string
	nvidiaSMI, procDriverNVIDIA            string
	runc, rootfs                           string
	hamiCoreProcesses                      int
}

func checkCommand(code *int) *cobra.Command {
	f := checkFlags{}
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Discover, publish, prepare a share per backend and measure memory and compute limits",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cfg, targets, cleanup, err := configFor(f)
			if err != nil {
				*code = exitNoGPU
				return err
			}
			defer cleanup()
			report, err := gpucheck.Run(ctx, cfg, targets)
			if err != nil {
				*code = exitNoGPU
				return err
			}
			if f.notesFile != "" {
				notes, err := os.ReadFile(f.notesFile)
				if err != nil {
					return fmt.Errorf("--notes-file: %w", err)
				}
				for line := range strings.SplitSeq(strings.TrimSpace(string(notes)), "\n") {
					if line = strings.TrimSpace(line); line != "" {
						report.Notes = append(report.Notes, line)
					}
				}
			}
			if f.resultsDir != "" {
				if err := writeResults(f.resultsDir, report); err != nil {
					*code = exitMissed
					return err
				}
			}
			if !f.jsonOnly {
				if err := report.WriteTable(os.Stdout); err != nil {
					return err
				}
			}
			if err := report.WriteJSON(os.Stdout); err != nil {
				return err
			}
			if !report.OK() && !f.reportOnly {
				*code = exitMissed
			}
			return nil
		},
	}
	host, _ := os.Hostname()
	fs := cmd.Flags()
	fs.StringVar(&f.node, "node-name", gpucheck.PoolName(host), "node (pool) name the slices are built for (default: the hostname made a valid pool name)")
	fs.StringVar(&f.resultsDir, "results-dir", "", "also write gpu-check.md and gpu-check.json into this directory")
	fs.StringVar(&f.notesFile, "notes-file", "", "lines to add to the report as notes about the run (run.sh's findings)")
	fs.StringVar(&f.hamiCoreSkipReason, "hami-core-skip-reason", "", "why there is no --hami-core-library (shown as HAMiCore's skip reason)")
	fs.StringVar(&f.hamiCoreError, "hami-core-error", "", "why a HAMi-core source that was given made no library (HAMiCore is then an ERROR)")
	fs.StringVar(&f.runc, "runc", "", "a runc binary: as root the container check runs the CDI spec in a container with it (else: a user and mount namespace)")
	fs.IntVar(&f.hamiCoreProcesses, "hami-core-processes", gpucheck.DefaultHAMiCoreProcesses, "processes of one HAMiCore claim that must share its memory limit")
	fs.StringVar(&f.rootfs, "rootfs", "", "the container check's root filesystem (a directory with bin/busybox); empty: an empty one")
	fs.StringVar(&f.nvidiaSMI, "nvidia-smi", "nvidia-smi", "nvidia-smi (path or name in PATH), the ground truth discovery is compared with")
	fs.StringVar(&f.procDriverNVIDIA, "proc-driver-nvidia", "/proc/driver/nvidia", "the kernel module's /proc directory, the other ground truth")
	fs.StringVar(&f.workDir, "work-dir", "", "directory for the checkpoint, CDI specs, MPS pipes (default: a new directory under /tmp, removed at the end)")
	fs.StringVar(&f.mockProfile, "mock-profile", "", "use a mock GPU profile instead of the real driver (prepares and reads specs; no probes): one of "+strings.Join(gpu.Profiles(), ", "))
	fs.StringVar(&f.driverRoot, "driver-root", "/", "root of the NVIDIA driver installation")
	fs.IntVar(&f.gpuMinor, "gpu", -1, "minor number of the GPU to check (default: the first)")
	fs.StringVar(&f.shareMemory, "share-memory", "", "memory of each share, a quantity such as 4Gi (default: a quarter of the GPU, whole GiB)")
	fs.IntSliceVar(&f.cores, "cores", []int{30, 70}, "cores (percent) of the two shares run together")
	fs.StringSliceVar(&f.isolations, "isolation", isolationNames(gpucheck.DefaultIsolations), "backends to check")
	fs.StringVar(&f.mpsControl, "mps-control", "nvidia-cuda-mps-control", "the driver's MPS control program (path or name in PATH)")
	fs.StringVar(&f.hamiCoreLibrary, "hami-core-library", "", "host path of HAMi-core's libvgpu.so; empty skips HAMiCore")
	fs.StringVar(&f.hookPath, "nvidia-cdi-hook-path", isolation.DefaultNVIDIACDIHookPath, "the NVIDIA container toolkit's nvidia-cdi-hook (DriverMemory)")
	fs.StringSliceVar(&f.cdiSpecDirs, "nvidia-cdi-spec-dirs", []string{"/etc/cdi", "/var/run/cdi"}, "where the NVIDIA container toolkit's CDI spec is looked for")
	fs.DurationVar(&f.computeTime, "compute-time", 10*time.Second, "how long the two compute probes run together")
	fs.Float64Var(&f.memoryTolerance, "memory-tolerance-mib", gpucheck.DefaultTargets.MemoryToleranceMiB, "target: memory obtained within this many MiB of the limit")
	fs.Float64Var(&f.splitTolerance, "split-tolerance", gpucheck.DefaultTargets.SplitTolerancePoints, "target: each share's part of the work within this many percentage points of its part of the request")
	fs.BoolVar(&f.reportOnly, "report-only", false, "exit 0 even when a target is missed (report only)")
	fs.BoolVar(&f.allowBusy, "allow-busy", false, "probe although other compute processes run on the GPU")
	fs.BoolVar(&f.noProbes, "no-probes", false, "prepare and read back the specs only")
	fs.BoolVar(&f.jsonOnly, "json", false, "print only the JSON line")
	klogFlags := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	return cmd
}

func isolationNames(isos []configapi.Isolation) []string {
	out := make([]string, len(isos))
	for i, iso := range isos {
		out[i] = string(iso)
	}
	return out
}

// configFor turns the flags into a check; cleanup shuts NVML down and
// removes a temporary work directory.
func configFor(f checkFlags) (gpucheck.Config, gpucheck.Targets, func(), error) {
	var cfg gpucheck.Config
	targets := gpucheck.Targets{MemoryToleranceMiB: f.memoryTolerance, SplitTolerancePoints: f.splitTolerance}
	if len(f.cores) != 2 {
		return cfg, targets, nil, fmt.Errorf("--cores %v: want two percentages", f.cores)
	}
	cfg = gpucheck.Config{
		NodeName: f.node, GPUMinor: f.gpuMinor, Cores: [2]int64{int64(f.cores[0]), int64(f.cores[1])},
		MPSControl: f.mpsControl, HAMiCoreLibrary: f.hamiCoreLibrary, DriverRoot: f.driverRoot,
		NVIDIACDIHookPath: f.hookPath, NVIDIACDISpecDirs: f.cdiSpecDirs, ComputeTime: f.computeTime, AllowBusy: f.allowBusy,
		HAMiCoreSkipReason: f.hamiCoreSkipReason, HAMiCoreError: f.hamiCoreError, NvidiaSMI: f.nvidiaSMI, ProcDriverNVIDIA: f.procDriverNVIDIA,
		Runc: f.runc, RootFS: f.rootfs, HAMiCoreProcesses: f.hamiCoreProcesses,
	}
	for _, iso := range f.isolations {
		cfg.Isolations = append(cfg.Isolations, configapi.Isolation(iso))
	}
	if f.shareMemory != "" {
		q, err := resource.ParseQuantity(f.shareMemory)
		if err != nil || q.Value() < 1<<20 {
			return cfg, targets, nil, fmt.Errorf("--share-memory %q: want a quantity of at least 1Mi, such as 4Gi", f.shareMemory)
		}
		cfg.ShareMemory = q.Value()
	}
	if f.hamiCoreLibrary != "" {
		if _, err := os.Stat(f.hamiCoreLibrary); err != nil {
			return cfg, targets, nil, fmt.Errorf("--hami-core-library: %w", err)
		}
	}
	dir := f.workDir
	removeDir := false
	if dir == "" {
		d, err := os.MkdirTemp("", "tgc")
		if err != nil {
			return cfg, targets, nil, err
		}
		dir, removeDir = d, true
	}
	cfg.WorkDir, _ = filepath.Abs(dir)
	if f.mockProfile != "" {
		lib, err := gpu.NewMock(f.mockProfile)
		if err != nil {
			return cfg, targets, nil, fmt.Errorf("--mock-profile: %w", err)
		}
		if err := gpu.Open(lib); err != nil {
			return cfg, targets, nil, err
		}
		cfg.NVML, cfg.Mock = lib, true
		if !f.noProbes {
			// The probe's mock mode: the same child processes and
			// protocol, figures simulated from the spec's variables.
			self, err := os.Executable()
			if err != nil {
				return cfg, targets, nil, err
			}
			disc, err := gpu.DiscoverNode(lib)
			if err != nil || len(disc.GPUs) == 0 {
				return cfg, targets, nil, fmt.Errorf("--mock-profile %s: discovery: %v", f.mockProfile, err)
			}
			cfg.Prober = gpucheck.ExecProber{
				Command: []string{self, "probe", "--simulate-gpu-mib", fmt.Sprint(disc.GPUs[0].MemoryBytes >> 20),
					"--simulate-registry", filepath.Join(cfg.WorkDir, gpucheck.SimRegistryDir)},
			}
		}
	} else {
		lib, err := gpu.OpenNVML(f.driverRoot)
		if err != nil {
			if errors.Is(err, gpu.ErrUnavailable) {
				return cfg, targets, nil, fmt.Errorf("no usable NVIDIA GPU on this machine: %w (the check needs an NVIDIA GPU and its driver; see docs/gpu-check.md)", err)
			}
			return cfg, targets, nil, err
		}
		cfg.NVML = lib
		if !f.noProbes {
			self, err := os.Executable()
			if err != nil {
				return cfg, targets, nil, err
			}
			cfg.Prober = gpucheck.ExecProber{Command: []string{self, "probe"}, ProcessMemory: gpucheck.NVMLProcessMemory(lib)}
		}
	}
	lib := cfg.NVML
	return cfg, targets, func() {
		_ = lib.Shutdown()
		if removeDir {
			_ = os.RemoveAll(dir)
		}
	}, nil
}

func probeCommand() *cobra.Command {
	var simulateMiB uint64
	cmd := &cobra.Command{
		Use:    "probe",
		Short:  "A probe process (run by check in a prepared environment)",
		Hidden: true,
	}
	var registry string
	var faults []string
	cmd.PersistentFlags().Uint64Var(&simulateMiB, "simulate-gpu-mib", 0, "mock mode: load no driver, simulate a GPU of this many MiB from the environment's variables")
	cmd.PersistentFlags().StringSliceVar(&faults, "simulate-fault", nil, "mock mode, for tests: simulate a broken driver ("+strings.Join(gpucheck.SimFaults, ", ")+")")
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error {
		for _, f := range faults {
			if !slices.Contains(gpucheck.SimFaults, f) {
				return fmt.Errorf("--simulate-fault %q: want one of %s", f, strings.Join(gpucheck.SimFaults, ", "))
			}
		}
		if len(faults) > 0 && simulateMiB == 0 {
			return errors.New("--simulate-fault needs --simulate-gpu-mib (the mock mode)")
		}
		return nil
	}
	cmd.PersistentFlags().StringVar(&registry, "simulate-registry", "", "mock mode: the directory where simulated clients register (which MPS server, which context)")
	var allocator string
	var stopAfterMiB uint64
	var waitStart bool
	memOpts := func() (gpucheck.MemoryOptions, error) {
		a, err := cuda.ParseAllocator(allocator)
		return gpucheck.MemoryOptions{Allocator: a, StopAfterBytes: stopAfterMiB << 20, WaitStart: waitStart}, err
	}
	memory := func(in io.Reader, out io.Writer) error {
		opts, err := memOpts()
		if err != nil {
			return err
		}
		if simulateMiB > 0 {
			return gpucheck.RunSimulatedMemoryProbe(in, out, os.Environ(), simulateMiB<<20, opts, gpucheck.SimRegistry{Dir: registry}, faults...)
		}
		return gpucheck.RunMemoryProbe(in, out, opts)
	}
	memFlags := func(c *cobra.Command) {
		c.Flags().StringVar(&allocator, "allocator", "alloc", "allocate with alloc (cuMemAlloc), async (cuMemAllocAsync), vmm (cuMemCreate+cuMemMap) or managed (cuMemAllocManaged)")
		c.Flags().Uint64Var(&stopAfterMiB, "stop-after-mib", 0, "stop allocating after this many MiB without a refusal (0: no bound)")
		c.Flags().BoolVar(&waitStart, "wait-start", false, "report ready once the context exists; allocate after a line on stdin")
	}
	memCmd := &cobra.Command{
		Use:   "memory",
		Short: "Allocate device memory until refused; report on stdout",
		RunE:  func(*cobra.Command, []string) error { return memory(os.Stdin, os.Stdout) },
	}
	memFlags(memCmd)
	cmd.AddCommand(memCmd)
	var expect string
	inside := &cobra.Command{
		Use:   "inside",
		Short: "In a container: report what the CDI spec gave this process, then run the memory probe",
		RunE: func(*cobra.Command, []string) error {
			return gpucheck.RunInside(os.Stdin, os.Stdout, expect, memory)
		},
	}
	inside.Flags().StringVar(&expect, "expect", "/tessera/expect.json", "what the spec says the process must find")
	memFlags(inside)
	cmd.AddCommand(inside)
	cmd.AddCommand(&cobra.Command{
		Use:   "hold",
		Short: "Create a CUDA context (an MPS client connects) and hold it until a line on stdin",
		RunE: func(*cobra.Command, []string) error {
			if simulateMiB > 0 {
				return gpucheck.RunSimulatedHoldProbe(os.Stdin, os.Stdout, os.Environ(), simulateMiB<<20, gpucheck.SimRegistry{Dir: registry}, faults...)
			}
			return gpucheck.RunHoldProbe(os.Stdin, os.Stdout)
		},
	})
	cmd.AddCommand(timedCommand("work", "Run fixed-work kernels on a quarter of the SMs for --seconds after a line on stdin", 5, "wall time to run", func(d time.Duration) error {
		if simulateMiB > 0 {
			return gpucheck.RunSimulatedWorkProbe(os.Stdin, os.Stdout, os.Environ(), d, gpucheck.SimRegistry{Dir: registry})
		}
		return gpucheck.RunWorkProbe(os.Stdin, os.Stdout, d)
	}))
	cmd.AddCommand(timedCommand("compute", "Spin the PTX kernel for --seconds after a line on stdin; report the work done", 10, "wall time to spin", func(d time.Duration) error {
		if simulateMiB > 0 {
			return gpucheck.RunSimulatedComputeProbe(os.Stdin, os.Stdout, os.Environ(), d)
		}
		return gpucheck.RunComputeProbe(os.Stdin, os.Stdout, d)
	}))
	return cmd
}

// timedCommand is a probe command with a --seconds flag (def by default,
// usage its help) that must be positive; run gets it as a duration.
func timedCommand(use, short string, def float64, usage string, run func(time.Duration) error) *cobra.Command {
	var seconds float64
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		RunE: func(*cobra.Command, []string) error {
			if seconds <= 0 {
				return fmt.Errorf("--seconds %v: want a positive duration", seconds)
			}
			return run(time.Duration(seconds * float64(time.Second)))
		},
	}
	cmd.Flags().Float64Var(&seconds, "seconds", def, usage)
	return cmd
}

// nsexecCommand is the check's own namespace shim (gpucheck.NSExec): it is
// started in new namespaces, mounts, chroots and executes.
func nsexecCommand() *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use:    "nsexec",
		Short:  "Mount, chroot and execute as a config file says (run by check in new namespaces)",
		Hidden: true,
		RunE: func(*cobra.Command, []string) error {
			err := gpucheck.RunNSExec(config)
			// The check reads a probe's stdout: say there why the
			// namespace could not be set up.
			gpucheck.ReportNSExecError(os.Stdout, err)
			return err
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "the NSExec config (JSON)")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

// writeResults writes gpu-check.md and gpu-check.json into dir.
func writeResults(dir string, r *gpucheck.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--results-dir: %w", err)
	}
	var md, js strings.Builder
	if err := r.WriteMarkdown(&md); err != nil {
		return err
	}
	if err := r.WriteJSON(&js); err != nil {
		return err
	}
	for name, body := range map[string]string{"gpu-check.md": md.String(), "gpu-check.json": js.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("--results-dir: %w", err)
		}
	}
	return nil
}

// mockGroundTruthCommand writes what nvidia-smi and the kernel module's
// /proc tree would say about a mock profile's GPUs, for the bundle's dry
// run (a fake nvidia-smi prints the CSV). It is the mock's own view: the
// dry run proves the comparison runs, the unit tests that it finds
// mismatches.
func mockGroundTruthCommand() *cobra.Command {
	var profile, out string
	cmd := &cobra.Command{
		Use:    "mock-ground-truth",
		Short:  "Write a mock profile's nvidia-smi CSV and /proc/driver/nvidia tree (dry run)",
		Hidden: true,
		RunE: func(*cobra.Command, []string) error {
			lib, err := gpu.NewMock(profile)
			if err != nil {
				return fmt.Errorf("--mock-profile: %w", err)
			}
			if err := gpu.Open(lib); err != nil {
				return err
			}
			disc, err := gpu.DiscoverNode(lib)
			if err != nil {
				return err
			}
			return gpucheck.WriteMockGroundTruth(out, disc.GPUs)
		},
	}
	cmd.Flags().StringVar(&profile, "mock-profile", "hgx-h100", "the mock profile")
	cmd.Flags().StringVar(&out, "out", "", "directory to write nvidia-smi.csv and proc/driver/nvidia into")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}
