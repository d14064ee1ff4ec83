package webhook

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// startServer runs s on a loopback port with a fresh certificate and returns
// its base URL and a client that trusts it.
func startServer(t testing.TB, s *Server) (string, *http.Client, *x509.Certificate) {
	t.Helper()
	dir := t.TempDir()
	cert := writeCert(t, dir, "gate", time.Now().Add(-time.Minute))
	listening := make(chan net.Addr, 1)
	s.Addr, s.CertFile, s.KeyFile, s.listening = "127.0.0.1:0", filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), listening
	addr, cancel, done := runServer(t, s, listening)
	t.Cleanup(func() {
		cancel()
		<-done
	})
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	t.Cleanup(client.CloseIdleConnections)
	return "https://" + addr.String(), client, cert
}

// slowBody opens a connection to base and POSTs a review whose headers
// declare length bytes, then sends first of them and nothing more. It
// returns the connection's response status once the server answers (or 0
// when the connection closes without one).
func slowBody(t *testing.T, base string, cert *x509.Certificate, length int, first []byte) <-chan int {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	conn, err := tls.Dial("tcp", base[len("https://"):], &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", ValidatePath, length); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(first); err != nil {
		t.Fatal(err)
	}
	status := make(chan int, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			status <- 0
			return
		}
		_ = resp.Body.Close()
		status <- resp.StatusCode
	}()
	return status
}

func postReview(client *http.Client, url string, body []byte) (int, *admissionv1.AdmissionReview, error) {
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil, nil
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(out, &review); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%w: %s", err, out)
	}
	return resp.StatusCode, &review, nil
}

