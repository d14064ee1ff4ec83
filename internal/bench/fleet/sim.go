package fleet

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// Options control one simulation run.
type Options struct {
	// Nodes is the fleet size when Fleet is empty: that many hgx-h100 nodes
	// (8 GPUs each).
	Nodes int
	// Fleet is the cluster's nodes; empty: HGXFleet(Nodes).
	Fleet Fleet
	// Check verifies after every placement that no GPU is over capacity, that a
	// whole GPU is never shared and that partitions never overlap; a violation ends
	// the run with an error.
	Check bool
	// AlwaysAsk calls the allocator on every node even where the answer is known
	// (a node that refused a claim at least as large, or accepted one at least as
	// large, and has not changed since). The answer is the same; only the run is
	// slower. For tests.
	AlwaysAsk bool
	// Queue is the scheduling queue: QueueKube (the default) or QueueFIFO.
	Queue QueueModel
	// NodeChoice is how a node is picked among those that fit: ChoiceScore (the
	// default, kube-scheduler's) or ChoiceFirst.
	NodeChoice NodeChoice
	// Scoring is what kube-scheduler's score plugins see of nodes and pods
	// (ChoiceScore); the zero value is DefaultScoring.
	Scoring Scoring
	// AttemptCost is the simulated time one scheduling attempt takes, in seconds
	// (0: instantaneous). The scheduler makes one attempt at a time; a job placed
	// by an attempt starts when the attempt ends.
	AttemptCost float64
}

// fleet is the simulated cluster.
func (o Options) fleet() Fleet {
	if len(o.Fleet.Nodes) > 0 {
		return o.Fleet
	}
	return HGXFleet(o.Nodes)
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
	// ServedPerHour counts each job by the share of its run time that falls
	// inside the window (a job that runs entirely inside counts 1, one that
	// straddles an end its fraction inside), per hour: completions per hour
	// except at the window's two ends. ServedBound bounds it.
	ServedPerHour float64
	// MeanRunning is the number of jobs running, time-averaged over the
	// window. RunningBound bounds it.
	MeanRunning float64
	// MeanActiveGPUs is the time-average of GPUs running at least one job in the window.
	MeanActiveGPUs float64
	// MemUtilActive is used memory / memory of active GPUs, time-averaged in the window.
	MemUtilActive float64
	// WaitMean, WaitP50, WaitP95 and WaitP99 are over all jobs, in seconds
	// (every job eventually runs).
	WaitMean, WaitP50, WaitP95, WaitP99 float64
	// Makespan is when the last job completed.
	Makespan float64
	// MaxJobsPerGPU is the most jobs one GPU ever ran at once.
	MaxJobsPerGPU int
	// Attempts counts scheduling attempts (a job tried against the fleet).
	Attempts int
	// AllocatorCalls counts Allocate calls (0 for the oracle and reference models).
	AllocatorCalls int
	// Undecided counts the migrating reference's packing checks that neither a
	// packing nor a proof of infeasibility settled within the search budget;
	// they were taken as packable.
	Undecided int
	// Starts is the start time of every job, by job ID (for tests).
	Starts []float64
	// Skipped says why the model was not run (empty when it was).
	Skipped string `json:",omitempty"`
}

// gpuUse is what one allocated device takes of its GPU.
type gpuUse struct {
	whole  bool
	memory int64 // bytes
	cores  int64 // percent
	slots  uint8 // eighths of the GPU, for fixed partitions
}

type placement struct {
	node int
	job  int
	// gpus are the global indexes of the GPUs the job holds and uses what it
	// takes of each; empty for a CPU-only job and for the reference models
	// that place on no GPU (fluid, migrating).
	gpus []int
	uses []gpuUse
	// charged is what a GPU-less reference model charged the fleet.
	charged gpuUse
	results []resourceapi.DeviceRequestAllocationResult
}

// placer is one allocation model: it starts a job when it has room.
type placer interface {
	place(ctx context.Context, j *Job) (placement, bool, error)
	release(p placement, j *Job)
}

