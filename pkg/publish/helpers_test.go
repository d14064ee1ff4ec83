package publish

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

const testNode = "node-a"

// testGPUs: gpu-0 and gpu-1 share NVLink domain "nvl-a", gpu-2 and gpu-3
// "nvl-b". gpu-1 sits on a lower PCI bus than gpu-0, so device order differs
// from minor order.
func testGPUs() []gpu.GPU {
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

func uuidOf(minor int) string { return testGPUs()[minor].UUID }

// ctxFor logs through t.
func ctxFor(t testing.TB) context.Context {
	_, ctx := ktesting.NewTestContext(t)
	return ctx
}

// fakeEvents records Node events as "<type> <reason>: <message>".
type fakeEvents struct {
	mu     sync.Mutex
	events []string
}

func (f *fakeEvents) Event(eventType, reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, eventType+" "+reason+": "+message)
}

func (f *fakeEvents) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events)
}

func hasEvent(events []string, prefix string, parts ...string) bool {
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

type fakePublisher struct {
	published []resourceslice.DriverResources
}

func (f *fakePublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	f.published = append(f.published, r)
	return nil
}

// devices returns the taints of every device of the last publication, by
// device name (nil for an untainted device), and how many slices it had.
func (f *fakePublisher) devices(t *testing.T) (map[string][]resourceapi.DeviceTaint, int) {
	t.Helper()
	if len(f.published) == 0 {
		t.Fatal("nothing published")
	}
	last := f.published[len(f.published)-1]
	out := map[string][]resourceapi.DeviceTaint{}
	n := 0
	for _, pool := range last.Pools {
		for _, s := range pool.Slices {
			n++
			for _, d := range s.Devices {
				out[d.Name] = d.Taints
			}
		}
	}
	return out, n
}

// lockedPublisher records publications; safe for the inventory's goroutine.
type lockedPublisher struct {
	mu   sync.Mutex
	last resourceslice.DriverResources
	n    int
}

func (p *lockedPublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last, p.n = r, p.n+1
	return nil
}

// taints returns the taints of every device in the last publication that has any.
func (p *lockedPublisher) taints() map[string][]resourceapi.DeviceTaint {
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
