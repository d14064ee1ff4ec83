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
// claim series namespace, claim, uid and pod, and request, device and share,
// so that each allocation result has its own series: a claim with two shares
// of one GPU must not produce two series with equal labels, which would fail
// the whole scrape. What a device holds of its GPU is counted by
// [accounting]; a MIG device (Snapshot.MIG, built by [MIGDevices]) holds its
// own memory and compute. MIG device series (tessera_mig_device_*) carry gpu
// and uuid of the parent GPU and device; the claims that hold a MIG device
// have claim series with that device.
package metrics

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/types"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/accounting"
	"github.com/tessera-dev/tessera/pkg/model"
)

// Snapshot is what the collector reports at one scrape.
type Snapshot struct {
	GPUs   []GPU
	Claims []Claim
	// MIG are the MIG devices of the GPUs in MIG mode (MIGDevices), with
	// the claims that hold them; Claims has the other devices.
	MIG []MIGDevice
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
	// Pods are the names of the pods the claim is reserved for, as far as
	// the plugin knows them (from the claim it prepared); empty when it does
	// not (the claim was prepared by an earlier process).
	Pods    []string
	Devices []Device
}

// Device is one prepared device of a claim: one allocation result.
type Device struct {
	Request string // request name of the allocation result
	Device  string // gpu-3 or gpu-3-shared
	ShareID string // the share's ID; empty for whole GPUs
	UUID    string
	Minor   int
	Shared  bool
	// AdminAccess devices observe; they hold nothing.
	AdminAccess bool
	// ConsumedMemory (bytes) and ConsumedCores (percent) are a share's
	// consumedCapacity: what the scheduler took from the GPU. Ignored for
	// whole GPUs, which hold all of the GPU, and admin access (see
	// [accounting.Device.Holds]).
	ConsumedMemory int64
	ConsumedCores  int64
	// MemoryLimit (bytes) and CoresLimit (percent) are the share's limits
	// in the container; Isolation its backend. Zero/empty for whole GPUs.
	MemoryLimit int64
	CoresLimit  int64
	Isolation   string
}

// accounting is d as the accounting rule sees it; GPUs are named by minor
// (one node).
func (d Device) accounting() accounting.Device {
	return accounting.Device{
		GPU:         accounting.GPU{Minor: d.Minor},
		Shared:      d.Shared,
		AdminAccess: d.AdminAccess,
		Consumed:    accounting.Capacity{MemoryBytes: d.ConsumedMemory, Cores: d.ConsumedCores},
	}
}

// Source supplies snapshots; the plugin is one. MetricsSnapshot runs at
// every scrape and answers from the source's own state: it makes no API
// calls, so /metrics does not depend on the API server.
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
	statusErrors     prometheus.Counter
	// lending is set by AddLending.
	lending *lendingMetrics
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
		statusErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tessera_claim_status_write_errors_total", Help: "Writes of a claim's status.devices (the attestation of a prepared " +
				"claim, or the reason a prepare failed) that the API server did not take; the prepare's outcome is not affected.",
			ConstLabels: constLabels,
		}),
	}
	reg.MustRegister(m.prepareSeconds, m.unprepareSeconds, m.prepareErrors, m.unprepareErrors, m.statusErrors,
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
	observe(m.prepareSeconds, m.prepareErrors, d, err)
}

// ObserveUnprepare records one claim's unprepare. Safe on a nil *Metrics.
func (m *Metrics) ObserveUnprepare(d time.Duration, err error) {
	if m == nil {
		return
	}
	observe(m.unprepareSeconds, m.unprepareErrors, d, err)
}

// observe records a call that took d in seconds and, when it failed, in
// errors.
func observe(seconds prometheus.Histogram, errors prometheus.Counter, d time.Duration, err error) {
	seconds.Observe(d.Seconds())
	if err != nil {
		errors.Inc()
	}
}

// ObserveStatusWrite records one write of a claim's status.devices. Safe on
// a nil *Metrics.
func (m *Metrics) ObserveStatusWrite(err error) {
	if m == nil || err == nil {
		return
	}
	m.statusErrors.Inc()
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
	claimMemory, claimCores, claimMemoryLimit, claimCoresLimit, claimLimitEnforced     *prometheus.Desc
	podMemory                                                                          *prometheus.Desc
	mig                                                                                migDescs
}

