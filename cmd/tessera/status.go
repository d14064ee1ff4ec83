package main

import (
	"github.com/spf13/cobra"

	"github.com/tessera-dev/tessera/internal/cli/clusterview"
)

func newStatusCommand() *cobra.Command {
	var (
		kube         kubeFlags
		node, output string
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
			if err := checkReportFormat(output); err != nil {
				return err
			}
			client, _, err := kube.client()
			if err != nil {
				return err
			}
			report, err := clusterview.Get(cmd.Context(), client, node)
			if err != nil {
				return err
			}
			dyn, err := kube.dynamicClient()
			if err != nil {
				return err
			}
			if report.Budgets, err = clusterview.GetBudgets(cmd.Context(), dyn); err != nil {
				return err
			}
			return writeReport(cmd.OutOrStdout(), output, report, report.WriteTable)
		},
	}
	kube.add(cmd)
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "show only this node")
	f.StringVarP(&output, "output", "o", formatTable, "output format: table, json or yaml")
	return cmd
}
