package main

import (
	"github.com/spf13/cobra"

	"github.com/tessera-dev/tessera/pkg/model"
)

func newDeviceClassesCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "deviceclasses",
		Short: "Print the DeviceClasses Tessera installs (deployments/deviceclasses.yaml)",
		Args:  cobra.NoArgs,
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
