package isolation

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// pidFile is the file the MPS control daemon writes into its pipe directory.
const pidFile = "nvidia-cuda-mps-control.pid"

// ExecRunner runs the real nvidia-cuda-mps-control: one daemon per GPU,
// started as "nvidia-cuda-mps-control -d" with CUDA_VISIBLE_DEVICES=<uuid>,
// CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY set to the GPU's
// directories under Root, and stopped with "quit" on its stdin.
type ExecRunner struct {
	// Binary is the control program; default "nvidia-cuda-mps-control" from PATH.
	Binary string
	// Root holds the per-GPU directories (same as [NewMPS]'s root).
	Root string
}

func (r ExecRunner) binary() string {
	if r.Binary == "" {
		return "nvidia-cuda-mps-control"
	}
	return r.Binary
}

func (r ExecRunner) command(ctx context.Context, d Daemon, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.binary(), args...)
	cmd.Env = append(os.Environ(),
		"CUDA_VISIBLE_DEVICES="+d.UUID,
		"CUDA_MPS_PIPE_DIRECTORY="+d.PipeDir,
		"CUDA_MPS_LOG_DIRECTORY="+d.LogDir)
	return cmd
}

// running reports whether the daemon's pid file names a live process.
func running(d Daemon) bool {
	data, err := os.ReadFile(filepath.Join(d.PipeDir, pidFile))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return false
	}
	_, err = os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
	return err == nil
}

// Start implements [DaemonRunner].
func (r ExecRunner) Start(ctx context.Context, d Daemon) error {
	if running(d) {
		return nil
	}
	for _, dir := range []string{d.PipeDir, d.LogDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	cmd := r.command(ctx, d, "-d")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// With -d the control program forks the daemon and returns.
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s -d: %w: %s", r.binary(), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Stop implements [DaemonRunner].
func (r ExecRunner) Stop(ctx context.Context, d Daemon) error {
	if !running(d) {
		return nil
	}
	cmd := r.command(ctx, d)
	cmd.Stdin = strings.NewReader("quit\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("echo quit | %s: %w: %s", r.binary(), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Running implements [DaemonRunner]: the GPUs under Root whose daemon's pid
// file names a live process.
func (r ExecRunner) Running(context.Context) ([]string, error) {
	entries, err := os.ReadDir(r.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(r.Root, e.Name())
		if running(Daemon{UUID: e.Name(), PipeDir: filepath.Join(dir, "pipe")}) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// FakeRunner is a [DaemonRunner] for tests: it keeps the set of running
// daemons in memory and counts starts and stops. One FakeRunner shared by two
// plugin instances models daemons that outlive a plugin restart.
type FakeRunner struct {
	mu      sync.Mutex
	running map[string]Daemon
	// starts and stops count calls that changed something.
	starts, stops int
	startErr      error
}

// NewFakeRunner returns a FakeRunner with no daemons running.
func NewFakeRunner() *FakeRunner { return &FakeRunner{running: map[string]Daemon{}} }

// FailStarts makes every following Start fail with err (nil: succeed again).
func (f *FakeRunner) FailStarts(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.startErr = err
}

// Start implements [DaemonRunner].
func (f *FakeRunner) Start(_ context.Context, d Daemon) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.startErr != nil {
		return f.startErr
	}
	if _, ok := f.running[d.UUID]; !ok {
		f.running[d.UUID] = d
		f.starts++
	}
	return nil
}

// Stop implements [DaemonRunner].
func (f *FakeRunner) Stop(_ context.Context, d Daemon) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.running[d.UUID]; ok {
		delete(f.running, d.UUID)
		f.stops++
	}
	return nil
}

// Running implements [DaemonRunner].
func (f *FakeRunner) Running(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.running))
	for uuid := range f.running {
		out = append(out, uuid)
	}
	slices.Sort(out)
	return out, nil
}

// Counts returns the number of daemons started and stopped so far.
func (f *FakeRunner) Counts() (starts, stops int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts, f.stops
}
