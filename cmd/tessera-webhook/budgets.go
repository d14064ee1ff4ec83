package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/pflag"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-dev/tessera/pkg/budget"
	"github.com/tessera-dev/tessera/pkg/metricsserver"
	"github.com/tessera-dev/tessera/pkg/webhook"
)

// budgetQPS bounds the budget client's requests per second.
const budgetQPS = 200

// budgetFlags are the flags of namespace GPU budgets (pkg/budget).
type budgetFlags struct {
	enabled        bool
	ttl            time.Duration
	confirmWindow  time.Duration
	resync         time.Duration
	webhookTimeout time.Duration
	metricsAddress string
	// namespaceSelector is the budget webhook's namespaceSelector (a JSON
	// LabelSelector), for the budgets' Enforced condition.
	namespaceSelector string
}

func (b *budgetFlags) add(flags *pflag.FlagSet) {
	flags.BoolVar(&b.enabled, "budgets", false,
		"serve "+budget.Path+": charge every ResourceClaim at CREATE against the GPUBudgets of its namespace, and reconcile their status")
	flags.DurationVar(&b.ttl, "budget-pending-ttl", budget.DefaultTTL,
		"how long an admitted claim's charge stays pending at least (pkg/budget.Reconciler); at least "+budget.MinTTL.String()+
			" (the API server's 60s request timeout and a margin) and above --budget-webhook-timeout and the watch lag")
	flags.DurationVar(&b.confirmWindow, "budget-confirm-window", budget.DefaultConfirmWindow,
		"how long an admitted claim's charge counts before a ResourceClaim of its name and uid is seen; a charge no claim confirms in time "+
			"(a review no creation followed, or a forged one) counts no more, and tessera_gpu_budget_unconfirmed_charges_total counts it")
	flags.DurationVar(&b.resync, "budget-resync", time.Minute, "how often every GPUBudget is recomputed from the claims without a change")
	flags.DurationVar(&b.webhookTimeout, "budget-webhook-timeout", 5*time.Second,
		"the budget webhook's timeoutSeconds in its ValidatingWebhookConfiguration (the chart passes it): --budget-pending-ttl must exceed it")
	flags.StringVar(&b.namespaceSelector, "budget-namespace-selector", "",
		"the namespaceSelector of the budget webhook's entry in the ValidatingWebhookConfiguration, as JSON (the chart passes it): "+
			"a GPUBudget in a namespace it does not select gets the condition Enforced False, reason NotEnforced (get on namespaces); empty: no such condition")
	flags.StringVar(&b.metricsAddress, "budget-metrics-bind-address", "",
		"serve the budgets' Prometheus metrics (tessera_gpu_budget_used, _hard, _refusals_total, _errors_total) over HTTPS on this address at /metrics, "+
			"with --tls-cert-file's certificate, to bearer tokens whose user may get the non-resource URL /metrics "+
			"(the API server is asked: create on tokenreviews and subjectaccessreviews); empty: not served")
}

func (b *budgetFlags) validate() error {
	if !b.enabled {
		return nil
	}
	if b.ttl < budget.MinTTL {
		return fmt.Errorf("--budget-pending-ttl %v must be at least %v: a charge must outlive the API server's request timeout (60s by default), "+
			"so that a claim not found once it expires was never created", b.ttl, budget.MinTTL)
	}
	if b.ttl <= b.webhookTimeout {
		return fmt.Errorf("--budget-pending-ttl %v must be longer than --budget-webhook-timeout %v: a charge must outlive the admission that made it", b.ttl, b.webhookTimeout)
	}
	if b.confirmWindow < time.Second || b.confirmWindow >= b.ttl {
		return fmt.Errorf("--budget-confirm-window %v must be at least 1s and below --budget-pending-ttl %v", b.confirmWindow, b.ttl)
	}
	if b.resync <= 0 {
		return errors.New("--budget-resync must be positive")
	}
	if _, err := b.selector(); err != nil {
		return err
	}
	return nil
}

