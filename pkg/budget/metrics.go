package budget

import (
	"net/http"

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
	m.registry.MustRegister(m.used, m.hard, m.refusals)
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
	m.refusals.WithLabelValues(r.Namespace, r.Budget, string(r.Resource)).Inc()
}

// observe records a budget's used and hard.
func (m *Metrics) observe(b *configapi.GPUBudget) {
	if m == nil {
		return
	}
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
	for _, r := range Resources {
		m.used.DeleteLabelValues(namespace, name, string(r))
		m.hard.DeleteLabelValues(namespace, name, string(r))
	}
}
