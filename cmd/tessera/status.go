package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/status"
)

func newStatusCommand() *cobra.Command {
	var (
		kubeconfig, kubeContext, node, output string
	)
	cmd := &cobra.Command{
		Use:   "status [--node NAME] [-o table|json|yaml]",
		Short: "Show every GPU Tessera publishes: memory and cores held, holders (pod, claim), health",
		Long: `Show, per node and GPU, the model, how much memory and compute claims hold out of
the total, which pods and claims hold it, and whether it is healthy. Reads the
ResourceSlices of gpu.tessera.dev and all ResourceClaims (needs list on both).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch output {
			case "table", formatJSON, formatYAML:
			default:
				return fmt.Errorf("--output %q: unknown format (valid: table, json, yaml)", output)
			}
			rules := clientcmd.NewDefaultClientConfigLoadingRules()
			rules.ExplicitPath = kubeconfig
			cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
				&clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
			if err != nil {
				return fmt.Errorf("kubeconfig: %w", err)
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			report, err := status.Get(cmd.Context(), client, node)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch output {
			case formatJSON:
				b, err := json.MarshalIndent(report, "", "  ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(out, "%s\n", b)
				return err
			case formatYAML:
				b, err := yaml.Marshal(report)
				if err != nil {
					return err
				}
				_, err = out.Write(b)
				return err
			}
			return report.WriteTable(out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&kubeContext, "context", "", "kubeconfig context (default: the current one)")
	f.StringVar(&node, "node", "", "show only this node")
	f.StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}
