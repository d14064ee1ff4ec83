package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Discovery is the outcome of the kubelet plugin's latest GPU discovery.
type Discovery struct {
	// Up is false when the latest discovery failed as a whole: no NVML (no
	// library, no kernel module) or NVML could not enumerate the GPUs.
	Up bool
	// GPUs is how many GPUs the latest discovery described.
	GPUs int
	// Failed are the GPUs NVML enumerates but discovery could not describe.
	Failed []FailedGPU
	// Errors counts the discoveries since the start that failed as a whole
	// or for at least one GPU.
	Errors uint64
	// Conditions are what the latest discovery found wrong with the GPUs
	// it described (gpu.Conditions).
	Conditions []GPUCondition
}

// GPUCondition is one gpu.Condition of a described GPU.
type GPUCondition struct {
	Index int
	UUID  string
	// Reason is the gpu.ConditionReason ("MIGEnabled", "MIGModePending",
	// "MIGUnknown", "NVLinkUnknown", "FabricNotReady", "ComputeMode").
	Reason string
	// Published is false when the GPU is not published at all.
	Published bool
	// Taint is the value of the gpu.tessera.dev/unhealthy taint its devices
	// carry for it; empty for none.
	Taint string
}

// SkipReasons are the reasons of tessera_gpus_skipped, always exported (0
// when no GPU is skipped for them) so that an alert can compare them.
var SkipReasons = []string{"MIGEnabled", "DiscoveryFailed"}

// FailedGPU is one GPU that failed discovery.
type FailedGPU struct {
	// Index is NVML's index; UUID is empty when it could not be read.
	Index int
	UUID  string
	// Published is true when its devices are published anyway (tainted).
	Published bool
}

// DiscoverySource supplies the discovery outcome; the plugin's Inventory is
// one.
type DiscoverySource interface {
	DiscoverySnapshot() Discovery
}

// AddDiscovery registers the discovery series, computed from src at each
// scrape. Call it once.
//
//	tessera_gpu_discovery_up                 1 when NVML enumerated the GPUs at the latest discovery
//	tessera_gpus_discovered                  GPUs the latest discovery described
//	tessera_gpu_discovery_failed{index,uuid,published}
//	                                         1 for every GPU that failed the latest discovery
//	tessera_gpu_discovery_errors_total       discoveries that failed, as a whole or for a GPU
//	tessera_gpus_skipped{reason}             GPUs NVML enumerates that are not published, by reason
//	                                         (SkipReasons: MIGEnabled, kept at 0 for alerts now that MIG GPUs
//	                                         are published as MIG devices; discovery failed before their facts were known)
//	tessera_gpu_condition{index,uuid,reason,published,taint}
//	                                         1 for every condition of a described GPU (gpu.Conditions)
func (m *Metrics) AddDiscovery(src DiscoverySource) {
	m.Registry.MustRegister(newDiscoveryCollector(m.node, src))
}

type discoveryCollector struct {
	src                          DiscoverySource
	up, discovered, failed, errs *prometheus.Desc
	skipped, condition           *prometheus.Desc
}

func newDiscoveryCollector(node string, src DiscoverySource) *discoveryCollector {
	c := prometheus.Labels{"node": node}
	return &discoveryCollector{
		src: src,
		up: prometheus.NewDesc("tessera_gpu_discovery_up", "1 when the latest GPU discovery could use NVML and enumerate the GPUs, "+
			"0 when it failed as a whole (no NVML library, no kernel module, ...; the plugin then publishes no GPU or keeps what it published before).", nil, c),
		discovered: prometheus.NewDesc("tessera_gpus_discovered", "GPUs the latest discovery described (0 on a node without GPUs).", nil, c),
		failed: prometheus.NewDesc("tessera_gpu_discovery_failed", "1 for every GPU NVML enumerates but the latest discovery could not describe, by NVML index "+
			"(uuid empty when unreadable); published=true when its devices are published anyway, tainted gpu.tessera.dev/unhealthy=DiscoveryFailed:NoSchedule.",
			[]string{"index", "uuid", "published"}, c),
		errs: prometheus.NewDesc("tessera_gpu_discovery_errors_total", "GPU discoveries that failed, as a whole or for at least one GPU.", nil, c),
		skipped: prometheus.NewDesc("tessera_gpus_skipped", "GPUs NVML enumerates that the latest discovery left unpublished, by reason: "+
			"MIGEnabled (kept so that alerts on it keep their series: a GPU in MIG mode is published as MIG devices, so it stays 0 on a plugin that publishes them), "+
			"DiscoveryFailed (failed before its UUID, minor number or memory were known).",
			[]string{"reason"}, c),
		condition: prometheus.NewDesc("tessera_gpu_condition", "1 for every condition the latest discovery found on a GPU it described: "+
			"MIGEnabled (in MIG mode: published as MIG devices only, never whole or in shares), "+
			"MIGModePending (its pending MIG mode differs from the current one: published in the current mode, tainted, until a reset of the idle GPU), "+
			"MIGUnknown (NVML failed on its MIG queries: published as far as read, tainted), "+
			"NVLinkUnknown (NVML failed on its NVLink or fabric queries: published in an NVLink domain of its own), "+
			"FabricNotReady (NVLink fabric registration not completed), ComputeMode (not in the expected compute mode); "+
			"taint is the value of its gpu.tessera.dev/unhealthy:NoSchedule taint, empty for none.",
			[]string{"index", "uuid", "reason", "published", "taint"}, c),
	}
}

func (c *discoveryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.discovered
	ch <- c.failed
	ch <- c.errs
	ch <- c.skipped
	ch <- c.condition
}

func (c *discoveryCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.src.DiscoverySnapshot()
	up := 0.0
	if d.Up {
		up = 1
	}
	gauge(ch, c.up, up)
	gauge(ch, c.discovered, float64(d.GPUs))
	for _, f := range d.Failed {
		gauge(ch, c.failed, 1, strconv.Itoa(f.Index), f.UUID, strconv.FormatBool(f.Published))
	}
	ch <- prometheus.MustNewConstMetric(c.errs, prometheus.CounterValue, float64(d.Errors))
	skipped := map[string]int{}
	for _, f := range d.Failed {
		if !f.Published {
			skipped["DiscoveryFailed"]++
		}
	}
	for _, cond := range d.Conditions {
		if !cond.Published {
			skipped[cond.Reason]++
		}
	}
	for _, reason := range SkipReasons {
		gauge(ch, c.skipped, float64(skipped[reason]), reason)
	}
	for _, cond := range d.Conditions {
		gauge(ch, c.condition, 1, strconv.Itoa(cond.Index), cond.UUID, cond.Reason, strconv.FormatBool(cond.Published), cond.Taint)
	}
}
