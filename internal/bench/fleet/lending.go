package fleet

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/lending"
)

// LendingWorkload is the fleet of the lending model: GPUs each held whole by
// one owner (a notebook or dev pod) for the whole horizon, opted in to
// lending and busy part of the time in bursts, and a stream of preemptible
// batch borrowers. The same LendingWorkload always generates the same owners
// and borrowers, whatever the policy they are replayed against.
type LendingWorkload struct {
	Seed int64
	// GPUs is the number of owned GPUs, one owner each.
	GPUs int
	// Horizon is the simulated time.
	Horizon time.Duration
	// GPUMemory is each GPU's memory, in bytes.
	GPUMemory int64
	// BusyFraction is the range each owner's share of busy time is drawn
	// from (uniformly, once per owner).
	BusyFraction [2]float64
	// BurstMean is the range each owner's mean busy burst is drawn from;
	// bursts are exponential with that mean, idle gaps exponential with the
	// mean that gives the owner its busy fraction.
	BurstMean [2]time.Duration
	// OwnerMemory is the range of the memory an idle owner keeps (drawn
	// once per owner, whole GiB); BusyMemory is what it adds while busy.
	OwnerMemory [2]int64
	BusyMemory  int64
	// BorrowerLoad is the borrowers' offered work relative to the owners'
	// expected idle GPU time: Poisson arrivals at BorrowerLoad × GPUs ×
	// (1 − mean busy fraction) / mean work. Above 1 the queue never drains,
	// so what borrowers get is limited by lending, not by demand.
	BorrowerLoad float64
	// Work is the range of a borrower's GPU work (uniform).
	Work [2]time.Duration
	// BorrowerMemory is the range of a borrower's memory (uniform, whole
	// GiB). Every borrower must fit what any idle owner leaves.
	BorrowerMemory [2]int64
}

// DefaultLendingWorkload is 64 H100-sized GPUs over three days, owners busy
// 20–40 % of the time in bursts of 10–30 min on average, keeping 5–20 GiB
// while idle, and borrowers of 30–240 min of work offered at 1.25× the
// owners' idle time.
func DefaultLendingWorkload(seed int64) LendingWorkload {
	return LendingWorkload{
		Seed:           seed,
		GPUs:           64,
		Horizon:        72 * time.Hour,
		GPUMemory:      80 << 30,
		BusyFraction:   [2]float64{0.2, 0.4},
		BurstMean:      [2]time.Duration{10 * time.Minute, 30 * time.Minute},
		OwnerMemory:    [2]int64{5 << 30, 20 << 30},
		BusyMemory:     20 << 30,
		BorrowerLoad:   1.25,
		Work:           [2]time.Duration{30 * time.Minute, 240 * time.Minute},
		BorrowerMemory: [2]int64{8 << 30, 40 << 30},
	}
}

// Validate reports a workload the model cannot run, naming the field.
func (w LendingWorkload) Validate(p lending.Policy) error {
	switch {
	case w.GPUs <= 0:
		return fmt.Errorf("lending workload GPUs %d: must be positive", w.GPUs)
	case w.Horizon <= 0:
		return fmt.Errorf("lending workload Horizon %s: must be positive", w.Horizon)
	case w.GPUMemory <= 0:
		return fmt.Errorf("lending workload GPUMemory %d: must be positive", w.GPUMemory)
	case !(0 < w.BusyFraction[0] && w.BusyFraction[0] <= w.BusyFraction[1] && w.BusyFraction[1] < 1):
		return fmt.Errorf("lending workload BusyFraction %v: want 0 < low <= high < 1", w.BusyFraction)
	case !(0 < w.BurstMean[0] && w.BurstMean[0] <= w.BurstMean[1]):
		return fmt.Errorf("lending workload BurstMean %v: want 0 < low <= high", w.BurstMean)
	case !(0 <= w.OwnerMemory[0] && w.OwnerMemory[0] <= w.OwnerMemory[1]) || w.BusyMemory < 0:
		return fmt.Errorf("lending workload OwnerMemory %v, BusyMemory %d: want 0 <= low <= high and BusyMemory >= 0", w.OwnerMemory, w.BusyMemory)
	case w.OwnerMemory[1]+w.BusyMemory > w.GPUMemory:
		return fmt.Errorf("lending workload OwnerMemory %v + BusyMemory %d: more than GPUMemory %d", w.OwnerMemory, w.BusyMemory, w.GPUMemory)
	case !(w.BorrowerLoad > 0) || math.IsInf(w.BorrowerLoad, 0):
		return fmt.Errorf("lending workload BorrowerLoad %v: must be positive", w.BorrowerLoad)
	case !(0 < w.Work[0] && w.Work[0] <= w.Work[1]):
		return fmt.Errorf("lending workload Work %v: want 0 < low <= high", w.Work)
	case !(0 < w.BorrowerMemory[0] && w.BorrowerMemory[0] <= w.BorrowerMemory[1]):
		return fmt.Errorf("lending workload BorrowerMemory %v: want 0 < low <= high", w.BorrowerMemory)
	}
	if lendable := w.GPUMemory - w.OwnerMemory[1] - p.Reserve; w.BorrowerMemory[1] > lendable {
		return fmt.Errorf("lending workload BorrowerMemory %v: more than the %d bytes the most demanding idle owner leaves (GPUMemory - OwnerMemory high - policy Reserve)", w.BorrowerMemory, lendable)
	}
	return nil
}

