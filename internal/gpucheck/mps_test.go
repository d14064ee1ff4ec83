package gpucheck

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

// fakeMPSControl is a stand-in for nvidia-cuda-mps-control: "-d" leaves a
// daemon (a sleep with the control program's environment, so with its
// CUDA_MPS_PIPE_DIRECTORY) and makes the control socket (a file); "quit"
// on stdin ends the daemon and removes the socket. The variables
// FAKE_MPS_STUBBORN (quit does nothing), FAKE_MPS_NO_SOCKET (the daemon
// never makes its socket) and FAKE_MPS_HOLD_OUTPUT (the daemon keeps the
// start command's stdout and stderr) make it misbehave.
const fakeMPSControl = `#!/bin/sh
if [ "$1" = "-d" ]; then
  if [ -n "$FAKE_MPS_HOLD_OUTPUT" ]; then
    sleep 20 &
  else
    sleep 300 </dev/null >/dev/null 2>&1 &
  fi
  echo $! >"$CUDA_MPS_PIPE_DIRECTORY/daemon.pid"
  [ -n "$FAKE_MPS_NO_SOCKET" ] || touch "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit 0
fi
read -r cmd
case "$cmd" in
  quit*)
    [ -z "$FAKE_MPS_STUBBORN" ] || exit 0
    kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/daemon.pid")"
    rm -f "$CUDA_MPS_PIPE_DIRECTORY/control" ;;
esac
`

func fakeLocalMPS(t *testing.T) (*LocalMPS, isolation.Daemon) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "nvidia-cuda-mps-control")
	if err := os.WriteFile(bin, []byte(fakeMPSControl), 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "mps")
	d := isolation.Daemon{UUID: "GPU-fake", Domain: "dom", Dir: filepath.Join(root, "d"),
		PipeDir: filepath.Join(root, "d", "pipe"), ShmDir: filepath.Join(root, "d", "shm"), LogDir: filepath.Join(root, "d", "log")}
	l := &LocalMPS{Binary: bin, Root: root, Wait: 2 * time.Second, QuitAfter: 1}
	t.Cleanup(func() { killAll(mpsProcesses("/proc", func(p string) bool { return strings.HasPrefix(p, root+"/") })) })
	return l, d
}

func daemonProcesses(d isolation.Daemon) []int {
	return mpsProcesses("/proc", func(p string) bool { return p == d.PipeDir })
}

// TestLocalMPSStopKillsStubbornDaemon: a daemon that ignores quit is killed
// by PID, so it never outlives the check (and the plugin's removal of its
// pipe directory).
func TestLocalMPSStopKillsStubbornDaemon(t *testing.T) {
	t.Setenv("FAKE_MPS_STUBBORN", "1")
	l, d := fakeLocalMPS(t)
	ctx := context.Background()
	if err := l.Start(ctx, d, false); err != nil {
		t.Fatal(err)
	}
	if len(daemonProcesses(d)) == 0 {
		t.Fatal("the fake daemon does not run")
	}
	start := time.Now()
	if err := l.Stop(ctx, d); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if left := daemonProcesses(d); len(left) > 0 {
		t.Errorf("processes %v of the daemon still run after Stop", left)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("Stop took %s", took)
	}
	if keys, _ := l.Running(ctx); len(keys) != 0 {
		t.Errorf("still recorded as running: %v", keys)
	}
}

// TestLocalMPSStopAllAfterFailedStart: a daemon whose control socket never
// came is recorded anyway, and StopAll ends it.
func TestLocalMPSStopAllAfterFailedStart(t *testing.T) {
	t.Setenv("FAKE_MPS_NO_SOCKET", "1")
	l, d := fakeLocalMPS(t)
	ctx := context.Background()
	if err := l.Start(ctx, d, false); err == nil || !strings.Contains(err.Error(), "no control socket") {
		t.Fatalf("Start = %v, want no control socket", err)
	}
	if len(daemonProcesses(d)) == 0 {
		t.Fatal("the fake daemon does not run")
	}
	if err := l.StopAll(ctx); err != nil {
		t.Fatalf("StopAll: %v", err)
	}
	if left := daemonProcesses(d); len(left) > 0 {
		t.Errorf("processes %v of the daemon still run after StopAll", left)
	}
}

// TestLocalMPSStartDoesNotWaitForDaemonOutput: a daemon that keeps the
// start command's output open does not hold Start until it exits.
func TestLocalMPSStartDoesNotWaitForDaemonOutput(t *testing.T) {
	t.Setenv("FAKE_MPS_HOLD_OUTPUT", "1")
	l, d := fakeLocalMPS(t)
	ctx := context.Background()
	start := time.Now()
	if err := l.Start(ctx, d, false); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Start took %s: it waited for the daemon's output", took)
	}
	if err := l.StopAll(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMPSProcessesDescendants: a process without the variable whose parent
// has it (an MPS server, the control daemon's child) is the daemon's too.
func TestMPSProcessesDescendants(t *testing.T) {
	proc := t.TempDir()
	write := func(pid, stat, env string) {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(filepath.Join(proc, pid, "stat"), []byte(stat), 0o644)
		_ = os.WriteFile(filepath.Join(proc, pid, "environ"), []byte(env), 0o644)
	}
	write("10", "10 (nvidia-cuda-mps) S 1 10", "A=1\x00CUDA_MPS_PIPE_DIRECTORY=/w/mps/x/pipe\x00")
	write("11", "11 (nvidia (mps) srv) S 10 10", "B=2\x00")
	write("12", "12 (other) S 1 12", "CUDA_MPS_PIPE_DIRECTORY=/elsewhere\x00")
	write("13", "13 (grandchild) S 11 13", "")
	got := mpsProcesses(proc, func(p string) bool { return strings.HasPrefix(p, "/w/mps/") })
	if len(got) != 3 || got[0] != 10 || got[1] != 11 || got[2] != 13 {
		t.Errorf("got %v, want [10 11 13]", got)
	}
}

// TestLocalMPSStartRefusesLongSocketPath: a pipe directory whose longest
// socket would not fit a Unix socket address is refused with a message
// (the real control daemon exits 1 and says nothing), and nothing starts.
func TestLocalMPSStartRefusesLongSocketPath(t *testing.T) {
	l, d := fakeLocalMPS(t)
	d.PipeDir = filepath.Join(d.Dir, strings.Repeat("p", maxMPSSocketPath))
	err := l.Start(context.Background(), d, false)
	if err == nil || !strings.Contains(err.Error(), "more than a Unix socket path may") {
		t.Fatalf("Start = %v, want the socket path refused", err)
	}
	if _, serr := os.Stat(d.PipeDir); !os.IsNotExist(serr) {
		t.Errorf("the pipe directory was made (%v): Start went on", serr)
	}
}
