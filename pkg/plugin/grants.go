package plugin

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/model"
)

// grant is one claim's hold on a GPU: the whole GPU, or shares of it with
// the capacity they consume.
type grant struct {
	claim  types.UID
	name   string // "ns/name (uid …)" for messages
	shared bool
	memory int64 // bytes consumed by the claim's shares of the GPU
	cores  int64 // percent consumed by the claim's shares of the GPU
}

// grants is the plugin's index of which claims hold which GPUs, by minor.
// It mirrors the checkpoint (rebuilt from it at start) plus the claims being
// prepared right now, so that two concurrent prepares cannot both pass the
// double-grant and capacity checks. It is the last line of defence behind the
// scheduler: whatever an allocation says, a GPU is never prepared whole for
// one claim and in any way for another, and its shares never add up to more
// than its memory or 100% of its cores.
type grants struct {
	mu     sync.Mutex
	byGPU  map[int][]grant
	claims map[types.UID][]int
}

func newGrants() grants {
	return grants{byGPU: map[int][]grant{}, claims: map[types.UID][]int{}}
}

// reset forgets every hold.
func (g *grants) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.byGPU = map[int][]grant{}
	g.claims = map[types.UID][]int{}
}

// grantRequest is one device a claim wants: a whole GPU, or a share of it
// consuming memory bytes and cores percent.
type grantRequest struct {
	minor  int
	shared bool
	memory int64
	cores  int64
}

// grantConflict is a refused reservation. holders are the claims in the way:
// if they no longer exist with their allocation, releasing them resolves it.
type grantConflict struct {
	msg     string
	holders []types.UID
	// oversubscribed is true when the shares would not fit the GPU (rather
	// than whole and share, or two whole grants, colliding).
	oversubscribed bool
}

func (e *grantConflict) Error() string { return e.msg }

// capacityOf returns a GPU's memory in bytes; ok is false for unknown GPUs,
// whose memory is then not checked.
type capacityOf func(minor int) (memory int64, ok bool)

// reserve records that claim holds the devices, unless that conflicts with
// what other claims hold: a whole GPU is exclusive, a GPU is either shared
// or whole, and the shares of a GPU (the claim's own added to the others')
// fit its memory and 100% of its cores. It is all-or-nothing and returns a
// *grantConflict when refusing. Reserving again for a claim that holds the
// GPUs replaces its holds.
func (g *grants) reserve(claim types.UID, name string, reqs []grantRequest, capacity capacityOf) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(claim, name, reqs, capacity); err != nil {
		return err
	}
	g.put(claim, name, reqs)
	return nil
}

// restore records the holds of a checkpointed claim even if they conflict
// (its containers may run; dropping it from the index would let a third claim
// in) and returns the conflict, if any, for reporting.
func (g *grants) restore(claim types.UID, name string, reqs []grantRequest, capacity capacityOf) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.check(claim, name, reqs, capacity)
	g.put(claim, name, reqs)
	return err
}

func (g *grants) check(claim types.UID, name string, reqs []grantRequest, capacity capacityOf) error {
	want := map[int]*grant{}
	var minors []int
	for _, r := range reqs {
		w, ok := want[r.minor]
		if !ok {
			w = &grant{shared: true}
			want[r.minor] = w
			minors = append(minors, r.minor)
		}
		w.shared = w.shared && r.shared
		w.memory += r.memory
		w.cores += r.cores
	}
	slices.Sort(minors)
	for _, minor := range minors {
		w := want[minor]
		device := model.WholeDeviceName(minor)
		usedMemory, usedCores := w.memory, w.cores
		var sharers []string
		var holders []types.UID
		for _, other := range g.byGPU[minor] {
			if other.claim == claim {
				continue
			}
			if !w.shared || !other.shared {
				return &grantConflict{
					msg: fmt.Sprintf("device %s is already prepared for claim %s as %s; refusing to also give it to claim %s as %s",
						device, other.name, kind(other.shared), name, kind(w.shared)),
					holders: []types.UID{other.claim},
				}
			}
			usedMemory += other.memory
			usedCores += other.cores
			sharers = append(sharers, other.name)
			holders = append(holders, other.claim)
		}
		if !w.shared {
			continue
		}
		memory, known := capacity(minor)
		over := ""
		switch {
		case known && usedMemory > memory:
			over = fmt.Sprintf("memory %d bytes > %d", usedMemory, memory)
		case usedCores > configapi.MaxCores:
			over = fmt.Sprintf("cores %d%% > %d%%", usedCores, configapi.MaxCores)
		}
		if over != "" {
			return &grantConflict{
				msg: fmt.Sprintf("refusing to prepare claim %s: its shares of %s (memory %d bytes, cores %d%%) and those of %s add up to %s: the GPU would be oversubscribed",
					name, device, w.memory, w.cores, strings.Join(sharers, ", "), over),
				holders:        holders,
				oversubscribed: true,
			}
		}
	}
	return nil
}

func (g *grants) put(claim types.UID, name string, reqs []grantRequest) {
	g.dropLocked(claim)
	for _, r := range reqs {
		i := slices.IndexFunc(g.byGPU[r.minor], func(x grant) bool { return x.claim == claim })
		if i < 0 {
			g.byGPU[r.minor] = append(g.byGPU[r.minor], grant{claim: claim, name: name, shared: r.shared})
			g.claims[claim] = append(g.claims[claim], r.minor)
			i = len(g.byGPU[r.minor]) - 1
		}
		x := &g.byGPU[r.minor][i]
		x.shared = x.shared && r.shared
		x.memory += r.memory
		x.cores += r.cores
	}
}

// release drops every hold of claim; unknown claims are a no-op.
func (g *grants) release(claim types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropLocked(claim)
}

func (g *grants) dropLocked(claim types.UID) {
	for _, minor := range g.claims[claim] {
		holders := g.byGPU[minor][:0]
		for _, x := range g.byGPU[minor] {
			if x.claim != claim {
				holders = append(holders, x)
			}
		}
		if len(holders) == 0 {
			delete(g.byGPU, minor)
		} else {
			g.byGPU[minor] = holders
		}
	}
	delete(g.claims, claim)
}

// count returns the number of claims holding GPUs (for tests).
func (g *grants) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.claims)
}

func kind(shared bool) string {
	if shared {
		return "a share"
	}
	return "a whole GPU"
}