// LendingOwner is one owner's activity: it holds its GPU all horizon long.
type LendingOwner struct {
	// Busy are the owner's busy intervals in simulated seconds, sorted and
	// disjoint, clipped to the horizon.
	Busy [][2]float64
	// Memory is what the owner keeps on the GPU while idle, in bytes;
	// BusyMemory is what it adds while busy.
	Memory, BusyMemory int64
}

// Borrower is one preemptible batch job.
type Borrower struct {
	ID int
	// Arrival is when the borrower's pod is created, in simulated seconds;
	// an evicted borrower goes back to the queue with it.
	Arrival float64
	// Work is the GPU time the borrower needs, in seconds.
	Work float64
	// Memory is what it asks of the lending device, in bytes.
	Memory int64
}

// Generate draws the owners and the borrowers.
func (w LendingWorkload) Generate() ([]LendingOwner, []Borrower) {
	horizon := w.Horizon.Seconds()
	owners := make([]LendingOwner, w.GPUs)
	for g := range owners {
		rng := rand.New(rand.NewPCG(uint64(w.Seed), uint64(g)))
		f := uniform(rng, w.BusyFraction[0], w.BusyFraction[1])
		burst := uniform(rng, w.BurstMean[0].Seconds(), w.BurstMean[1].Seconds())
		gap := burst * (1 - f) / f
		owners[g].BusyMemory = w.BusyMemory
		owners[g].Memory = gib(uniform(rng, float64(w.OwnerMemory[0]), float64(w.OwnerMemory[1])))
		// The owner starts busy with its busy fraction's probability; the
		// first interval is as long as any other (exponential durations
		// have no memory).
		busy, t := rng.Float64() < f, 0.0
		for t < horizon {
			mean := gap
			if busy {
				mean = burst
			}
			end := min(t+rng.ExpFloat64()*mean, horizon)
			if busy && end > t {
				owners[g].Busy = append(owners[g].Busy, [2]float64{t, end})
			}
			t, busy = end, !busy
		}
	}
	rng := rand.New(rand.NewPCG(uint64(w.Seed), math.MaxUint64))
	meanWork := (w.Work[0] + w.Work[1]).Seconds() / 2
	meanBusy := (w.BusyFraction[0] + w.BusyFraction[1]) / 2
	rate := w.BorrowerLoad * float64(w.GPUs) * (1 - meanBusy) / meanWork
	var borrowers []Borrower
	for t := rng.ExpFloat64() / rate; t < horizon; t += rng.ExpFloat64() / rate {
		borrowers = append(borrowers, Borrower{
			ID:      len(borrowers),
			Arrival: t,
			Work:    uniform(rng, w.Work[0].Seconds(), w.Work[1].Seconds()),
			Memory:  gib(uniform(rng, float64(w.BorrowerMemory[0]), float64(w.BorrowerMemory[1]))),
		})
	}
	return owners, borrowers
}

func uniform(rng *rand.Rand, lo, hi float64) float64 { return lo + rng.Float64()*(hi-lo) }

