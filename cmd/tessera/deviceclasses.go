package main

import (
	"github.com/spf13/cobra"

	"github.com/tessera-dev/tessera/pkg/model"
)

func newDeviceClassesCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "deviceclasses [-o yaml|json]",
		Short: "Print the DeviceClasses Tessera installs (deployments/deviceclasses.yaml)",
		Long: `Print the DeviceClasses Tessera installs: gpu.tessera.dev (whole GPUs, also the
extended resource tessera.dev/gpu), shared.gpu.tessera.dev (shares of a GPU),
lent.gpu.tessera.dev (idle GPUs lent to preemptible borrowers) and
mig.gpu.tessera.dev (MIG devices of GPUs in MIG mode).`,
		Example: `  tessera deviceclasses | kubectl apply -f -
  tessera deviceclasses -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			return writeObjects(cmd.OutOrStdout(), output, model.DeviceClasses())
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}
