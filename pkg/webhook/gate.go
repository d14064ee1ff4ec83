package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/klog/v2"

	"golang.org/x/sync/semaphore"
)

// Defaults of the gate in front of the handlers.
const (
	// DefaultBodyTimeout bounds reading one request's body. The API server
	// sends a review (at most a few MiB) in one go, within milliseconds; a
	// client that trickles its body loses its request after this long
	// instead of holding anything a review needs.
	DefaultBodyTimeout = 2 * time.Second
	// DefaultBodyBudget bounds the memory that bodies larger than
	// smallBodyBytes hold at once (while they are read and reviewed).
	// Every object the API server sends fits in a few KiB; a larger body
	// retries for budget, at most until its body deadline.
	DefaultBodyBudget = 48 << 20
	// smallBodyBytes of every body come from a pool of their own, which
	// large bodies never draw from: reviews of ordinary claims (a few KiB)
	// do not wait behind huge ones.
	smallBodyBytes = 64 << 10
	// smallBodies is how many bodies the small pool serves at once.
	smallBodies = 256
)

// gate admits a review in two steps. First its body is read, without a
// review slot, under a read deadline (bodyTimeout) and a memory budget: the
// first firstChunkBytes need none, the rest up to smallBodyBytes comes from
// the small pool, the rest from the large one, taken (never queued for) as
// the buffer grows with what arrived and held until the review ends. Then
// the review takes one of the slots (maxInFlight at once), waiting at most
// maxWait, or until its request ends, and gets 429 when none frees. A slow
// or huge body therefore holds no slot, and a trickle of them cannot make
// an ordinary review wait.
type gate struct {
	slots       chan struct{}
	maxWait     time.Duration
	bodyTimeout time.Duration
	small       *semaphore.Weighted
	large       *semaphore.Weighted
}

func newGate(maxInFlight int, maxWait, bodyTimeout time.Duration, bodyBudget int64) *gate {
	return &gate{
		slots:       make(chan struct{}, maxInFlight),
		maxWait:     maxWait,
		bodyTimeout: bodyTimeout,
		small:       semaphore.NewWeighted(smallBodies * smallBodyBytes),
		large:       semaphore.NewWeighted(bodyBudget),
	}
}

// reviewer answers a decoded AdmissionReview; Handler and MutateHandler are
// the two.
type reviewer interface {
	review(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview)
}

// serve is the handler that runs next behind the gate.
func (g *gate) serve(next reviewer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !checkRequest(w, r) {
			return
		}
		body, release, err := g.readBody(w, r)
		defer release()
		if err != nil {
			bodyError(w, r, err)
			return
		}
		if !g.acquireSlot(w, r) {
			return
		}
		defer func() { <-g.slots }()
		review, ok := decodeReview(w, body)
		if !ok {
			return
		}
		next.review(w, r, review)
	})
}

// acquireSlot waits for a review slot, at most maxWait or until the request
// ends; it answers 429 and returns false when it gets none.
func (g *gate) acquireSlot(w http.ResponseWriter, r *http.Request) bool {
	select {
	case g.slots <- struct{}{}:
		return true
	default:
	}
	timer := time.NewTimer(g.maxWait)
	defer timer.Stop()
	select {
	case g.slots <- struct{}{}:
		return true
	case <-timer.C:
		w.Header().Set("Retry-After", "1")
		http.Error(w, fmt.Sprintf("more than %d reviews in flight", cap(g.slots)), http.StatusTooManyRequests)
	case <-r.Context().Done():
	}
	return false
}

// errNoBudget is why a body was refused when the memory budget stayed
// spent until its deadline.
var errNoBudget = errors.New("too many large request bodies at once")

// firstChunkBytes of every body are read into a pooled buffer of this size
// without touching either budget: memory is granted only for bytes that
// arrived, so requests that declare a body and send nothing hold no budget
// and an ordinary review (a few KiB) never waits for one.
const firstChunkBytes = 4 << 10

// budgetRetry is how often a body that found the budget spent tries again.
// Budget is taken with TryAcquire only: nobody queues, so a stalled body
// can never sit ahead of another one.
const budgetRetry = 10 * time.Millisecond

var firstChunks = sync.Pool{New: func() any { return new([firstChunkBytes]byte) }}

