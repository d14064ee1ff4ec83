package fleet

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// SchedulerFeatures is the allocator feature set kube-scheduler 1.37 enables by
// default (the beta DRA gates); it selects the "incubating" allocator.
var SchedulerFeatures = structured.Features{
	AdminAccess:             true,
	ConsumableCapacity:      true,
	DeviceBindingAndStatus:  true,
	DeviceTaints:            true,
	PartitionableDevices:    true,
	PrioritizedList:         true,
	FractionalCapacityRange: true,
}

// Options control one simulation run.
type Options struct {
	// Nodes is the fleet size; every node is an hgx-h100 (8 GPUs).
	Nodes int
	// Check verifies after every placement that no GPU is over capacity, that a
	// whole GPU is never shared and that partitions never overlap; a violation ends
	// the run with an error.
	Check bool
	// AlwaysAsk calls the allocator on every node even where the answer is known
	// (a node that refused a claim at least as small and has not changed since).
	// The answer is the same; only the run is slower. For tests.
	AlwaysAsk bool
}

// Result is what one run of one model over one stream measured.
type Result struct {
	Kind       Kind
	MeanDemand float64
	Jobs       int
	// Window is the measurement window in simulated seconds: from the arrival of
	// the first tenth of the jobs (warm-up) to the last arrival.
	WindowStart, WindowEnd float64
	// JobsPerHour counts completions inside the window.
	JobsPerHour float64
	// MeanActiveGPUs is the time-average of GPUs running at least one job in the window.
	MeanActiveGPUs float64
	// MemUtilActive is used memory / memory of active GPUs, time-averaged in the window.
	MemUtilActive float64
	// WaitP50 and WaitP99 are over all jobs, in seconds (every job eventually runs).
	WaitP50, WaitP99 float64
	// Makespan is when the last job completed.
	Makespan float64
	// MaxJobsPerGPU is the most jobs one GPU ever ran at once.
	MaxJobsPerGPU int
	// AllocatorCalls counts Allocate calls (0 for the oracle and fluid models).
	AllocatorCalls int
	// Starts is the start time of every job, by job ID (for tests).
	Starts []float64
}

// gpuUse is what one allocated device takes of its GPU.
type gpuUse struct {
	whole  bool
	memory int64 // bytes
	cores  int64 // percent
	slots  uint8 // eighths of the GPU, for fixed partitions
}

type placement struct {
	gpu     int // global GPU index; -1 for the fluid model
	node    int
	use     gpuUse
	results []resourceapi.DeviceRequestAllocationResult
}

// placer is one allocation model: it starts a job when it has room.
type placer interface {
	place(ctx context.Context, j *Job) (placement, bool, error)
	release(p placement)
}

// Run replays jobs (from w.Generate) against one model and measures it.
//
// The simulation is discrete-event over a simulated clock: arrivals and completions
// are the only events. The queue is FIFO with head-of-line blocking: when the head
// job cannot be placed, nothing is tried again until a job completes (that is the
// default scheduler with equal priorities; without backfill nothing overtakes the
// head). A job goes to the first node, in node order, whose allocation succeeds
// (the scheduler with equal node scores). Every placement attempt for the device
// models is a real structured.Allocator call against the node's current
// AllocatedState; results are fed back into that state as the scheduler does.
func Run(ctx context.Context, kind Kind, w Workload, jobs []Job, opt Options) (Result, error) {
	if opt.Nodes < 1 {
		return Result{}, errors.New("fleet: at least one node")
	}
	gpus := opt.Nodes * GPUsPerNode
	var p placer
	var calls *int
	switch kind {
	case Fluid:
		p = &fluidPlacer{free: float64(gpus)}
	case TesseraBestFit:
		p = newOraclePlacer(gpus, true)
	default:
		m, err := newDeviceModel(kind)
		if err != nil {
			return Result{}, err
		}
		ap, err := newAllocatorPlacer(m, opt)
		if err != nil {
			return Result{}, err
		}
		p, calls = ap, &ap.calls
	}
	return simulate(ctx, kind, w, jobs, opt, p, calls)
}

