package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
)

// BenchmarkReviewAtLimits is one Review of the costliest claim the API
// allows: 32 requests × 8 alternatives, 32 configs of 10 KiB and 32
// constraints, each naming every request.
func BenchmarkReviewAtLimits(b *testing.B) {
	req := worstClaim(32, 8, 32, 32, 10<<10)
	ctx := context.Background()
	for b.Loop() {
		if resp := Review(ctx, req, nil); !resp.Allowed {
			b.Fatal(resp.Result.Message)
		}
	}
}

// BenchmarkServeUnderAttack measures what an ordinary review costs a client
// of the webhook while 32 other clients send it the worst bodies they can,
// in-process over loopback TLS with the Server's default limits. Each
// iteration is one ordinary review (testdata/claim-v1-valid.json); it
// reports their p50/p99/max latency, the reviews refused (any status but
// 200), and the process's peak RSS (VmHWM, which includes the attacking
// clients' own buffers) and peak live heap. The attacks:
//
//   - slow: each declares the largest body (4 MiB) and sends one byte every
//     100ms, again as soon as the server cuts it off;
//   - huge: each sends 4 MiB at once but the last byte, and waits;
//   - costly: each sends the review of the costliest claim the API allows
//     (worstClaim at the limits, in namespace tenant-b), as fast as the
//     server answers.
//
// Run it with
//
//	go test -run '^$' -bench BenchmarkServeUnderAttack -benchtime 200x ./pkg/webhook/
func BenchmarkServeUnderAttack(b *testing.B) {
	valid, err := os.ReadFile(filepath.Join("testdata", "claim-v1-valid.json"))
	if err != nil {
		b.Fatal(err)
	}
	// The attackers' claims are in a namespace of their own: the ordinary
	// review is another tenant's (team-a).
	costly := worstClaim(32, 8, 32, 32, 10<<10)
	costly.Namespace = "tenant-b"
	worst, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: admissionTypeMeta, Request: costly})
	if err != nil {
		b.Fatal(err)
	}
	// One body for every attacker, so that the figures are the server's.
	huge := bytes.Repeat([]byte(" "), maxReviewBytes)
	huge[0] = '{'
	for _, attack := range []string{"none", "slow", "huge", "costly"} {
		b.Run(attack, func(b *testing.B) {
			base, client, cert := startServer(b, &Server{})
			stop := make(chan struct{})
			var attackers sync.WaitGroup
			if attack != "none" {
				for range 32 {
					attackers.Add(1)
					go func() {
						defer attackers.Done()
						attackLoop(base, cert, attack, worst, huge, stop)
					}()
				}
			}
			peak := startPeakHeap()
			resetPeakRSS()
			// Let the attack reach its steady state.
			time.Sleep(3 * time.Second)
			latencies := make([]time.Duration, 0, b.N)
			refused := 0
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				resp, err := client.Post(base+ValidatePath, "application/json", bytes.NewReader(valid))
				if err == nil {
					_ = resp.Body.Close()
				}
				latencies = append(latencies, time.Since(start))
				if err != nil || resp.StatusCode != http.StatusOK {
					refused++
				}
			}
			b.StopTimer()
			close(stop)
			heap := peak()
			rss := peakRSS()
			attackers.Wait()
			slices.Sort(latencies)
			at := func(q float64) time.Duration { return latencies[min(len(latencies)-1, int(q*float64(len(latencies))))] }
			b.ReportMetric(float64(at(0.50).Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(at(0.99).Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(latencies[len(latencies)-1].Microseconds())/1000, "max-ms")
			b.ReportMetric(float64(refused), "refused")
			b.ReportMetric(float64(rss)/(1<<20), "peak-rss-MiB")
			b.ReportMetric(float64(heap)/(1<<20), "peak-heap-MiB")
		})
	}
}

var admissionTypeMeta = admissionv1.AdmissionReview{}.TypeMeta

func init() {
	admissionTypeMeta.APIVersion = "admission.k8s.io/v1"
	admissionTypeMeta.Kind = "AdmissionReview"
}

// attackLoop sends one kind of bad body to base until stop closes.
func attackLoop(base string, cert *x509.Certificate, attack string, worst, huge []byte, stop <-chan struct{}) {
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	tlsConfig := &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	defer client.CloseIdleConnections()
	for {
		select {
		case <-stop:
			return
		default:
		}
		if attack == "costly" {
			if resp, err := client.Post(base+ValidatePath, "application/json", bytes.NewReader(worst)); err == nil {
				_ = resp.Body.Close()
			}
			continue
		}
		conn, err := tls.Dial("tcp", strings.TrimPrefix(base, "https://"), tlsConfig)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", ValidatePath, len(huge))
		switch {
		case err != nil:
		case attack == "huge":
			if _, err := conn.Write(huge[:len(huge)-1]); err == nil {
				// Until the server answers (its body deadline) or stop.
				done := make(chan struct{})
				go func() { _, _ = conn.Read(make([]byte, 1)); close(done) }()
				select {
				case <-done:
				case <-stop:
				}
			}
		default: // slow
			for i := 0; i < len(huge); i++ {
				if _, err := conn.Write(huge[i : i+1]); err != nil {
					break
				}
				select {
				case <-stop:
					i = len(huge)
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
		_ = conn.Close()
	}
}

// startPeakHeap samples the live heap every 5ms until the returned
// function is called, which returns the largest sample.
func startPeakHeap() func() uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var mu sync.Mutex
	var peak uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(5 * time.Millisecond)
		defer ticker.Stop()
		for {
			metrics.Read(sample)
			mu.Lock()
			peak = max(peak, sample[0].Value.Uint64())
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-ticker.C:
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		return peak
	}
}

// resetPeakRSS resets the process's VmHWM (Linux: clear_refs 5).
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS is the process's VmHWM in bytes, 0 where it cannot be read.
func peakRSS() uint64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
