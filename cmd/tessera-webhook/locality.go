package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/locality"
)

// newLocalityCommand is "tessera-webhook locality-controller": the
// controller that judges shares against the locality rules (pkg/locality).
// It lives in the webhook's binary because both are cluster-wide
// components of the same image.
func newLocalityCommand() *cobra.Command {
	var kubeconfig string
	var leaderElect, fences bool
	var fenceTTL time.Duration
	election := locality.Election{Name: "tessera-locality"}
	cmd := &cobra.Command{
		Use:   "locality-controller",
		Short: "Accept or reject each share placed on a GPU against GpuConfig locality (affinity, antiAffinity, exclusion)",
		Long: "Watches ResourceClaims and writes the verdict the scheduler waits for in PreBind into the status.devices " +
			"entry of each share of a device published with --locality-verdicts (the kubelet plugin's flag): condition " +
			"gpu.tessera.dev/LocalityAccepted or gpu.tessera.dev/LocalityRejected. One replica judges at a time " +
			"(a coordination.k8s.io Lease); it needs get, list, watch on resourceclaims, patch on resourceclaims/status, " +
			"arbitrary-node:patch on resourceclaims/driver named gpu.tessera.dev, get, create, update on leases, " +
			"and (--fences) create, delete, list on devicetaintrules.",
		// Errors and usage are silenced by the root command.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext("tessera-locality")
			defer stop()
			client, err := connect(kubeconfig)
			if err != nil {
				return err
			}
			c := &locality.Controller{Writer: locality.APIWriter{Client: client}, FenceTTL: fenceTTL}
			if fences {
				c.Fences = locality.APIFences{Client: client}
			}
			if leaderElect && (election.Namespace == "" || election.Identity == "") {
				return errors.New("--leader-elect needs --lease-namespace and --identity (or POD_NAMESPACE and POD_NAME)")
			}
			if !leaderElect {
				err = c.Run(ctx, client)
			} else {
				err = locality.RunLeader(ctx, client, election, c)
			}
			if ctx.Err() != nil {
				// Stopped (SIGTERM: uninstalled, scaled down, rolled):
				// lift the fences, or they would outlive the controller.
				lift, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if lerr := c.LiftFences(lift); lerr != nil {
					klog.FromContext(ctx).Error(lerr, "Lifting the fences failed; delete the DeviceTaintRules labelled app.kubernetes.io/managed-by=tessera-locality")
				}
			}
			return err
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file for the API server; empty: the pod's service account (in-cluster)")
	flags.BoolVar(&leaderElect, "leader-elect", true, "judge only while holding the Lease --lease-namespace/--lease-name; false: judge at once (only one replica may run)")
	flags.BoolVar(&fences, "fences", true, "steer a rejected share away from the GPU it was rejected on: a DeviceTaintRule ("+locality.FenceTaintKey+
		":NoSchedule) on that GPU's shared device until the share is accepted elsewhere, deleted, or --fence-ttl passes (needs create, delete, list on devicetaintrules)")
	flags.DurationVar(&fenceTTL, "fence-ttl", locality.DefaultFenceTTL, "how long a fence stands after the last rejection on its GPU")
	flags.StringVar(&election.Namespace, "lease-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the Lease")
	flags.StringVar(&election.Name, "lease-name", election.Name, "name of the Lease")
	flags.StringVar(&election.Identity, "identity", os.Getenv("POD_NAME"), "this replica's name in the Lease")
	flags.DurationVar(&election.LeaseDuration, "lease-duration", 15*time.Second, "how long another replica waits after the leader's last renewal before it takes over")
	flags.DurationVar(&election.RenewDeadline, "renew-deadline", 10*time.Second, "the leader stops judging when it could not renew for this long; must be below --lease-duration")
	flags.DurationVar(&election.RetryPeriod, "retry-period", 2*time.Second, "how often replicas try to take or renew the Lease")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	flags.AddGoFlagSet(klogFlags)
	return cmd
}

// connect returns a client: with kubeconfig when set, else with the pod's
// service account.
func connect(kubeconfig string) (kubernetes.Interface, error) {
	config, err := restConfig(kubeconfig, "tessera-locality-controller", "")
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(config)
}
