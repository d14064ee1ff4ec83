package mpsdaemon

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

// TestBoundLogs: a log past the limit is cut in place (a writer that holds
// it open keeps appending to the same file) with its end kept in <name>.1;
// logs under the limit and files that are not logs (the clients' limits)
// are left alone.
func TestBoundLogs(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "server.log")
	tail := bytes.Repeat([]byte("z"), logKeep)
	if err := os.WriteFile(big, append(bytes.Repeat([]byte("a"), 3<<20), tail...), 0o644); err != nil {
		t.Fatal(err)
	}
	writer, err := os.OpenFile(big, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	small := filepath.Join(dir, "control.log")
	if err := os.WriteFile(small, []byte("started\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	limits := filepath.Join(dir, isolation.MPSLimitsFile)
	if err := os.WriteFile(limits, bytes.Repeat([]byte(" "), 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}

	if err := boundLogs(dir, 2<<20); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(big); err != nil || fi.Size() > 4096 {
		t.Errorf("the big log after the cut: %v bytes (%v), want a line", fi.Size(), err)
	}
	if kept, err := os.ReadFile(big + ".1"); err != nil || !bytes.Equal(kept, tail) {
		t.Errorf("%s.1: %d bytes (%v), want the log's last %d", big, len(kept), err, logKeep)
	}
	if _, err := writer.WriteString("after the cut\n"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(big); !strings.HasSuffix(string(got), "after the cut\n") || len(got) > 4096 {
		t.Errorf("the writer's next line: the log is %q", got)
	}
	if got, _ := os.ReadFile(small); string(got) != "started\n" {
		t.Errorf("a small log was changed: %q", got)
	}
	if fi, _ := os.Stat(limits); fi.Size() != 3<<20 {
		t.Errorf("the limits file was cut to %d bytes", fi.Size())
	}
}

// TestRunBoundsLogs: a running daemon keeps its log directory bounded.
func TestRunBoundsLogs(t *testing.T) {
	root := t.TempDir()
	logDir := filepath.Join(root, LogDir)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	server := filepath.Join(logDir, "server.log")
	if err := os.WriteFile(server, bytes.Repeat([]byte("x"), 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{GPU: "GPU-1", Fake: true, DriverRoot: root, ReadyFile: filepath.Join(root, "state", "ready"),
			LogLimit: 16 << 10, LogCheckInterval: 10 * time.Millisecond})
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if fi, err := os.Stat(server); err == nil && fi.Size() <= 16<<10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon's server.log was never cut")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