// selector parses --budget-namespace-selector; nil when unset.
func (b *budgetFlags) selector() (labels.Selector, error) {
	if b.namespaceSelector == "" {
		return nil, nil
	}
	var ls metav1.LabelSelector
	if err := json.Unmarshal([]byte(b.namespaceSelector), &ls); err != nil {
		return nil, fmt.Errorf("--budget-namespace-selector %q: not a JSON LabelSelector: %w", b.namespaceSelector, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		return nil, fmt.Errorf("--budget-namespace-selector %q: %w", b.namespaceSelector, err)
	}
	return sel, nil
}

// enforced tells whether the budget webhook's namespaceSelector, sel,
// selects namespace (read live: a label is a cluster admin's write, seen
// on the next reconcile).
func enforced(kube kubernetes.Interface, sel labels.Selector) func(ctx context.Context, namespace string) (bool, string, error) {
	return func(ctx context.Context, namespace string) (bool, string, error) {
		ns, err := kube.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		if sel.Matches(labels.Set(ns.Labels)) {
			return true, "", nil
		}
		return false, fmt.Sprintf("namespace %s is not selected by the budget webhook's namespaceSelector (%s): its claims are not charged; "+
			"a cluster admin labels it (budgets.namespaceSelector in the chart, by default gpu.tessera.dev/budgets=enforced) to enforce this budget", namespace, sel), nil
	}
}

// start builds the charger and the reconciler; the tasks run the
// reconciler and the metrics server.
// The metrics server serves the webhook's own certificate (certFile,
// keyFile).
func (b *budgetFlags) start(ctx context.Context, config *rest.Config, classes *webhook.DeviceClasses, certFile, keyFile string) (webhook.AdmitFunc, []task, error) {
	// Every admitted claim costs a status write (and a GET per conflict):
	// client-go's default limit (5 QPS, burst 10) would make a burst of
	// claims wait past the webhook's timeout.
	config = rest.CopyConfig(config)
	config.QPS, config.Burst = budgetQPS, 2*budgetQPS
	dyn, err := dynamic.NewForConfig(config)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the API server: %w", err)
	}
	// The reconciler's live claim reads (pending entries that expired)
	// share that limit.
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the API server: %w", err)
	}
	inventory := budget.NewInventory(classes.Client())
	inventory.Start(ctx)
	pricer := budget.NewPricer(inventory.Devices, classes.Get)
	store := budget.NewDynamicStore(dyn, 0)
	metrics := budget.NewMetrics()
	controller := budget.NewController(kube, store, pricer, metrics, b.resync)
	controller.Reconciler.Device = inventory.Device
	if sel, _ := b.selector(); sel != nil {
		controller.Reconciler.Enforced = enforced(kube, sel)
	}
	charger := &budget.Charger{Store: store, Pricer: pricer, TTL: b.ttl, ConfirmWindow: b.confirmWindow, Metrics: metrics, Ready: controller.Synced,
		Lookup: controller.Reconciler.Lookup}
	if err := charger.WatchDeletions(store.Informer()); err != nil {
		return nil, nil, err
	}
	tasks := []task{{controller.Run, "the GPU budget reconciler"}}
	if b.metricsAddress != "" {
		// As the kubelet plugin's metrics (pkg/metricsserver): HTTPS,
		// /metrics behind TokenReview and SubjectAccessReview, through a
		// client of their own limited to metricsserver.DelegatedQPS.
		auth, err := metricsserver.NewDelegatedForConfig(config)
		if err != nil {
			return nil, nil, err
		}
		srv := &metricsserver.Server{
			Address:     b.metricsAddress,
			Certificate: &metricsserver.Certificate{CertFile: certFile, KeyFile: keyFile},
			Auth:        auth,
			Metrics:     metrics.Handler(),
			Health:      &metricsserver.Health{},
		}
		if _, err := srv.Handler(); err != nil {
			return nil, nil, err
		}
		tasks = append(tasks, task{srv.Run, "the GPU budget metrics server"})
	}
	return charger.Admit, tasks, nil
}

// notCharging is budget.Path's admission without --budgets: a replica that
// does not charge budgets (one of a rollout that turns them on or off)
// answers a ResourceClaim CREATE with a retry instead of admitting it
// uncharged; the API server's next try may reach a replica that charges.
// Only claims of the namespaces the budget webhook selects are sent here.
// Anything else is allowed.
func notCharging(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create || req.Resource.Resource != "resourceclaims" {
		return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	}
	return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: false, Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusTooManyRequests, Reason: metav1.StatusReasonTooManyRequests,
		Message: "GPU budgets: this webhook replica does not charge GPU budgets (it runs without --budgets, as during a rollout that turns them on or off), retry in a few seconds"}}
}