func simulate(ctx context.Context, kind Kind, w Workload, jobs []Job, opt Options, p placer, calls *int) (Result, error) {
	gpus := opt.Nodes * GPUsPerNode
	r := Result{Kind: kind, MeanDemand: w.MeanDemand, Jobs: len(jobs), Starts: make([]float64, len(jobs))}
	if len(jobs) == 0 {
		return r, nil
	}
	r.WindowStart, r.WindowEnd = jobs[len(jobs)/10].Arrival, jobs[len(jobs)-1].Arrival

	load := make([]struct {
		n      int
		demand float64
		use    []gpuUse
	}, gpus)
	var (
		now, active, totalDemand float64
		activeArea, usedArea     float64
		completedInWindow        int
		queue                    []int // job indices, FIFO
		blocked                  bool  // the head failed and nothing completed since
		running                  completions
		next                     int // next arrival
		waits                    = make([]float64, 0, len(jobs))
		placements               = make(map[int]placement)
	)
	activeGPUs := func() float64 {
		if kind == Fluid {
			return math.Ceil(totalDemand - 1e-9)
		}
		return active
	}
	advance := func(t float64) {
		lo, hi := max(now, r.WindowStart), min(t, r.WindowEnd)
		if hi > lo {
			activeArea += activeGPUs() * (hi - lo)
			usedArea += totalDemand * (hi - lo)
		}
		now = t
	}

	for next < len(jobs) || running.Len() > 0 {
		// Completions first on ties: they free capacity for what arrives at that instant.
		if running.Len() > 0 && (next == len(jobs) || running[0].at <= jobs[next].Arrival) {
			c := heap.Pop(&running).(completion)
			advance(c.at)
			j := &jobs[c.job]
			pl := placements[c.job]
			delete(placements, c.job)
			p.release(pl)
			totalDemand -= j.Demand
			if pl.gpu >= 0 {
				g := &load[pl.gpu]
				g.n--
				g.demand -= j.Demand
				if g.n == 0 {
					active--
					g.demand = 0
				}
				if opt.Check {
					i := slices.Index(g.use, pl.use)
					g.use = slices.Delete(g.use, i, i+1)
				}
			}
			if c.at >= r.WindowStart && c.at <= r.WindowEnd {
				completedInWindow++
			}
			r.Makespan = c.at
			blocked = false
		} else {
			advance(jobs[next].Arrival)
			queue = append(queue, next)
			next++
		}
		for !blocked && len(queue) > 0 {
			j := &jobs[queue[0]]
			pl, ok, err := p.place(ctx, j)
			if err != nil {
				return r, fmt.Errorf("%s: job %d (demand %.3f): %w", kind, j.ID, j.Demand, err)
			}
			if !ok {
				blocked = true
				break
			}
			queue = queue[1:]
			placements[j.ID] = pl
			r.Starts[j.ID] = now
			waits = append(waits, now-j.Arrival)
			heap.Push(&running, completion{at: now + j.Runtime, job: j.ID})
			totalDemand += j.Demand
			if pl.gpu >= 0 {
				g := &load[pl.gpu]
				if g.n == 0 {
					active++
				}
				g.n++
				g.demand += j.Demand
				r.MaxJobsPerGPU = max(r.MaxJobsPerGPU, g.n)
				if opt.Check {
					g.use = append(g.use, pl.use)
					if err := checkGPU(g.use); err != nil {
						return r, fmt.Errorf("%s: GPU %d (node %d) after job %d: %w", kind, pl.gpu, pl.node, j.ID, err)
					}
				}
			}
		}
	}

	window := r.WindowEnd - r.WindowStart
	if window > 0 {
		r.JobsPerHour = float64(completedInWindow) / window * 3600
		r.MeanActiveGPUs = activeArea / window
	}
	if activeArea > 0 {
		r.MemUtilActive = usedArea / activeArea
	}
	slices.Sort(waits)
	r.WaitP50, r.WaitP99 = percentile(waits, 0.50), percentile(waits, 0.99)
	if calls != nil {
		r.AllocatorCalls = *calls
	}
	return r, nil
}

