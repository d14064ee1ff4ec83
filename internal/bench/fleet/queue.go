package fleet

import (
	"container/heap"
	"fmt"
	"math"
)

// QueueModel names how pending jobs are ordered and retried.
type QueueModel string

const (
	// QueueKube is kube-scheduler 1.37's scheduling queue (pkg/scheduler/backend/queue)
	// for pods of equal priority whose only rejecting plugin is DynamicResources:
	//
	//   - activeQ is ordered by the pod's timestamp (PrioritySort): its arrival,
	//     then the end of its last failed attempt (the timestamp is refreshed
	//     when a pod is re-added);
	//   - a pod that fails goes to the unschedulable pool with its backoff
	//     computed: 1 s × 2^(failures−1), at most 10 s, from its timestamp,
	//     truncated to the 1 s ordering window; it does not block the pods
	//     behind it;
	//   - a claim deallocation (a job completed) is an event DynamicResources'
	//     queueing hint answers Queue for, for every such pod: each unschedulable
	//     pod moves to backoffQ if still backing off, else to activeQ;
	//   - Pop takes activeQ's head; with activeQ empty it takes backoffQ's
	//     earliest expiry (SchedulerPopFromBackoffQ, beta, on); completed
	//     backoffs are flushed into activeQ;
	//   - a pod that fails while a cluster event arrived during its attempt goes
	//     back to activeQ/backoffQ instead of the unschedulable pool.
	//
	// The periodic flush of pods unschedulable for 5 minutes is not modelled:
	// only completions change what fits, and every completion already requeues
	// every pod.
	QueueKube QueueModel = "kube-scheduler"
	// QueueFIFO is strict arrival order with head-of-line blocking: when the head
	// fits nowhere nothing is tried until a job completes. Not kube-scheduler's;
	// kept because the GPU-boundary bound is a proven bound under it.
	QueueFIFO QueueModel = "fifo"
)

// queue is a scheduling queue over job indices.
type queue interface {
	arrive(job int, now float64)
	// ready says whether pop has a job to try at now.
	ready(now float64) bool
	pop(now float64) *queuedJob
	placed(it *queuedJob)
	// failed takes back a job whose attempt failed; sawEvent says a cluster
	// event arrived during the attempt.
	failed(it *queuedJob, now float64, sawEvent bool)
	// clusterEvent is a claim deallocated (a job completed).
	clusterEvent(now float64)
}

func newQueue(m QueueModel) (queue, error) {
	switch m {
	case QueueKube, "":
		return &kubeQueue{backoff: jobHeap{byExpry: true}}, nil
	case QueueFIFO:
		return &fifoQueue{}, nil
	}
	return nil, fmt.Errorf("unknown queue model %q (want %s or %s)", m, QueueKube, QueueFIFO)
}

type queuedJob struct {
	job int
	// ts is PrioritySort's key; seq breaks ties in the order the real queue's
	// nanosecond timestamps would.
	ts       float64
	seq      int64
	failures int
	expiry   float64 // backoff expiry, truncated to the ordering window
	index    int     // in its heap
}

// --- kube-scheduler -------------------------------------------------------------

const (
	initialBackoff = 1.0  // DefaultPodInitialBackoffDuration, seconds
	maxBackoff     = 10.0 // DefaultPodMaxBackoffDuration
	backoffWindow  = 1.0  // backoffQOrderingWindowDuration
)

type kubeQueue struct {
	active  jobHeap // by (ts, seq)
	backoff jobHeap // by (expiry, ts, seq)
	unsched []*queuedJob
	seq     int64
}

func truncWindow(t float64) float64 { return math.Floor(t/backoffWindow) * backoffWindow }

// backingOff is backoffQueue.isEntityBackingoff: the expiry is not before the
// current window.
func backingOff(it *queuedJob, now float64) bool {
	return it.failures > 0 && it.expiry >= truncWindow(now)
}

func (q *kubeQueue) arrive(job int, now float64) {
	q.seq++
	heap.Push(&q.active, &queuedJob{job: job, ts: now, seq: q.seq})
}

func (q *kubeQueue) flushBackoff(now float64) {
	for q.backoff.Len() > 0 && !backingOff(q.backoff.items[0], now) {
		heap.Push(&q.active, heap.Pop(&q.backoff))
	}
}

func (q *kubeQueue) ready(float64) bool { return q.active.Len()+q.backoff.Len() > 0 }

func (q *kubeQueue) pop(now float64) *queuedJob {
	q.flushBackoff(now)
	if q.active.Len() > 0 {
		return heap.Pop(&q.active).(*queuedJob)
	}
	return heap.Pop(&q.backoff).(*queuedJob)
}

func (q *kubeQueue) placed(*queuedJob) {}

func (q *kubeQueue) failed(it *queuedJob, now float64, sawEvent bool) {
	it.failures++
	q.seq++
	it.ts, it.seq = now, q.seq
	it.expiry = truncWindow(now + min(initialBackoff*math.Pow(2, float64(it.failures-1)), maxBackoff))
	if sawEvent {
		q.requeue(it, now)
		return
	}
	q.unsched = append(q.unsched, it)
}

func (q *kubeQueue) requeue(it *queuedJob, now float64) {
	if backingOff(it, now) {
		heap.Push(&q.backoff, it)
	} else {
		heap.Push(&q.active, it)
	}
}

func (q *kubeQueue) clusterEvent(now float64) {
	for _, it := range q.unsched {
		q.requeue(it, now)
	}
	q.unsched = q.unsched[:0]
}

// jobHeap orders queued jobs: by ts then seq, or by expiry first when backoff.
type jobHeap struct {
	items   []*queuedJob
	byExpry bool
}

func (h jobHeap) Len() int { return len(h.items) }
func (h jobHeap) Less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	if h.byExpry && a.expiry != b.expiry {
		return a.expiry < b.expiry
	}
	return a.ts < b.ts || (a.ts == b.ts && a.seq < b.seq)
}
func (h jobHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].index, h.items[j].index = i, j
}
func (h *jobHeap) Push(x any) {
	it := x.(*queuedJob)
	it.index = len(h.items)
	h.items = append(h.items, it)
}
func (h *jobHeap) Pop() any {
	old := h.items
	x := old[len(old)-1]
	h.items = old[:len(old)-1]
	return x
}

// --- FIFO with head-of-line blocking ---------------------------------------------

type fifoQueue struct {
	jobs    []*queuedJob
	blocked bool
}

func (q *fifoQueue) arrive(job int, now float64) {
	q.jobs = append(q.jobs, &queuedJob{job: job, ts: now})
}
func (q *fifoQueue) ready(float64) bool { return !q.blocked && len(q.jobs) > 0 }
func (q *fifoQueue) pop(float64) *queuedJob {
	it := q.jobs[0]
	q.jobs = q.jobs[1:]
	return it
}
func (q *fifoQueue) placed(*queuedJob) {}
func (q *fifoQueue) failed(it *queuedJob, _ float64, sawEvent bool) {
	q.jobs = append([]*queuedJob{it}, q.jobs...)
	q.blocked = !sawEvent
}
func (q *fifoQueue) clusterEvent(float64) { q.blocked = false }