// gib rounds bytes to whole GiB.
func gib(bytes float64) int64 { return int64(math.Round(bytes/(1<<30))) << 30 }

// LendingOptions are the node's and the borrowers' side of one run.
type LendingOptions struct {
	// Policy is the kubelet plugin's lending policy; every lend and reclaim
	// decision is lending.Step's with it.
	Policy lending.Policy
	// Sample is the plugin's sample interval: every GPU is stepped at every
	// multiple of it.
	Sample time.Duration
	// Grace is the borrowers' tolerationSeconds for the reclaim taint.
	Grace time.Duration
	// EvictionLatency is from the end of the grace to the borrower's pod gone
	// and its claim unprepared (kube-controller-manager's eviction, the pod's
	// termination, the unprepare).
	EvictionLatency time.Duration
	// StartLatency is from a borrower's allocation to its first GPU work
	// (binding, prepare, container start); the GPU is the borrower's
	// meanwhile.
	StartLatency time.Duration
	// CheckpointEvery is how much GPU work a borrower does between two
	// periodic checkpoints; an eviction loses the work since the last one.
	CheckpointEvery time.Duration
	// CheckpointWrite is how long a borrower takes to save its work when the
	// reclaim taint lands. A grace at least this long keeps all of its work
	// up to the taint (it stops computing to save); a shorter grace keeps
	// only its last periodic checkpoint.
	CheckpointWrite time.Duration
	// Trace records phases, placements and evictions in the result (tests).
	Trace bool
}

// DefaultLendingOptions: the node's default policy with the given idle
// period, the plugin's default sample interval (2 s,
// --lending-sample-interval), 3 s eviction latency, 5 s start latency,
// checkpoints every 10 min of work, 10 s to save on notice.
func DefaultLendingOptions(idle, grace time.Duration) LendingOptions {
	p := lending.DefaultPolicy()
	p.IdlePeriod = idle
	return LendingOptions{
		Policy:          p,
		Sample:          2 * time.Second,
		Grace:           grace,
		EvictionLatency: 3 * time.Second,
		StartLatency:    5 * time.Second,
		CheckpointEvery: 10 * time.Minute,
		CheckpointWrite: 10 * time.Second,
	}
}

// Validate reports options the model cannot run, naming the field.
func (o LendingOptions) Validate() error {
	if err := o.Policy.Validate(); err != nil {
		return err
	}
	switch {
	case o.Sample <= 0:
		return fmt.Errorf("lending options Sample %s: must be positive", o.Sample)
	case o.Grace < 0 || o.EvictionLatency < 0 || o.StartLatency < 0 || o.CheckpointWrite < 0:
		return fmt.Errorf("lending options Grace %s, EvictionLatency %s, StartLatency %s, CheckpointWrite %s: must not be negative", o.Grace, o.EvictionLatency, o.StartLatency, o.CheckpointWrite)
	case o.CheckpointEvery <= 0:
		return fmt.Errorf("lending options CheckpointEvery %s: must be positive", o.CheckpointEvery)
	}
	return nil
}

// ReclaimBound is the longest a borrower can stay on a GPU after its owner
// turns busy: a sample interval (the owner may turn busy just after a
// sample), the grace and the eviction latency.
func (o LendingOptions) ReclaimBound() time.Duration { return o.Sample + o.Grace + o.EvictionLatency }

