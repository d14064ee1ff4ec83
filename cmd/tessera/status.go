package main

import (
	"context"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-dev/tessera/internal/cli/clusterview"
)

func newStatusCommand() *cobra.Command {
	var (
		flags clusterReportFlags
		node  string
	)
	cmd := &cobra.Command{
		Use:   "status [--node NAME] [-o table|json|yaml]",
		Short: "Show every GPU Tessera publishes: memory and cores held, holders (pod, claim), health",
		Long: `Show, per node and GPU, the model, how much memory and compute claims hold out of
the total, which pods and claims hold it, and whether it is healthy. A GPU in MIG
mode shows its MIG devices (every static instance, the held placements of a
dynamic-MIG GPU), each with its holders and health. Reads the ResourceSlices of
gpu.tessera.dev and all ResourceClaims (needs list on both). Then, where the
cluster has GPUBudgets (chart value budgets.enabled), each budget's memory,
cores and whole GPUs used out of its hard caps ("-": unlimited) and the claims
still pending (needs list on gpubudgets.gpu.tessera.dev).`,
		Example: `  tessera status
  tessera status --node gpu-node-1 -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runClusterReport(cmd, &flags, func(ctx context.Context, client kubernetes.Interface, _ string) (clusterview.Report, error) {
				report, err := clusterview.Get(ctx, client, node)
				if err != nil {
					return report, err
				}
				dyn, err := flags.kube.dynamicClient()
				if err != nil {
					return report, err
				}
				report.Budgets, err = clusterview.GetBudgets(ctx, dyn)
				return report, err
			})
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "show only this node")
	flags.add(cmd)
	return cmd
}