// Run replays jobs (from w.Generate) against one model and measures it.
//
// The simulation is discrete-event over a simulated clock: arrivals, completions
// and scheduling attempts are the events. Which job is tried when is the queue
// model's (Options.Queue: kube-scheduler's active, backoff and unschedulable
// queues by default); where a job goes is the node choice's (Options.NodeChoice:
// kube-scheduler's scores by default). Every placement attempt for the device
// models is a real structured.Allocator call against the node's current
// AllocatedState; results are fed back into that state as the scheduler does.
func Run(ctx context.Context, kind Kind, w Workload, jobs []Job, opt Options) (Result, error) {
	f := opt.fleet()
	if len(f.Nodes) < 1 {
		return Result{}, errors.New("fleet: at least one node")
	}
	var p placer
	var calls, undecided *int
	switch kind {
	case Fluid:
		fp, err := newFluidPlacer(f, jobs)
		if err != nil {
			return Result{}, err
		}
		p = fp
	case Migrating:
		b, err := newMigratingPlacer(f, jobs)
		if err != nil {
			return Result{}, err
		}
		p, undecided = b, &b.undecided
	case TesseraBestFit:
		p = newOraclePlacer(f, opt, true)
	default:
		m, err := newDeviceModel(kind, f)
		if err != nil {
			return Result{}, err
		}
		ap, err := newAllocatorPlacer(m, opt)
		if err != nil {
			return Result{}, err
		}
		p, calls = ap, &ap.calls
	}
	r, err := simulate(ctx, kind, w, jobs, opt, p)
	if calls != nil {
		r.AllocatorCalls = *calls
	}
	if undecided != nil {
		r.Undecided = *undecided
	}
	return r, err
}

func simulate(ctx context.Context, kind Kind, w Workload, jobs []Job, opt Options, p placer) (Result, error) {
	f := opt.fleet()
	gpus := f.GPUs()
	capacity := make([]int64, 0, gpus) // memory of each GPU
	for _, s := range f.Nodes {
		for range s.GPUs {
			capacity = append(capacity, s.Model.MemoryBytes())
		}
	}
	r := Result{Kind: kind, MeanDemand: w.MeanDemand, Jobs: len(jobs), Starts: make([]float64, len(jobs))}
	if len(jobs) == 0 {
		return r, nil
	}
	r.WindowStart, r.WindowEnd = jobs[len(jobs)/10].Arrival, jobs[len(jobs)-1].Arrival
	q, err := newQueue(opt.Queue)
	if err != nil {
		return r, err
	}

	load := make([]struct {
		n   int
		use []gpuUse
	}, gpus)
	var (
		now, active, usedMemory float64 // usedMemory in GPUs
		fluidActive             float64 // what the GPU-less models count as active
		activeArea, usedArea    float64
		completedInWindow       int
		running                 completions
		next                    int // next arrival
		waits                   = make([]float64, 0, len(jobs))
		placements              = make(map[int]placement)
		schedFree               float64 // when the scheduler finishes its current attempt
		pending                 *pendingFailure
	)
	gpuLess := kind == Fluid || kind == Migrating
	advance := func(t float64) {
		lo, hi := max(now, r.WindowStart), min(t, r.WindowEnd)
		if hi > lo {
			a := active
			if gpuLess {
				a = fluidActive
			}
			activeArea += a * (hi - lo)
			usedArea += usedMemory * (hi - lo)
		}
		now = t
	}
	// What a job uses of its GPUs' memory, in GPUs, whatever its claim holds.
	memFrac := func(j *Job) float64 { return j.Memory * float64(j.gpuCount()) }

	for {
		tArr, tComp, tSched := math.Inf(1), math.Inf(1), math.Inf(1)
		if next < len(jobs) {
			tArr = jobs[next].Arrival
		}
		if running.Len() > 0 {
			tComp = running[0].at
		}
		if pending != nil || q.ready(max(now, schedFree)) {
			tSched = max(now, schedFree)
		}
		switch {
		case math.IsInf(min(tArr, tComp, tSched), 1):
			window := r.WindowEnd - r.WindowStart
			if window > 0 {
				r.JobsPerHour = float64(completedInWindow) / window * 3600
				r.MeanActiveGPUs = activeArea / window
			}
			if activeArea > 0 {
				r.MemUtilActive = usedArea / activeArea
			}
			if len(waits) != len(jobs) {
				return r, fmt.Errorf("%s: %d of %d jobs never started", kind, len(jobs)-len(waits), len(jobs))
			}
			for _, w := range waits {
				r.WaitMean += w / float64(len(waits))
			}
			slices.Sort(waits)
			r.WaitP50, r.WaitP95, r.WaitP99 = percentile(waits, 0.50), percentile(waits, 0.95), percentile(waits, 0.99)
			r.ServedPerHour, r.MeanRunning = served(jobs, r.Starts, r.WindowStart, r.WindowEnd)
			return r, nil

		// Completions first on ties: they free capacity for what arrives or is
		// tried at that instant.
		case tComp <= tArr && tComp <= tSched:
			c := heap.Pop(&running).(completion)
			advance(c.at)
			j := &jobs[c.job]
			pl := placements[c.job]
			delete(placements, c.job)
			p.release(pl, j)
			usedMemory -= memFrac(j)
			fluidActive = math.Ceil(usedMemory - 1e-9)
			for k, gi := range pl.gpus {
				g := &load[gi]
				g.n--
				if g.n == 0 {
					active--
				}
				if opt.Check {
					i := slices.Index(g.use, pl.uses[k])
					g.use = slices.Delete(g.use, i, i+1)
				}
			}
			if c.at >= r.WindowStart && c.at <= r.WindowEnd {
				completedInWindow++
			}
			r.Makespan = c.at
			if pending != nil {
				pending.sawEvent = true
			}
			// The claim is deallocated: kube-scheduler moves the pods that
			// DynamicResources rejected out of the unschedulable queue.
			q.clusterEvent(now)

		case tArr <= tSched:
			advance(tArr)
			q.arrive(next, now)
			next++

		default:
			advance(tSched)
			if pending != nil {
				q.failed(pending.item, now, pending.sawEvent)
				pending = nil
				continue
			}
			it := q.pop(now)
			j := &jobs[it.job]
			r.Attempts++
			pl, ok, err := p.place(ctx, j)
			if err != nil {
				return r, fmt.Errorf("%s: job %d (demand %.3f/%.3f): %w", kind, j.ID, j.Memory, j.Cores, err)
			}
			schedFree = now + opt.AttemptCost
			if !ok {
				if opt.AttemptCost > 0 {
					pending = &pendingFailure{item: it}
				} else {
					q.failed(it, now, false)
				}
				continue
			}
			q.placed(it)
			start := schedFree
			placements[j.ID] = pl
			r.Starts[j.ID] = start
			waits = append(waits, start-j.Arrival)
			heap.Push(&running, completion{at: start + j.Runtime, job: j.ID})
			usedMemory += memFrac(j)
			fluidActive = math.Ceil(usedMemory - 1e-9)
			if !gpuLess && !j.CPUOnly && len(pl.gpus) != j.gpuCount() {
				return r, fmt.Errorf("%s: job %d holds %d GPUs, asked for %d", kind, j.ID, len(pl.gpus), j.gpuCount())
			}
			for k, gi := range pl.gpus {
				g := &load[gi]
				if g.n == 0 {
					active++
				}
				g.n++
				r.MaxJobsPerGPU = max(r.MaxJobsPerGPU, g.n)
				if opt.Check {
					g.use = append(g.use, pl.uses[k])
					if err := checkGPU(g.use, capacity[gi]); err != nil {
						return r, fmt.Errorf("%s: GPU %d (node %d) after job %d: %w", kind, gi, pl.node, j.ID, err)
					}
				}
			}
		}
	}
}

