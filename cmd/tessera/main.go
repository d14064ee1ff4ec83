// Command tessera is Tessera's command line for users and admins. Each subcommand
// lives in its own file and only parses flags and wires packages together; the
// logic is in pkg/ and, for what only the CLI runs, internal/cli.
//
//	tessera slices --profile hgx-h100 [--node NAME] [-o yaml|json]
//	tessera deviceclasses [-o yaml|json]
//	tessera claim-template --name NAME [--gpus N] [--memory Q] [--cores PCT | --fraction 1/K] [--mig [PROFILE]] [--nvlink prefer|require]
//	tessera convert -f FILE [--gpushare-unit GiB|MiB] [--profile PROFILE]
//	tessera status [--node NAME] [-o table|json|yaml]
//	tessera why (POD | pod/NAME | claim/NAME) [-n NAMESPACE] [-o table|json|yaml]
//	tessera version [-o table|json|yaml]   (also tessera --version)
//	tessera doctor [NODE] [-o table|json|yaml]
//	tessera completion bash|zsh|fish|powershell
//
// Installed as kubectl-tessera it is the kubectl plugin "kubectl tessera".
package main

import (
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := newRootCommand()
	asKubectlPlugin(root, os.Args[0])
	if err := root.Execute(); err != nil {
		// cobra has printed the error.
		os.Exit(1)
	}
}

// newRootCommand builds the command tree. New subcommands (status,
// claim-template) add themselves here.
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "tessera",
		Short: "Inspect and troubleshoot the Tessera GPU DRA driver (gpu.tessera.dev)",
		Long: `tessera inspects what the Tessera GPU DRA driver publishes and installs, shows
who holds which GPU, and explains why a pod's GPU claim is not allocated.

The commands that read the cluster (status, why) take kubectl's --kubeconfig
and --context flags; the others print objects and need no cluster.`,
		Example: `  # Which GPUs are held, by whom, and are they healthy?
  tessera status

  # Why is my pod pending?
  tessera why my-pod -n my-namespace

  # A claim template for a quarter of a GPU
  tessera claim-template --name quarter --memory 19Gi --cores 25`,
		Version:      currentVersion().String(),
		SilenceUsage: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(
		newSlicesCommand(),
		newDeviceClassesCommand(),
		newClaimTemplateCommand(),
		newConvertCommand(),
		newStatusCommand(),
		newWhyCommand(),
		newVersionCommand(),
		newDoctorCommand(),
	)
	return root
}