// claimLabels name one allocation result of one claim, so no two series of a
// scrape can carry the same labels (which would fail the whole scrape).
var claimLabels = []string{"namespace", "claim", "uid", "pod", "request", "device", "share", "gpu", "uuid", "isolation"}

func newStateCollector(node string, src Source, usage *Usage) *stateCollector {
	c := prometheus.Labels{"node": node}
	gpu := []string{"gpu", "uuid"}
	const counted = " Counted: a whole GPU holds all of its memory and compute; a share holds its consumedCapacity " +
		"(what the scheduler allocated, not its limits); a MIG device its own memory and compute; admin-access devices hold nothing; shares add up."
	const perResult = " One series per allocation result (request, device, share) of the claim; pod is the claim's " +
		"reservedFor pods (comma-separated), empty when the plugin did not see the claim prepared."
	return &stateCollector{
		src:   src,
		usage: usage,
		gpuInfo: prometheus.NewDesc("tessera_gpu_info", "A GPU Tessera publishes (value 1), with its product name.",
			append(gpu, "product"), c),
		gpuMemory:      prometheus.NewDesc("tessera_gpu_memory_bytes", "Total memory of the GPU.", gpu, c),
		gpuCores:       prometheus.NewDesc("tessera_gpu_cores", "Compute of the GPU in percent (always 100).", gpu, c),
		gpuAllocMemory: prometheus.NewDesc("tessera_gpu_allocated_memory_bytes", "Memory (bytes) of the GPU held by the claims prepared on it."+counted, gpu, c),
		gpuAllocCores:  prometheus.NewDesc("tessera_gpu_allocated_cores", "Guaranteed compute (percent) of the GPU held by the claims prepared on it."+counted, gpu, c),
		gpuShares:      prometheus.NewDesc("tessera_gpu_shares", "Prepared shares of the GPU, admin-access devices not counted.", gpu, c),
		gpuHealthy: prometheus.NewDesc("tessera_gpu_healthy", "1 when the GPU is healthy, 0 while it is tainted "+
			"gpu.tessera.dev/unhealthy (effect in the label).", append(gpu, "effect"), c),
		claimMemory: prometheus.NewDesc("tessera_claim_memory_bytes", "Memory (bytes) of the GPU a prepared claim's device holds: "+
			"a share's consumedCapacity, all of the GPU's memory for a whole GPU, 0 for admin access."+perResult, claimLabels, c),
		claimCores: prometheus.NewDesc("tessera_claim_cores", "Guaranteed compute (percent) of the GPU a prepared claim's device holds: "+
			"a share's consumedCapacity, 100 for a whole GPU, 0 for admin access."+perResult, claimLabels, c),
		claimMemoryLimit: prometheus.NewDesc("tessera_claim_memory_limit_bytes", "Memory limit (bytes) of a prepared share in the container "+
			"(shares only; may be lower than what the share holds)."+perResult, claimLabels, c),
		claimCoresLimit: prometheus.NewDesc("tessera_claim_cores_limit", "Compute limit (percent) of a prepared share in the container "+
			"(shares only; may differ from what the share holds)."+perResult, claimLabels, c),
		claimLimitEnforced: prometheus.NewDesc("tessera_claim_limit_enforced", "1 when the isolation backend of a prepared share "+
			"enforces its limit (label limit: memory or cores), 0 when the limit is only advertised to the container (Advisory). "+
			"The claim's status.devices[].data (GpuAttestation) says the same."+perResult, append(slices.Clone(claimLabels), "limit"), c),
		mig: newMIGDescs(c),
		podMemory: prometheus.NewDesc("tessera_pod_gpu_memory_used_bytes", "GPU memory used by the processes of a pod (NVML per-process accounting). "+
			"Processes outside any known pod are summed with empty namespace and pod.", []string{"namespace", "pod", "pod_uid", "gpu", "uuid"}, c),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.gpuInfo, c.gpuMemory, c.gpuCores, c.gpuAllocMemory, c.gpuAllocCores,
		c.gpuShares, c.gpuHealthy, c.claimMemory, c.claimCores, c.claimMemoryLimit, c.claimCoresLimit, c.claimLimitEnforced, c.podMemory} {
		ch <- d
	}
	for _, d := range c.mig.all() {
		ch <- d
	}
}

