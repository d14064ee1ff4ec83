package metricsserver

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"

	"google.golang.org/grpc"
)

// fakeAPIServer is an HTTP server answering the API server's TokenReview
// (token "reader" is user reader, token "other" is user other, anything else
// is invalid) and SubjectAccessReview (only reader may get /metrics) calls,
// and a client of it; it counts the reviews.
func fakeAPIServer(t *testing.T) (kubernetes.Interface, *reviews) {
	t.Helper()
	r := &reviews{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /apis/authentication.k8s.io/v1/tokenreviews", answerReview(r, "token", func(tr *authnv1.TokenReview) {
		switch tr.Spec.Token {
		case "reader", "other":
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: tr.Spec.Token}}
		default:
			tr.Status = authnv1.TokenReviewStatus{Authenticated: false, Error: "invalid token"}
		}
	}))
	mux.HandleFunc("POST /apis/authorization.k8s.io/v1/subjectaccessreviews", answerReview(r, "access", func(sar *authzv1.SubjectAccessReview) {
		nr := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = sar.Spec.User == "reader" && nr != nil && nr.Path == "/metrics" && nr.Verb == "get"
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return client, r
}

// answerReview serves a review of type T: it decodes the request's, counts
// it as kind in r, lets answer fill in its status and sends it back.
func answerReview[T any](r *reviews, kind string, answer func(*T)) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		var review T
		if err := json.NewDecoder(req.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(kind)
		answer(&review)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(review)
	}
}

type reviews struct {
	mu     sync.Mutex
	counts map[string]int
}

func (r *reviews) add(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[kind]++
}

func (r *reviews) get(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[kind]
}

// start serves s on a free local port over real TLS and returns its base URL.
func start(t *testing.T, s *Server) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s.Address = "127.0.0.1:0"
	l, err := s.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "https://" + l.Addr().String()
}

var insecureClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := insecureClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func newServer(t *testing.T, metrics http.Handler, health *Health) (*Server, *reviews) {
	t.Helper()
	client, r := fakeAPIServer(t)
	auth, err := NewDelegated(client)
	if err != nil {
		t.Fatal(err)
	}
	if health == nil {
		health = &Health{}
	}
	return &Server{Certificate: &Certificate{Host: "node-a"}, Auth: auth, Metrics: metrics, Health: health}, r
}

var metricsBody = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	_, _ = io.WriteString(w, "tessera_up 1\n")
})

func TestMetricsNeedTokenAndPermission(t *testing.T) {
	s, r := newServer(t, metricsBody, nil)
	base := start(t, s)
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"anonymous", "", http.StatusUnauthorized},
		{"invalid token", "forged", http.StatusUnauthorized},
		{"user without the permission", "other", http.StatusForbidden},
		{"metrics reader", "reader", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(t, base+"/metrics", tc.token)
			if code != tc.want {
				t.Fatalf("GET /metrics: %d %q, want %d", code, body, tc.want)
			}
			if got := strings.Contains(body, "tessera_up 1"); got != (tc.want == http.StatusOK) {
				t.Errorf("body %q: metrics served %v", body, got)
			}
		})
	}
	// Answers are cached: a second authorized scrape asks the API server
	// nothing new.
	tokens, access := r.get("token"), r.get("access")
	if code, _ := get(t, base+"/metrics", "reader"); code != http.StatusOK {
		t.Fatalf("second scrape: %d", code)
	}
	if r.get("token") != tokens || r.get("access") != access {
		t.Errorf("second scrape made reviews: tokens %d->%d, access %d->%d", tokens, r.get("token"), access, r.get("access"))
	}
	// Other paths of the server are not served, whoever asks.
	if code, _ := get(t, base+"/mock/xid", "reader"); code != http.StatusNotFound {
		t.Errorf("GET /mock/xid: %d, want 404", code)
	}
}

func TestPlainHTTPRefused(t *testing.T) {
	s, _ := newServer(t, metricsBody, nil)
	base := start(t, s)
	resp, err := http.Get(strings.Replace(base, "https://", "http://", 1) + "/metrics")
	if err == nil {
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if strings.Contains(string(b), "tessera_up") {
			t.Fatalf("plain HTTP served the metrics: %d %q", resp.StatusCode, b)
		}
	}
}

