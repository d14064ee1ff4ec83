package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
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
	// waits for budget, at most until its body deadline.
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
// first smallBodyBytes of a body from the small pool, the rest from the
// large one, taken as the buffer grows and held until the review ends. Then
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

// readBody reads the request body, at most maxReviewBytes, before the body
// deadline. Memory for it is taken from the budget before it is allocated;
// release gives it back (call it once the body is no longer used, also
// after an error).
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
	// grow makes room for n bytes, from the small pool first.
	grow := func(n int64) error {
		fromSmall := min(n, smallBodyBytes-smallHeld)
		if fromSmall > 0 {
			if err := g.small.Acquire(ctx, fromSmall); err != nil {
				return errNoBudget
			}
			smallHeld += fromSmall
		}
		if fromLarge := n - max(fromSmall, 0); fromLarge > 0 {
			if err := g.large.Acquire(ctx, fromLarge); err != nil {
				return errNoBudget
			}
			largeHeld += fromLarge
		}
		return nil
	}
	// The buffer grows with what arrives, up to the declared length (one
	// byte more, to see the end), so a client that declares a large body and
	// sends little holds little.
	limit := int64(maxReviewBytes + 1)
	if n := r.ContentLength; n >= 0 && n < maxReviewBytes {
		limit = n + 1
	}
	size := min(limit, smallBodyBytes)
	if err := grow(size); err != nil {
		return nil, release, err
	}
	buf := make([]byte, 0, size)
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
			if errors.Is(err, os.ErrDeadlineExceeded) || ctx.Err() != nil {
				return nil, release, fmt.Errorf("the request body was not read within %v: %w", g.bodyTimeout, err)
			}
			return nil, release, err
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
