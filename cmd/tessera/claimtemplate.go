package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tessera-dev/tessera/pkg/claimtemplate"
)

func newClaimTemplateCommand() *cobra.Command {
	var (
		opts   claimtemplate.Options
		nvlink string
		output string
	)
	cmd := &cobra.Command{
		Use:   "claim-template --name NAME [--gpus N] [--memory Q] [--cores PCT] [--nvlink prefer|require] [--isolation Advisory|MPS|HAMiCore]",
		Short: "Print a ResourceClaimTemplate for whole GPUs or GPU shares",
		Long: `Print a ResourceClaimTemplate that asks Tessera for GPUs, so the firstAvailable and
constraint boilerplate never has to be written by hand.

Without --memory and --cores the template asks for whole GPUs; with either, for a
share of each GPU (several shares land on distinct GPUs). A share without --memory
is allocated all of its GPU's memory (a warning says so).

Options whose template the admission webhook would refuse, because the node could
never prepare its claims, are refused here with the same check: --compute-limit
below --cores, or --isolation MPS with --gpus 2 or more (an MPS claim is exactly
one share).`,
		Example: `  tessera claim-template --name quarter --memory 19Gi --cores 25
  tessera claim-template --name pair --gpus 2 --nvlink prefer
  tessera claim-template --name mps --memory 16Gi --cores 30 --isolation MPS --compute-limit 50`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			if opts.GPUs < 1 {
				return fmt.Errorf("--gpus %d: must be at least 1", opts.GPUs)
			}
			opts.NVLink = claimtemplate.NVLink(nvlink)
			tmpl, warnings, err := claimtemplate.Build(opts)
			if err != nil {
				return err
			}
			for _, w := range warnings {
				fmt.Fprintf(cmd.ErrOrStderr(), "Warning: %s\n", w)
			}
			return writeObjects(cmd.OutOrStdout(), output, []any{tmpl})
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Name, "name", "", "name of the ResourceClaimTemplate (required)")
	f.StringVarP(&opts.Namespace, "namespace", "n", "", "namespace of the ResourceClaimTemplate")
	f.IntVar(&opts.GPUs, "gpus", 1, "number of GPUs (or of shares, each on a different GPU)")
	f.StringVar(&opts.Memory, "memory", "", "memory of each share, e.g. 10Gi (makes it a share)")
	f.IntVar(&opts.Cores, "cores", 0, "guaranteed percent of each GPU's compute, 0-100 (makes it a share)")
	f.StringVar(&nvlink, "nvlink", "", "for --gpus 2+: prefer (NVLink set first, any GPUs second) or require")
	f.StringVar(&opts.Isolation, "isolation", "", "how the share's limits are enforced: Advisory, MPS or HAMiCore")
	f.IntVar(&opts.ComputeLimit, "compute-limit", 0, "cap a share's compute above its guaranteed --cores, in percent")
	addOutputFlag(cmd, &output)
	return cmd
}
