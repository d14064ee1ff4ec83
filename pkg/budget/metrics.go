package budget

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// Metrics are the budgets' Prometheus metrics: used and hard per budget and
// dimension, as the reconciler last saw them, and the claims refused. A nil
// *Metrics records nothing.
type Metrics struct {
	registry *prometheus.Registry
	used     *prometheus.GaugeVec
	hard     *prometheus.GaugeVec
	refusals *prometheus.CounterVec
	errors   *prometheus.CounterVec
	// unconfirmedCharges counts entries dropped unconfirmed.
	unconfirmedCharges *prometheus.CounterVec

	mu sync.Mutex
	// budgets with series, by namespace.
	budgets map[string]map[string]bool
}

func (m *Metrics) track(namespace, name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.budgets == nil {
		m.budgets = map[string]map[string]bool{}
	}
	if m.budgets[namespace] == nil {
		m.budgets[namespace] = map[string]bool{}
	}
	m.budgets[namespace][name] = true
}

// retain drops the series of the budgets of namespace not in names (deleted
// since they were recorded).
func (m *Metrics) retain(namespace string, names map[string]bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	var gone []string
	for name := range m.budgets[namespace] {
		if !names[name] {
			gone = append(gone, name)
		}
	}
	m.mu.Unlock()
	for _, name := range gone {
		m.forget(namespace, name)
	}
}

// NewMetrics returns metrics in a registry of their own (Handler serves it).
func NewMetrics() *Metrics {
	labels := []string{"namespace", "budget", "resource"}
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		used: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tessera_gpu_budget_used",
			Help: "What a GPUBudget's status.used says: memory in bytes, cores in percent of a GPU, whole GPUs."}, labels),
		hard: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tessera_gpu_budget_hard",
			Help: "A GPUBudget's spec.hard, for the dimensions it limits."}, labels),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tessera_gpu_budget_refusals_total",
			Help: "ResourceClaims refused at admission because a GPUBudget would be exceeded, by the dimension that refused them."}, labels),
	}
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tessera_gpu_budget_errors_total",
		Help: "Errors of the GPU budget reconciler, by reason (claim_read_forbidden: a live read of a ResourceClaim was refused, RBAC; claim_read: it failed otherwise; namespace_read: a read of a budget's Namespace failed)."},
		[]string{"reason"})
	m.unconfirmedCharges = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tessera_gpu_budget_unconfirmed_charges_total",
		Help: "Pending charges this replica dropped because no ResourceClaim of their name and uid was seen within the confirm window (a review no claim followed: a creation that failed after admission, or a forged review)."},
		[]string{"namespace", "budget"})
	m.registry.MustRegister(m.used, m.hard, m.refusals, m.errors, m.unconfirmedCharges)
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

func (m *Metrics) refused(r *Refusal) {
	if m == nil {
		return
	}
	m.track(r.Namespace, r.Budget)
	m.refusals.WithLabelValues(r.Namespace, r.Budget, string(r.Resource)).Inc()
}

// unconfirmed counts n pending charges of a budget dropped unconfirmed.
func (m *Metrics) unconfirmed(namespace, name string, n int) {
	if m == nil || n == 0 {
		return
	}
	m.track(namespace, name)
	m.unconfirmedCharges.WithLabelValues(namespace, name).Add(float64(n))
}

// failed counts an error of the reconciler.
func (m *Metrics) failed(reason string) {
	if m == nil {
		return
	}
	m.errors.WithLabelValues(reason).Inc()
}

// observe records a budget's used and hard.
func (m *Metrics) observe(b *configapi.GPUBudget) {
	if m == nil {
		return
	}
	m.track(b.Namespace, b.Name)
	used := amount(b.Status.Used)
	hard := limits(b.Spec.Hard)
	for _, r := range Resources {
		m.used.WithLabelValues(b.Namespace, b.Name, string(r)).Set(float64(used.Get(r)))
		if h, ok := hard.Get(r); ok {
			m.hard.WithLabelValues(b.Namespace, b.Name, string(r)).Set(float64(h))
		} else {
			m.hard.DeleteLabelValues(b.Namespace, b.Name, string(r))
		}
	}
}

// forget drops a deleted budget's series.
func (m *Metrics) forget(namespace, name string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	delete(m.budgets[namespace], name)
	if len(m.budgets[namespace]) == 0 {
		delete(m.budgets, namespace)
	}
	m.mu.Unlock()
	budget := prometheus.Labels{"namespace": namespace, "budget": name}
	m.used.DeletePartialMatch(budget)
	m.hard.DeletePartialMatch(budget)
	m.refusals.DeletePartialMatch(budget)
	m.unconfirmedCharges.DeletePartialMatch(budget)
}
