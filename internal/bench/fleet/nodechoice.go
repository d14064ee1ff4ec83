package fleet

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"math"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/fraction"
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

// Scoring is what the score plugins see: the allocatable cpu and memory of
// nodes whose NodeSpec leaves them 0, and the requests of job pods that name
// none (0: none, so the non-zero defaults apply to LeastAllocated and
// BalancedAllocation skips the pod).
type Scoring struct {
	NodeMilliCPU, NodeMemory int64
	PodMilliCPU, PodMemory   int64
	// PercentageOfNodesToScore is the scheduler's setting; 0 is adaptive.
	PercentageOfNodesToScore int32
	// MaxPods is every node's pod capacity (NodeResourcesFit filters on it);
	// 0 is 110, the kubelet's default and hack/scale's fake nodes'.
	MaxPods int
}

// DefaultScoring is a fake node of hack/scale (128 cpu, 1Ti, 110 pods:
// scale.FakeNode) and pods without requests.
var DefaultScoring = Scoring{NodeMilliCPU: 128000, NodeMemory: 1 << 40}

const (
	defaultMilliCPURequest = 100               // schedutil.DefaultMilliCPURequest
	defaultMemoryRequest   = 200 * 1024 * 1024 // schedutil.DefaultMemoryRequest
	defaultMaxPods         = 110
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

// podRequests is what the score plugins count of one pod: its requests
// (0: none) and the non-zero versions LeastAllocated uses.
type podRequests struct{ cpu, mem, nzCPU, nzMem int64 }

func (s Scoring) requestsOf(j *Job) podRequests {
	r := podRequests{cpu: j.MilliCPU, mem: j.MemoryMiB << 20}
	if r.cpu == 0 && r.mem == 0 {
		r.cpu, r.mem = s.PodMilliCPU, s.PodMemory
	}
	r.nzCPU, r.nzMem = r.cpu, r.mem
	if r.nzCPU == 0 {
		r.nzCPU = defaultMilliCPURequest
	}
	if r.nzMem == 0 {
		r.nzMem = defaultMemoryRequest
	}
	return r
}

// nodeLoad is what a node's pods request in sum.
type nodeLoad struct {
	pods                   int
	cpu, mem, nzCPU, nzMem int64
	allocCPU, allocMem     int64
}

func (l *nodeLoad) add(r podRequests, sign int64) {
	l.pods += int(sign)
	l.cpu += sign * r.cpu
	l.mem += sign * r.mem
	l.nzCPU += sign * r.nzCPU
	l.nzMem += sign * r.nzMem
}

// room is NodeResourcesFit's filter: the pod count and the pod's cpu and
// memory requests against what the node allocates.
func (l *nodeLoad) room(r podRequests, maxPods int) bool {
	if l.pods+1 > maxPods {
		return false
	}
	if r.cpu > 0 && l.allocCPU > 0 && l.cpu+r.cpu > l.allocCPU {
		return false
	}
	if r.mem > 0 && l.allocMem > 0 && l.mem+r.mem > l.allocMem {
		return false
	}
	return true
}

// score is the sum of the weighted scores that differ between nodes for a
// job pod with requests r landing on a node with load l: NodeResourcesFit
// (LeastAllocated over cpu and memory with non-zero requests) and
// NodeResourcesBalancedAllocation (the pod's own requests, none for a
// best-effort pod).
func (l *nodeLoad) score(r podRequests) int64 {
	least := func(req, capacity int64) int64 {
		if capacity == 0 || req > capacity {
			return 0
		}
		return (capacity - req) * maxNodeScore / capacity
	}
	var fit int64
	var weights int64
	for _, x := range []struct{ req, capacity int64 }{{l.nzCPU + r.nzCPU, l.allocCPU}, {l.nzMem + r.nzMem, l.allocMem}} {
		if x.capacity == 0 {
			continue
		}
		fit += least(x.req, x.capacity)
		weights++
	}
	if weights > 0 {
		fit /= weights
	}
	var balanced int64
	if (r.cpu > 0 || r.mem > 0) && l.allocCPU > 0 && l.allocMem > 0 {
		bal := func(c, m int64) int64 {
			fc, fm := math.Min(float64(c)/float64(l.allocCPU), 1), math.Min(float64(m)/float64(l.allocMem), 1)
			return int64((1 - math.Abs(fc-fm)/2) * maxNodeScore)
		}
		with := bal(l.cpu+r.cpu, l.mem+r.mem)
		without := bal(l.cpu, l.mem)
		balanced = maxNodeScore/2 + (maxNodeScore/2+with-without)/2
	}
	return fit + balanced
}

// score is nodeLoad.score for a node of this Scoring's size that already
// runs pods job pods, all with the Scoring's requests.
func (s Scoring) score(pods int) int64 {
	r := s.requestsOf(&Job{})
	l := nodeLoad{allocCPU: s.NodeMilliCPU, allocMem: s.NodeMemory}
	for range pods {
		l.add(r, 1)
	}
	return l.score(r)
}

// scoredNode is fwk.NodePluginScores with Randomizer 0.
type scoredNode struct {
	node  int
	score int64
}

// scoreHeap is framework.sortedNodeScores' heap with every Randomizer 0.
type scoreHeap = orderedHeap[scoredNode]

func (a scoredNode) before(b scoredNode) bool { return a.score > b.score }

// size is a claim's size for the known-answer shortcuts: claims of one
// class (the same kind of request, type constraint and NVLink need) are
// ordered by device count and then memory and cores.
type size struct {
	class      string
	count      int
	mem, cores float64
}

func (a size) le(b size) bool {
	return a.class == b.class && a.count <= b.count && a.mem <= b.mem && a.cores <= b.cores
}

type simNode struct {
	node    *v1.Node
	spec    NodeSpec
	gpuBase int // global index of its GPU 0
	slices  []*resourceapi.ResourceSlice
	state   structured.AllocatedState
	// alloc is valid for the current state; nil after any change (the allocator
	// caches the counters left in each pool, so it must not outlive the state).
	alloc structured.Allocator
	// refused are minimal sizes this node refused, accepted maximal sizes it
	// accepted, since it last changed.
	refused, accepted []size
	load              nodeLoad
	// subrequest is the name of the firstAvailable subrequest of a share
	// claim that matches this node's GPU model ("" without GPUs).
	subrequest string
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
	maxPods   int
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
	p := &allocatorPlacer{model: m, classes: newClassLister(m.classes()), cel: newCELCache(), opt: opt,
		claims: map[int]*resourceapi.ResourceClaim{}, maxPods: opt.Scoring.MaxPods}
	if p.maxPods == 0 {
		p.maxPods = defaultMaxPods
	}
	base := 0
	for i, spec := range opt.fleet().Nodes {
		name := fmt.Sprintf("node-%03d", i)
		sl, err := m.slices(name, spec)
		if err != nil {
			return nil, err
		}
		n := &simNode{
			node:    &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}},
			spec:    spec,
			gpuBase: base,
			slices:  sl,
			state:   model.NewAllocatedState(),
			load:    nodeLoad{allocCPU: cmp.Or(spec.MilliCPU, opt.Scoring.NodeMilliCPU), allocMem: cmp.Or(spec.MemoryMiB<<20, opt.Scoring.NodeMemory)},
		}
		if spec.GPUs > 0 {
			fm, err := fractionModel(spec.Model)
			if err != nil {
				return nil, err
			}
			n.subrequest = fraction.SubrequestName(fm)
		}
		p.nodes = append(p.nodes, n)
		base += spec.GPUs
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

// allocate runs the allocator for j (of size key) on node i; nil results: it does not fit.
func (p *allocatorPlacer) allocate(ctx context.Context, i int, j *Job, key size) ([]resourceapi.DeviceRequestAllocationResult, error) {
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
	if len(res) == 0 {
		n.refused = append(n.refused, key)
		return nil, nil
	}
	n.accepted = append(n.accepted, key)
	if got := len(res[0].Devices.Results); got != j.gpuCount() {
		return nil, fmt.Errorf("node %s: %d devices allocated for job %d, which asks for %d", n.node.Name, got, j.ID, j.gpuCount())
	}
	return res[0].Devices.Results, nil
}

// attempt is what one placement attempt of a job computes once for every node.
type attempt struct {
	key size
	req podRequests
}

// fits says whether j fits on node i, from the known answers when there is one.
func (p *allocatorPlacer) fits(ctx context.Context, i int, j *Job, a attempt) (bool, []resourceapi.DeviceRequestAllocationResult, error) {
	n := p.nodes[i]
	if !n.load.room(a.req, p.maxPods) {
		return false, nil, nil
	}
	if j.CPUOnly {
		return true, nil, nil
	}
	key := a.key
	if !p.opt.AlwaysAsk {
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
	res, err := p.allocate(ctx, i, j, key)
	return res != nil, res, err
}

// draScore is DynamicResources' raw score of j's claim on node i: for a
// firstAvailable request, FirstAvailableDeviceRequestMaxSize less the index
// of the subrequest the node's GPUs satisfy; 0 for exact requests.
func (p *allocatorPlacer) draScore(i int, j *Job) int64 {
	c, err := p.claim(j)
	if err != nil || c == nil {
		return 0
	}
	var score int64
	for _, req := range c.Spec.Devices.Requests {
		for k, sub := range req.FirstAvailable {
			if sub.Name == p.nodes[i].subrequest {
				score += int64(resourceapi.FirstAvailableDeviceRequestMaxSize - k)
			}
		}
	}
	return score
}

func (p *allocatorPlacer) place(ctx context.Context, j *Job) (placement, bool, error) {
	n := len(p.nodes)
	a := attempt{key: p.model.sizeKey(j), req: p.opt.Scoring.requestsOf(j)}
	if p.opt.NodeChoice == ChoiceFirst {
		for i := range n {
			ok, res, err := p.fits(ctx, i, j, a)
			if err != nil || !ok {
				if err != nil {
					return placement{}, false, err
				}
				continue
			}
			return p.commit(ctx, i, j, a, res)
		}
		return placement{}, false, nil
	}

	toFind := int(numFeasibleNodesToFind(p.opt.Scoring.PercentageOfNodesToScore, int32(n)))
	var feasible scoreHeap
	var dra []int64
	var top int64
	results := map[int][]resourceapi.DeviceRequestAllocationResult{}
	processed := 0
	for k := 0; k < n && len(feasible) < toFind; k++ {
		i := (p.nextStart + k) % n
		processed++
		ok, res, err := p.fits(ctx, i, j, a)
		if err != nil {
			return placement{}, false, err
		}
		if ok {
			feasible = append(feasible, scoredNode{node: i, score: p.nodes[i].load.score(a.req)})
			d := p.draScore(i, j)
			dra = append(dra, d)
			top = max(top, d)
			if res != nil {
				results[i] = res
			}
		}
	}
	p.nextStart = (p.nextStart + processed) % n
	if len(feasible) == 0 {
		return placement{}, false, nil
	}
	// DynamicResources' NormalizeScore: DefaultNormalizeScore to 0..100 over
	// the feasible nodes, weight 1.
	if top > 0 {
		for k := range feasible {
			feasible[k].score += maxNodeScore * dra[k] / top
		}
	}
	i := popBest(feasible)
	return p.commit(ctx, i, j, a, results[i])
}

// commit records j on node i with res, allocating first when the fit was known
// without a call.
func (p *allocatorPlacer) commit(ctx context.Context, i int, j *Job, a attempt, res []resourceapi.DeviceRequestAllocationResult) (placement, bool, error) {
	n := p.nodes[i]
	if res == nil && !j.CPUOnly {
		var err error
		if res, err = p.allocate(ctx, i, j, a.key); err != nil {
			return placement{}, false, err
		}
		if res == nil {
			return placement{}, false, fmt.Errorf("node %s: refused job %d after accepting a larger claim", n.node.Name, j.ID)
		}
	}
	pl := placement{node: i, job: j.ID, results: res}
	for k := range res {
		g, u, err := p.model.use(&res[k], n.spec)
		if err != nil {
			return placement{}, false, fmt.Errorf("node %s: %w", n.node.Name, err)
		}
		pl.gpus, pl.uses = append(pl.gpus, n.gpuBase+g), append(pl.uses, u)
	}
	if len(res) > 0 {
		commit(n.state, res)
		n.changed()
	}
	n.load.add(a.req, 1)
	delete(p.claims, j.ID)
	return pl, true, nil
}

func (p *allocatorPlacer) release(pl placement, j *Job) {
	n := p.nodes[pl.node]
	if len(pl.results) > 0 {
		uncommit(n.state, pl.results)
		n.changed()
	}
	n.load.add(p.opt.Scoring.requestsOf(j), -1)
}

// popBest is the node schedulePod takes from the feasible nodes h, in filter order.
func popBest(h scoreHeap) int {
	heap.Init(&h)
	return heap.Pop(&h).(scoredNode).node
}