// LendingResult is what one run measured. Times are in hours unless named
// otherwise.
type LendingResult struct {
	IdlePeriod      time.Duration `json:"idlePeriodNanoseconds"`
	Grace           time.Duration `json:"graceNanoseconds"`
	EvictionLatency time.Duration `json:"evictionLatencyNanoseconds"`
	Sample          time.Duration `json:"sampleNanoseconds"`
	// OwnerIdleGPUHours and OwnerBusyGPUHours split the owners' GPU time.
	OwnerIdleGPUHours float64 `json:"ownerIdleGPUHours"`
	OwnerBusyGPUHours float64 `json:"ownerBusyGPUHours"`
	// LentGPUHours is the GPU time in phase Lent.
	LentGPUHours float64 `json:"lentGPUHours"`
	// BorrowerGPUHours is the borrowers' useful work: work of completed
	// borrowers, work saved by evicted ones, and work of running ones at the
	// horizon. Lost work is not in it.
	BorrowerGPUHours float64 `json:"borrowerGPUHours"`
	// BorrowerShare is BorrowerGPUHours / OwnerIdleGPUHours.
	BorrowerShare float64 `json:"borrowerShare"`
	// LostGPUHours is borrower work thrown away by evictions.
	LostGPUHours float64 `json:"lostGPUHours"`
	// OwnerWaitHours is the time owners were busy while a borrower was on
	// their GPU; OwnerWaitShare is it over OwnerBusyGPUHours.
	OwnerWaitHours float64 `json:"ownerWaitHours"`
	OwnerWaitShare float64 `json:"ownerWaitShare"`
	// Loans counts entries into Lent; Reclaims counts reclaims that had
	// borrowers to evict.
	Loans    int `json:"loans"`
	Reclaims int `json:"reclaims"`
	// Evictions counts borrowers evicted (a reclaim evicts every borrower of
	// its GPU).
	Evictions int `json:"evictions"`
	// ReclaimP50 and ReclaimP99 (and the maximum) are from an owner turning
	// busy to the last borrower gone from its GPU, in seconds.
	ReclaimP50 float64 `json:"reclaimP50Seconds"`
	ReclaimP99 float64 `json:"reclaimP99Seconds"`
	ReclaimMax float64 `json:"reclaimMaxSeconds"`
	// Borrowers arrived; Completed finished their work within the horizon.
	Borrowers int `json:"borrowers"`
	Completed int `json:"completed"`
	// TotalWork and RemainingWork are the arrived borrowers' work, all and
	// not yet done, in GPU-hours.
	TotalWork     float64 `json:"totalWorkGPUHours"`
	RemainingWork float64 `json:"remainingWorkGPUHours"`
	// Steps counts lending.Step calls.
	Steps int64 `json:"steps"`
	// Trace is set with LendingOptions.Trace.
	Trace *LendingTrace `json:"-"`
}

// BorrowersMet is the target: borrowers use at least half the
// owners' idle GPU-hours.
func (r LendingResult) BorrowersMet() bool { return r.BorrowerShare >= 0.5 }

// OwnersMet is the target: owners' extra wait at most 1 % of their
// busy time.
func (r LendingResult) OwnersMet() bool { return r.OwnerWaitShare <= 0.01 }

// LendingTrace is what a run did, for checks that do not trust the
// simulator's own accounting.
type LendingTrace struct {
	// Phases are every GPU's phase changes (the result of lending.Step), in
	// time order.
	Phases [][]PhaseChange
	// Stays are the borrowers' stays on GPUs, in order of their start.
	Stays []Stay
}

// PhaseChange is a GPU entering Phase at T (simulated seconds).
type PhaseChange struct {
	T     float64
	Phase lending.Phase
}

// Stay is one borrower allocated one GPU's lending device from From until
// To (its pod gone), in simulated seconds.
type Stay struct {
	Borrower, GPU int
	From, To      float64
	// Evicted is false when the borrower finished (or the horizon ended).
	Evicted bool
	// Progress is the GPU work it did in the stay; Lost is what of it the
	// eviction threw away, in seconds.
	Progress, Lost float64
}

// lendingEpoch is simulated time 0 for lending.Step.
var lendingEpoch = time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)

// lendGPU is one GPU of the run.
type lendGPU struct {
	index      int
	owner      *LendingOwner
	next       int  // owner.Busy index of the next flip's interval
	busy       bool // the owner computes now
	busySeen   bool // the owner computed since the previous sample
	busyStart  float64
	state      lending.State
	obs        lending.Observation
	borrower   *lendBorrower // one borrower takes all of a lent GPU's cores
	accounted  float64       // overlap is accounted up to here
	reclaimRef float64       // owner's busy start that the running reclaim answers; NaN when none
}

type lendBorrower struct {
	Borrower
	uid      types.UID
	gpu      *lendGPU
	gpuIndex int
	saved    float64 // work kept by checkpoints
	placed   float64
	runFrom  float64
	stopAt   float64 // stops computing here to save on notice; +Inf when not
	gen      int     // events of an earlier stay carry an older gen
	stay     int     // index in the trace, -1 without one
}

// progress is the borrower's work done at t in its current stay.
func (b *lendBorrower) progress(t float64) float64 {
	return min(b.Work, b.saved+max(0, min(t, b.stopAt)-b.runFrom))
}

