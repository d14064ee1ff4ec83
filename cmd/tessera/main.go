// Command tessera is Tessera's command line for users and admins. Each subcommand
// lives in its own file and only parses flags and wires packages together; the
// logic is in pkg/.
//
//	tessera slices --profile hgx-h100 [--node NAME] [-o yaml|json]
//	tessera deviceclasses [-o yaml|json]
//	tessera claim-template --name NAME [--gpus N] [--memory Q] [--cores PCT] [--nvlink prefer|require]
//	tessera status [--node NAME] [-o table|json|yaml]
package main

import (
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		// cobra has printed the error.
		os.Exit(1)
	}
}

// newRootCommand builds the command tree. New subcommands (status,
// claim-template) add themselves here.
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:          "tessera",
		Short:        "Inspect what the Tessera GPU DRA driver publishes and installs",
		SilenceUsage: true,
	}
	root.AddCommand(
		newSlicesCommand(),
		newDeviceClassesCommand(),
		newClaimTemplateCommand(),
		newStatusCommand(),
	)
	return root
}
