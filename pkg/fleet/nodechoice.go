package fleet

import (
	"container/heap"
	"context"
	"fmt"
	"math"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/model"
)

// NodeChoice names how a node is picked among the nodes a claim fits on.
type NodeChoice string

const (
	// ChoiceScore is kube-scheduler 1.37's schedulePod for a pod with one claim:
	//
	//   - Filter runs on the nodes starting at nextStartNodeIndex and stops after
	//     numFeasibleNodesToFind feasible nodes (all nodes below 100; else
	//     max(100, n × percentage / 100) with the adaptive percentage
	//     max(5, 50 − n/125) when percentageOfNodesToScore is unset); the index
	//     then advances by the number of nodes processed (so it stays put while
	//     every node is filtered);
	//   - the default score plugins score the feasible nodes. For these pods only
	//     NodeResourcesFit (LeastAllocated over cpu and memory, weight 1, with
	//     the non-zero defaults 100m/200Mi for containers without requests) and
	//     NodeResourcesBalancedAllocation (weight 1; none for a pod without
	//     requests) differ between identical nodes; DynamicResources scores
	//     only firstAvailable subrequests (0 otherwise, and the same on every
	//     node of one GPU model), TaintToleration, NodeAffinity,
	//     PodTopologySpread, InterPodAffinity and ImageLocality give every node
	//     the same score for a bare pod;
	//   - the node is popped from a max-heap over the scores in filter order.
	//     Without extenders every Randomizer is 0, so ties go to whichever equal
	//     node container/heap puts on top: deterministic, not random
	//     (the reservoir-sampling selectHost of older releases is gone).
	//
	// Filter is parallel in the real scheduler, so its feasible list is in
	// completion order, close to node order; the model uses node order.
	ChoiceScore NodeChoice = "score"
	// ChoiceFirst takes the first node in node order whose allocation succeeds
	// (the simulator's earlier model; kept for comparison).
	ChoiceFirst NodeChoice = "first"
)

// Scoring is what the score plugins see: every node's allocatable cpu and
// memory, and each job pod's requests (0: none, so the non-zero defaults apply
// to LeastAllocated and BalancedAllocation skips the pod).
type Scoring struct {
	NodeMilliCPU, NodeMemory int64
	PodMilliCPU, PodMemory   int64
	// PercentageOfNodesToScore is the scheduler's setting; 0 is adaptive.
	PercentageOfNodesToScore int32
}

// DefaultScoring is a fake node of hack/scale (128 cpu, 1Ti: scalebench.FakeNode) and
// pods without requests.
var DefaultScoring = Scoring{NodeMilliCPU: 128000, NodeMemory: 1 << 40}

const (
	defaultMilliCPURequest = 100               // schedutil.DefaultMilliCPURequest
	defaultMemoryRequest   = 200 * 1024 * 1024 // schedutil.DefaultMemoryRequest
	maxNodeScore           = 100
	minFeasibleNodesToFind = 100
	minFeasiblePercentage  = 5
)

// numFeasibleNodesToFind is the scheduler's function of the same name.
func numFeasibleNodesToFind(percentage int32, n int32) int32 {
	if n < minFeasibleNodesToFind {
		return n
	}
	if percentage == 0 {
		percentage = max(int32(50)-n/125, minFeasiblePercentage)
	}
	return max(n*percentage/100, minFeasibleNodesToFind)
}

