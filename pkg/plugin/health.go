package plugin

import (
	"context"
	"slices"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/model"
)

// DefaultHealthResend is how often WatchHealthStatus re-sends the full
// report when nothing changed: a third of the kubelet's 30 s default
// HealthCheckTimeout, so that one lost or late report does not turn the
// devices Unknown.
const DefaultHealthResend = 10 * time.Second

// WatchHealthStatus implements kubeletplugin.DRAPlugin. Without a health
// tracker (Options.Health) it returns ErrHealthNotSupported at once.
//
// Otherwise it sends a report covering every published device (gpu-N and
// gpu-N-shared of each GPU not in MIG mode, the MIG devices of each GPU in
// MIG mode, each with its GPU's health) at once, again after every health
// change, and re-sends it every Options.HealthResend (DefaultHealthResend)
// so the kubelet's lease never runs out. A device of an unhealthy GPU is
// Unhealthy with a message naming the events and the taint effect; all
// others are Healthy. It returns nil when ctx is done; the kubelet may call
// it again (one subscription per call).
func (p *Plugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	tracker := p.opts.Health
	if tracker == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	changes, stop := tracker.Subscribe()
	defer stop()
	resend := p.opts.HealthResend
	if resend <= 0 {
		resend = DefaultHealthResend
	}
	ticker := time.NewTicker(resend)
	defer ticker.Stop()
	logger := klog.FromContext(ctx)
	logger.V(2).Info("Kubelet watches device health")
	for {
		report := p.HealthReport()
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
			logger.V(2).Info("Sending device health after a change")
		case <-ticker.C:
		}
	}
}

// gpusByMinor returns the plugin's GPUs, ordered by minor number.
func (p *Plugin) gpusByMinor() []gpu.GPU {
	p.gpusMu.RLock()
	gpus := make([]gpu.GPU, 0, len(p.gpus))
	for _, g := range p.gpus {
		gpus = append(gpus, g)
	}
	p.gpusMu.RUnlock()
	slices.SortFunc(gpus, func(a, b gpu.GPU) int { return a.Minor - b.Minor })
	return gpus
}

// HealthReport is the current health of every published device.
func (p *Plugin) HealthReport() kubeletplugin.DeviceHealthReport {
	gpus := p.gpusByMinor()

	now := time.Now()
	// A MIG device an XID named is unhealthy on its own (the GPU's other
	// instances are isolated from it in hardware).
	migStatuses := p.opts.Health.MIGDeviceStatuses(gpus, p.dynamicMIG)
	report := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, 2*len(gpus))}
	for _, g := range gpus {
		st := p.opts.Health.Status(g.UUID)
		for _, name := range p.deviceNames(g) {
			h := kubeletplugin.DeviceHealth{PoolName: p.opts.NodeName, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now}
			ds := st
			if ms, ok := migStatuses[name]; ok && ds.Healthy {
				ds = ms
			}
			if !ds.Healthy {
				h.Health = kubeletplugin.HealthStatusUnhealthy
				h.Message = healthMessage(ds)
			}
			report.Devices = append(report.Devices, h)
		}
	}
	return report
}

// deviceNames are the devices the GPU publishes (besides a lending
// device): gpu-N and gpu-N-shared, or its MIG devices in MIG mode (its GPU
// instances, or with dynamic MIG every placement of every profile, a
// superset of what it publishes once held instances block some).
func (p *Plugin) deviceNames(g gpu.GPU) []string {
	if !g.MIGEnabled {
		return []string{model.WholeDeviceName(g.Minor), model.SharedDeviceName(g.Minor)}
	}
	if g.MIG == nil {
		return nil
	}
	var names []string
	if p.dynamicMIG(g) {
		for _, prof := range g.MIG.Profiles {
			for _, pl := range prof.Placements {
				names = append(names, model.MIGPlacementDeviceName(g.Minor, prof.Name, pl.Start))
			}
		}
		return names
	}
	for _, gi := range g.MIG.Instances {
		if len(gi.ComputeInstances) > 0 {
			names = append(names, model.MIGStaticDeviceName(g.Minor, gi.ID))
		}
	}
	return names
}

func healthMessage(st health.Status) string {
	return st.Reason + " since " + st.Since.UTC().Format(time.RFC3339) + " (taint " + health.TaintKey + ":" + string(st.Effect) +
		"; healthy again after " + st.RecoversAt.UTC().Format(time.RFC3339) + " without further errors)"
}
