package mpsdaemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

// TestRunSetsClientLimits: the limits the plugin wrote into the daemon's log
// directory become the control daemon's defaults before the daemon is
// Ready (the fake records the commands a real daemon is given), so that
// every MPS server, and through it every client, is held to them whatever
// the client's environment says; a file that does not parse keeps the daemon
// from ever being Ready.
func TestRunSetsClientLimits(t *testing.T) {
	run := func(t *testing.T, limits string) (root, ready string, done chan error, stop func()) {
		t.Helper()
		root = t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, LogDir), 0o755); err != nil {
			t.Fatal(err)
		}
		if limits != "" {
			if err := os.WriteFile(filepath.Join(root, LogDir, isolation.MPSLimitsFile), []byte(limits), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ready = filepath.Join(root, "state", "ready")
		ctx, cancel := context.WithCancel(context.Background())
		done = make(chan error, 1)
		go func() { done <- Run(ctx, Options{GPU: "GPU-1", Fake: true, DriverRoot: root, ReadyFile: ready}) }()
		return root, ready, done, cancel
	}

	root, ready, done, stop := run(t, `{"pinnedDeviceMemoryMiB":3584,"activeThreadPercentage":25}`)
	deadline := time.Now().Add(5 * time.Second)
	for Ready(ready) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %v", Ready(ready))
		}
		time.Sleep(10 * time.Millisecond)
	}
	log, err := os.ReadFile(filepath.Join(root, LogDir, "control.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"control: set_default_device_pinned_mem_limit 0 3584M", "control: set_default_active_thread_percentage 25"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("control log %q lacks %q", log, want)
		}
	}
	if i, j := strings.Index(string(log), "set_default_device_pinned_mem_limit"), strings.Index(string(log), "ready"); i < 0 || j < i {
		t.Errorf("control log %q: the limits are not set before the daemon is ready", log)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A daemon of an earlier release's plugin has no file: none is set.
	root, ready, done, stop = run(t, "")
	for Ready(ready) != nil {
		time.Sleep(10 * time.Millisecond)
	}
	if log, _ := os.ReadFile(filepath.Join(root, LogDir, "control.log")); strings.Contains(string(log), "set_default") {
		t.Errorf("without a limits file the control log says %q", log)
	}
	stop()
	<-done

	for _, bad := range []string{`{"pinnedDeviceMemoryMiB":`, `{"pinnedDeviceMemoryMiB":0,"activeThreadPercentage":25}`, `{"pinnedDeviceMemoryMiB":10,"activeThreadPercentage":101}`} {
		_, ready, done, stop := run(t, bad)
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), isolation.MPSLimitsFile) {
				t.Errorf("limits %s: Run returned %v, want an error naming the file", bad, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("limits %s: the daemon runs (ready: %v)", bad, Ready(ready))
		}
		if Ready(ready) == nil {
			t.Errorf("limits %s: the daemon is ready", bad)
		}
		stop()
	}
}