// claimValues are the values of one claim series.
type claimValues struct {
	labels                  []string
	memory, cores           int64
	memoryLimit, coresLimit int64
	shared                  bool
	enforced                configapi.EnforcedLimits
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.src.MetricsSnapshot()
	gpuOf := make(map[int]GPU, len(snap.GPUs))
	for _, g := range snap.GPUs {
		gpuOf[g.Minor] = g
	}
	capacityOf := func(k accounting.GPU) (accounting.Capacity, bool) {
		g, ok := gpuOf[k.Minor]
		return accounting.Capacity{MemoryBytes: g.MemoryBytes, Cores: model.CoresPerGPU}, ok
	}

	var devices []accounting.Device
	series := map[string]*claimValues{}
	var order []string
	for _, cl := range snap.Claims {
		pods := slices.Clone(cl.Pods)
		slices.Sort(pods)
		pod := strings.Join(slices.Compact(pods), ",")
		for _, d := range cl.Devices {
			ad := d.accounting()
			// A device counts against the GPU its minor names only while
			// that is still the GPU it was prepared on.
			gpuCap, known := capacityOf(ad.GPU)
			if known && gpuOf[d.Minor].UUID == d.UUID {
				devices = append(devices, ad)
			} else {
				gpuCap = accounting.Capacity{}
			}
			held := ad.Holds(gpuCap)
			labels := []string{cl.Namespace, cl.Name, string(cl.UID), pod, d.Request, d.Device, d.ShareID,
				"gpu-" + strconv.Itoa(d.Minor), d.UUID, d.Isolation}
			// Equal labels (a checkpoint that lists one result twice) are
			// summed rather than sent twice.
			key := strings.Join(labels, "\x00")
			v := series[key]
			if v == nil {
				v = &claimValues{labels: labels}
				series[key] = v
				order = append(order, key)
			}
			v.memory += held.MemoryBytes
			v.cores += held.Cores
			if d.Shared && !d.AdminAccess {
				v.shared = true
				v.enforced = configapi.Enforces(configapi.Isolation(d.Isolation))
				v.memoryLimit += d.MemoryLimit
				v.coresLimit += d.CoresLimit
			}
		}
	}
	heldMIG, migClaims := c.mig.collect(ch, snap.MIG)
	for _, m := range migClaims {
		key := strings.Join(m.labels, "\x00")
		v := series[key]
		if v == nil {
			v = &claimValues{labels: m.labels}
			series[key] = v
			order = append(order, key)
		}
		v.memory += m.memory
		v.cores += m.cores
	}
	for _, key := range order {
		v := series[key]
		gauge(ch, c.claimMemory, float64(v.memory), v.labels...)
		gauge(ch, c.claimCores, float64(v.cores), v.labels...)
		if v.shared {
			gauge(ch, c.claimMemoryLimit, float64(v.memoryLimit), v.labels...)
			gauge(ch, c.claimCoresLimit, float64(v.coresLimit), v.labels...)
			gauge(ch, c.claimLimitEnforced, boolValue(v.enforced.Memory), append(slices.Clone(v.labels), "memory")...)
			gauge(ch, c.claimLimitEnforced, boolValue(v.enforced.Cores), append(slices.Clone(v.labels), "cores")...)
		}
	}

	allocated := accounting.Allocated(devices, capacityOf)
	for _, g := range snap.GPUs {
		labels := []string{"gpu-" + strconv.Itoa(g.Minor), g.UUID}
		a := allocated[accounting.GPU{Minor: g.Minor}]
		a.MemoryBytes += heldMIG[g.Minor][0]
		a.Cores += heldMIG[g.Minor][1]
		gauge(ch, c.gpuInfo, 1, append(labels, g.ProductName)...)
		gauge(ch, c.gpuMemory, float64(g.MemoryBytes), labels...)
		gauge(ch, c.gpuCores, model.CoresPerGPU, labels...)
		gauge(ch, c.gpuAllocMemory, float64(a.MemoryBytes), labels...)
		gauge(ch, c.gpuAllocCores, float64(a.Cores), labels...)
		gauge(ch, c.gpuShares, float64(a.Shares), labels...)
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

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}