func TestHealthzIsUnauthenticatedAndFailsWithAFailedCheck(t *testing.T) {
	// Every request runs the checks again.
	h := &Health{Status: func() string { return "ok: 8 GPUs" }, CacheFor: time.Nanosecond}
	var broken error
	var mu sync.Mutex
	h.Add("grpc", func(context.Context) error { mu.Lock(); defer mu.Unlock(); return broken })
	h.Add("publisher", func(context.Context) error { return nil })
	s, _ := newServer(t, metricsBody, h)
	base := start(t, s)
	if code, body := get(t, base+"/healthz", ""); code != http.StatusOK || body != "ok: 8 GPUs\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	mu.Lock()
	broken = errors.New("gRPC server on /plugin/dra.sock: not ready")
	mu.Unlock()
	code, body := get(t, base+"/healthz", "")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "grpc: gRPC server on /plugin/dra.sock: not ready") || strings.Contains(body, "publisher") {
		t.Fatalf("/healthz with a failed check: %d %q", code, body)
	}
}

// TestHealthzChecksSharedAndCached: concurrent /healthz requests share one
// run of the checks, and later ones within CacheFor reuse its result; a
// caller's cancelled request does not fail the run the others wait for.
func TestHealthzChecksSharedAndCached(t *testing.T) {
	var mu sync.Mutex
	runs := 0
	release := make(chan struct{})
	h := &Health{Status: func() string { return "2 GPUs" }, CacheFor: time.Hour}
	h.Add("grpc", func(ctx context.Context) error {
		mu.Lock()
		runs++
		mu.Unlock()
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	serve := func(ctx context.Context) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	// The first caller gives up while the checks run.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if code, body := serve(gone); code != http.StatusServiceUnavailable || !strings.Contains(body, "context canceled") {
		t.Errorf("/healthz of a cancelled request: %d %q", code, body)
	}
	const callers = 16
	var wg sync.WaitGroup
	codes := make(chan string, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body := serve(context.Background())
			codes <- fmt.Sprint(code, " ", body)
		}()
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != "200 ok: 2 GPUs\n" {
			t.Errorf("/healthz: %q, want 200 ok", c)
		}
	}
	if code, _ := serve(context.Background()); code != http.StatusOK {
		t.Errorf("/healthz within CacheFor: %d", code)
	}
	mu.Lock()
	if runs != 1 {
		t.Errorf("the checks ran %d times for %d requests, want once", runs, callers+2)
	}
	mu.Unlock()
	// A new check is run at the next request.
	h.Add("publisher", func(context.Context) error { return errors.New("stopped") })
	if code, body := serve(context.Background()); code != http.StatusServiceUnavailable || !strings.Contains(body, "publisher: stopped") {
		t.Errorf("/healthz after Add: %d %q", code, body)
	}
}

// TestInFlightCapBeforeAuthentication: requests with made-up tokens are
// counted against MaxInFlight before their TokenReview, so that at most
// MaxInFlight reviews are asked of the API server at once; the others get
// 429 without a review.
func TestInFlightCapBeforeAuthentication(t *testing.T) {
	var mu sync.Mutex
	inReview, maxInReview, total := 0, 0, 0
	entered := make(chan struct{}, 64)
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /apis/authentication.k8s.io/v1/tokenreviews", func(w http.ResponseWriter, req *http.Request) {
		var tr authnv1.TokenReview
		if err := json.NewDecoder(req.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		inReview++
		total++
		maxInReview = max(maxInReview, inReview)
		mu.Unlock()
		entered <- struct{}{}
		<-release
		mu.Lock()
		inReview--
		mu.Unlock()
		tr.Status = authnv1.TokenReviewStatus{Authenticated: false, Error: "invalid token"}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(tr)
	})
	api := httptest.NewServer(mux)
	t.Cleanup(api.Close)
	auth, err := NewDelegatedForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Certificate: &Certificate{Host: "node-a"}, Auth: auth, Metrics: metricsBody, Health: &Health{}, MaxInFlight: 1}
	base := start(t, s)

	first := make(chan int, 1)
	go func() { code, _ := get(t, base+"/metrics", "made-up-0"); first <- code }()
	<-entered
	const others = 8
	var wg sync.WaitGroup
	codes := make(chan int, others)
	for i := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := get(t, base+"/metrics", fmt.Sprintf("made-up-%d", i+1))
			codes <- code
		}()
	}
	// The others are answered while the first review still waits; without
	// the cap before authentication they would wait in reviews of their own.
	for range others {
		select {
		case code := <-codes:
			if code != http.StatusTooManyRequests {
				t.Errorf("a request while another one's token is reviewed: %d, want 429", code)
			}
			continue
		case <-time.After(10 * time.Second):
			t.Errorf("a request while another one's token is reviewed got no answer")
		}
		break
	}
	close(release)
	wg.Wait()
	select {
	case code := <-first:
		if code != http.StatusUnauthorized {
			t.Errorf("the reviewed made-up token: %d, want 401", code)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the reviewed made-up token got no answer")
	}
	mu.Lock()
	defer mu.Unlock()
	if maxInReview != 1 || total != 1 {
		t.Errorf("%d TokenReviews at once, %d in all for %d requests with MaxInFlight 1; want 1 and 1", maxInReview, total, others+1)
	}
}

