package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/budget"
	"github.com/tessera-dev/tessera/pkg/webhook"
)

// budgetQPS bounds the budget client's requests per second.
const budgetQPS = 200

// budgetFlags are the flags of namespace GPU budgets (pkg/budget).
type budgetFlags struct {
	enabled        bool
	ttl            time.Duration
	resync         time.Duration
	webhookTimeout time.Duration
	metricsAddress string
}

func (b *budgetFlags) add(flags *pflag.FlagSet) {
	flags.BoolVar(&b.enabled, "budgets", false,
		"serve "+budget.Path+": charge every ResourceClaim at CREATE against the GPUBudgets of its namespace, and reconcile their status")
	flags.DurationVar(&b.ttl, "budget-pending-ttl", budget.DefaultTTL,
		"how long an admitted claim's charge stays pending while the informer has not seen the claim; above --budget-webhook-timeout and the watch lag")
	flags.DurationVar(&b.resync, "budget-resync", time.Minute, "how often every GPUBudget is recomputed from the claims without a change")
	flags.DurationVar(&b.webhookTimeout, "budget-webhook-timeout", 5*time.Second,
		"the budget webhook's timeoutSeconds in its ValidatingWebhookConfiguration (the chart passes it): --budget-pending-ttl must exceed it")
	flags.StringVar(&b.metricsAddress, "budget-metrics-bind-address", "",
		"serve the budgets' Prometheus metrics (tessera_gpu_budget_used, _hard, _refusals_total) over HTTP on this address at /metrics; empty: not served")
}

func (b *budgetFlags) validate() error {
	if !b.enabled {
		return nil
	}
	if b.ttl <= b.webhookTimeout {
		return fmt.Errorf("--budget-pending-ttl %v must be longer than --budget-webhook-timeout %v: a charge must outlive the admission that made it", b.ttl, b.webhookTimeout)
	}
	if b.resync <= 0 {
		return errors.New("--budget-resync must be positive")
	}
	return nil
}

// start builds the charger and the reconciler; the tasks run the
// reconciler and the metrics server.
func (b *budgetFlags) start(ctx context.Context, config *rest.Config, classes *webhook.DeviceClasses) (webhook.AdmitFunc, []task, error) {
	// Every admitted claim costs a status write (and a GET per conflict):
	// client-go's default limit (5 QPS, burst 10) would make a burst of
	// claims wait past the webhook's timeout.
	config = rest.CopyConfig(config)
	config.QPS, config.Burst = budgetQPS, 2*budgetQPS
	dyn, err := dynamic.NewForConfig(config)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the API server: %w", err)
	}
	inventory := budget.NewInventory(classes.Client())
	inventory.Start(ctx)
	pricer := budget.NewPricer(inventory.Devices, classes.Get)
	store := budget.NewDynamicStore(dyn, 0)
	metrics := budget.NewMetrics()
	controller := budget.NewController(classes.Client(), store, pricer, metrics, b.resync)
	charger := &budget.Charger{Store: store, Pricer: pricer, TTL: b.ttl, Metrics: metrics}
	tasks := []task{{controller.Run, "the GPU budget reconciler"}}
	if b.metricsAddress != "" {
		tasks = append(tasks, task{func(ctx context.Context) error { return serveMetrics(ctx, b.metricsAddress, metrics) }, "the GPU budget metrics server"})
	}
	return charger.Admit, tasks, nil
}

func serveMetrics(ctx context.Context, address string, metrics *budget.Metrics) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler())
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	var lc net.ListenConfig
	listener, err := lc.Listen(ctx, "tcp", address)
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Serving GPU budget metrics", "address", listener.Addr().String())
	go func() {
		<-ctx.Done()
		_ = server.Close()
	}()
	if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
