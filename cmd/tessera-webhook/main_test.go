package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/pkg/budget"
)

func TestFlags(t *testing.T) {
	cmd := newCommand()
	if err := cmd.ParseFlags([]string{"--bind-address=127.0.0.1:9443", "--drain-delay=1s", "--v=2"}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"bind-address":         "127.0.0.1:9443",
		"drain-delay":          (time.Second).String(),
		"shutdown-timeout":     (10 * time.Second).String(),
		"tls-cert-file":        "/etc/tessera-webhook/tls/tls.crt",
		"v":                    "2",
		"kubeconfig":           "",
		"device-class-timeout": (2 * time.Second).String(),
		// Pod translation is opt-in.
		"translate-legacy-pods": "false",
		"gpushare-memory-unit":  "GiB",
		"legacy-template-grace": (5 * time.Minute).String(),
	} {
		if got := cmd.Flags().Lookup(name).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
}

// TestNoAPIServer: without a kubeconfig and outside a cluster the webhook
// refuses to start, rather than serve without reading DeviceClasses.
func TestNoAPIServer(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	cmd := newCommand()
	cmd.SetArgs([]string{"--bind-address=127.0.0.1:0"})
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "connect to the API server to read DeviceClasses") {
		t.Fatalf("Execute = %v, want an error about the API server", err)
	}
}

// TestKubeconfig: --kubeconfig names the API server; a missing file is an
// error that names it.
func TestKubeconfig(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := webhookConfig(missing); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("webhookConfig(%s) = %v, want an error naming the file", missing, err)
	}
	file := filepath.Join(t.TempDir(), "kubeconfig")
	config := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := webhookConfig(file)
	if err != nil {
		t.Fatalf("webhookConfig(%s): %v", file, err)
	}
	if _, err := deviceClasses(rc); err != nil {
		t.Fatalf("deviceClasses(%s): %v", file, err)
	}
}

// TestBudgetFlags: the pending TTL must outlive the webhook's timeout and
// the API server's request timeout.
func TestBudgetFlags(t *testing.T) {
	cmd := newCommand()
	cmd.SetArgs([]string{"--budgets", "--budget-pending-ttl=100s", "--budget-webhook-timeout=100s"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--budget-pending-ttl 1m40s must be longer than --budget-webhook-timeout 1m40s") {
		t.Errorf("Execute = %v, want the TTL refused", err)
	}
	// Below the API server's request timeout and a margin.
	cmd = newCommand()
	cmd.SetArgs([]string{"--budgets", "--budget-pending-ttl=60s"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--budget-pending-ttl 1m0s must be at least 1m30s") {
		t.Errorf("Execute = %v, want a 60s TTL refused", err)
	}
}

// TestLocalityControllerFlags: the subcommand takes the Lease from the pod's
// environment, and refuses leader election without a namespace.
func TestLocalityControllerFlags(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "tessera")
	t.Setenv("POD_NAME", "locality-0")
	cmd := newLocalityCommand()
	for name, want := range map[string]string{"lease-namespace": "tessera", "identity": "locality-0", "lease-name": "tessera-locality", "leader-elect": "true"} {
		if got := cmd.Flags().Lookup(name).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	root := newCommand()
	root.SetArgs([]string{"locality-controller"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "connect to the API server") {
		t.Fatalf("Execute = %v, want an error about the API server", err)
	}
}

// TestMemoryLimit: --memory-limit (the container's limit, as the chart
// passes it) sets the Go runtime's soft limit to 90% of it; GOMEMLIMIT wins;
// a value that is not a quantity is an error naming the flag.
func TestMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(before)
	ctx := context.Background()
	t.Setenv("GOMEMLIMIT", "")
	if err := setMemoryLimit(ctx, "268435456"); err != nil {
		t.Fatal(err)
	}
	if got, want := debug.SetMemoryLimit(-1), int64(268435456/10*9); got != want {
		t.Errorf("soft limit = %d, want %d", got, want)
	}
	if err := setMemoryLimit(ctx, "128Mi"); err != nil {
		t.Fatal(err)
	}
	if got, want := debug.SetMemoryLimit(-1), int64(128<<20/10*9); got != want {
		t.Errorf("soft limit = %d, want %d", got, want)
	}
	t.Setenv("GOMEMLIMIT", "100MiB")
	if err := setMemoryLimit(ctx, "1Gi"); err != nil {
		t.Fatal(err)
	}
	if got, want := debug.SetMemoryLimit(-1), int64(128<<20/10*9); got != want {
		t.Errorf("with GOMEMLIMIT set: soft limit = %d, want it unchanged (%d)", got, want)
	}
	t.Setenv("GOMEMLIMIT", "")
	if err := setMemoryLimit(ctx, "lots"); err == nil || !strings.Contains(err.Error(), "--memory-limit") {
		t.Errorf("setMemoryLimit(lots) = %v, want an error naming --memory-limit", err)
	}
}

// TestServeWithBackgroundFailure: a background task that fails stops the
// server and its error is returned (the process exits non-zero); one that
// ends with the context is no error.
func TestServeWithBackgroundFailure(t *testing.T) {
	serve := func(ctx context.Context) error { <-ctx.Done(); return nil }
	err := serveWith(context.Background(), serve, task{func(context.Context) error { return errors.New("caches did not sync") }, "the cleaner"})
	if err == nil || !strings.Contains(err.Error(), "the cleaner stopped: caches did not sync") {
		t.Errorf("serveWith: %v, want the cleaner's failure", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	if err := serveWith(ctx, serve, task{func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, "the cleaner"}); err != nil {
		t.Errorf("serveWith after SIGTERM: %v, want nil", err)
	}
}

// TestBudgetPathAlwaysServed: without --budgets, budget.Path answers a
// claim's CREATE with a retry (a replica of a rollout that turns budgets on
// must not admit claims uncharged) and allows anything else.
func TestBudgetPathAlwaysServed(t *testing.T) {
	admit, ok := isolated(nil)[budget.Path]
	if !ok {
		t.Fatalf("%s not served without --budgets", budget.Path)
	}
	claims := metav1.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaims"}
	resp := admit(context.Background(), &admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create, Resource: claims})
	if resp.Allowed || resp.UID != "u" || resp.Result.Code != 429 || !strings.Contains(resp.Result.Message, "retry") {
		t.Errorf("a claim without --budgets: %+v, want a retry refusal", resp)
	}
	if resp := admit(context.Background(), &admissionv1.AdmissionRequest{UID: "v", Operation: admissionv1.Delete, Resource: claims}); !resp.Allowed {
		t.Errorf("a delete without --budgets: %+v, want allowed", resp)
	}
}