func TestInFlightCapAndTimeout(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "tessera_up 1\n")
	})
	s, _ := newServer(t, slow, nil)
	s.MaxInFlight = 1
	s.RequestTimeout = 2 * time.Second
	base := start(t, s)

	first := make(chan int, 1)
	go func() { code, _ := get(t, base+"/metrics", "reader"); first <- code }()
	<-entered
	if code, body := get(t, base+"/metrics", "reader"); code != http.StatusTooManyRequests {
		t.Errorf("second scrape while one is in flight: %d %q, want 429", code, body)
	}
	// The first scrape outlasts the request timeout.
	if code := <-first; code != http.StatusServiceUnavailable {
		t.Errorf("scrape past the timeout: %d, want 503", code)
	}
	close(release)
	// The slot is free again once the timed-out handler returned.
	deadline := time.Now().Add(5 * time.Second)
	for {
		go func() { <-entered }()
		code, _ := get(t, base+"/metrics", "reader")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape after the release: %d", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestCertificateFiles(t *testing.T) {
	dir := t.TempDir()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("metrics.example", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	c := &Certificate{CertFile: certFile, KeyFile: keyFile}
	got, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	if got.Leaf == nil || !slices.Equal(got.Leaf.DNSNames, []string{"metrics.example"}) {
		t.Fatalf("loaded certificate for %v, want metrics.example", got.Leaf.DNSNames)
	}
	for _, tc := range []struct {
		name string
		c    *Certificate
		want string
	}{
		{"key without certificate", &Certificate{KeyFile: keyFile}, "set both"},
		{"missing certificate", &Certificate{CertFile: filepath.Join(dir, "nope.crt"), KeyFile: keyFile}, "nope.crt"},
		{"key is not a key", &Certificate{CertFile: certFile, KeyFile: certFile}, "tls.crt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.c.Load(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestServerNeedsAuth(t *testing.T) {
	s := &Server{Address: "127.0.0.1:0", Certificate: &Certificate{Host: "n"}, Metrics: metricsBody, Health: &Health{}}
	if _, err := s.Handler(); err == nil {
		t.Fatal("a server without an authenticator serves")
	}
}

func TestSocketsCheck(t *testing.T) {
	dir, err := os.MkdirTemp("", "ms") // short: Unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	var sockets Sockets
	ctx := context.Background()
	if err := sockets.Check(ctx); err != nil {
		t.Fatalf("no sockets yet: %v", err)
	}
	path := filepath.Join(dir, "dra.sock")
	// A stale file from a previous run is replaced.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := sockets.Listen(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go func() { _ = srv.Serve(l) }()
	if err := sockets.Check(ctx); err != nil {
		t.Fatalf("serving: %v", err)
	}
	srv.Stop()
	err = sockets.Check(ctx)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("stopped server: %v, want an error naming %s", err, path)
	}
	if _, statErr := os.Stat(path); !errors.Is(statErr, os.ErrNotExist) {
		t.Errorf("socket left behind after Close: %v", statErr)
	}
}

func TestAlive(t *testing.T) {
	var a Alive
	started, stop := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); a.Run(func() { close(started); <-stop }) }()
	<-started
	if err := a.Check(context.Background()); err != nil {
		t.Fatalf("running: %v", err)
	}
	close(stop)
	<-done
	if err := a.Check(context.Background()); err == nil {
		t.Fatal("returned, still healthy")
	}
}

var _ net.Listener = (*unixListener)(nil)

// Run waits for a taken address (the other pod of a surge update) and
// serves once it is free; a bad address is an error at once.
func TestRunRetriesATakenAddress(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a retry (5 s)")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newServer(t, metricsBody, &Health{})
	s.Address = taken.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Run returned while the address was taken: %v", err)
	default:
	}
	_ = taken.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := insecureClient.Get("https://" + s.Address + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not serving after the address was freed: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	bad := &Server{Address: "no-port", Certificate: &Certificate{Host: "n"}, Auth: s.Auth, Metrics: metricsBody, Health: &Health{}}
	if err := bad.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "no-port") {
		t.Errorf("Run with a bad address: %v, want an error naming it", err)
	}
}
