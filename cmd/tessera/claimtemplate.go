package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/internal/cli/claimtemplate"
	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/gpu"
)

func newClaimTemplateCommand() *cobra.Command {
	var (
		opts     claimtemplate.Options
		nvlink   string
		output   string
		profiles []string
		mig      string
		kf       kubeFlags
	)
	cmd := &cobra.Command{
		Use:   "claim-template --name NAME [--gpus N] [--memory Q] [--cores PCT | --fraction 1/K] [--mig [PROFILE]] [--nvlink prefer|require] [--isolation Advisory|MPS|HAMiCore]",
		Short: "Print a ResourceClaimTemplate for whole GPUs, GPU shares or MIG devices",
		Long: `Print a ResourceClaimTemplate that asks Tessera for GPUs, so the firstAvailable and
constraint boilerplate never has to be written by hand.

Without --memory and --cores the template asks for whole GPUs; with either, for a
share of each GPU (several shares land on distinct GPUs). A share without --memory
is allocated all of its GPU's memory (a warning says so).

--fraction 1/K (or a decimal) asks for that fraction of whichever GPU model the
claim lands on: one firstAvailable subrequest per model, with memory and cores
such that exactly K shares fit on one GPU of that model. The models are those
the cluster's ResourceSlices publish now (--kubeconfig), or those of mock
profiles (--profile, offline). A model that joins the cluster later is not in
the template: print it again, or use the gpu.tessera.dev/fraction annotation,
which the admission webhook expands for each claim when it is created
(docs/fractions.md).

--mig PROFILE asks for MIG devices of that profile (3g.40gb, 1g.10gb+me), which
are isolated in hardware (docs/mig.md); --mig alone takes the smallest free MIG
device of any profile. --mig --fraction 1/K asks, for each GPU model whose MIG
profile table Tessera knows, for the smallest profile whose compute and memory
both cover 1/K (firstAvailable, one subrequest per model; no cluster access
needed). --isolation MPS runs MPS inside the MIG device; HAMiCore and
DriverMemory do not apply to MIG devices and are refused.

Options whose template the admission webhook would refuse, because the node could
never prepare its claims, are refused here with the same check: --compute-limit
below --cores, --isolation MPS with --gpus 2 or more (an MPS claim is exactly
one share), or --mig with --isolation HAMiCore.`,
		Example: `  tessera claim-template --name quarter --memory 19Gi --cores 25
  tessera claim-template --name pair --gpus 2 --nvlink prefer
  tessera claim-template --name quarter --fraction 1/4
  tessera claim-template --name half --fraction 0.5 --profile hgx-h100,l4x4
  tessera claim-template --name mps --memory 16Gi --cores 30 --isolation MPS --compute-limit 50
  tessera claim-template --name isolated --mig 3g.40gb
  tessera claim-template --name seventh --mig --fraction 1/7`,
		// One argument only after a bare --mig: "--mig 3g.40gb" (pflag
		// reads a flag with an optional value as --mig=VALUE only).
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && mig == migAnyProfile {
				return nil
			}
			return cobra.NoArgs(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			if cmd.Flags().Changed("mig") {
				opts.MIG = true
				switch {
				case len(args) == 1:
					opts.MIGProfile = args[0]
				case mig != migAnyProfile:
					opts.MIGProfile = mig
				}
			}
			if opts.GPUs < 1 {
				return fmt.Errorf("--gpus %d: must be at least 1", opts.GPUs)
			}
			opts.NVLink = claimtemplate.NVLink(nvlink)
			if opts.Fraction != "" && !opts.MIG {
				models, err := fractionModels(cmd.Context(), profiles, &kf)
				if err != nil {
					return err
				}
				opts.Models = models
			} else if len(profiles) > 0 {
				return fmt.Errorf("--profile applies to --fraction of shares (a MIG fraction uses the built-in MIG profile tables)")
			}
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
	f.StringVar(&opts.Fraction, "fraction", "", "a share of this fraction of whichever GPU model it lands on: 1/K or a decimal (replaces --memory and --cores)")
	f.StringSliceVar(&profiles, "profile", nil, "with --fraction: the GPU models of these mock profiles ("+fmt.Sprint(gpu.Profiles())+") instead of the cluster's")
	f.StringVar(&mig, "mig", "", "MIG devices (hardware-isolated) of this profile, e.g. 3g.40gb; alone, of any profile, or with --fraction the smallest that covers it")
	f.Lookup("mig").NoOptDefVal = migAnyProfile
	kf.add(cmd)
	addOutputFlag(cmd, &output)
	return cmd
}

// migAnyProfile is --mig given without a profile.
const migAnyProfile = "*"

// fractionModels are the GPU models of the mock profiles, or else of the
// cluster's ResourceSlices.
func fractionModels(ctx context.Context, profiles []string, kf *kubeFlags) ([]fraction.Model, error) {
	var slices []resourceapi.ResourceSlice
	if len(profiles) > 0 {
		for _, p := range profiles {
			objs, err := profileSlices(p, p)
			if err != nil {
				return nil, err
			}
			slices = append(slices, objs...)
		}
	} else {
		client, _, err := kf.client()
		if err != nil {
			return nil, fmt.Errorf("--fraction needs the cluster's GPU models (or --profile): %w", err)
		}
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("--fraction: list ResourceSlices: %w", err)
		}
		slices = list.Items
	}
	models := fraction.Models(slices)
	if len(models) == 0 {
		return nil, fmt.Errorf("--fraction: %w", fraction.ErrNoModels)
	}
	return models, nil
}
