package plugin

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/model"
)

// grant is one claim's hold on a GPU.
type grant struct {
	claim  types.UID
	name   string // "ns/name (uid …)" for messages
	shared bool
}

// grants is the plugin's index of which claims hold which GPUs, by minor.
// It mirrors the checkpoint (rebuilt from it at start) plus the claims being
// prepared right now, so that two concurrent prepares cannot both pass the
// double-grant check.
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

// grantRequest is one GPU a claim wants.
type grantRequest struct {
	minor  int
	shared bool
}

// reserve records that claim holds the GPUs, unless another claim holds one of
// them in a conflicting way: a whole GPU is exclusive, and a GPU is either
// shared or whole, never both. It is all-or-nothing. Reserving for a claim
// that already holds the GPUs is a no-op.
func (g *grants) reserve(claim types.UID, name string, reqs []grantRequest) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range reqs {
		for _, other := range g.byGPU[r.minor] {
			if other.claim == claim {
				continue
			}
			if !r.shared || !other.shared {
				return fmt.Errorf("device %s is already prepared for claim %s as %s; refusing to also give it to claim %s as %s",
					model.WholeDeviceName(r.minor), other.name, kind(other.shared), name, kind(r.shared))
			}
		}
	}
	for _, r := range reqs {
		if g.holds(claim, r.minor) {
			continue
		}
		g.byGPU[r.minor] = append(g.byGPU[r.minor], grant{claim: claim, name: name, shared: r.shared})
		g.claims[claim] = append(g.claims[claim], r.minor)
	}
	return nil
}

func (g *grants) holds(claim types.UID, minor int) bool {
	for _, x := range g.byGPU[minor] {
		if x.claim == claim {
			return true
		}
	}
	return false
}

// release drops every hold of claim; unknown claims are a no-op.
func (g *grants) release(claim types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
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