// pendingFailure is an attempt that failed and is still running (AttemptCost >
// 0): whether a cluster event arrived meanwhile decides where the pod goes.
type pendingFailure struct {
	item     *queuedJob
	sawEvent bool
}

// checkGPU is the conservation check: what runs on one GPU of memory
// capacity bytes fits on it.
func checkGPU(uses []gpuUse, capacity int64) error {
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
	if mem > capacity || cores > 100 {
		return fmt.Errorf("over capacity: memory %d > %d or cores %d > 100", mem, capacity, cores)
	}
	return nil
}

// served is Result.ServedPerHour and Result.MeanRunning for jobs started
// at starts.
func served(jobs []Job, starts []float64, w0, w1 float64) (perHour, running float64) {
	if w1 <= w0 {
		return 0, 0
	}
	var n, busy float64
	for i, j := range jobs {
		s := starts[i]
		if j.Runtime <= 0 {
			if s >= w0 && s <= w1 {
				n++
			}
			continue
		}
		if in := min(s+j.Runtime, w1) - max(s, w0); in > 0 {
			n += in / j.Runtime
			busy += in
		}
	}
	return n / (w1 - w0) * 3600, busy / (w1 - w0)
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
type completions = orderedHeap[completion]

func (a completion) before(b completion) bool {
	return a.at < b.at || (a.at == b.at && a.job < b.job)
}

// heapItem is an element of an orderedHeap: a.before(b) when a is to pop
// first.
type heapItem[T any] interface{ before(T) bool }

// orderedHeap is a container/heap.Interface over a slice, ordered by its
// elements' before: the top is the element before every other.
type orderedHeap[T heapItem[T]] []T

func (h orderedHeap[T]) Len() int           { return len(h) }
func (h orderedHeap[T]) Less(i, j int) bool { return h[i].before(h[j]) }
func (h orderedHeap[T]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *orderedHeap[T]) Push(x any)        { *h = append(*h, x.(T)) }
func (h *orderedHeap[T]) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
