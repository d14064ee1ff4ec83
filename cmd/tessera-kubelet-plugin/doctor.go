package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/doctor"
)

// newDoctorCommand is "doctor": the checks of pkg/doctor, run in the
// plugin's pod so that they see the node through the plugin's own mounts.
// The settings checked are the running plugin's: its command line is read
// from /proc and parsed with the plugin's flag set (pluginFlags, which
// fills f), unless flags are given after "--".
func newDoctorCommand(f *flags, pluginFlags *pflag.FlagSet) *cobra.Command {
	var output, procRoot, containerdConfig, toolkitConfig string
	cmd := &cobra.Command{
		Use:   "doctor [-o table|json|yaml] [-- PLUGIN-FLAGS...]",
		Short: "Check this node for what the plugin needs; run it in the plugin's pod",
		Long: `Check the node the plugin runs on: NVML and the driver version, the NVIDIA
container toolkit's CDI spec for every GPU, containerd's CDI setting, whether
the NVIDIA runtime honours NVIDIA_VISIBLE_DEVICES from unprivileged containers
(the toolkit's config.toml), the plugin's kubelet registration and DRA sockets, the MPS control binary and
daemon image, the HAMi-core library, cgroup v2 and driver-enforced memory
limits, and the clock against the API server's. Each line is OK, WARN, FAIL
or SKIP, with the fix for WARN and FAIL. The exit status is 1 when a check
failed.

The settings checked are those of the plugin running in the same pod (its
command line, read from /proc); give other plugin flags after "--".`,
		Example: `  # from a workstation
  kubectl exec -n tessera ds/tessera-kubelet-plugin -- tessera-kubelet-plugin doctor
  kubectl tessera doctor NODE

  # for scripts
  kubectl exec -n tessera POD -- tessera-kubelet-plugin doctor -o json`,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch output {
			case "table", "json", "yaml":
			default:
				return fmt.Errorf("--output %q: unknown format (valid: table, json, yaml)", output)
			}
			source := "flags given after --"
			if len(args) == 0 {
				p, err := doctor.FindPlugin(procRoot, filepath.Base(os.Args[0]), os.Getpid(), []string{"doctor", "mps-daemon"})
				if err == nil {
					args = p.Args
					source = fmt.Sprintf("settings of the running plugin, pid %d", p.PID)
				} else {
					source = "the plugin's default settings (" + err.Error() + ")"
				}
			} else if cmd.ArgsLenAtDash() != 0 {
				return fmt.Errorf("unexpected arguments %q: give plugin flags after --", args)
			}
			if err := pluginFlags.Parse(args); err != nil {
				return fmt.Errorf("plugin flags %q: %w", strings.Join(args, " "), err)
			}
			config := doctorConfig(*f, containerdConfig)
			config.ToolkitConfig = toolkitConfig
			report := doctor.Run(cmd.Context(), config)
			report.Config = source
			out := cmd.OutOrStdout()
			switch output {
			case "json":
				b, err := json.MarshalIndent(report, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "%s\n", b)
			case "yaml":
				b, err := yaml.Marshal(report)
				if err != nil {
					return err
				}
				_, _ = out.Write(b)
			default:
				if err := report.WriteTable(out); err != nil {
					return err
				}
			}
			return report.Err()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	cmd.Flags().StringVar(&procRoot, "proc-root", "/proc", "where to look for the running plugin's command line")
	cmd.Flags().StringVar(&containerdConfig, "containerd-config", "", "containerd's config.toml as seen here (default <host-root>/etc/containerd/config.toml)")
	cmd.Flags().StringVar(&toolkitConfig, "toolkit-config", "", "the NVIDIA container toolkit's config.toml as seen here (default <host-root>/etc/nvidia-container-runtime/config.toml, else the GPU Operator's <host-root>/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml)")
	return cmd
}

// doctorConfig is what the doctor checks for a plugin run with f.
func doctorConfig(f flags, containerdConfig string) doctor.Config {
	c := doctor.Config{
		Node:              f.node.name,
		MockProfile:       f.mock.profile,
		DriverRoot:        f.node.driverRoot,
		HostRoot:          f.node.hostRoot,
		RegistrarDir:      f.kubelet.registrarDir,
		PluginDataDir:     f.kubelet.pluginDataDir,
		CDIRoot:           f.kubelet.cdiRoot,
		ToolkitSpecDirs:   f.isolation.nvidiaCDISpecDirs,
		LegacyRuntime:     f.isolation.legacyRuntime,
		ContainerdConfig:  containerdConfig,
		HostProc:          f.node.procRoot,
		NVIDIACDIHookPath: f.isolation.nvidiaCDIHookPath,
		HAMiCoreLibrary:   f.isolation.hamiCoreLibrary,
		MPSImage:          f.mps.image,
		DefaultIsolation:  configapi.Isolation(f.isolation.defaultIsolation),
		OpenNVML:          func() (nvml.Interface, error) { return openNVML(f) },
	}
	// A bad --expected-compute-mode stops the plugin; the doctor then
	// checks against the default (Default).
	c.ComputeModes, _ = f.node.computeModes()
	// As the plugin connects: --kubeconfig, else in-cluster (quietly
	// nothing outside a pod).
	load := rest.InClusterConfig
	if f.kubelet.kubeconfig != "" {
		load = func() (*rest.Config, error) { return clientcmd.BuildConfigFromFlags("", f.kubelet.kubeconfig) }
	}
	if cfg, err := load(); err == nil {
		if client, err := rest.HTTPClientFor(cfg); err == nil {
			c.APIServer = doctor.HTTPServerClock{Client: client, URL: strings.TrimSuffix(cfg.Host, "/") + "/version"}
		}
	}
	return c
}
