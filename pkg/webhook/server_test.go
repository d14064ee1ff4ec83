package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
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

	"github.com/tessera-dev/tessera/pkg/webhook/caller"
)

// writeCert writes a self-signed serving certificate for 127.0.0.1 with the
// given common name and returns it parsed.
func writeCert(t testing.TB, dir, cn string, mtime time.Time) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// runServer runs s until the returned cancel, once it listens on the address
// it sends to listening; Run's result comes on the returned channel.
func runServer(t testing.TB, s *Server, listening <-chan net.Addr) (net.Addr, context.CancelFunc, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case addr := <-listening:
		return addr, cancel, done
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("not listening after 10s")
	}
	return nil, nil, nil
}

func TestServer(t *testing.T) {
	dir := t.TempDir()
	first := writeCert(t, dir, "first", time.Now().Add(-time.Minute))
	listening := make(chan net.Addr, 1)
	s := &Server{
		Addr:       "127.0.0.1:0",
		CertFile:   filepath.Join(dir, "tls.crt"),
		KeyFile:    filepath.Join(dir, "tls.key"),
		DrainDelay: 300 * time.Millisecond,
		listening:  listening,
		Admitters: map[string]AdmitFunc{"/extra": func(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
			return &admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{"extra saw " + req.Name}}
		}},
	}
	addr, cancel, done := runServer(t, s, listening)
	defer cancel()
	base := "https://" + addr.String()

	clientFor := func(cert *x509.Certificate) *http.Client {
		pool := x509.NewCertPool()
		pool.AddCert(cert)
		return &http.Client{
			Timeout:   5 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true},
		}
	}
	get := func(client *http.Client, path string) (int, error) {
		resp, err := client.Get(base + path)
		if err != nil {
			return 0, err
		}
		defer func() { _ = resp.Body.Close() }()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}

	client := clientFor(first)
	for _, path := range []string{HealthzPath, ReadyzPath} {
		if code, err := get(client, path); err != nil || code != 200 {
			t.Fatalf("GET %s = %d, %v; want 200", path, code, err)
		}
	}
	review, err := os.ReadFile(filepath.Join("testdata", "template-v1-typo.json"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Post(base+ValidatePath, "application/json", bytes.NewReader(review))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte("sharing.isolaton: unknown field")) {
		t.Fatalf("POST %s = %d %s", ValidatePath, resp.StatusCode, body)
	}

	// An Admitter is served on its path, behind the gate, with the UID set.
	resp, err = client.Post(base+"/extra", "application/json", bytes.NewReader(review))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"warnings":["extra saw `)) || !bytes.Contains(body, []byte(`"uid":"`)) {
		t.Fatalf("POST /extra = %d %s", resp.StatusCode, body)
	}

	// A rotated certificate is served without a restart.
	second := writeCert(t, dir, "second", time.Now())
	if code, err := get(clientFor(second), HealthzPath); err != nil || code != 200 {
		t.Fatalf("after rotation: GET %s = %d, %v; want 200 with the new certificate", HealthzPath, code, err)
	}
	// A half-written rotation keeps the last good certificate.
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, err := get(clientFor(second), HealthzPath); err != nil || code != 200 {
		t.Fatalf("with a broken key file: GET %s = %d, %v; want the last good certificate", HealthzPath, code, err)
	}

	// Shutdown: readyz fails during the drain, then Run returns nil.
	cancel()
	time.Sleep(100 * time.Millisecond)
	if code, err := get(clientFor(second), ReadyzPath); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("during the drain: GET %s = %d, %v; want 503", ReadyzPath, code, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v after shutdown, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after shutdown")
	}
	if _, err := get(clientFor(second), HealthzPath); err == nil {
		t.Error("still serving after Run returned")
	}
}

// TestServerRefusesTakenPath: an Admitter cannot replace a path the
// server serves itself.
func TestServerRefusesTakenPath(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir, "c", time.Now())
	s := &Server{Addr: "127.0.0.1:0", CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
		Admitters: map[string]AdmitFunc{ValidatePath: nil}}
	if err := s.Run(context.Background()); err == nil || !strings.Contains(err.Error(), ValidatePath) {
		t.Fatalf("Run = %v, want an error naming %s", err, ValidatePath)
	}
}

func TestServerRefusesMissingCertificate(t *testing.T) {
	s := &Server{Addr: "127.0.0.1:0", CertFile: "/nonexistent/tls.crt", KeyFile: "/nonexistent/tls.key"}
	if err := s.Run(context.Background()); err == nil {
		t.Fatal("Run without a certificate succeeded")
	}
}

// Two replicas in one network namespace share the address with ReusePort;
// when one stops, every new connection reaches the other.
func TestServerReusePort(t *testing.T) {
	dir := t.TempDir()
	cert := writeCert(t, dir, "shared", time.Now().Add(-time.Minute))
	// A free port: bind, note it, release.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	_ = probe.Close()
	start := func(reuse bool) (context.CancelFunc, chan error) {
		listening := make(chan net.Addr, 1)
		s := &Server{Addr: addr, CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), ReusePort: reuse, listening: listening}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		select {
		case <-listening:
		case err := <-done:
			cancel()
			done <- err
			return nil, done
		case <-time.After(10 * time.Second):
			t.Fatal("not listening after 10s")
		}
		return cancel, done
	}
	stopA, doneA := start(true)
	if stopA == nil {
		t.Fatalf("first replica: %v", <-doneA)
	}
	defer stopA()
	stopB, doneB := start(true)
	if stopB == nil {
		t.Fatalf("second replica on the same address: %v", <-doneB)
	}
	// Without the option a third cannot bind: the test is not vacuous.
	if stopC, doneC := start(false); stopC != nil {
		stopC()
		t.Fatal("a listener without SO_REUSEPORT bound the shared address")
	} else if err := <-doneC; err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("third replica: %v, want address already in use", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	stopB()
	if err := <-doneB; err != nil {
		t.Fatalf("second replica's shutdown: %v", err)
	}
	for i := range 20 {
		resp, err := client.Get("https://" + addr + HealthzPath)
		if err != nil {
			t.Fatalf("request %d after one replica stopped: %v", i, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
}

// An Isolated path whose reviews wait (all its slots held) leaves the
// other paths their slots.
func TestIsolatedPathHasOwnSlots(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	s := &Server{MaxInFlight: 1, MaxWait: 50 * time.Millisecond,
		Isolated: map[string]AdmitFunc{"/slow": func(context.Context, *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
			entered <- struct{}{}
			<-release
			return &admissionv1.AdmissionResponse{Allowed: true}
		}}}
	var down atomic.Bool
	mux, err := s.mux(&down)
	if err != nil {
		t.Fatal(err)
	}
	review, err := os.ReadFile(filepath.Join("testdata", "template-v1-typo.json"))
	if err != nil {
		t.Fatal(err)
	}
	post := func(path string) int {
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(review))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w.Code
	}
	done := make(chan int, 1)
	go func() { done <- post("/slow") }()
	<-entered
	if code := post(ValidatePath); code != http.StatusOK {
		t.Errorf("%s while /slow holds its only slot: %d, want 200", ValidatePath, code)
	}
	if code := post("/slow"); code != http.StatusTooManyRequests {
		t.Errorf("/slow while its only slot is held: %d, want 429", code)
	}
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Errorf("/slow: %d", code)
	}
	if _, err := (&Server{Admitters: map[string]AdmitFunc{"/x": nil}, Isolated: map[string]AdmitFunc{"/x": nil}}).mux(&down); err == nil {
		t.Error("a path both Admitter and Isolated accepted")
	}
}

// testCA is a CA that signs client certificates in tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t testing.TB, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// client is a TLS client certificate that ca signs for cn and dnsNames.
func (ca *testCA) client(t testing.TB, cn string, dnsNames ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     dnsNames,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// whoAdmits answers every review with a warning naming the verified
// caller, or "unverified".
func whoAdmits(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	name, ok := caller.Verified(ctx)
	if !ok {
		name = "unverified"
	}
	return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true, Warnings: []string{"caller " + name}}
}

// A client certificate that the client CA signs for an allowed name makes
// the review's caller verified; with RequireClientCert every other review
// gets 403 while the probes stay open; a certificate of another CA fails
// the handshake; a rotated CA file applies to new connections.
func TestClientCertificates(t *testing.T) {
	review, err := os.ReadFile(filepath.Join("testdata", "claim-v1-valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	ca, other := newTestCA(t, "webhook-client-ca"), newTestCA(t, "other-ca")
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	apiServer := ca.client(t, "kube-apiserver")
	bySAN := ca.client(t, "someone", "kube-apiserver")
	stranger := ca.client(t, "tenant")
	forged := other.client(t, "kube-apiserver")

	for _, require := range []bool{false, true} {
		t.Run(fmt.Sprintf("require=%v", require), func(t *testing.T) {
			s := &Server{ClientCAFile: caFile, ClientNames: []string{"kube-apiserver"}, RequireClientCert: require,
				Isolated: map[string]AdmitFunc{"/who": whoAdmits}}
			base, _, serving := startServer(t, s)
			roots := x509.NewCertPool()
			roots.AddCert(serving)
			// The client sends its certificate whatever CAs the server
			// names, as an attacker would.
			clientWith := func(certs ...tls.Certificate) *http.Client {
				config := &tls.Config{RootCAs: roots}
				if len(certs) > 0 {
					config.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
				}
				c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: config, ForceAttemptHTTP2: true}}
				t.Cleanup(c.CloseIdleConnections)
				return c
			}
			// who posts a review and returns the status and the caller the
			// admission saw ("" without an answer).
			who := func(c *http.Client) (int, string, error) {
				resp, err := c.Post(base+"/who", "application/json", bytes.NewReader(review))
				if err != nil {
					return 0, "", err
				}
				defer func() { _ = resp.Body.Close() }()
				body, _ := io.ReadAll(resp.Body)
				if resp.ProtoMajor != 2 {
					t.Errorf("served over %s, want HTTP/2", resp.Proto)
				}
				if resp.StatusCode != http.StatusOK {
					return resp.StatusCode, "", nil
				}
				var out admissionv1.AdmissionReview
				if err := json.Unmarshal(body, &out); err != nil || out.Response == nil || len(out.Response.Warnings) != 1 {
					return resp.StatusCode, "", fmt.Errorf("answer %s: %v", body, err)
				}
				return resp.StatusCode, strings.TrimPrefix(out.Response.Warnings[0], "caller "), nil
			}
			unverified := http.StatusOK
			if require {
				unverified = http.StatusForbidden
			}
			for _, tc := range []struct {
				name   string
				client *http.Client
				code   int
				caller string
			}{
				{"the API server's certificate", clientWith(apiServer), http.StatusOK, "kube-apiserver"},
				{"an allowed DNS name", clientWith(bySAN), http.StatusOK, "kube-apiserver"},
				{"no certificate", clientWith(), unverified, "unverified"},
				{"a name not allowed", clientWith(stranger), unverified, "unverified"},
			} {
				code, name, err := who(tc.client)
				if err != nil {
					t.Errorf("%s: %v", tc.name, err)
					continue
				}
				if code != tc.code || (code == http.StatusOK && name != tc.caller) {
					t.Errorf("%s: %d, caller %q; want %d, caller %q", tc.name, code, name, tc.code, tc.caller)
				}
			}
			if _, _, err := who(clientWith(forged)); err == nil {
				t.Error("a certificate of another CA was accepted; want a failed handshake")
			}
			for _, path := range []string{HealthzPath, ReadyzPath} {
				resp, err := clientWith().Get(base + path)
				if err != nil {
					t.Fatalf("GET %s without a certificate: %v", path, err)
				}
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("GET %s without a certificate: %d, want 200", path, resp.StatusCode)
				}
			}
			if !require {
				return
			}
			// Rotation: the other CA replaces the first; new connections
			// verify against it.
			if err := os.WriteFile(caFile, other.pem, 0o600); err != nil {
				t.Fatal(err)
			}
			later := time.Now().Add(time.Minute)
			if err := os.Chtimes(caFile, later, later); err != nil {
				t.Fatal(err)
			}
			if code, name, err := who(clientWith(forged)); err != nil || code != http.StatusOK || name != "kube-apiserver" {
				t.Errorf("after rotation, the new CA's certificate: %d, %q, %v; want 200, kube-apiserver", code, name, err)
			}
			if _, _, err := who(clientWith(apiServer)); err == nil {
				t.Error("after rotation, the old CA's certificate was accepted")
			}
		})
	}
}

// Client names and RequireClientCert without a CA, an unreadable CA file
// and an empty name are refused at Run.
func TestClientAuthConfigErrors(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir, "c", time.Now())
	bad := filepath.Join(dir, "bad.crt")
	if err := os.WriteFile(bad, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*Server{
		"require without CA": {RequireClientCert: true},
		"names without CA":   {ClientNames: []string{"kube-apiserver"}},
		"CA file not PEM":    {ClientCAFile: bad},
		"CA file missing":    {ClientCAFile: filepath.Join(dir, "missing.crt")},
		"an empty name":      {ClientCAFile: filepath.Join(dir, "tls.crt"), ClientNames: []string{""}},
	} {
		s.Addr, s.CertFile, s.KeyFile = "127.0.0.1:0", filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		// Run returns nil once ctx ends if it started.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := s.Run(ctx)
		cancel()
		if err == nil {
			t.Errorf("%s: Run started", name)
		}
	}
}