type lendEventKind uint8

const (
	lendOwnerFlip lendEventKind = iota
	lendArrival
	lendFinish
	lendEvict
)

type lendEvent struct {
	t    float64
	seq  int
	kind lendEventKind
	gpu  int
	b    *lendBorrower
	gen  int
}

// lendEvents is the event queue: by time, then in the order the events were made.
type lendEvents = orderedHeap[lendEvent]

func (a lendEvent) before(b lendEvent) bool {
	if a.t != b.t {
		return a.t < b.t
	}
	return a.seq < b.seq
}

type lendSim struct {
	opt       LendingOptions
	horizon   float64
	gpus      []*lendGPU
	waiting   []*lendBorrower // sorted by arrival: the scheduler's queue order
	events    lendEvents
	seq       int
	res       LendingResult
	latencies []float64
	trace     *LendingTrace
}

// RunLending replays the owners and borrowers against the options. Every
// sample of every GPU is a lending.Step call; a borrower is allocated only a
// GPU whose last Step left it Lent (and the GPU stays the borrower's until
// it finishes or is evicted); the NoExecute taint of a reclaim evicts it
// after the grace and the eviction latency. Placement follows
// kube-scheduler's queue order for equal priorities: the earliest arrival
// first, an evicted borrower keeping its arrival; it takes the first lent GPU
// (by index) that is free and has the memory.
//
// The owner holds its GPU throughout; while it is busy and a borrower is
// still on the GPU the owner shares it, and that time is the owner's extra
// wait. The same inputs give the same result.
func RunLending(owners []LendingOwner, borrowers []Borrower, horizon time.Duration, gpuMemory int64, opt LendingOptions) (LendingResult, error) {
	if err := opt.Validate(); err != nil {
		return LendingResult{}, err
	}
	s := &lendSim{opt: opt, horizon: horizon.Seconds()}
	s.res = LendingResult{IdlePeriod: opt.Policy.IdlePeriod, Grace: opt.Grace, EvictionLatency: opt.EvictionLatency, Sample: opt.Sample}
	if opt.Trace {
		s.trace = &LendingTrace{Phases: make([][]PhaseChange, len(owners))}
	}
	for g := range owners {
		o := &owners[g]
		lg := &lendGPU{index: g, owner: o, reclaimRef: math.NaN()}
		lg.obs = lending.Observation{
			Owners:         []lending.Owner{{Claim: types.UID("owner-" + strconv.Itoa(g)), Lend: true}},
			Observed:       true,
			OwnerProcesses: []uint32{uint32(1000 + g)},
			Memory:         gpuMemory,
			Borrowers:      make([]types.UID, 0, 1),
		}
		s.gpus = append(s.gpus, lg)
		if len(o.Busy) > 0 {
			s.push(lendEvent{t: o.Busy[0][0], kind: lendOwnerFlip, gpu: g})
		}
		for _, iv := range o.Busy {
			s.res.OwnerBusyGPUHours += (iv[1] - iv[0]) / 3600
		}
	}
	s.res.OwnerIdleGPUHours = float64(len(owners))*s.horizon/3600 - s.res.OwnerBusyGPUHours
	all := make([]*lendBorrower, len(borrowers))
	for i, b := range borrowers {
		all[i] = &lendBorrower{Borrower: b, uid: types.UID("borrower-" + strconv.Itoa(b.ID)), stopAt: math.Inf(1), stay: -1}
		if b.Arrival < s.horizon {
			s.push(lendEvent{t: b.Arrival, kind: lendArrival, b: all[i]})
			s.res.Borrowers++
			s.res.TotalWork += b.Work / 3600
		}
	}

	sample := opt.Sample.Seconds()
	for k := int64(0); ; k++ {
		tick := float64(k) * sample
		if tick > s.horizon {
			break
		}
		for len(s.events) > 0 && s.events[0].t <= tick {
			s.handle(heap.Pop(&s.events).(lendEvent))
		}
		s.sample(tick)
	}
	for len(s.events) > 0 && s.events[0].t <= s.horizon {
		s.handle(heap.Pop(&s.events).(lendEvent))
	}
	s.finish(all)
	return s.res, nil
}

