package main

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

func newSlicesCommand() *cobra.Command {
	var profile, node, output string
	cmd := &cobra.Command{
		Use:   "slices --profile PROFILE [--node NAME] [-o yaml|json]",
		Short: "Print the ResourceSlices a node with a mock GPU profile would publish",
		Long: `Print the ResourceSlice objects that the Tessera kubelet plugin on a node with
the given built-in mock GPU profile would create: counter slices first, then the
device slices, named by generateName as the API server receives them.

Profiles: ` + strings.Join(gpu.Profiles(), ", "),
		Example: `  tessera slices --profile hgx-h100
  tessera slices --profile a100-pairs --node gpu-node-1 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			if node == "" {
				node = profile
			}
			objs, err := profileSlices(profile, node)
			if err != nil {
				return err
			}
			return writeObjects(cmd.OutOrStdout(), output, objs)
		},
	}
	cmd.Flags().StringVar(&profile, "profile", "", "mock GPU node profile ("+strings.Join(gpu.Profiles(), ", ")+")")
	cmd.Flags().StringVar(&node, "node", "", "node name, also the pool name (default: the profile name)")
	_ = cmd.MarkFlagRequired("profile")
	addOutputFlag(cmd, &output)
	return cmd
}

// profileSlices are the ResourceSlices the kubelet plugin would publish on
// node for mock profile.
func profileSlices(profile, node string) ([]resourceapi.ResourceSlice, error) {
	lib, err := gpu.NewMock(profile)
	if err != nil {
		return nil, fmt.Errorf("--profile: %w", err)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("mock profile %s: NVML init: %v", profile, ret)
	}
	defer lib.Shutdown()
	gpus, err := gpu.Discover(lib)
	if err != nil {
		return nil, fmt.Errorf("mock profile %s: %w", profile, err)
	}
	res, err := model.Resources(node, gpus)
	if err != nil {
		return nil, fmt.Errorf("mock profile %s on node %s: %w", profile, node, err)
	}
	objs, err := model.ResourceSlices(node, res)
	if err != nil {
		return nil, fmt.Errorf("mock profile %s on node %s: %w", profile, node, err)
	}
	return objs, nil
}
