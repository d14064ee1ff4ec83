package plugin

import (
	"context"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/metrics"
	"github.com/tessera-dev/tessera/pkg/model"
)

// claimFacts is what the checkpoint does not keep about a prepared claim but
// metrics need: what the scheduler allocated to each share (the limits in the
// checkpoint may differ from it), and the pods the claim is reserved for.
// It is recorded at prepare from the claim object and, for claims prepared
// by an earlier process, read from the API once at the first scrape.
type claimFacts struct {
	consumed map[deviceKey]capacity
	pods     []metrics.PodRef
}

type deviceKey struct{ request, device, shareID string }

type capacity struct{ memory, cores int64 }

// facts is the plugin's claimFacts cache, by claim UID.
type facts struct {
	mu     sync.Mutex
	claims map[types.UID]claimFacts
	// tried records failed API look-ups, retried after a minute.
	tried map[types.UID]time.Time
}

func factsOf(claim *resourceapi.ResourceClaim) claimFacts {
	f := claimFacts{consumed: map[deviceKey]capacity{}}
	if claim.Status.Allocation != nil {
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != model.DriverName {
				continue
			}
			k := deviceKey{request: r.Request, device: r.Device}
			if r.ShareID != nil {
				k.shareID = string(*r.ShareID)
			}
			var c capacity
			if q, ok := r.ConsumedCapacity[capacityMemory]; ok {
				c.memory = q.Value()
			}
			if q, ok := r.ConsumedCapacity[capacityCores]; ok {
				c.cores = q.Value()
			}
			f.consumed[k] = c
		}
	}
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
	delete(p.facts.tried, uid)
}

// claimFactsFor returns the facts of a checkpointed claim, reading the claim
// from the API when this process has not seen it (it was prepared before a
// restart or by the other pod of a rolling update).
func (p *Plugin) claimFactsFor(ctx context.Context, c checkpoint.Claim) (claimFacts, bool) {
	p.facts.mu.Lock()
	f, ok := p.facts.claims[c.UID]
	last, tried := p.facts.tried[c.UID]
	p.facts.mu.Unlock()
	if ok || p.opts.Client == nil || (tried && time.Since(last) < time.Minute) {
		return f, ok
	}
	obj, err := p.opts.Client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil || obj.UID != c.UID {
		if err != nil {
			klog.FromContext(ctx).V(2).Info("Reading claim for metrics failed", "claim", c.String(), "err", err)
		}
		p.facts.mu.Lock()
		if p.facts.tried == nil {
			p.facts.tried = map[types.UID]time.Time{}
		}
		p.facts.tried[c.UID] = time.Now()
		p.facts.mu.Unlock()
		return claimFacts{}, false
	}
	p.rememberClaim(obj)
	return factsOf(obj), true
}

// MetricsSnapshot implements metrics.Source: the published GPUs with their
// health, and every completed claim of the checkpoint with what was
// allocated. A share whose allocation is unknown (the claim could not be
// read) reports its limits as its allocation.
func (p *Plugin) MetricsSnapshot() metrics.Snapshot {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var snap metrics.Snapshot
	memoryOf := map[int]int64{}
	p.gpusMu.RLock()
	for minor, g := range p.gpus {
		if g.MIGEnabled {
			continue
		}
		mg := metrics.GPU{UUID: g.UUID, Minor: minor, ProductName: g.ProductName, MemoryBytes: int64(g.MemoryBytes), Healthy: true}
		if p.opts.Health != nil {
			if st := p.opts.Health.Status(g.UUID); !st.Healthy {
				mg.Healthy, mg.Taint = false, string(st.Effect)
			}
		}
		memoryOf[minor] = mg.MemoryBytes
		snap.GPUs = append(snap.GPUs, mg)
	}
	p.gpusMu.RUnlock()

	for _, c := range p.opts.Store.List() {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		f, known := p.claimFactsFor(ctx, c)
		mc := metrics.Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name}
		for _, d := range c.Devices {
			_, shared, _ := model.ParseDeviceName(d.Device)
			md := metrics.Device{Device: d.Device, UUID: d.UUID, Minor: d.Minor, Shared: shared,
				MemoryLimit: d.MemoryLimit, CoresLimit: d.CoresLimit, Isolation: d.Isolation}
			switch {
			case shared && d.ShareID == "":
				md.AdminAccess = true
			case shared:
				consumed, ok := f.consumed[deviceKey{request: d.Request, device: d.Device, shareID: d.ShareID}]
				if !known || !ok {
					consumed = capacity{memory: d.MemoryLimit, cores: d.CoresLimit}
				}
				md.MemoryBytes, md.Cores = consumed.memory, consumed.cores
			default:
				md.MemoryBytes, md.Cores = memoryOf[d.Minor], model.CoresPerGPU
			}
			mc.Devices = append(mc.Devices, md)
		}
		snap.Claims = append(snap.Claims, mc)
	}
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
