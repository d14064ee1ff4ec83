package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	if _, err := deviceClasses(missing); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("deviceClasses(%s) = %v, want an error naming the file", missing, err)
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
	if _, err := deviceClasses(file); err != nil {
		t.Fatalf("deviceClasses(%s): %v", file, err)
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
