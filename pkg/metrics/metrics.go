// Package metrics exposes the kubelet plugin's state as Prometheus metrics,
// all named tessera_*, on a private registry (never the global one, so
// nothing a library registers leaks into /metrics).
//
// Gauges about GPUs and claims are computed at scrape time from a [Source]
// (the plugin's inventory, checkpoint and health), so they cannot drift from
// what the plugin believes. Prepare/unprepare latency and errors are
// recorded as they happen through [Metrics.ObservePrepare] and
// [Metrics.ObserveUnprepare]. Per-pod GPU memory comes from NVML's
// per-process accounting (see [Usage]).
//
// Every series carries node; GPU series carry gpu (gpu-<minor>) and uuid;
// claim series namespace, claim and uid.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/types"
)

// Snapshot is what the collector reports at one scrape.
type Snapshot struct {
	GPUs   []GPU
	Claims []Claim
}

// GPU is one published GPU.
type GPU struct {
	UUID        string
	Minor       int
	ProductName string
	MemoryBytes int64
	// Healthy is false while the GPU is tainted; Taint is the effect then.
	Healthy bool
	Taint   string
}

// Claim is one prepared claim.
type Claim struct {
	UID       types.UID
	Namespace string
	Name      string
	Devices   []Device
}

// Device is one prepared device of a claim.
type Device struct {
	Device string // gpu-3 or gpu-3-shared
	UUID   string
	Minor  int
	Shared bool
	// AdminAccess devices observe; they hold nothing.
	AdminAccess bool
	// MemoryBytes and Cores are what the scheduler allocated: the share's
	// consumedCapacity. For a whole GPU they are the GPU's.
	MemoryBytes int64
	Cores       int64
	// MemoryLimit (bytes) and CoresLimit (percent) are the share's limits
	// in the container; Isolation its backend. Zero/empty for whole GPUs.
	MemoryLimit int64
	CoresLimit  int64
	Isolation   string
}

// Source supplies snapshots; the plugin is one.
type Source interface {
	MetricsSnapshot() Snapshot
}

// Metrics is the plugin's collectors on their own registry.
type Metrics struct {
	Registry *prometheus.Registry
	node     string

	prepareSeconds   prometheus.Histogram
	unprepareSeconds prometheus.Histogram
	prepareErrors    prometheus.Counter
	unprepareErrors  prometheus.Counter
}

