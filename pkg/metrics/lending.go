package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tessera-dev/tessera/pkg/model"
)

// LentGPU is one GPU's lending state at a scrape.
type LentGPU struct {
	UUID  string
	Minor int
	// Phase is the lending phase (package lending): Lent, Reclaiming, ...
	Phase string
	// LendableBytes is the memory the GPU lends (Lent, Reclaiming).
	LendableBytes int64
	// Borrowers counts the claims prepared on the GPU's lending device.
	Borrowers int
}

// LendingSource supplies the GPUs' lending states; the plugin's Lender is one.
type LendingSource interface {
	LendingSnapshot() []LentGPU
}

// lendingMetrics are the lending series that are recorded as they happen.
type lendingMetrics struct {
	loans, outstayed prometheus.Counter
	reclaims         *prometheus.CounterVec
	reclaimSeconds   prometheus.Histogram
}

// AddLending registers the lending series. Call it once.
//
//	tessera_gpu_lending_phase{gpu,uuid,phase}   1 for each GPU's lending phase
//	tessera_gpu_lendable_bytes{gpu,uuid}        memory a lent GPU lends
//	tessera_gpu_borrowers{gpu,uuid}             borrower claims prepared on the GPU
//	tessera_lending_loans_total                 times a GPU was lent
//	tessera_lending_reclaims_total{reason}      times a lent GPU was taken back with borrowers on it
//	tessera_lending_reclaim_seconds             from taking a GPU back to its last borrower gone
//	tessera_lending_borrowers_outstayed_total   borrowers still holding a GPU long after its reclaim began
func (m *Metrics) AddLending(src LendingSource) {
	c := prometheus.Labels{"node": m.node}
	m.lending = &lendingMetrics{
		loans: prometheus.NewCounter(prometheus.CounterOpts{Name: "tessera_lending_loans_total",
			Help: "Times an idle GPU was lent to borrowers.", ConstLabels: c}),
		outstayed: prometheus.NewCounter(prometheus.CounterOpts{Name: "tessera_lending_borrowers_outstayed_total",
			Help: "Borrower claims still holding a GPU after the longest reclaim grace (plus eviction time) since its reclaim began.", ConstLabels: c}),
		reclaims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tessera_lending_reclaims_total",
			Help: "Times a lent GPU with borrowers was taken back, by reason (OwnerBusy, OwnerReleased, GPUUnobservable, NotLent).", ConstLabels: c}, []string{"reason"}),
		reclaimSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tessera_lending_reclaim_seconds",
			Help:    "Time from taking a lent GPU back to its last borrower unprepared (the borrowers' grace included).",
			Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600}, ConstLabels: c}),
	}
	m.Registry.MustRegister(m.lending.loans, m.lending.outstayed, m.lending.reclaims, m.lending.reclaimSeconds,
		&lendingCollector{src: src,
			phase:     prometheus.NewDesc("tessera_gpu_lending_phase", "1 for the GPU's lending phase (Lent: borrowers may be placed on gpu-N-lent).", []string{"gpu", "uuid", "phase"}, c),
			lendable:  prometheus.NewDesc("tessera_gpu_lendable_bytes", "Memory a lent GPU lends to borrowers through gpu-N-lent.", []string{"gpu", "uuid"}, c),
			borrowers: prometheus.NewDesc("tessera_gpu_borrowers", "Borrower claims prepared on the GPU's lending device.", []string{"gpu", "uuid"}, c),
		})
}

// LendingOpened counts a loan. Safe on a nil *Metrics.
func (m *Metrics) LendingOpened() {
	if m != nil && m.lending != nil {
		m.lending.loans.Inc()
	}
}

// ReclaimStarted counts a reclaim. Safe on a nil *Metrics.
func (m *Metrics) ReclaimStarted(reason string) {
	if m != nil && m.lending != nil {
		m.lending.reclaims.WithLabelValues(reason).Inc()
	}
}

// ReclaimDone records how long a reclaim took. Safe on a nil *Metrics.
func (m *Metrics) ReclaimDone(d time.Duration) {
	if m != nil && m.lending != nil {
		m.lending.reclaimSeconds.Observe(d.Seconds())
	}
}

// BorrowerOutstayed counts a borrower reported for outstaying its grace.
// Safe on a nil *Metrics.
func (m *Metrics) BorrowerOutstayed() {
	if m != nil && m.lending != nil {
		m.lending.outstayed.Inc()
	}
}

type lendingCollector struct {
	src                        LendingSource
	phase, lendable, borrowers *prometheus.Desc
}

func (c *lendingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.phase
	ch <- c.lendable
	ch <- c.borrowers
}

func (c *lendingCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.src.LendingSnapshot() {
		name := model.WholeDeviceName(g.Minor)
		ch <- prometheus.MustNewConstMetric(c.phase, prometheus.GaugeValue, 1, name, g.UUID, g.Phase)
		ch <- prometheus.MustNewConstMetric(c.lendable, prometheus.GaugeValue, float64(g.LendableBytes), name, g.UUID)
		ch <- prometheus.MustNewConstMetric(c.borrowers, prometheus.GaugeValue, float64(g.Borrowers), name, g.UUID)
	}
}