// score is the sum of the weighted scores that differ between nodes for a job
// pod landing on a node that already runs pods job pods.
func (s Scoring) score(pods int) int64 {
	k := int64(pods)
	// NodeResourcesFit, LeastAllocated: non-zero requests.
	cpu, mem := s.PodMilliCPU, s.PodMemory
	if cpu == 0 {
		cpu = defaultMilliCPURequest
	}
	if mem == 0 {
		mem = defaultMemoryRequest
	}
	least := func(req, capacity int64) int64 {
		if capacity == 0 || req > capacity {
			return 0
		}
		return (capacity - req) * maxNodeScore / capacity
	}
	var fit int64
	var weights int64
	for _, r := range []struct{ req, capacity int64 }{{(k + 1) * cpu, s.NodeMilliCPU}, {(k + 1) * mem, s.NodeMemory}} {
		if r.capacity == 0 {
			continue
		}
		fit += least(r.req, r.capacity)
		weights++
	}
	if weights > 0 {
		fit /= weights
	}
	// NodeResourcesBalancedAllocation: the pod's own requests, none for a
	// best-effort pod.
	var balanced int64
	if s.PodMilliCPU > 0 || s.PodMemory > 0 {
		bal := func(c, m int64) int64 {
			fc, fm := math.Min(float64(c)/float64(s.NodeMilliCPU), 1), math.Min(float64(m)/float64(s.NodeMemory), 1)
			return int64((1 - math.Abs(fc-fm)/2) * maxNodeScore)
		}
		with := bal((k+1)*s.PodMilliCPU, (k+1)*s.PodMemory)
		without := bal(k*s.PodMilliCPU, k*s.PodMemory)
		balanced = maxNodeScore/2 + (maxNodeScore/2+with-without)/2
	}
	return fit + balanced
}

// scoredNode is fwk.NodePluginScores with Randomizer 0.
type scoredNode struct {
	node  int
	score int64
}

// scoreHeap is framework.sortedNodeScores' heap with every Randomizer 0.
type scoreHeap []scoredNode

func (h scoreHeap) Len() int           { return len(h) }
func (h scoreHeap) Less(i, j int) bool { return h[i].score > h[j].score }
func (h scoreHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *scoreHeap) Push(x any)        { *h = append(*h, x.(scoredNode)) }
func (h *scoreHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// size is a claim's size in two dimensions (memory, cores) for the known-answer
// shortcuts.
type size struct{ mem, cores float64 }

func (a size) le(b size) bool { return a.mem <= b.mem && a.cores <= b.cores }

type simNode struct {
	node   *v1.Node
	slices []*resourceapi.ResourceSlice
	state  structured.AllocatedState
	// alloc is valid for the current state; nil after any change (the allocator
	// caches the counters left in each pool, so it must not outlive the state).
	alloc structured.Allocator
	// refused are minimal sizes this node refused, accepted maximal sizes it
	// accepted, since it last changed.
	refused, accepted []size
	pods              int
}

func (n *simNode) changed() {
	n.alloc, n.refused, n.accepted = nil, n.refused[:0], n.accepted[:0]
}

type allocatorPlacer struct {
	model     deviceModel
	nodes     []*simNode
	classes   model.ClassLister
	cel       *cel.Cache
	opt       Options
	calls     int
	nextStart int
	claims    map[int]*resourceapi.ResourceClaim
}

func newAllocatorPlacer(m deviceModel, opt Options) (*allocatorPlacer, error) {
	switch opt.NodeChoice {
	case "", ChoiceScore, ChoiceFirst:
	default:
		return nil, fmt.Errorf("unknown node choice %q (want %s or %s)", opt.NodeChoice, ChoiceScore, ChoiceFirst)
	}
	if opt.Scoring == (Scoring{}) {
		opt.Scoring = DefaultScoring
	}
	p := &allocatorPlacer{model: m, classes: newClassLister(m.classes()), cel: newCELCache(), opt: opt, claims: map[int]*resourceapi.ResourceClaim{}}
	for i := range opt.Nodes {
		name := fmt.Sprintf("node-%03d", i)
		sl, err := m.slices(name)
		if err != nil {
			return nil, err
		}
		p.nodes = append(p.nodes, &simNode{
			node:   &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}},
			slices: sl,
			state:  newAllocatedState(),
		})
	}
	return p, nil
}

func (p *allocatorPlacer) claim(j *Job) (*resourceapi.ResourceClaim, error) {
	if c, ok := p.claims[j.ID]; ok {
		return c, nil
	}
	c, err := p.model.claim(j)
	if err != nil {
		return nil, err
	}
	p.claims[j.ID] = c
	return c, nil
}

