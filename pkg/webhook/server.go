package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"k8s.io/klog/v2"
)

// Paths the Server serves.
const (
	// ValidatePath is where the API server sends AdmissionReviews.
	ValidatePath = "/validate"
	// HealthzPath answers 200 while the process serves.
	HealthzPath = "/healthz"
	// ReadyzPath answers 200 until shutdown begins, then 503.
	ReadyzPath = "/readyz"
)

// Defaults of Server's limits.
const (
	// DefaultMaxInFlight reviews at once: a review is a JSON decode and a
	// DeviceClass read from the cache, milliseconds each, so 32 keep up with
	// the API server's bursts. Bodies are read before a review takes a slot
	// (see BodyTimeout and BodyBudget).
	DefaultMaxInFlight = 32
	// DefaultMaxWait for a slot: below the webhook's default timeoutSeconds (5).
	DefaultMaxWait = 3 * time.Second
	// maxConcurrentStreams per HTTP/2 connection.
	maxConcurrentStreams = 100
)

// Server serves Handler over TLS. The zero value is not usable: Addr, CertFile
// and KeyFile are required.
type Server struct {
	// Addr is the address to listen on, for example ":9443" or "127.0.0.1:9443".
	Addr string
	// CertFile and KeyFile hold the serving certificate (PEM). They are read
	// again when their modification time or size changes, so a rotated
	// certificate (cert-manager, a re-rendered Secret) is used without a restart.
	CertFile, KeyFile string
	// DrainDelay is how long the server keeps serving after shutdown begins
	// with /readyz failing, so that the Service's endpoints drop the pod before
	// it stops accepting connections. Zero means no delay.
	DrainDelay time.Duration
	// ShutdownTimeout bounds the wait for requests in flight after the drain.
	// Zero means 10s.
	ShutdownTimeout time.Duration
	// Classes reads the DeviceClasses that claims name (Handler.Classes); nil
	// reads none.
	Classes DeviceClassReader
	// Models reads the GPU models the cluster publishes, for MutatePath
	// (MutateHandler); nil serves no MutatePath.
	Models GPUModelReader
	// Admitters are further paths to serve, each with its AdmitFunc, behind
	// the same gate as ValidatePath and MutatePath (pkg/webhook/legacypods's
	// Path). A path the Server serves itself is an error.
	Admitters map[string]AdmitFunc
	// Isolated are further paths served like Admitters but with review
	// slots of their own (MaxInFlight more, same MaxWait; the body budget
	// is shared), for reviews that may wait long: GPU budgets
	// (pkg/budget) wait on a per-budget lock, and a burst of them must not
	// take the slots of the other paths (a 429 there is a refusal under
	// failurePolicy Fail).
	Isolated map[string]AdmitFunc
	// MaxInFlight caps the reviews served at once (0: DefaultMaxInFlight).
	// A review takes a slot only once its body has been read; beyond the
	// cap it waits, at most until its request's context ends or MaxWait
	// passes, then gets 429 (the API server applies the webhook's
	// failurePolicy).
	MaxInFlight int
	// MaxInFlightPerNamespace caps the slots the reviews of one namespace
	// (the review's request.namespace; cluster-scoped objects count as one
	// namespace) hold at once (0: an eighth of MaxInFlight, at least 1;
	// above MaxInFlight: MaxInFlight). Beyond it a review waits, as beyond
	// MaxInFlight, for its own namespace's slot: a burst in one namespace
	// leaves the other namespaces at least MaxInFlight minus this many
	// slots, and the CPU that this many reviews at once leave
	// (results/webhook-load.md). With ClientCAFile, reviews whose caller is
	// not verified count as one namespace whatever they name.
	MaxInFlightPerNamespace int
	// MaxWait bounds the wait for a slot (0: DefaultMaxWait).
	MaxWait time.Duration
	// BodyTimeout bounds reading a request's body, which happens before the
	// review takes a slot (0: DefaultBodyTimeout). A body not read by then
	// gets 400.
	BodyTimeout time.Duration
	// BodyBudget bounds the bytes that bodies beyond their first 64 KiB
	// hold at once, from reading to the end of their review
	// (0: DefaultBodyBudget). A body that cannot get budget before its
	// BodyTimeout gets 429. Budget is granted only for bytes that arrived
	// (the first 4 KiB need none) and without queueing, so requests that
	// declare a body and send nothing hold none; bodies up to 64 KiB draw
	// first on a separate pool of 256 × 64 KiB, so large bodies cannot
	// starve them.
	BodyBudget int64
	// ClientCAFile, when set, holds the CA certificates (PEM) that sign the
	// API server's client certificate (the kubeconfig its admission
	// configuration names for this webhook). The TLS handshake then asks for
	// a client certificate and verifies one that is given (a certificate
	// that does not verify fails the handshake); a review whose certificate
	// verifies and names one of ClientNames runs with caller.WithVerified in
	// its context. The file is read again when its modification time or
	// size changes, so a rotated CA is used without a restart.
	ClientCAFile string
	// ClientNames are the client certificate names (subject common name or
	// a DNS subject alternative name) whose reviews count as verified;
	// empty: any certificate that ClientCAFile's CAs sign. Only with
	// ClientCAFile.
	ClientNames []string
	// RequireClientCert refuses, with 403, review requests whose caller
	// is not verified (no certificate, or one naming none of ClientNames).
	// HealthzPath and ReadyzPath stay open: the kubelet's probes carry no
	// certificate. Only with ClientCAFile.
	RequireClientCert bool
	// ReusePort sets SO_REUSEPORT on the listener: replicas in the host's
	// network namespace of one node (running as the same user) can then all
	// listen on Addr, the kernel spreads connections among them, and one
	// replica going away leaves the others serving.
	ReusePort bool

	// listening, when set, receives the bound address once the listener is up
	// (tests listen on port 0).
	listening chan<- net.Addr
}