func (s *lendSim) push(e lendEvent) {
	e.seq = s.seq
	s.seq++
	heap.Push(&s.events, e)
}

func (s *lendSim) handle(e lendEvent) {
	switch e.kind {
	case lendOwnerFlip:
		g := s.gpus[e.gpu]
		s.account(g, e.t)
		iv := g.owner.Busy[g.next]
		if !g.busy {
			g.busy, g.busySeen, g.busyStart = true, true, e.t
			s.push(lendEvent{t: iv[1], kind: lendOwnerFlip, gpu: e.gpu})
		} else {
			g.busy = false
			if g.next++; g.next < len(g.owner.Busy) {
				s.push(lendEvent{t: g.owner.Busy[g.next][0], kind: lendOwnerFlip, gpu: e.gpu})
			}
		}
	case lendArrival:
		s.enqueue(e.b)
		s.place(e.t)
	case lendFinish:
		b := e.b
		if e.gen != b.gen {
			return
		}
		s.res.Completed++
		s.leave(b, e.t, b.Work, false)
		s.place(e.t)
	case lendEvict:
		b := e.b
		if e.gen != b.gen {
			return
		}
		p := b.progress(e.t)
		var kept float64
		if math.IsInf(b.stopAt, 1) {
			// No save on notice: the last periodic checkpoint is what is kept.
			every := s.opt.CheckpointEvery.Seconds()
			kept = b.saved + math.Floor((p-b.saved)/every)*every
		} else {
			kept = p
		}
		s.res.LostGPUHours += (p - kept) / 3600
		s.res.Evictions++
		s.leave(b, e.t, kept, true)
		s.enqueue(b)
		s.place(e.t)
	}
}

// leave ends the borrower's stay on its GPU at t, keeping kept of its work.
func (s *lendSim) leave(b *lendBorrower, t, kept float64, evicted bool) {
	g := b.gpu
	s.account(g, t)
	if s.trace != nil {
		st := &s.trace.Stays[b.stay]
		st.To, st.Evicted = t, evicted
		st.Progress, st.Lost = b.progress(t)-b.saved, max(0, b.progress(t)-kept)
	}
	b.saved = kept
	g.borrower, b.gpu = nil, nil
	b.gen++
	b.stopAt = math.Inf(1)
	if !math.IsNaN(g.reclaimRef) {
		s.latencies = append(s.latencies, t-g.reclaimRef)
		g.reclaimRef = math.NaN()
	}
}

// enqueue puts the borrower in the queue behind every earlier arrival.
func (s *lendSim) enqueue(b *lendBorrower) {
	i, _ := slices.BinarySearchFunc(s.waiting, b, func(a, b *lendBorrower) int {
		if a.Arrival != b.Arrival {
			if a.Arrival < b.Arrival {
				return -1
			}
			return 1
		}
		return a.ID - b.ID
	})
	s.waiting = slices.Insert(s.waiting, i, b)
}

// place allocates waiting borrowers, earliest arrival first, to free lent
// GPUs at t.
func (s *lendSim) place(t float64) {
	if t > s.horizon || len(s.waiting) == 0 {
		return
	}
	var open []*lendGPU
	for _, g := range s.gpus {
		if g.borrower == nil && g.state.Open() {
			open = append(open, g)
		}
	}
	if len(open) == 0 {
		return
	}
	kept := s.waiting[:0]
	for i, b := range s.waiting {
		if len(open) == 0 {
			kept = append(kept, s.waiting[i:]...)
			break
		}
		j := slices.IndexFunc(open, func(g *lendGPU) bool { return g.state.Lendable >= b.Memory })
		if j < 0 {
			kept = append(kept, b)
			continue
		}
		g := open[j]
		open = slices.Delete(open, j, j+1)
		s.account(g, t)
		g.borrower, b.gpu = b, g
		b.gpuIndex = g.index
		b.placed, b.runFrom, b.stopAt = t, t+s.opt.StartLatency.Seconds(), math.Inf(1)
		s.push(lendEvent{t: b.runFrom + (b.Work - b.saved), kind: lendFinish, b: b, gen: b.gen})
		if s.trace != nil {
			b.stay = len(s.trace.Stays)
			s.trace.Stays = append(s.trace.Stays, Stay{Borrower: b.ID, GPU: b.gpuIndex, From: t, To: math.NaN()})
		}
	}
	clear(s.waiting[len(kept):])
	s.waiting = kept
}