// allocate runs the allocator for j on node i; nil results: it does not fit.
func (p *allocatorPlacer) allocate(ctx context.Context, i int, j *Job) ([]resourceapi.DeviceRequestAllocationResult, error) {
	n := p.nodes[i]
	if n.alloc == nil {
		a, err := structured.NewAllocator(ctx, model.SchedulerFeatures, n.state, p.classes, n.slices, p.cel)
		if err != nil {
			return nil, err
		}
		n.alloc = a
	}
	claim, err := p.claim(j)
	if err != nil {
		return nil, err
	}
	p.calls++
	res, err := n.alloc.Allocate(ctx, n.node, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.node.Name, err)
	}
	key := p.model.sizeKey(j)
	if len(res) == 0 {
		n.refused = append(n.refused, key)
		return nil, nil
	}
	n.accepted = append(n.accepted, key)
	if len(res[0].Devices.Results) != 1 {
		return nil, fmt.Errorf("node %s: %d devices allocated for one request", n.node.Name, len(res[0].Devices.Results))
	}
	return res[0].Devices.Results, nil
}

// fits says whether j fits on node i, from the known answers when there is one.
func (p *allocatorPlacer) fits(ctx context.Context, i int, j *Job) (bool, []resourceapi.DeviceRequestAllocationResult, error) {
	n := p.nodes[i]
	if !p.opt.AlwaysAsk {
		key := p.model.sizeKey(j)
		for _, r := range n.refused {
			if r.le(key) {
				return false, nil, nil
			}
		}
		for _, a := range n.accepted {
			if key.le(a) {
				return true, nil, nil
			}
		}
	}
	res, err := p.allocate(ctx, i, j)
	return res != nil, res, err
}

func (p *allocatorPlacer) place(ctx context.Context, j *Job) (placement, bool, error) {
	n := len(p.nodes)
	if p.opt.NodeChoice == ChoiceFirst {
		for i := range n {
			ok, res, err := p.fits(ctx, i, j)
			if err != nil || !ok {
				if err != nil {
					return placement{}, false, err
				}
				continue
			}
			return p.commit(ctx, i, j, res)
		}
		return placement{}, false, nil
	}

	toFind := int(numFeasibleNodesToFind(p.opt.Scoring.PercentageOfNodesToScore, int32(n)))
	var feasible scoreHeap
	results := map[int][]resourceapi.DeviceRequestAllocationResult{}
	processed := 0
	for k := 0; k < n && len(feasible) < toFind; k++ {
		i := (p.nextStart + k) % n
		processed++
		ok, res, err := p.fits(ctx, i, j)
		if err != nil {
			return placement{}, false, err
		}
		if ok {
			feasible = append(feasible, scoredNode{node: i, score: p.opt.Scoring.score(p.nodes[i].pods)})
			results[i] = res
		}
	}
	p.nextStart = (p.nextStart + processed) % n
	if len(feasible) == 0 {
		return placement{}, false, nil
	}
	i := popBest(feasible)
	return p.commit(ctx, i, j, results[i])
}

// commit records j on node i with res, allocating first when the fit was known
// without a call.
func (p *allocatorPlacer) commit(ctx context.Context, i int, j *Job, res []resourceapi.DeviceRequestAllocationResult) (placement, bool, error) {
	n := p.nodes[i]
	if res == nil {
		var err error
		if res, err = p.allocate(ctx, i, j); err != nil {
			return placement{}, false, err
		}
		if res == nil {
			return placement{}, false, fmt.Errorf("node %s: refused job %d after accepting a larger claim", n.node.Name, j.ID)
		}
	}
	g, u, err := p.model.use(&res[0])
	if err != nil {
		return placement{}, false, fmt.Errorf("node %s: %w", n.node.Name, err)
	}
	commit(n.state, res)
	n.changed()
	n.pods++
	delete(p.claims, j.ID)
	return placement{gpu: i*GPUsPerNode + g, node: i, use: u, results: res}, true, nil
}

func (p *allocatorPlacer) release(pl placement) {
	n := p.nodes[pl.node]
	uncommit(n.state, pl.results)
	n.changed()
	n.pods--
}

// popBest is the node schedulePod takes from the feasible nodes h, in filter order.
func popBest(h scoreHeap) int {
	heap.Init(&h)
	return heap.Pop(&h).(scoredNode).node
}