// checkGPU is the conservation check: what runs on one GPU fits on it.
func checkGPU(uses []gpuUse) error {
	var mem, cores int64
	var slots uint8
	for _, u := range uses {
		if u.whole && len(uses) > 1 {
			return fmt.Errorf("whole GPU shared by %d jobs", len(uses))
		}
		if slots&u.slots != 0 {
			return fmt.Errorf("partitions overlap (slots %08b and %08b)", slots, u.slots)
		}
		slots |= u.slots
		mem += u.memory
		cores += u.cores
	}
	if mem > gpuMemory.Value() || cores > 100 {
		return fmt.Errorf("over capacity: memory %d > %d or cores %d > 100", mem, gpuMemory.Value(), cores)
	}
	return nil
}

func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

type completion struct {
	at  float64
	job int
}

// completions is a min-heap on time, then job ID (deterministic on ties).
type completions []completion

func (h completions) Len() int { return len(h) }
func (h completions) Less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].job < h[j].job)
}
func (h completions) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *completions) Push(x any)   { *h = append(*h, x.(completion)) }
func (h *completions) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// --- allocator-backed models -----------------------------------------------------------

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, name := range slices.Sorted(maps.Keys(l)) {
		out = append(out, l[name])
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("deviceclass %q not found", name)
}

func newClassLister(classes []*resourceapi.DeviceClass) classLister {
	l := classLister{}
	for _, c := range classes {
		l[c.Name] = c
	}
	return l
}

func newCELCache() *cel.Cache {
	return cel.NewCache(100, cel.Features{EnableConsumableCapacity: true})
}

func newAllocatedState() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

// commit records an allocation in the state the way kube-scheduler's allocated-devices
// tracker does: shares by shareID plus their consumed capacity, whole devices by ID.
func commit(state structured.AllocatedState, results []resourceapi.DeviceRequestAllocationResult) {
	for _, r := range results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			state.AllocatedDevices.Insert(id)
			continue
		}
		state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}

// uncommit is the inverse of commit: the claim was deallocated.
func uncommit(state structured.AllocatedState, results []resourceapi.DeviceRequestAllocationResult) {
	for _, r := range results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			state.AllocatedDevices.Delete(id)
			continue
		}
		state.AllocatedSharedDeviceIDs.Delete(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			state.AggregatedCapacity.Remove(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}

type simNode struct {
	node   *v1.Node
	slices []*resourceapi.ResourceSlice
	state  structured.AllocatedState
	// alloc is valid for the current state; nil after any change (the allocator
	// caches the counters left in each pool, so it must not outlive the state).
	alloc structured.Allocator
	// refused is the smallest size key this node refused since it last changed.
	refused float64
}

type allocatorPlacer struct {
	model   deviceModel
	nodes   []*simNode
	classes classLister
	cel     *cel.Cache
	opt     Options
	calls   int
}

func newAllocatorPlacer(m deviceModel, opt Options) (*allocatorPlacer, error) {
	p := &allocatorPlacer{model: m, classes: newClassLister(m.classes()), cel: newCELCache(), opt: opt}
	for i := range opt.Nodes {
		name := fmt.Sprintf("node-%03d", i)
		sl, err := m.slices(name)
		if err != nil {
			return nil, err
		}
		p.nodes = append(p.nodes, &simNode{
			node:    &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}},
			slices:  sl,
			state:   newAllocatedState(),
			refused: math.Inf(1),
		})
	}
	return p, nil
}

