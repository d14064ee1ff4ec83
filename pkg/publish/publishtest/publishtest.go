// Package publishtest holds the fakes and fixtures that the tests of package
// publish and of the kubelet plugin share: four test GPUs, an event recorder
// and two publishers that record what an Inventory publishes. Only tests
// import it.
package publishtest

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// GPUs returns four H100s: gpu-0 and gpu-1 share NVLink domain "nvl-a",
// gpu-2 and gpu-3 "nvl-b". gpu-1 sits on a lower PCI bus than gpu-0, so
// device order differs from minor order.
func GPUs() []gpu.GPU {
	mk := func(minor int, bus, domain string) gpu.GPU {
		return gpu.GPU{
			UUID: "GPU-0000000" + string(rune('0'+minor)), Minor: minor, Index: minor,
			ProductName: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, PCIBusID: bus, NVLinkDomain: domain,
		}
	}
	return []gpu.GPU{
		mk(0, "0000:0a:00.0", "nvl-a"),
		mk(1, "0000:07:00.0", "nvl-a"),
		mk(2, "0000:41:00.0", "nvl-b"),
		mk(3, "0000:44:00.0", "nvl-b"),
	}
}

// UUID is the UUID of the GPU of [GPUs] with minor number minor.
func UUID(minor int) string { return GPUs()[minor].UUID }

// Events records Node events as "<type> <reason>: <message>" and claim
// events as "claim <namespace>/<name>: <type> <reason>: <message>". It is
// safe for concurrent use.
type Events struct {
	mu     sync.Mutex
	events []string
}

// Event records an event on the Node.
func (f *Events) Event(eventType, reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, eventType+" "+reason+": "+message)
}

// ClaimEvent records an event on claim.
func (f *Events) ClaimEvent(claim *resourceapi.ResourceClaim, eventType, reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, "claim "+claim.Namespace+"/"+claim.Name+": "+eventType+" "+reason+": "+message)
}

// List returns the events recorded so far, oldest first.
func (f *Events) List() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events)
}

// HasEvent reports whether one of events starts with prefix and contains
// every one of parts.
func HasEvent(events []string, prefix string, parts ...string) bool {
	for _, e := range events {
		if !strings.HasPrefix(e, prefix) {
			continue
		}
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(e, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// Publisher records every publication, for a test that syncs an Inventory
// itself. It is not safe for concurrent use; see [LockedPublisher].
type Publisher struct {
	Published []resourceslice.DriverResources
}

// PublishResources records r.
func (f *Publisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	f.Published = append(f.Published, r)
	return nil
}

// Last returns the last publication; t fails when there was none.
func (f *Publisher) Last(t testing.TB) resourceslice.DriverResources {
	t.Helper()
	if len(f.Published) == 0 {
		t.Fatal("nothing published")
	}
	return f.Published[len(f.Published)-1]
}

// Devices returns the taints of every device of the last publication, by
// device name (nil for an untainted device), and how many slices it had.
func (f *Publisher) Devices(t testing.TB) (map[string][]resourceapi.DeviceTaint, int) {
	t.Helper()
	out := map[string][]resourceapi.DeviceTaint{}
	n := 0
	for _, pool := range f.Last(t).Pools {
		for _, s := range pool.Slices {
			n++
			for _, d := range s.Devices {
				out[d.Name] = d.Taints
			}
		}
	}
	return out, n
}

// Counters returns the values of the shared counter set name in the last
// publication; t fails when it has no such set.
func (f *Publisher) Counters(t testing.TB, name string) map[string]int64 {
	t.Helper()
	for _, pool := range f.Last(t).Pools {
		for _, s := range pool.Slices {
			for _, cs := range s.SharedCounters {
				if cs.Name != name {
					continue
				}
				out := map[string]int64{}
				for k, v := range cs.Counters {
					out[k] = v.Value.Value()
				}
				return out
			}
		}
	}
	t.Fatalf("no counter set %s published", name)
	return nil
}

// LockedPublisher keeps the last publication; unlike [Publisher] it is safe
// for an Inventory that runs in its own goroutine.
type LockedPublisher struct {
	mu   sync.Mutex
	last resourceslice.DriverResources
}

// PublishResources keeps r as the last publication.
func (p *LockedPublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = r
	return nil
}

// Taints returns the taints of every device in the last publication that has
// any, by device name.
func (p *LockedPublisher) Taints() map[string][]resourceapi.DeviceTaint {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string][]resourceapi.DeviceTaint{}
	for _, pool := range p.last.Pools {
		for _, s := range pool.Slices {
			for _, d := range s.Devices {
				if len(d.Taints) > 0 {
					out[d.Name] = d.Taints
				}
			}
		}
	}
	return out
}
