package metricsserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// Check is one liveness condition: nil while it holds.
type Check func(ctx context.Context) error

// DefaultHealthCacheFor is how long Health reuses the checks' result.
const DefaultHealthCacheFor = time.Second

// Health answers /healthz from named checks and a status line. /healthz is
// unauthenticated and its checks dial the plugin's gRPC sockets, so the
// checks run at most once per CacheFor, and requests that come while they
// run wait for that run instead of starting their own.
type Health struct {
	// Status is written after "ok: " (or after the failures); may be nil.
	Status func() string
	// CacheFor is how long a result answers later requests (0: the
	// default).
	CacheFor time.Duration

	mu     sync.Mutex
	checks map[string]Check

	result struct {
		sync.Mutex
		at      time.Time     // when the last run ended; zero: none
		failed  []string      // its failures
		running chan struct{} // closed when the run under way ends; nil: none
	}
}

// Add registers a check under name (replacing one of the same name) and
// forgets the cached result.
func (h *Health) Add(name string, c Check) {
	h.mu.Lock()
	if h.checks == nil {
		h.checks = map[string]Check{}
	}
	h.checks[name] = c
	h.mu.Unlock()
	h.result.Lock()
	h.result.at = time.Time{}
	h.result.Unlock()
}

// cachedFailures is Failures run at most once per CacheFor and shared by
// the requests that come while it runs. The run has its own 4 seconds (the
// chart's liveness probe times out after 5), so that a caller that gives up
// does not fail the others; a caller whose ctx ends first gets its error.
func (h *Health) cachedFailures(ctx context.Context) ([]string, error) {
	cacheFor := h.CacheFor
	if cacheFor <= 0 {
		cacheFor = DefaultHealthCacheFor
	}
	r := &h.result
	r.Lock()
	if !r.at.IsZero() && time.Since(r.at) < cacheFor {
		failed := r.failed
		r.Unlock()
		return failed, nil
	}
	if r.running == nil {
		done := make(chan struct{})
		r.running = done
		go func() {
			runCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 4*time.Second)
			defer cancel()
			failed := h.Failures(runCtx)
			r.Lock()
			r.failed, r.at, r.running = failed, time.Now(), nil
			r.Unlock()
			close(done)
		}()
	}
	running := r.running
	r.Unlock()
	select {
	case <-running:
		r.Lock()
		defer r.Unlock()
		return r.failed, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Failures runs every check and returns "name: error" of each failed one,
// sorted by name.
func (h *Health) Failures(ctx context.Context) []string {
	h.mu.Lock()
	names := make([]string, 0, len(h.checks))
	for n := range h.checks {
		names = append(names, n)
	}
	checks := make(map[string]Check, len(h.checks))
	for n, c := range h.checks {
		checks[n] = c
	}
	h.mu.Unlock()
	sort.Strings(names)
	var failed []string
	for _, n := range names {
		if err := checks[n](ctx); err != nil {
			failed = append(failed, n+": "+err.Error())
		}
	}
	return failed
}

// ServeHTTP answers 200 "ok: <status>" when every check holds, else 503
// with one line per failed check. The checks' result is at most CacheFor
// old; they get at most 4 seconds together (the chart's liveness probe
// times out after 5).
func (h *Health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	failed, err := h.cachedFailures(r.Context())
	if err != nil {
		failed = []string{"healthz: " + err.Error()}
	}
	status := ""
	if h.Status != nil {
		status = h.Status()
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if len(failed) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "unhealthy: %s\n%s\n", strings.Join(failed, "; "), status)
		return
	}
	_, _ = fmt.Fprintf(w, "ok: %s\n", strings.TrimPrefix(status, "ok: "))
}

// Sockets records the Unix sockets the kubelet plugin helper listens on
// (pass Listen to kubeletplugin.PluginListener and RegistrarListener), so that
// a health check can connect to them as the kubelet does.
type Sockets struct {
	mu    sync.Mutex
	paths []string
}

// Listen removes a stale socket at path and listens there; closing the
// listener removes the socket again, as the helper's own listener does.
func (s *Sockets) Listen(ctx context.Context, path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	l, err := (&net.ListenConfig{}).Listen(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.paths = append(s.paths, path)
	s.mu.Unlock()
	return &unixListener{Listener: l, path: path}, nil
}

type unixListener struct {
	net.Listener
	path string
	once sync.Once
}

func (l *unixListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { _ = os.Remove(l.path) })
	return err
}

// Check connects to every recorded socket over gRPC (an HTTP/2 handshake
// with the server behind it) and fails naming the first that does not
// answer; before the helper has listened there is nothing to check.
func (s *Sockets) Check(ctx context.Context) error {
	s.mu.Lock()
	paths := append([]string(nil), s.paths...)
	s.mu.Unlock()
	for _, p := range paths {
		if err := grpcReady(ctx, p); err != nil {
			return fmt.Errorf("gRPC server on %s: %w", p, err)
		}
	}
	return nil
}

func grpcReady(ctx context.Context, path string) error {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn.Connect()
	for {
		st := conn.GetState()
		if st == connectivity.Ready {
			return nil
		}
		if !conn.WaitForStateChange(ctx, st) {
			return fmt.Errorf("not ready (%s): %w", st, ctx.Err())
		}
	}
}

// Alive is a check for a long-running goroutine: Run runs f and the check
// fails once f has returned while the plugin still runs.
type Alive struct {
	mu     sync.Mutex
	exited bool
}

// Run runs f and records its return.
func (a *Alive) Run(f func()) {
	defer func() {
		a.mu.Lock()
		a.exited = true
		a.mu.Unlock()
	}()
	f()
}

// Check fails once the function given to Run has returned.
func (a *Alive) Check(context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.exited {
		return errors.New("stopped")
	}
	return nil
}
