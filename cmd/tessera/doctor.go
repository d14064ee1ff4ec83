package main

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/tessera-dev/tessera/pkg/doctor"
)

// newDoctorCommand runs the kubelet plugin's doctor in the plugin pod of a
// node. The checks need the node's view (the plugin's mounts and
// settings), so they run there: through kubectl exec, which the kubectl
// plugin has at hand, instead of client-go's remotecommand (SPDY/websocket
// streaming) in this binary.
func newDoctorCommand() *cobra.Command {
	var (
		kf                        kubeFlags
		namespace, selector, kctl string
		output                    string
	)
	cmd := &cobra.Command{
		Use:   "doctor [NODE] [-n NAMESPACE] [-o table|json|yaml]",
		Short: "Check a node for what Tessera needs (runs the plugin's doctor in its pod)",
		Long: `Run "tessera-kubelet-plugin doctor" in the kubelet plugin pod on NODE (with
kubectl exec) and print its report: NVML and the driver version, the NVIDIA
container toolkit's CDI spec for every GPU, containerd's CDI setting, the
plugin's kubelet registration and DRA sockets, the MPS control binary and
daemon image, the HAMi-core library, cgroup v2 and driver-enforced memory
limits, and the clock against the API server's. Each line is OK, WARN, FAIL
or SKIP; WARN and FAIL lines say the fix. The exit status is 1 when a check
failed.

NODE may be left out when the plugin runs on one node only. Needs kubectl in
PATH (or --kubectl) and pods/exec on the plugin's pods.`,
		Example: `  # check the node of a pending pod
  tessera doctor gpu-node-7

  # as a kubectl plugin, for scripts
  kubectl tessera doctor gpu-node-7 -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkReportFormat(output); err != nil {
				return err
			}
			node := ""
			if len(args) == 1 {
				node = args[0]
			}
			client, _, err := kf.client()
			if err != nil {
				return err
			}
			pod, err := doctor.PluginPod(cmd.Context(), client, node, namespace, selector)
			if err != nil {
				return err
			}
			path, err := exec.LookPath(kctl)
			if err != nil {
				return fmt.Errorf("--kubectl %q: %w", kctl, err)
			}
			run := exec.CommandContext(cmd.Context(), path, doctor.KubectlExecArgs(pod, output, kf.kubeconfig, kf.context)...)
			run.Stdin, run.Stdout, run.Stderr = nil, cmd.OutOrStdout(), cmd.ErrOrStderr()
			err = run.Run()
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return fmt.Errorf("doctor in pod %s/%s on node %s: %s", pod.Namespace, pod.Name, pod.Spec.NodeName, exit)
			}
			return err
		},
	}
	kf.add(cmd)
	f := cmd.Flags()
	f.StringVarP(&namespace, "namespace", "n", "", "namespace of the kubelet plugin (default: all namespaces)")
	f.StringVarP(&selector, "selector", "l", doctor.PluginSelector, "label selector of the kubelet plugin pods")
	f.StringVar(&kctl, "kubectl", "kubectl", "the kubectl binary that runs kubectl exec")
	f.StringVarP(&output, "output", "o", formatTable, "output format: table, json or yaml")
	return cmd
}

// asKubectlPlugin makes help and completion say "kubectl tessera" when the
// binary runs as kubectl-tessera (kubectl runs plugins by that name; make
// kubectl-plugin links it).
func asKubectlPlugin(root *cobra.Command, argv0 string) {
	if filepath.Base(argv0) != "kubectl-tessera" {
		return
	}
	if root.Annotations == nil {
		root.Annotations = map[string]string{}
	}
	root.Annotations[cobra.CommandDisplayNameAnnotation] = "kubectl tessera"
}