func (p *allocatorPlacer) place(ctx context.Context, j *Job) (placement, bool, error) {
	key := p.model.sizeKey(j)
	var claim *resourceapi.ResourceClaim
	for i, n := range p.nodes {
		if key >= n.refused && !p.opt.AlwaysAsk {
			continue
		}
		if n.alloc == nil {
			a, err := structured.NewAllocator(ctx, SchedulerFeatures, n.state, p.classes, n.slices, p.cel)
			if err != nil {
				return placement{}, false, err
			}
			n.alloc = a
		}
		if claim == nil {
			claim = p.model.claim(j)
		}
		p.calls++
		res, err := n.alloc.Allocate(ctx, n.node, []*resourceapi.ResourceClaim{claim})
		if err != nil {
			return placement{}, false, fmt.Errorf("node %s: %w", n.node.Name, err)
		}
		if len(res) == 0 {
			n.refused = min(n.refused, key)
			continue
		}
		results := res[0].Devices.Results
		if len(results) != 1 {
			return placement{}, false, fmt.Errorf("node %s: %d devices allocated for one request", n.node.Name, len(results))
		}
		g, u, err := p.model.use(&results[0])
		if err != nil {
			return placement{}, false, fmt.Errorf("node %s: %w", n.node.Name, err)
		}
		commit(n.state, results)
		n.alloc, n.refused = nil, math.Inf(1)
		return placement{gpu: i*GPUsPerNode + g, node: i, use: u, results: results}, true, nil
	}
	return placement{}, false, nil
}

func (p *allocatorPlacer) release(pl placement) {
	n := p.nodes[pl.node]
	uncommit(n.state, pl.results)
	n.alloc, n.refused = nil, math.Inf(1)
}

// --- fluid bound ---------------------------------------------------------------------

type fluidPlacer struct{ free float64 }

func (p *fluidPlacer) place(_ context.Context, j *Job) (placement, bool, error) {
	if j.Demand > p.free+1e-9 {
		return placement{}, false, nil
	}
	p.free -= j.Demand
	return placement{gpu: -1, use: gpuUse{memory: int64(j.Demand * float64(gpuMemory.Value()))}}, true, nil
}

func (p *fluidPlacer) release(pl placement) {
	p.free += float64(pl.use.memory) / float64(gpuMemory.Value())
}

// --- packing oracle ----------------------------------------------------------------------

// oraclePlacer packs Tessera's share requests without the allocator: best-fit (the
// fullest GPU that still fits, fleet-wide) or first-fit (node order, GPU order, which
// is what the allocator does; tests compare the two).
type oraclePlacer struct {
	bestFit bool
	mem     []int64 // free bytes per GPU
	cores   []int64
}

func newOraclePlacer(gpus int, bestFit bool) *oraclePlacer {
	p := &oraclePlacer{bestFit: bestFit, mem: make([]int64, gpus), cores: make([]int64, gpus)}
	for g := range gpus {
		p.mem[g], p.cores[g] = gpuMemory.Value(), 100
	}
	return p
}

func (p *oraclePlacer) place(_ context.Context, j *Job) (placement, bool, error) {
	memQ, coresQ := ShareRequest(j.Demand)
	mem, cores := memQ.Value(), coresQ.Value()
	best := -1
	for g := range p.mem {
		if p.mem[g] < mem || p.cores[g] < cores {
			continue
		}
		if !p.bestFit {
			best = g
			break
		}
		if best < 0 || p.mem[g] < p.mem[best] {
			best = g
		}
	}
	if best < 0 {
		return placement{}, false, nil
	}
	p.mem[best] -= mem
	p.cores[best] -= cores
	return placement{gpu: best, node: best / GPUsPerNode, use: gpuUse{memory: mem, cores: cores}}, true, nil
}

func (p *oraclePlacer) release(pl placement) {
	p.mem[pl.gpu] += pl.use.memory
	p.cores[pl.gpu] += pl.use.cores
}
