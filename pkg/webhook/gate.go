package webhook

import (
	"context"
	"encoding/json"
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

	"github.com/tessera-dev/tessera/pkg/webhook/caller"
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
// the review takes one of the slots (maxInFlight at once, perNamespace of
// them at most for the reviews of one namespace), waiting at most maxWait,
// or until its request ends, and gets 429 when none frees. A slow or huge
// body therefore holds no slot, and a trickle of them cannot make an
// ordinary review wait; nor can a burst of reviews in one namespace take
// the slots of the others. With auth, the caller is checked before
// anything is read.
type gate struct {
	slots       *fairSlots
	maxWait     time.Duration
	bodyTimeout time.Duration
	small       *semaphore.Weighted
	large       *semaphore.Weighted
	auth        *clientAuth
}

func newGate(maxInFlight, perNamespace int, maxWait, bodyTimeout time.Duration, bodyBudget int64) *gate {
	return &gate{
		slots:       newFairSlots(maxInFlight, perNamespace),
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
		verified := false
		if g.auth != nil {
			name, ok := g.auth.verified(r)
			if !ok && g.auth.require {
				refuseCaller(w, r)
				return
			}
			if ok {
				r = r.WithContext(caller.WithVerified(r.Context(), name))
				verified = true
			}
		}
		body, release, err := g.readBody(w, r)
		defer release()
		if err != nil {
			bodyError(w, r, err)
			return
		}
		key := reviewNamespace(body)
		if g.auth != nil && !verified {
			// Anyone who reaches the port can name any namespace: the
			// reviews of unverified callers share one namespace's slots.
			key = unverifiedKey
		}
		if !g.acquireSlot(w, r, key) {
			return
		}
		defer g.slots.release(key)
		review, ok := decodeReview(w, body)
		if !ok {
			return
		}
		next.review(w, r, review)
	})
}

// acquireSlot waits for a review slot of namespace key, at most maxWait or
// until the request ends; it answers 429 and returns false when it gets
// none.
func (g *gate) acquireSlot(w http.ResponseWriter, r *http.Request, key string) bool {
	ctx, cancel := context.WithTimeout(r.Context(), g.maxWait)
	defer cancel()
	if g.slots.acquire(ctx, key) {
		return true
	}
	if r.Context().Err() == nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, fmt.Sprintf("more than %d reviews in flight, or %d of this namespace", g.slots.total, g.slots.perKey),
			http.StatusTooManyRequests)
	}
	return false
}

// unverifiedKey is the slot key of the reviews of unverified callers: no
// namespace has this name (a namespace name is a DNS label).
const unverifiedKey = "\x00unverified"

// reviewNamespace is the request.namespace of an AdmissionReview body,
// read without decoding the objects it holds; "" when the body names none
// or is not one (the full decode refuses it then).
func reviewNamespace(body []byte) string {
	var peek struct {
		Request *struct {
			Namespace string `json:"namespace"`
		} `json:"request"`
	}
	if err := json.Unmarshal(body, &peek); err != nil || peek.Request == nil {
		return ""
	}
	return peek.Request.Namespace
}

// refuseCaller answers a review request whose caller is not verified.
func refuseCaller(w http.ResponseWriter, r *http.Request) {
	reason := "no client certificate"
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		reason = "the client certificate names no allowed client"
	}
	klog.FromContext(r.Context()).V(2).Info("Refused a review from an unverified caller",
		"path", r.URL.Path, "remote", r.RemoteAddr, "reason", reason)
	http.Error(w, "reviews are served only to a verified client certificate: "+reason, http.StatusForbidden)
}

// fairSlots are review slots, total at once and perKey at most for one
// key (a namespace). A review that cannot take one waits in one queue of
// all keys; a released slot goes to the first waiter that both bounds
// allow. Waiters of a key at its bound are passed over, so the slots a
// key cannot hold go to the others, and each key's waiters are served in
// arrival order.
type fairSlots struct {
	total, perKey int

	mu      sync.Mutex
	inUse   int
	held    map[string]int
	waiters []*slotWaiter
}

type slotWaiter struct {
	key     string
	granted chan struct{} // closed when the slot is the waiter's
}

func newFairSlots(total, perKey int) *fairSlots {
	return &fairSlots{total: total, perKey: perKey, held: map[string]int{}}
}

// acquire takes a slot for key, waiting until ctx ends; it reports whether
// it got one.
func (f *fairSlots) acquire(ctx context.Context, key string) bool {
	f.mu.Lock()
	if f.fits(key) && !f.queued(key) {
		f.take(key)
		f.mu.Unlock()
		return true
	}
	w := &slotWaiter{key: key, granted: make(chan struct{})}
	f.waiters = append(f.waiters, w)
	f.mu.Unlock()
	select {
	case <-w.granted:
		return true
	case <-ctx.Done():
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-w.granted:
		// Granted as ctx ended: hand it on.
		f.releaseLocked(key)
	default:
		for i, other := range f.waiters {
			if other == w {
				f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
				break
			}
		}
	}
	return false
}

// release gives back a slot that acquire took for key.
func (f *fairSlots) release(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releaseLocked(key)
}

func (f *fairSlots) releaseLocked(key string) {
	f.inUse--
	if f.held[key]--; f.held[key] <= 0 {
		delete(f.held, key)
	}
	// Grant the first waiters that fit, in arrival order.
	for i := 0; i < len(f.waiters) && f.inUse < f.total; {
		w := f.waiters[i]
		if !f.fits(w.key) {
			i++
			continue
		}
		f.take(w.key)
		f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
		close(w.granted)
	}
}

// fits reports whether both bounds allow key another slot.
func (f *fairSlots) fits(key string) bool { return f.inUse < f.total && f.held[key] < f.perKey }

// queued reports whether a review of key waits: a newcomer does not pass it.
func (f *fairSlots) queued(key string) bool {
	for _, w := range f.waiters {
		if w.key == key {
			return true
		}
	}
	return false
}

func (f *fairSlots) take(key string) {
	f.inUse++
	f.held[key]++
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
