package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/legacy"
)

func newConvertCommand() *cobra.Command {
	var (
		file     string
		unit     string
		profiles []string
	)
	cmd := &cobra.Command{
		Use:   "convert -f FILE [--gpushare-unit GiB|MiB] [--profile PROFILE]",
		Short: "Rewrite manifests written for HAMi, gpushare, Koordinator or the NVIDIA device plugin for Tessera",
		Long: `Read Kubernetes manifests (multi-document YAML; -f - reads stdin) and print them
for Tessera: in Pods, Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs and
CronJobs, each container's legacy GPU resources (HAMi's nvidia.com/gpumem,
gpumem-percentage and gpucores, gpushare's aliyun.com/gpu-mem, Koordinator's
koordinator.sh/gpu-core, gpu-memory, gpu-memory-ratio, gpu and gpu.shared) and
HAMi's GPU-type and UUID annotations become a ResourceClaimTemplate of
gpu.tessera.dev and a claim that refers to it. Plain nvidia.com/gpu is kept: the
opt-in DeviceClass nvidia-gpu.gpu.tessera.dev serves it.

The templates come first, once each, in the namespace of the objects that use
them. Translated documents are written anew (keys sorted, comments dropped);
every other document is printed as it was. Nothing needs a cluster. An input
that cannot be translated is an error naming the document and the field, and
nothing is printed.

HAMi's gpumem-percentage with a different gpucores (50% of memory, 30% of
compute) needs the GPU models to size the shares: --profile takes them from
mock profiles (` + fmt.Sprint(gpu.Profiles()) + `). What each name becomes:
docs/migration.md.`,
		Example: `  tessera convert -f deployment.yaml > tessera.yaml
  helm template my-chart | tessera convert -f - | kubectl apply -f -
  tessera convert -f gpushare-jobs.yaml --gpushare-unit MiB`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var data []byte
			var err error
			if file == "-" {
				data, err = io.ReadAll(cmd.InOrStdin())
			} else {
				data, err = os.ReadFile(file)
			}
			if err != nil {
				return fmt.Errorf("-f %s: %w", file, err)
			}
			opts := legacy.Options{GPUShareUnit: legacy.MemoryUnit(unit)}
			if unit != string(legacy.GiB) && unit != string(legacy.MiB) {
				return fmt.Errorf("--gpushare-unit %q: must be GiB or MiB (gpushare's device plugin --memory-unit)", unit)
			}
			if len(profiles) > 0 {
				if opts.Models, err = fractionModels(cmd.Context(), profiles, nil); err != nil {
					return err
				}
			}
			out, err := legacy.ConvertManifests(data, opts)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "filename", "f", "", "manifests to convert; - reads stdin (required)")
	f.StringVar(&unit, "gpushare-unit", string(legacy.GiB), "the unit of aliyun.com/gpu-mem in this installation of gpushare: GiB or MiB")
	f.StringSliceVar(&profiles, "profile", nil, "GPU models of these mock profiles, to size a percentage of memory with a different percentage of compute")
	_ = cmd.MarkFlagRequired("filename")
	return cmd
}
