// Command tessera-webhook is Tessera's admission webhook (pkg/webhook): it
// validates the GpuConfig in ResourceClaims, ResourceClaimTemplates and
// DeviceClasses, expands claims annotated with a GPU fraction, and, when
// turned on, translates pods written for other GPU-sharing systems
// (pkg/webhook/legacypods) and charges claims against namespace GPU budgets
// (pkg/budget). It parses flags, connects to the API server (in-cluster, or
// --kubeconfig) and runs webhook.Server until SIGTERM or SIGINT. Its
// subcommand locality-controller runs the locality controller (pkg/locality).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/budget"
	"github.com/tessera-dev/tessera/pkg/legacy"
	"github.com/tessera-dev/tessera/pkg/webhook"
	"github.com/tessera-dev/tessera/pkg/webhook/legacypods"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tessera-webhook:", err)
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	server := &webhook.Server{}
	var kubeconfig string
	var classTimeout time.Duration
	var memoryLimit string
	var translateLegacy bool
	var gpushareUnit string
	var templateGrace time.Duration
	var budgets budgetFlags
	cmd := &cobra.Command{
		Use:   "tessera-webhook",
		Short: "Validating admission webhook for gpu.tessera.dev GpuConfig in ResourceClaims and ResourceClaimTemplates",
		Long: "Serves AdmissionReview v1 on " + webhook.ValidatePath + " over TLS, and " +
			webhook.HealthzPath + " and " + webhook.ReadyzPath + " on the same port.\n" +
			"On SIGTERM, " + webhook.ReadyzPath + " fails at once, requests are still served for --drain-delay, " +
			"then the server stops after the requests in flight (at most --shutdown-timeout).\n" +
			"It reads the DeviceClasses that claims name (get, list, watch on deviceclasses.resource.k8s.io), " +
			"to refuse a claim whose sharing.isolation its class's sharing.allowedIsolations does not allow; " +
			"a class that cannot be read lets the claim through with a warning (prepare checks it again). " +
			"On " + webhook.MutatePath + " it expands ResourceClaims annotated gpu.tessera.dev/fraction into a share of each GPU model " +
			"the cluster's ResourceSlices publish (list, watch on resourceslices.resource.k8s.io).\n" +
			"With --translate-legacy-pods, on " + legacypods.Path + " it translates pods written for HAMi, gpushare, Koordinator " +
			"and NVIDIA's device plugin at CREATE (pkg/legacy, docs/migration.md), writing nothing (get on resourceclaimtemplates.resource.k8s.io, " +
			"get on namespaces); a controller beside it creates the ResourceClaimTemplates that translated pods in opted-in namespaces name, " +
			"from the stored pods, and deletes them once no pod uses them (list, watch on pods and namespaces; list, watch, create, delete on resourceclaimtemplates; " +
			"create, patch on events: why a pod's template cannot be created).\n" +
			"On " + budget.Path + " it allows every review unless --budgets is set; with --budgets it charges every ResourceClaim at CREATE against the GPUBudgets of its namespace " +
			"(pkg/budget) and keeps their status up to date (get, list, watch on gpubudgets.gpu.tessera.dev, update on gpubudgets/status; " +
			"get, list, watch on resourceclaims).",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext("tessera-webhook")
			defer stop()
			if err := setMemoryLimit(ctx, memoryLimit); err != nil {
				return err
			}
			if err := budgets.validate(); err != nil {
				return err
			}
			if server.ClientCAFile == "" && !cmd.Flags().Changed("client-names") {
				// --client-names' default applies only with a client CA.
				server.ClientNames = nil
			}
			config, err := webhookConfig(kubeconfig)
			if err != nil {
				return err
			}
			classes, err := deviceClasses(config)
			if err != nil {
				return err
			}
			classes.Timeout = classTimeout
			classes.Start(ctx)
			server.Classes = classes
			models := webhook.NewGPUModels(classes.Client())
			models.Timeout = classTimeout
			models.Start(ctx)
			server.Models = models
			server.Admitters = map[string]webhook.AdmitFunc{}
			// budget.Path is always served, behind review slots of its own:
			// without --budgets it answers claims with a retry
			// (notCharging), so that replicas of a version or
			// configuration without budgets that a webhook configuration
			// already sends claims to (a helm upgrade that turns budgets
			// on) neither admit them uncharged nor answer 404.
			var background []task
			var charge webhook.AdmitFunc
			if budgets.enabled {
				admit, tasks, err := budgets.start(ctx, config, classes, server.CertFile, server.KeyFile)
				if err != nil {
					return err
				}
				charge = admit
				background = append(background, tasks...)
			}
			server.Isolated = isolated(charge)
			if translateLegacy {
				unit := legacy.MemoryUnit(gpushareUnit)
				if unit != legacy.GiB && unit != legacy.MiB {
					return fmt.Errorf("--gpushare-memory-unit %q: GiB or MiB", gpushareUnit)
				}
				client := classes.Client()
				controller, err := legacypods.NewController(client, legacypods.Options{Grace: templateGrace, Models: models, GPUShareUnit: unit})
				if err != nil {
					return err
				}
				translator := &legacypods.Translator{Client: client, Namespaces: controller, Models: models, GPUShareUnit: unit}
				server.Admitters[legacypods.Path] = translator.Admit
				background = append(background, task{controller.Run, "the controller of translated ResourceClaimTemplates"})
			}
			return serveWith(ctx, server.Run, background...)
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&server.Addr, "bind-address", ":9443", "address to serve on (host:port)")
	flags.StringVar(&server.CertFile, "tls-cert-file", "/etc/tessera-webhook/tls/tls.crt", "serving certificate (PEM), reloaded when it changes")
	flags.StringVar(&server.KeyFile, "tls-key-file", "/etc/tessera-webhook/tls/tls.key", "serving key (PEM), reloaded when it changes")
	flags.DurationVar(&server.DrainDelay, "drain-delay", 5*time.Second, "after SIGTERM, keep serving this long with "+webhook.ReadyzPath+" failing")
	flags.DurationVar(&server.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "after the drain, wait at most this long for requests in flight")
	flags.IntVar(&server.MaxInFlight, "max-in-flight", webhook.DefaultMaxInFlight, "reviews served at once; more wait up to --max-wait, then get 429")
	flags.DurationVar(&server.MaxWait, "max-wait", webhook.DefaultMaxWait, "how long a review waits for a slot when --max-in-flight are served")
	flags.DurationVar(&server.BodyTimeout, "body-timeout", webhook.DefaultBodyTimeout,
		"bound on reading a request's body, which happens before the review takes one of --max-in-flight slots; a body not read by then gets 400")
	flags.Int64Var(&server.BodyBudget, "body-budget", webhook.DefaultBodyBudget,
		"bytes that request bodies beyond their first 64 KiB may hold at once, from reading to the end of their review; a body that gets none within --body-timeout gets 429")
	flags.StringVar(&memoryLimit, "memory-limit", "",
		"the container's memory limit (bytes or a quantity such as 256Mi; the chart passes limits.memory): the Go runtime's soft memory limit is set to 90% of it, unless GOMEMLIMIT is set; empty or 0: none")
	flags.StringVar(&server.ClientCAFile, "client-ca-file", "",
		"CA certificates (PEM) that sign the API server's client certificate (its admission configuration's kubeconfig for this webhook), reloaded when the file changes; "+
			"a review whose certificate they sign for one of --client-names may see figures of its namespace's budget; empty: no client certificates are asked for")
	flags.StringSliceVar(&server.ClientNames, "client-names", []string{"kube-apiserver"},
		"client certificate names (subject common name or DNS name) that --client-ca-file's certificates must carry; empty: any name that CA signs")
	flags.BoolVar(&server.RequireClientCert, "require-client-cert", false,
		"refuse (403) reviews without a verified client certificate (needs --client-ca-file); "+webhook.HealthzPath+" and "+webhook.ReadyzPath+" stay open")
	flags.BoolVar(&server.ReusePort, "reuse-port", false, "listen with SO_REUSEPORT, so that replicas in the host's network namespace of one node share --bind-address")
	flags.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file for the API server; empty: the pod's service account (in-cluster)")
	flags.DurationVar(&classTimeout, "device-class-timeout", webhook.DefaultClassTimeout,
		"bound on reading a DeviceClass from the API server when the cache does not hold it; keep it below the webhook's timeoutSeconds")
	flags.BoolVar(&translateLegacy, "translate-legacy-pods", false,
		"serve "+legacypods.Path+": translate pods' legacy GPU resources (HAMi, gpushare, Koordinator) into references to ResourceClaimTemplates at CREATE; create those templates from the stored pods, and delete them once unused")
	flags.StringVar(&gpushareUnit, "gpushare-memory-unit", string(legacy.GiB),
		"the unit of aliyun.com/gpu-mem in this cluster (gpushare's device plugin --memory-unit): GiB or MiB")
	flags.DurationVar(&templateGrace, "legacy-template-grace", legacypods.DefaultGrace,
		"a translated ResourceClaimTemplate that no pod uses is deleted this long after it was made (at least "+legacypods.MinGrace.String()+")")
	budgets.add(flags)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	flags.AddGoFlagSet(klogFlags)
	cmd.AddCommand(newLocalityCommand())
	return cmd
}

