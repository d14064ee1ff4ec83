package metricsserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// Defaults of Server's limits.
const (
	DefaultRequestTimeout = 30 * time.Second
	DefaultMaxInFlight    = 4
)

// Server serves Metrics at /metrics (behind Auth) and Health at /healthz
// over HTTPS on Address.
type Server struct {
	// Address is host:port; an empty host listens on every interface.
	Address     string
	Certificate *Certificate
	// Auth protects /metrics. Required: there is no unauthenticated mode.
	Auth    Delegated
	Metrics http.Handler
	Health  http.Handler
	// RequestTimeout bounds each request's handler (0: the default).
	RequestTimeout time.Duration
	// MaxInFlight caps concurrent /metrics requests, counted before
	// authentication (a request with an unknown token costs a TokenReview);
	// more get 429 (0: the default).
	MaxInFlight int
}

// Handler is the server's routing with its limits: /metrics capped in
// flight, then authenticated and authorized; both paths under the timeout.
// The cap comes first so that callers with made-up tokens cannot have more
// than MaxInFlight TokenReviews asked of the API server at once.
func (s *Server) Handler() (http.Handler, error) {
	if s.Auth.Authenticator == nil || s.Auth.Authorizer == nil {
		return nil, errors.New("metrics server: no authenticator or authorizer")
	}
	if s.Metrics == nil || s.Health == nil {
		return nil, errors.New("metrics server: no metrics or health handler")
	}
	timeout := s.RequestTimeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	maxInFlight := s.MaxInFlight
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", limitInFlight(maxInFlight, s.Auth.Protect(s.Metrics)))
	mux.Handle("GET /healthz", s.Health)
	return http.TimeoutHandler(mux, timeout, "request timed out\n"), nil
}

// limitInFlight serves at most n requests at once and answers 429 to the
// others at once (a scraper retries at its next interval).
func limitInFlight(n int, next http.Handler) http.Handler {
	slots := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			next.ServeHTTP(w, r)
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many requests in flight", http.StatusTooManyRequests)
		}
	})
}

// Listen validates the configuration and opens the listening socket.
func (s *Server) Listen(ctx context.Context) (net.Listener, error) {
	if _, _, err := net.SplitHostPort(s.Address); err != nil {
		return nil, fmt.Errorf("metrics address %q: %w", s.Address, err)
	}
	if s.Certificate == nil {
		return nil, errors.New("metrics server: no certificate")
	}
	if _, err := s.Certificate.Load(); err != nil {
		return nil, err
	}
	return (&net.ListenConfig{}).Listen(ctx, "tcp", s.Address)
}

// Serve serves on l until ctx is done, then shuts down within 5 seconds.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	h, err := s.Handler()
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         s.Certificate.TLSConfig(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      2 * DefaultRequestTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	if s.RequestTimeout > DefaultRequestTimeout {
		srv.WriteTimeout = 2 * s.RequestTimeout
	}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	err = srv.Serve(tls.NewListener(l, srv.TLSConfig))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Run listens on Address (retrying every 5 seconds while it is taken: the
// other pod of a surge rolling update on the host network still holds it)
// and serves until ctx is done. A bad configuration is returned at once.
func (s *Server) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if _, err := s.Handler(); err != nil {
		return err
	}
	for {
		l, err := s.Listen(ctx)
		if err == nil {
			logger.Info("Serving metrics over HTTPS", "address", l.Addr().String(), "selfSigned", s.Certificate.CertFile == "")
			err = s.Serve(ctx, l)
			if err == nil || ctx.Err() != nil {
				return nil
			}
		} else if !isAddrInUse(err) {
			return err
		}
		logger.Error(err, "Metrics server failed; retrying", "address", s.Address)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(5 * time.Second):
		}
	}
}

func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE)
}