// Run serves until ctx is cancelled, then shuts down gracefully: /readyz fails
// at once, new connections are still accepted for DrainDelay, then the
// listener closes and requests in flight get up to ShutdownTimeout. It returns
// nil after a clean shutdown, or the error that stopped it.
func (s *Server) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if s.Addr == "" || s.CertFile == "" || s.KeyFile == "" {
		return errors.New("webhook server: address, certificate file and key file are required")
	}
	certs := &certificateFiles{certFile: s.CertFile, keyFile: s.KeyFile}
	if _, err := certs.GetCertificate(nil); err != nil {
		return err
	}

	auth, err := s.clientAuth()
	if err != nil {
		return err
	}
	tlsConfig := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: certs.GetCertificate,
	}
	if auth != nil {
		if _, err := auth.pool(); err != nil {
			return err
		}
		// Each handshake gets the CA pool read last: a rotated client CA
		// applies to new connections without a restart.
		tlsConfig.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			pool, err := auth.pool()
			if err != nil {
				return nil, err
			}
			return &tls.Config{
				MinVersion:     tls.VersionTLS12,
				GetCertificate: certs.GetCertificate,
				ClientCAs:      pool,
				// Asked for, verified when given: the kubelet's probes
				// send none, and RequireClientCert refuses reviews
				// without one per request.
				ClientAuth: tls.VerifyClientCertIfGiven,
				// This config replaces the server's for the connection,
				// so it names the protocols the server speaks.
				NextProtos: []string{"h2", "http/1.1"},
				// No resumption: a resumed session would keep a chain
				// verified against a CA since rotated away.
				SessionTicketsDisabled: true,
			}, nil
		}
	}

	var shuttingDown atomic.Bool
	mux, err := s.muxWith(&shuttingDown, auth)
	if err != nil {
		return err
	}

	var lc net.ListenConfig
	if s.ReusePort {
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var sockErr error
			if err := c.Control(func(fd uintptr) {
				sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}); err != nil {
				return err
			}
			return sockErr
		}
	}
	listener, err := lc.Listen(ctx, "tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("webhook server: %w", err)
	}
	server := &http.Server{
		Handler:           mux,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 10 * time.Second,
		// Bound the streams (requests) one HTTP/2 connection has open at
		// once, as HTTP/1 bounds them to one; the API server opens more
		// connections when it needs more.
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: maxConcurrentStreams},
		// The API server's webhook timeout is at most 30s; nothing needs longer.
		ReadTimeout:  30 * time.Second,
		WriteTimeout: 30 * time.Second,
		IdleTimeout:  90 * time.Second,
		// Requests keep the logger but not the cancellation: they must finish
		// during the drain.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	logger.Info("Serving", "address", listener.Addr().String(), "certificate", s.CertFile,
		"clientCA", s.ClientCAFile, "clientNames", s.ClientNames, "requireClientCert", s.RequireClientCert)
	if s.listening != nil {
		s.listening <- listener.Addr()
	}

	served := make(chan error, 1)
	go func() { served <- server.ServeTLS(listener, "", "") }()

	select {
	case err := <-served:
		return fmt.Errorf("webhook server: %w", err)
	case <-ctx.Done():
	}
	shuttingDown.Store(true)
	logger.Info("Shutting down", "drainDelay", s.DrainDelay)
	if s.DrainDelay > 0 {
		select {
		case err := <-served:
			return fmt.Errorf("webhook server: %w", err)
		case <-time.After(s.DrainDelay):
		}
	}
	timeout := s.ShutdownTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	// ctx is done; the shutdown needs a context of its own.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := server.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("webhook server: shutdown: %w", err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("webhook server: %w", err)
	}
	logger.Info("Stopped")
	return nil
}