// account adds the owner's extra wait up to t: the owner busy while a
// borrower is on its GPU.
func (s *lendSim) account(g *lendGPU, t float64) {
	t = min(t, s.horizon)
	if g.busy && g.borrower != nil && t > g.accounted {
		s.res.OwnerWaitHours += (t - g.accounted) / 3600
	}
	g.accounted = max(g.accounted, t)
}

// sample is the plugin's sample of every GPU at t: a lending.Step each, the
// taints that follow from it, then the scheduler's view of the lent GPUs.
func (s *lendSim) sample(t float64) {
	now := lendingEpoch.Add(time.Duration(t * float64(time.Second)))
	dt := s.opt.Sample.Seconds()
	for i, g := range s.gpus {
		g.obs.Busy = g.busy || g.busySeen
		g.obs.OwnerMemory = g.owner.Memory
		if g.busy {
			g.obs.OwnerMemory += g.owner.BusyMemory
		}
		g.obs.Borrowers = g.obs.Borrowers[:0]
		if g.borrower != nil {
			g.obs.Borrowers = append(g.obs.Borrowers, g.borrower.uid)
		}
		prev := g.state.Phase
		g.state = lending.Step(s.opt.Policy, g.state, g.obs, now)
		s.res.Steps++
		g.busySeen = g.busy
		if prev == lending.Lent {
			s.res.LentGPUHours += dt / 3600
		}
		if g.state.Phase == prev {
			continue
		}
		if s.trace != nil {
			s.trace.Phases[i] = append(s.trace.Phases[i], PhaseChange{T: t, Phase: g.state.Phase})
		}
		switch g.state.Phase {
		case lending.Lent:
			s.res.Loans++
		case lending.Reclaiming:
			s.res.Reclaims++
			g.reclaimRef = g.busyStart
			if b := g.borrower; b != nil {
				s.taint(b, t)
			}
		}
	}
	s.place(t)
}

// taint is the NoExecute taint reaching the borrower at t: it is evicted
// after its grace and the eviction latency, and saves its work meanwhile
// when the grace is long enough to.
func (s *lendSim) taint(b *lendBorrower, t float64) {
	b.gen++
	if s.opt.Grace >= s.opt.CheckpointWrite {
		b.stopAt = max(t, b.runFrom)
		s.push(lendEvent{t: t + (s.opt.Grace + s.opt.EvictionLatency).Seconds(), kind: lendEvict, b: b, gen: b.gen})
		return
	}
	evict := t + (s.opt.Grace + s.opt.EvictionLatency).Seconds()
	if finish := b.runFrom + (b.Work - b.saved); finish < evict {
		s.push(lendEvent{t: finish, kind: lendFinish, b: b, gen: b.gen})
		return
	}
	s.push(lendEvent{t: evict, kind: lendEvict, b: b, gen: b.gen})
}

// finish closes the books at the horizon.
func (s *lendSim) finish(all []*lendBorrower) {
	for _, g := range s.gpus {
		s.account(g, s.horizon)
		if g.borrower != nil && s.trace != nil {
			b := g.borrower
			st := &s.trace.Stays[b.stay]
			st.To, st.Progress = s.horizon, b.progress(s.horizon)-b.saved
		}
	}
	for _, b := range all {
		if b.Arrival >= s.horizon {
			continue
		}
		kept := b.saved
		if b.gpu != nil {
			kept = b.progress(s.horizon)
		}
		s.res.BorrowerGPUHours += kept / 3600
		s.res.RemainingWork += (b.Work - kept) / 3600
	}
	s.res.BorrowerShare = ratio(s.res.BorrowerGPUHours, s.res.OwnerIdleGPUHours)
	s.res.OwnerWaitShare = ratio(s.res.OwnerWaitHours, s.res.OwnerBusyGPUHours)
	slices.Sort(s.latencies)
	s.res.ReclaimP50 = percentile(s.latencies, 0.50)
	s.res.ReclaimP99 = percentile(s.latencies, 0.99)
	if n := len(s.latencies); n > 0 {
		s.res.ReclaimMax = s.latencies[n-1]
	}
	s.res.Trace = s.trace
}