// isolated are the Server's Isolated paths: budget.Path with charge, or
// notCharging when charge is nil (no --budgets).
func isolated(charge webhook.AdmitFunc) map[string]webhook.AdmitFunc {
	if charge == nil {
		charge = notCharging
	}
	return map[string]webhook.AdmitFunc{budget.Path: charge}
}

// task is a background task and what it is, for messages.
type task struct {
	run  func(context.Context) error
	what string
}

// serveWith runs serve and, beside it, the background tasks. When one
// fails before ctx ends, serve is stopped (its context cancelled: it drains
// as on SIGTERM) and the failure is returned, so the process exits non-zero
// and the pod restarts, visibly, rather than serving on without it.
func serveWith(ctx context.Context, serve func(context.Context) error, background ...task) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, len(background))
	for _, t := range background {
		go func() {
			if err := t.run(ctx); err != nil && ctx.Err() == nil {
				klog.FromContext(ctx).Error(err, "Stopping: a background task failed", "task", t.what)
				failed <- fmt.Errorf("%s stopped: %w", t.what, err)
				cancel()
			}
		}()
	}
	err := serve(ctx)
	select {
	case bgErr := <-failed:
		return errors.Join(bgErr, err)
	default:
		return err
	}
}

// setMemoryLimit sets the Go runtime's soft memory limit (what GOMEMLIMIT
// sets) to 90% of limit, a Kubernetes quantity: the garbage collector then
// works harder as the heap nears the container's limit instead of letting
// the kernel kill the process, keeping a tenth for what the runtime does not
// count against it (goroutine stacks in use by the OS, kernel buffers).
// GOMEMLIMIT in the environment wins.
func setMemoryLimit(ctx context.Context, limit string) error {
	if limit == "" || os.Getenv("GOMEMLIMIT") != "" {
		return nil
	}
	q, err := resource.ParseQuantity(limit)
	if err != nil {
		return fmt.Errorf("--memory-limit %q: %w", limit, err)
	}
	bytes, ok := q.AsInt64()
	if !ok || bytes < 0 {
		return fmt.Errorf("--memory-limit %q: not a byte count", limit)
	}
	if bytes == 0 {
		return nil
	}
	soft := bytes / 10 * 9
	debug.SetMemoryLimit(soft)
	klog.FromContext(ctx).Info("Set the Go runtime's memory limit", "containerLimit", bytes, "goMemLimit", soft)
	return nil
}

// signalContext is the context a command runs in: cancelled on SIGTERM or
// an interrupt, its logger named name.
func signalContext(name string) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	return klog.NewContext(ctx, klog.Background().WithName(name)), stop
}

// restConfig is how userAgent reaches the API server: kubeconfig when set,
// else the pod's service account. purpose, when set, says in an error what
// the connection is for (" to read DeviceClasses").
func restConfig(kubeconfig, userAgent, purpose string) (*rest.Config, error) {
	var config *rest.Config
	var err error
	if kubeconfig != "" {
		config, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		config, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("connect to the API server%s (--kubeconfig, or the pod's service account token): %w", purpose, err)
	}
	config.UserAgent = userAgent
	return config, nil
}

// webhookConfig is the webhook's restConfig.
func webhookConfig(kubeconfig string) (*rest.Config, error) {
	return restConfig(kubeconfig, "tessera-webhook", " to read DeviceClasses")
}

// deviceClasses reads DeviceClasses through config.
func deviceClasses(config *rest.Config) (*webhook.DeviceClasses, error) {
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("connect to the API server: %w", err)
	}
	return webhook.NewDeviceClasses(client), nil
}