// mux is muxWith without client authentication.
func (s *Server) mux(shuttingDown *atomic.Bool) (*http.ServeMux, error) {
	return s.muxWith(shuttingDown, nil)
}

// muxWith routes the Server's paths: ValidatePath, MutatePath and Admitters
// behind one gate; each Isolated path behind slots of its own (sharing the
// body budget); HealthzPath and ReadyzPath (failing once shuttingDown).
// auth, when not nil, checks the caller of every review path.
func (s *Server) muxWith(shuttingDown *atomic.Bool, auth *clientAuth) (*http.ServeMux, error) {
	mux := http.NewServeMux()
	// One gate for the paths whose reviews are quick: the slots and the
	// body budget bound the process.
	g := s.gate()
	g.auth = auth
	mux.Handle(ValidatePath, g.serve(Handler{Classes: s.Classes}))
	if s.Models != nil {
		mux.Handle(MutatePath, g.serve(MutateHandler{Models: s.Models}))
	}
	own := func(path string) error {
		if path == ValidatePath || path == MutatePath || path == HealthzPath || path == ReadyzPath {
			return fmt.Errorf("webhook server: %s is served by the server itself", path)
		}
		return nil
	}
	for path, admit := range s.Admitters {
		if err := own(path); err != nil {
			return nil, err
		}
		mux.Handle(path, g.serve(admit))
	}
	for path, admit := range s.Isolated {
		if err := own(path); err != nil {
			return nil, err
		}
		if _, dup := s.Admitters[path]; dup {
			return nil, fmt.Errorf("webhook server: %s is both an Admitter and Isolated", path)
		}
		// The same limits, its own slots: a burst that waits here does not
		// take the other paths' slots. The body budget stays shared, so
		// the process's memory bound is unchanged.
		isolated := *g
		isolated.slots = newFairSlots(g.slots.total, g.slots.perKey)
		mux.Handle(path, isolated.serve(admit))
	}
	mux.HandleFunc(HealthzPath, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc(ReadyzPath, func(w http.ResponseWriter, _ *http.Request) {
		if shuttingDown.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux, nil
}

// gate is the Server's gate, with its limits or their defaults.
func (s *Server) gate() *gate {
	maxInFlight, maxWait, bodyTimeout, bodyBudget := s.MaxInFlight, s.MaxWait, s.BodyTimeout, s.BodyBudget
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	if maxWait <= 0 {
		maxWait = DefaultMaxWait
	}
	if bodyTimeout <= 0 {
		bodyTimeout = DefaultBodyTimeout
	}
	if bodyBudget <= 0 {
		bodyBudget = DefaultBodyBudget
	}
	perNamespace := s.MaxInFlightPerNamespace
	if perNamespace <= 0 {
		perNamespace = max(maxInFlight/8, 1)
	}
	perNamespace = min(perNamespace, maxInFlight)
	// The largest body must fit, or it would wait for budget that never comes.
	bodyBudget = max(bodyBudget, maxReviewBytes+1)
	return newGate(maxInFlight, perNamespace, maxWait, bodyTimeout, bodyBudget)
}

// clientAuth is the Server's client authentication, nil without
// ClientCAFile.
func (s *Server) clientAuth() (*clientAuth, error) {
	if s.ClientCAFile == "" {
		if s.RequireClientCert || len(s.ClientNames) > 0 {
			return nil, errors.New("webhook server: client names and requiring a client certificate need a client CA file")
		}
		return nil, nil
	}
	names := map[string]bool{}
	for _, name := range s.ClientNames {
		if name == "" {
			return nil, errors.New("webhook server: an empty client name")
		}
		names[name] = true
	}
	return &clientAuth{caFile: s.ClientCAFile, names: names, require: s.RequireClientCert}, nil
}

// clientAuth verifies the callers of review paths against a CA file read
// again when it changes, and the names their certificates carry.
type clientAuth struct {
	caFile  string
	names   map[string]bool // empty: any name
	require bool

	mu      sync.Mutex
	cas     *x509.CertPool
	version string
}

// pool is the CA pool of caFile, read again when the file changed. A
// failed reload keeps the last good pool; with none, it is the error.
func (a *clientAuth) pool() (*x509.CertPool, error) {
	version, err := fileVersion(a.caFile)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil && version == a.version && a.cas != nil {
		return a.cas, nil
	}
	pool, loadErr := loadCAs(a.caFile)
	if loadErr != nil {
		if a.cas != nil {
			return a.cas, nil
		}
		return nil, fmt.Errorf("webhook server: load the client CA: %w", loadErr)
	}
	a.cas, a.version = pool, version
	return pool, nil
}

// loadCAs reads a PEM file of CA certificates.
func loadCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return pool, nil
}

// verified is the allowed name of r's verified client certificate, if it
// has one: the handshake verified its chain against the CA pool (r.TLS's
// VerifiedChains), and its subject common name or one of its DNS names is
// allowed.
func (a *clientAuth) verified(r *http.Request) (string, bool) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return "", false
	}
	leaf := r.TLS.VerifiedChains[0][0]
	if len(a.names) == 0 || a.names[leaf.Subject.CommonName] {
		return leaf.Subject.CommonName, true
	}
	for _, name := range leaf.DNSNames {
		if a.names[name] {
			return name, true
		}
	}
	return "", false
}

// certificateFiles loads a key pair from files and loads it again when either
// file changes. A failed reload keeps the last good pair (a rotation writes the
// two files one after the other; the next handshake sees both).
type certificateFiles struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	version string
}

func (c *certificateFiles) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	version, err := fileVersion(c.certFile, c.keyFile)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && version == c.version && c.cert != nil {
		return c.cert, nil
	}
	cert, loadErr := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if loadErr != nil {
		if c.cert != nil {
			return c.cert, nil
		}
		return nil, fmt.Errorf("webhook server: load the serving certificate: %w", loadErr)
	}
	c.cert, c.version = &cert, version
	return c.cert, nil
}

// fileVersion identifies the files' contents cheaply by size and mtime.
func fileVersion(paths ...string) (string, error) {
	version := ""
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		version += fmt.Sprintf("%s:%d:%d;", p, info.Size(), info.ModTime().UnixNano())
	}
	return version, nil
}