// readBody reads the request body, at most maxReviewBytes, before the body
// deadline. The first firstChunkBytes need no budget; beyond them, memory
// is taken from the budget (small pool first) before the buffer grows, at
// most twice what has arrived; release gives it back (call it once the
// body is no longer used, also after an error).
func (g *gate) readBody(w http.ResponseWriter, r *http.Request) (body []byte, release func(), err error) {
	deadline := time.Now().Add(g.bodyTimeout)
	// The connection's read deadline cuts a trickling client off mid-read
	// (HTTP/1 and HTTP/2 both support it); the context bounds the wait for
	// budget.
	if err := http.NewResponseController(w).SetReadDeadline(deadline); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return nil, func() {}, err
	}
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	var smallHeld, largeHeld int64
	release = func() {
		if smallHeld > 0 {
			g.small.Release(smallHeld)
		}
		if largeHeld > 0 {
			g.large.Release(largeHeld)
		}
		smallHeld, largeHeld = 0, 0
	}
	// tryGrow takes n bytes at once, from the small pool as far as this
	// body's share of it goes and from the large one for the rest, or
	// nothing.
	tryGrow := func(n int64) bool {
		fromSmall := max(min(n, smallBodyBytes-smallHeld), 0)
		if fromSmall > 0 && !g.small.TryAcquire(fromSmall) {
			fromSmall = 0
		}
		if fromLarge := n - fromSmall; fromLarge > 0 && !g.large.TryAcquire(fromLarge) {
			if fromSmall > 0 {
				g.small.Release(fromSmall)
			}
			return false
		}
		smallHeld += fromSmall
		largeHeld += n - fromSmall
		return true
	}
	// grow waits for n bytes of budget until the body deadline, retrying
	// without queueing.
	grow := func(n int64) error {
		for !tryGrow(n) {
			timer := time.NewTimer(budgetRetry)
			select {
			case <-ctx.Done():
				timer.Stop()
				return errNoBudget
			case <-timer.C:
			}
		}
		return nil
	}
	readErr := func(err error) error {
		if errors.Is(err, os.ErrDeadlineExceeded) || ctx.Err() != nil {
			return fmt.Errorf("the request body was not read within %v: %w", g.bodyTimeout, err)
		}
		return err
	}
	// Up to one byte more than the declared length (or the largest
	// review), to see the end.
	limit := int64(maxReviewBytes + 1)
	if n := r.ContentLength; n >= 0 && n < maxReviewBytes {
		limit = n + 1
	}
	// The first chunk: no budget.
	chunk := firstChunks.Get().(*[firstChunkBytes]byte)
	first := chunk[:min(limit, firstChunkBytes)]
	filled, eof := 0, false
	for filled < len(first) && !eof {
		n, err := r.Body.Read(first[filled:])
		filled += n
		switch {
		case errors.Is(err, io.EOF):
			eof = true
		case err != nil:
			firstChunks.Put(chunk)
			return nil, release, readErr(err)
		case ctx.Err() != nil:
			firstChunks.Put(chunk)
			return nil, release, fmt.Errorf("the request body was not read within %v", g.bodyTimeout)
		}
	}
	if eof || int64(filled) >= limit {
		// The whole body (or one byte past the declared length, which
		// ends the read below): copy it out, the chunk goes back.
		buf := append([]byte(nil), first[:filled]...)
		firstChunks.Put(chunk)
		if len(buf) > maxReviewBytes {
			return nil, release, errTooLarge
		}
		return buf, release, nil
	}
	// More than the first chunk: the buffer grows with what arrives, to at
	// most twice what has arrived, with budget taken before each growth.
	size := min(2*int64(filled), limit)
	if err := grow(size); err != nil {
		firstChunks.Put(chunk)
		return nil, release, err
	}
	buf := append(make([]byte, 0, size), first[:filled]...)
	firstChunks.Put(chunk)
	for {
		if len(buf) == cap(buf) {
			if int64(cap(buf)) >= limit {
				break
			}
			next := min(int64(cap(buf))*2, limit)
			if err := grow(next - int64(cap(buf))); err != nil {
				return nil, release, err
			}
			buf = append(make([]byte, 0, next), buf...)
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, release, readErr(err)
		}
		if ctx.Err() != nil {
			// Without connection deadlines (a handler served by something
			// other than net/http's server) the context still bounds reading
			// between chunks.
			return nil, release, fmt.Errorf("the request body was not read within %v", g.bodyTimeout)
		}
	}
	if len(buf) > maxReviewBytes {
		return nil, release, errTooLarge
	}
	return buf, release, nil
}

var errTooLarge = fmt.Errorf("the request is larger than %d bytes", maxReviewBytes)

// bodyError answers a request whose body could not be read.
func bodyError(w http.ResponseWriter, r *http.Request, err error) {
	klog.FromContext(r.Context()).V(2).Info("Refused a request body", "remote", r.RemoteAddr, "err", err)
	switch {
	case errors.Is(err, errTooLarge):
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
	case errors.Is(err, errNoBudget):
		w.Header().Set("Retry-After", "1")
		http.Error(w, err.Error(), http.StatusTooManyRequests)
	default:
		http.Error(w, fmt.Sprintf("read the request: %v", err), http.StatusBadRequest)
	}
}