// Bodies that never finish hold no review slot: with every slot's worth of
// them open, an ordinary review is answered, and each of them is cut off
// after the body timeout. (Before the body was read under a slot, the
// ordinary review got 429 after MaxWait.)
func TestSlowBodiesHoldNoSlot(t *testing.T) {
	s := &Server{MaxInFlight: 2, MaxWait: 500 * time.Millisecond, BodyTimeout: 2 * time.Second}
	base, client, cert := startServer(t, s)
	valid, err := os.ReadFile(filepath.Join("testdata", "claim-v1-valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	var stalled []<-chan int
	for range 2 * s.MaxInFlight {
		stalled = append(stalled, slowBody(t, base, cert, len(valid), valid[:10]))
	}
	// Let the server start reading every stalled body before the ordinary
	// review arrives.
	time.Sleep(200 * time.Millisecond)
	code, review, err := postReview(client, base+ValidatePath, valid)
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusOK || review.Response == nil || !review.Response.Allowed {
		t.Fatalf("ordinary review beside %d stalled bodies: status %d, want 200 and allowed", len(stalled), code)
	}
	for i, status := range stalled {
		select {
		case code := <-status:
			if code != http.StatusBadRequest && code != 0 {
				t.Errorf("stalled body %d: status %d, want 400 or the connection closed", i, code)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("stalled body %d still open 15s after a body timeout of %v", i, s.BodyTimeout)
		}
	}
}

// Large bodies draw on a budget of their own: with it spent by bodies that
// stall, an ordinary review is answered at once.
func TestLargeBodiesCannotStarveSmallOnes(t *testing.T) {
	s := &Server{BodyTimeout: 5 * time.Second, BodyBudget: 2 * maxReviewBytes}
	base, client, cert := startServer(t, s)
	valid, err := os.ReadFile(filepath.Join("testdata", "claim-v1-valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	// Two stalled bodies that declare the largest review take the budget.
	for range 2 {
		slowBody(t, base, cert, maxReviewBytes, []byte("{"))
	}
	time.Sleep(200 * time.Millisecond)
	code, review, err := postReview(client, base+ValidatePath, valid)
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusOK || review.Response == nil || !review.Response.Allowed {
		t.Fatalf("ordinary review with the large budget spent: status %d, want 200 and allowed", code)
	}
}

// A body that cannot get budget before its deadline is refused with 429
// (errNoBudget) instead of waiting on; one within the small pool is read.
func TestReadBodyBudget(t *testing.T) {
	g := newGate(1, 1, time.Second, 300*time.Millisecond, 1<<20)
	if err := g.large.Acquire(context.Background(), 1<<20); err != nil {
		t.Fatal(err)
	}
	read := func(body []byte) ([]byte, error) {
		req := httptest.NewRequest(http.MethodPost, ValidatePath, bytes.NewReader(body))
		got, release, err := g.readBody(httptest.NewRecorder(), req)
		release()
		return got, err
	}
	small := bytes.Repeat([]byte("s"), 10<<10)
	if got, err := read(small); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("small body with the large budget spent: %d bytes, %v", len(got), err)
	}
	if _, err := read(bytes.Repeat([]byte("l"), 200<<10)); !errors.Is(err, errNoBudget) {
		t.Fatalf("large body with the large budget spent: %v, want %v", err, errNoBudget)
	}
	g.large.Release(1 << 20)
	large := bytes.Repeat([]byte("l"), 200<<10)
	if got, err := read(large); err != nil || !bytes.Equal(got, large) {
		t.Fatalf("large body with budget: %d bytes, %v", len(got), err)
	}
	// Every byte was given back.
	if !g.large.TryAcquire(1<<20) || !g.small.TryAcquire(smallBodies*smallBodyBytes) {
		t.Error("budget not released")
	}
}

// blockingClasses answers every read only when the read's context ends.
type blockingClasses struct{}

func (blockingClasses) Get(ctx context.Context, _ string) (*resourceapi.DeviceClass, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// The handler bounds a review by the timeout the API server puts in the
// URL and stops it there: a DeviceClass read that never returns by itself
// ends with the request's deadline, and the review is abandoned.
func TestHandlerHonoursRequestTimeout(t *testing.T) {
	valid, err := os.ReadFile(filepath.Join("testdata", "claim-v1-valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, ValidatePath+"?timeout=100ms", bytes.NewReader(valid))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Handler{Classes: blockingClasses{}}.ServeHTTP(rec, req)
	}()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the review did not end 15s after its 100ms timeout")
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &review); err != nil {
		t.Fatalf("%v: %s", err, rec.Body.String())
	}
	if review.Response == nil || review.Response.Allowed || review.Response.Result.Code != http.StatusGatewayTimeout {
		t.Fatalf("response = %+v, want a denial with code 504", review.Response)
	}
}

// Requests that declare a large body and send nothing hold no memory budget:
// with 300 of them open (more than the 256 bodies the small pool once
// granted 64 KiB each up front, in FIFO order), an ordinary review is still
// answered and allowed within the API server's own timeout for it. (Before,
// it queued for the small pool behind the stalled requests until they hit
// their body deadline.)
func TestStalledDeclaredBodiesHoldNoBudget(t *testing.T) {
	s := &Server{BodyTimeout: 20 * time.Second}
	base, client, cert := startServer(t, s)
	valid, err := os.ReadFile(filepath.Join("testdata", "claim-v1-valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	var stalled []<-chan int
	for i := range 300 {
		// Half send nothing, half a few bytes.
		stalled = append(stalled, slowBody(t, base, cert, 1<<20, []byte("{\"a\":1,"[:i%2*7])))
	}
	time.Sleep(500 * time.Millisecond)
	// The API server gives the webhook timeoutSeconds (here 5s, the default
	// is 10s) and says so in the URL; the review must be answered by then.
	client.Timeout = 5 * time.Second
	code, review, err := postReview(client, base+ValidatePath+"?timeout=5s", valid)
	if err != nil {
		t.Fatalf("ordinary review beside %d stalled bodies: %v", len(stalled), err)
	}
	if code != http.StatusOK || review.Response == nil || !review.Response.Allowed {
		t.Fatalf("ordinary review beside %d stalled bodies: status %d, want 200 and allowed", len(stalled), code)
	}
}

// reviewIn is testdata/claim-v1-valid.json with request.namespace set to
// namespace.
func reviewIn(t testing.TB, namespace string) []byte {
	t.Helper()
	valid, err := os.ReadFile(filepath.Join("testdata", "claim-v1-valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	var review map[string]any
	if err := json.Unmarshal(valid, &review); err != nil {
		t.Fatal(err)
	}
	review["request"].(map[string]any)["namespace"] = namespace
	out, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A burst of reviews in one namespace, more than every slot, does not make
// a single review of another namespace wait: the burst holds at most its
// namespace's share, and the other review is answered at once. (With one
// pool of slots shared by every namespace, it got 429 after MaxWait.)
func TestBurstInOneNamespaceLeavesOthersSlots(t *testing.T) {
	release := make(chan struct{})
	var held atomic.Int32
	s := &Server{MaxInFlight: 16, MaxWait: 2 * time.Second,
		Admitters: map[string]AdmitFunc{"/hold": func(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
			if req.Namespace == "burst" {
				held.Add(1)
				<-release
			}
			return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
		}}}
	var down atomic.Bool
	mux, err := s.mux(&down)
	if err != nil {
		t.Fatal(err)
	}
	post := func(body []byte) int {
		r := httptest.NewRequest(http.MethodPost, "/hold", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w.Code
	}
	burst := reviewIn(t, "burst")
	codes := make(chan int, 32)
	for range 32 {
		go func() { codes <- post(burst) }()
	}
	// The burst's share (an eighth of 16) is taken; the rest of it waits.
	deadline := time.Now().Add(10 * time.Second)
	for held.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if n := held.Load(); n != 2 {
		t.Errorf("the burst holds %d slots, want its share, 2", n)
	}
	start := time.Now()
	if code := post(reviewIn(t, "quiet")); code != http.StatusOK {
		t.Errorf("a review of another namespace during the burst: %d, want 200", code)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("a review of another namespace waited %v during the burst", waited)
	}
	close(release)
	ok := 0
	for range 32 {
		if <-codes == http.StatusOK {
			ok++
		}
	}
	if ok == 0 {
		t.Error("no review of the burst was answered")
	}
}

// With client authentication, reviews whose caller is not verified share
// one namespace's slots whatever namespace they name.
func TestUnverifiedReviewsShareOneNamespace(t *testing.T) {
	release := make(chan struct{})
	var held atomic.Int32
	g := newGate(8, 2, 200*time.Millisecond, DefaultBodyTimeout, DefaultBodyBudget)
	g.auth = &clientAuth{names: map[string]bool{}}
	h := g.serve(reviewerFunc(func(http.ResponseWriter, *http.Request, *admissionv1.AdmissionReview) {
		held.Add(1)
		<-release
	}))
	post := func(namespace string) int {
		r := httptest.NewRequest(http.MethodPost, ValidatePath, bytes.NewReader(reviewIn(t, namespace)))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	codes := make(chan int, 8)
	for i := range 8 {
		go func() { codes <- post(fmt.Sprintf("ns-%d", i)) }()
	}
	refused := 0
	for range 6 {
		if <-codes == http.StatusTooManyRequests {
			refused++
		}
	}
	close(release)
	for range 2 {
		<-codes
	}
	if refused != 6 || held.Load() != 2 {
		t.Errorf("8 unverified reviews naming 8 namespaces: %d held a slot, %d refused; want 2 and 6", held.Load(), refused)
	}
}

// fairSlots hands a released slot to the first waiter that both bounds
// allow: a key at its bound is passed over, a key's waiters are served in
// arrival order, and a waiter whose context ends leaves the queue.
func TestFairSlotsOrder(t *testing.T) {
	f := newFairSlots(2, 1)
	ctx := context.Background()
	got := make(chan string, 8)
	wait := func(key, name string) {
		go func() {
			if f.acquire(ctx, key) {
				got <- name
			}
		}()
		// Queued before the next one.
		deadline := time.Now().Add(5 * time.Second)
		for {
			f.mu.Lock()
			n := 0
			for _, w := range f.waiters {
				if w.key == key {
					n++
				}
			}
			f.mu.Unlock()
			if n > 0 && strings.HasSuffix(name, fmt.Sprint(n)) || time.Now().After(deadline) {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	next := func(want string) {
		t.Helper()
		select {
		case name := <-got:
			if name != want {
				t.Fatalf("granted %s, want %s", name, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("nothing granted, want %s", want)
		}
	}
	if !f.acquire(ctx, "a") {
		t.Fatal("a: no slot")
	}
	wait("a", "a1")
	wait("a", "a2")
	// b passes a's waiters: a holds its bound, the total has room.
	if !f.acquire(ctx, "b") {
		t.Fatal("b: no slot beside a's waiters")
	}
	wait("c", "c1")
	cancelled, cancel := context.WithCancel(ctx)
	gone := make(chan bool)
	go func() { gone <- f.acquire(cancelled, "d") }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if <-gone {
		t.Fatal("d: a slot after its context ended")
	}
	f.release("b") // a1 and a2 cannot take it (a is at its bound): c1
	next("c1")
	f.release("a") // a1 before a2
	next("a1")
	f.release("c")
	f.release("a")
	next("a2")
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.waiters) != 0 || f.inUse != 1 {
		t.Errorf("%d waiters, %d in use; want 0 and 1 (a2)", len(f.waiters), f.inUse)
	}
}
