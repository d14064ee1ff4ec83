package main

import (
	"testing"
	"time"
)

func TestFlags(t *testing.T) {
	cmd := newCommand()
	if err := cmd.ParseFlags([]string{"--bind-address=127.0.0.1:9443", "--drain-delay=1s", "--v=2"}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"bind-address":     "127.0.0.1:9443",
		"drain-delay":      (time.Second).String(),
		"shutdown-timeout": (10 * time.Second).String(),
		"tls-cert-file":    "/etc/tessera-webhook/tls/tls.crt",
		"v":                "2",
	} {
		if got := cmd.Flags().Lookup(name).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
}