// New registers the prepare/unprepare and process collectors for node on a
// new registry; AddState adds the GPU, claim and pod gauges once their source
// exists (the plugin, which itself records into these metrics).
func New(node string) *Metrics {
	reg := prometheus.NewRegistry()
	constLabels := prometheus.Labels{"node": node}
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	m := &Metrics{
		Registry: reg,
		node:     node,
		prepareSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tessera_prepare_duration_seconds", Help: "Time to prepare one resource claim (successful or not).",
			Buckets: buckets, ConstLabels: constLabels,
		}),
		unprepareSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tessera_unprepare_duration_seconds", Help: "Time to unprepare one resource claim (successful or not).",
			Buckets: buckets, ConstLabels: constLabels,
		}),
		prepareErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tessera_prepare_errors_total", Help: "Resource claims whose prepare failed.", ConstLabels: constLabels,
		}),
		unprepareErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tessera_unprepare_errors_total", Help: "Resource claims whose unprepare failed.", ConstLabels: constLabels,
		}),
	}
	reg.MustRegister(m.prepareSeconds, m.unprepareSeconds, m.prepareErrors, m.unprepareErrors,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// AddState registers the gauges computed from src at each scrape; usage may
// be nil (no per-pod memory). Call it once.
func (m *Metrics) AddState(src Source, usage *Usage) {
	m.Registry.MustRegister(newStateCollector(m.node, src, usage))
}

// ObservePrepare records one claim's prepare. Safe on a nil *Metrics.
func (m *Metrics) ObservePrepare(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.prepareSeconds.Observe(d.Seconds())
	if err != nil {
		m.prepareErrors.Inc()
	}
}

// ObserveUnprepare records one claim's unprepare. Safe on a nil *Metrics.
func (m *Metrics) ObserveUnprepare(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.unprepareSeconds.Observe(d.Seconds())
	if err != nil {
		m.unprepareErrors.Inc()
	}
}

// Handler serves the registry in the Prometheus text (or OpenMetrics) format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// stateCollector computes the GPU, claim and pod gauges at each scrape.
type stateCollector struct {
	src   Source
	usage *Usage

	gpuInfo, gpuMemory, gpuCores, gpuAllocMemory, gpuAllocCores, gpuShares, gpuHealthy *prometheus.Desc
	claimMemory, claimCores, claimMemoryLimit, claimCoresLimit                         *prometheus.Desc
	podMemory                                                                          *prometheus.Desc
}

func newStateCollector(node string, src Source, usage *Usage) *stateCollector {
	c := prometheus.Labels{"node": node}
	gpu := []string{"gpu", "uuid"}
	claim := []string{"namespace", "claim", "uid", "device", "gpu", "uuid", "isolation"}
	return &stateCollector{
		src:   src,
		usage: usage,
		gpuInfo: prometheus.NewDesc("tessera_gpu_info", "A GPU Tessera publishes (value 1), with its product name.",
			append(gpu, "product"), c),
		gpuMemory:      prometheus.NewDesc("tessera_gpu_memory_bytes", "Total memory of the GPU.", gpu, c),
		gpuCores:       prometheus.NewDesc("tessera_gpu_cores", "Compute of the GPU in percent (always 100).", gpu, c),
		gpuAllocMemory: prometheus.NewDesc("tessera_gpu_allocated_memory_bytes", "Memory of the GPU held by prepared claims: the sum of its shares' allocated memory, or all of it when prepared whole.", gpu, c),
		gpuAllocCores:  prometheus.NewDesc("tessera_gpu_allocated_cores", "Guaranteed compute (percent) of the GPU held by prepared claims.", gpu, c),
		gpuShares:      prometheus.NewDesc("tessera_gpu_shares", "Prepared shares of the GPU.", gpu, c),
		gpuHealthy: prometheus.NewDesc("tessera_gpu_healthy", "1 when the GPU is healthy, 0 while it is tainted "+
			"gpu.tessera.dev/unhealthy (effect in the label).", append(gpu, "effect"), c),
		claimMemory:      prometheus.NewDesc("tessera_claim_memory_bytes", "Memory allocated to a prepared claim's device (consumedCapacity; the GPU's memory for a whole GPU).", claim, c),
		claimCores:       prometheus.NewDesc("tessera_claim_cores", "Guaranteed compute (percent) allocated to a prepared claim's device.", claim, c),
		claimMemoryLimit: prometheus.NewDesc("tessera_claim_memory_limit_bytes", "Memory limit of a prepared share in the container.", claim, c),
		claimCoresLimit:  prometheus.NewDesc("tessera_claim_cores_limit", "Compute limit (percent) of a prepared share in the container.", claim, c),
		podMemory: prometheus.NewDesc("tessera_pod_gpu_memory_used_bytes", "GPU memory used by the processes of a pod (NVML per-process accounting). "+
			"Processes outside any known pod are summed with empty namespace and pod.", []string{"namespace", "pod", "pod_uid", "gpu", "uuid"}, c),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.gpuInfo, c.gpuMemory, c.gpuCores, c.gpuAllocMemory, c.gpuAllocCores,
		c.gpuShares, c.gpuHealthy, c.claimMemory, c.claimCores, c.claimMemoryLimit, c.claimCoresLimit, c.podMemory} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.src.MetricsSnapshot()
	type alloc struct{ memory, cores, shares int64 }
	allocated := map[string]*alloc{}
	for _, g := range snap.GPUs {
		allocated[g.UUID] = &alloc{}
	}
	for _, cl := range snap.Claims {
		for _, d := range cl.Devices {
			gpuName := "gpu-" + strconv.Itoa(d.Minor)
			labels := []string{cl.Namespace, cl.Name, string(cl.UID), d.Device, gpuName, d.UUID, d.Isolation}
			gauge(ch, c.claimMemory, float64(d.MemoryBytes), labels...)
			gauge(ch, c.claimCores, float64(d.Cores), labels...)
			if d.Shared {
				gauge(ch, c.claimMemoryLimit, float64(d.MemoryLimit), labels...)
				gauge(ch, c.claimCoresLimit, float64(d.CoresLimit), labels...)
			}
			a := allocated[d.UUID]
			if a == nil || d.AdminAccess {
				continue
			}
			a.memory += d.MemoryBytes
			a.cores += d.Cores
			if d.Shared {
				a.shares++
			}
		}
	}
	for _, g := range snap.GPUs {
		labels := []string{"gpu-" + strconv.Itoa(g.Minor), g.UUID}
		a := allocated[g.UUID]
		gauge(ch, c.gpuInfo, 1, append(labels, g.ProductName)...)
		gauge(ch, c.gpuMemory, float64(g.MemoryBytes), labels...)
		gauge(ch, c.gpuCores, 100, labels...)
		gauge(ch, c.gpuAllocMemory, float64(a.memory), labels...)
		gauge(ch, c.gpuAllocCores, float64(a.cores), labels...)
		gauge(ch, c.gpuShares, float64(a.shares), labels...)
		healthy := 0.0
		if g.Healthy {
			healthy = 1
		}
		gauge(ch, c.gpuHealthy, healthy, append(labels, g.Taint)...)
	}
	if c.usage != nil {
		for _, u := range c.usage.Collect(snap.GPUs) {
			gauge(ch, c.podMemory, float64(u.UsedBytes), u.Namespace, u.Pod, string(u.PodUID), "gpu-"+strconv.Itoa(u.Minor), u.UUID)
		}
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}
