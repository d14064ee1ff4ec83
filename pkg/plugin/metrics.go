package plugin

import (
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/accounting"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/metrics"
)

// claimFacts is what the checkpoint does not keep about a prepared claim but
// metrics need: the pods the claim is reserved for. It is recorded from the
// claim object whenever the kubelet asks to prepare the claim. Claims
// prepared by an earlier process have none until then: their series carry an
// empty pod, and their processes' memory no pod name. The API is never asked
// (scrapes must not depend on it).
type claimFacts struct {
	pods []metrics.PodRef
}

// facts is the plugin's claimFacts, by claim UID.
type facts struct {
	mu     sync.Mutex
	claims map[types.UID]claimFacts
}

func factsOf(claim *resourceapi.ResourceClaim) claimFacts {
	var f claimFacts
	for _, ref := range claim.Status.ReservedFor {
		if ref.Resource == "pods" && ref.APIGroup == "" {
			f.pods = append(f.pods, metrics.PodRef{UID: ref.UID, Namespace: claim.Namespace, Name: ref.Name})
		}
	}
	return f
}

func (p *Plugin) rememberClaim(claim *resourceapi.ResourceClaim) {
	f := factsOf(claim)
	p.facts.mu.Lock()
	defer p.facts.mu.Unlock()
	if p.facts.claims == nil {
		p.facts.claims = map[types.UID]claimFacts{}
	}
	p.facts.claims[claim.UID] = f
}

func (p *Plugin) forgetClaim(uid types.UID) {
	p.facts.mu.Lock()
	defer p.facts.mu.Unlock()
	delete(p.facts.claims, uid)
}

// podNames returns the names of the pods each remembered claim is reserved for.
func (p *Plugin) podNames() map[types.UID][]string {
	p.facts.mu.Lock()
	defer p.facts.mu.Unlock()
	out := make(map[types.UID][]string, len(p.facts.claims))
	for uid, f := range p.facts.claims {
		for _, ref := range f.pods {
			out[uid] = append(out[uid], ref.Name)
		}
	}
	return out
}

// MetricsSnapshot implements metrics.Source from the plugin's own state only:
// the published GPUs with their health, and every completed claim of the
// checkpoint, each device as accounting.FromCheckpoint reads it (what a
// share consumed, admin access). Namespace and name come from the
// checkpoint, pods from what prepare remembered; nothing is read from the API.
func (p *Plugin) MetricsSnapshot() metrics.Snapshot {
	var snap metrics.Snapshot
	p.gpusMu.RLock()
	for minor, g := range p.gpus {
		// A GPU in MIG mode is listed too: it is published (as MIG
		// devices). Its MIG devices' holders are not claims' devices
		// below: accounting counts whole GPUs and shares.
		mg := metrics.GPU{UUID: g.UUID, Minor: minor, ProductName: g.ProductName, MemoryBytes: int64(g.MemoryBytes), Healthy: true}
		if p.opts.Health != nil {
			if st := p.opts.Health.Status(g.UUID); !st.Healthy {
				mg.Healthy, mg.Taint = false, string(st.Effect)
			}
		}
		snap.GPUs = append(snap.GPUs, mg)
	}
	p.gpusMu.RUnlock()

	pods := p.podNames()
	for _, c := range p.opts.Store.List() {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		mc := metrics.Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Pods: pods[c.UID]}
		for _, d := range c.Devices {
			a, ok := accounting.FromCheckpoint(d)
			if !ok {
				continue // not a device name of this driver; prepare never writes one
			}
			mc.Devices = append(mc.Devices, metrics.Device{
				Request: d.Request, Device: d.Device, ShareID: d.ShareID, UUID: d.UUID, Minor: d.Minor,
				Shared: a.Shared, AdminAccess: a.AdminAccess,
				ConsumedMemory: a.Consumed.MemoryBytes, ConsumedCores: a.Consumed.Cores,
				MemoryLimit: d.MemoryLimit, CoresLimit: d.CoresLimit, Isolation: d.Isolation,
			})
		}
		snap.Claims = append(snap.Claims, mc)
	}
	gpus := p.inventory()
	unhealthy := map[string]string{}
	if p.opts.Health != nil {
		for device, st := range p.opts.Health.MIGDeviceStatuses(gpus, p.dynamicMIG) {
			unhealthy[device] = string(st.Effect)
		}
	}
	snap.MIG = metrics.MIGDevices(gpus, p.dynamicMIG, p.opts.Store.List(), pods, unhealthy)
	return snap
}

// Pod implements metrics.Pods from the reservedFor lists of prepared claims.
func (p *Plugin) Pod(uid types.UID) (metrics.PodRef, bool) {
	p.facts.mu.Lock()
	defer p.facts.mu.Unlock()
	for _, f := range p.facts.claims {
		for _, ref := range f.pods {
			if ref.UID == uid {
				return ref, true
			}
		}
	}
	return metrics.PodRef{}, false
}
