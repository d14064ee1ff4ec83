// Command tessera-webhook is Tessera's validating admission webhook for the
// GpuConfig in ResourceClaims and ResourceClaimTemplates (pkg/webhook). It
// parses flags and runs webhook.Server until SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/webhook"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tessera-webhook:", err)
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	server := &webhook.Server{}
	cmd := &cobra.Command{
		Use:   "tessera-webhook",
		Short: "Validating admission webhook for gpu.tessera.dev GpuConfig in ResourceClaims and ResourceClaimTemplates",
		Long: "Serves AdmissionReview v1 on " + webhook.ValidatePath + " over TLS, and " +
			webhook.HealthzPath + " and " + webhook.ReadyzPath + " on the same port.\n" +
			"On SIGTERM, " + webhook.ReadyzPath + " fails at once, requests are still served for --drain-delay, " +
			"then the server stops after the requests in flight (at most --shutdown-timeout).",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			ctx = klog.NewContext(ctx, klog.Background().WithName("tessera-webhook"))
			return server.Run(ctx)
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&server.Addr, "bind-address", ":9443", "address to serve on (host:port)")
	flags.StringVar(&server.CertFile, "tls-cert-file", "/etc/tessera-webhook/tls/tls.crt", "serving certificate (PEM), reloaded when it changes")
	flags.StringVar(&server.KeyFile, "tls-key-file", "/etc/tessera-webhook/tls/tls.key", "serving key (PEM), reloaded when it changes")
	flags.DurationVar(&server.DrainDelay, "drain-delay", 5*time.Second, "after SIGTERM, keep serving this long with "+webhook.ReadyzPath+" failing")
	flags.DurationVar(&server.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "after the drain, wait at most this long for requests in flight")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	flags.AddGoFlagSet(klogFlags)
	return cmd
}
