// Command tessera-kubelet-plugin is the node daemon of the gpu.tessera.dev DRA
// driver: it discovers the node's GPUs, publishes them as ResourceSlices and
// prepares and unprepares resource claims for the kubelet. It only parses
// flags and wires packages; the logic lives in pkg/plugin and below.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/mpsdaemon"
)

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
	f.register(fs)
	cmd.AddCommand(newMPSDaemonCommand(), newDoctorCommand(&f, fs))
	return cmd
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

// run is the plugin: it checks the flags, opens NVML, connects to the API
// server, recovers the checkpoint, starts the servers and the kubelet
// plugin, publishes the GPUs and serves until ctx is done.
//
// A node without usable NVML (no library, no kernel module) runs without
// GPUs: it publishes an empty pool, says why (log, Node event, /healthz)
// and can still unprepare the claims prepared before; once NVML can be
// opened the plugin restarts.
func run(ctx context.Context, f flags) error {
	if err := f.validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(f.kubelet.pluginDataDir, 0o750); err != nil {
		return fmt.Errorf("create --plugin-data-dir: %w", err)
	}
	ctx, restart := context.WithCancelCause(ctx)
	defer restart(nil)
	d := &daemon{f: f, mock: f.mock.profile != ""}
	if err := d.openGPUs(ctx); err != nil {
		return err
	}
	defer d.closeNVML()
	if err := d.connect(ctx); err != nil {
		return err
	}
	defer d.events.Shutdown()
	opts, err := d.pluginOptions(ctx)
	if err != nil {
		return err
	}
	if err := d.openPlugin(ctx, opts); err != nil {
		return err
	}
	d.buildInventory(ctx)
	if err := d.startServers(ctx); err != nil {
		return err
	}
	helper, err := d.startKubeletPlugin(ctx)
	if err != nil {
		return err
	}
	defer helper.Stop()
	if err := d.startLending(ctx); err != nil {
		return err
	}
	if err := d.publish(ctx, helper); err != nil {
		return err
	}
	waitHealth := d.watchHealth(ctx)
	defer waitHealth()
	d.restartWithNVML(ctx, restart)
	return d.serve(ctx)
}

// errNVMLAvailable ends a plugin that started without NVML once NVML can be
// opened.
var errNVMLAvailable = errors.New("NVML became available")

// serve waits for the end: a signal, or NVML becoming available to a
// plugin that started without it.
func (d *daemon) serve(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	logger.Info("Kubelet plugin running", "node", d.f.node.name, "driver", model.DriverName, "gpus", d.inv.Status())
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

// openNVML returns the initialised NVML of the real driver, or of the mock
// profile when --mock-profile is set (with the GPUs of --mock-fail-discovery
// failing discovery). An error wrapping gpu.ErrUnavailable means the node has
// no usable NVML; any other is a configuration error.
func openNVML(f flags) (nvml.Interface, error) {
	if f.mock.profile == "" {
		return gpu.OpenNVML(f.node.driverRoot)
	}
	node, err := gpu.NewMockNodeWith(f.mock.profile, gpu.MockOptions{MIGStateFile: f.mock.migStateFile})
	if err != nil {
		return nil, err
	}
	for _, spec := range f.mock.failDiscovery {
		if err := node.FailDiscoverySpec(spec); err != nil {
			return nil, fmt.Errorf("--mock-fail-discovery: %w", err)
		}
	}
	if err := gpu.Open(node); err != nil {
		return nil, err
	}
	return node, nil
}
