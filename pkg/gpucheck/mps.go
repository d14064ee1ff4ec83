package gpucheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

// LocalMPS is an isolation.DaemonRunner that runs the driver's
// nvidia-cuda-mps-control on this machine, as a child of the check: the
// kubelet plugin runs each GPU's daemon in a pod, which needs Kubernetes.
// The daemon gets CUDA_VISIBLE_DEVICES=<uuid> and the pipe and log
// directories the plugin chose; it uses the host's /dev/shm, as the probes
// (which run on the host too) do.
type LocalMPS struct {
	// Binary is nvidia-cuda-mps-control (a path, or a name in PATH).
	Binary string
	// Wait bounds the wait for the control socket after a start and for
	// its removal after a stop; zero: 30s.
	Wait time.Duration

	mu      sync.Mutex
	running map[isolation.DaemonKey]isolation.Daemon
}

var _ isolation.DaemonRunner = (*LocalMPS)(nil)

func (l *LocalMPS) wait() time.Duration {
	if l.Wait <= 0 {
		return 30 * time.Second
	}
	return l.Wait
}

func (l *LocalMPS) command(ctx context.Context, d isolation.Daemon, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, l.Binary, args...)
	cmd.Env = append(withoutCUDAEnv(os.Environ()),
		"CUDA_VISIBLE_DEVICES="+d.UUID,
		"CUDA_MPS_PIPE_DIRECTORY="+d.PipeDir,
		"CUDA_MPS_LOG_DIRECTORY="+d.LogDir)
	return cmd
}

// Start implements isolation.DaemonRunner: "nvidia-cuda-mps-control -d"
// (a daemon it started is kept as it is),
// then it waits for the control socket.
func (l *LocalMPS) Start(ctx context.Context, d isolation.Daemon, _ bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.running[d.Key()]; ok {
		return nil
	}
	for _, dir := range []string{d.PipeDir, d.LogDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("mps daemon for %s: %w", d.UUID, err)
		}
	}
	var out bytes.Buffer
	cmd := l.command(ctx, d, "-d")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s -d for GPU %s: %w: %s", l.Binary, d.UUID, err, strings.TrimSpace(out.String()))
	}
	control := filepath.Join(d.PipeDir, "control")
	if err := waitFor(ctx, l.wait(), func() bool { _, err := os.Stat(control); return err == nil }); err != nil {
		return fmt.Errorf("mps daemon for GPU %s: no control socket %s after %s (see %s)", d.UUID, control, l.wait(), d.LogDir)
	}
	if l.running == nil {
		l.running = map[isolation.DaemonKey]isolation.Daemon{}
	}
	l.running[d.Key()] = d
	return nil
}

// Stop implements isolation.DaemonRunner: "quit" on the control program's
// stdin, then it waits for the control socket to go.
func (l *LocalMPS) Stop(ctx context.Context, d isolation.Daemon) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.running[d.Key()]; !ok {
		return nil
	}
	var out bytes.Buffer
	cmd := l.command(ctx, d)
	cmd.Stdin = strings.NewReader("quit\n")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("echo quit | %s for GPU %s: %w: %s", l.Binary, d.UUID, err, strings.TrimSpace(out.String()))
	}
	control := filepath.Join(d.PipeDir, "control")
	if err := waitFor(ctx, l.wait(), func() bool { _, err := os.Stat(control); return errors.Is(err, os.ErrNotExist) }); err != nil {
		return fmt.Errorf("mps daemon for GPU %s: control socket %s still there %s after quit", d.UUID, control, l.wait())
	}
	delete(l.running, d.Key())
	return nil
}

// Running implements isolation.DaemonRunner: the daemons this runner
// started and has not stopped.
func (l *LocalMPS) Running(context.Context) ([]isolation.DaemonKey, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]isolation.DaemonKey, 0, len(l.running))
	for key := range l.running {
		out = append(out, key)
	}
	slices.SortFunc(out, func(a, b isolation.DaemonKey) int { return strings.Compare(a.String(), b.String()) })
	return out, nil
}

// StopAll stops every daemon still running (the check's cleanup).
func (l *LocalMPS) StopAll(ctx context.Context) error {
	l.mu.Lock()
	daemons := make([]isolation.Daemon, 0, len(l.running))
	for _, d := range l.running {
		daemons = append(daemons, d)
	}
	l.mu.Unlock()
	var errs []error
	for _, d := range daemons {
		errs = append(errs, l.Stop(ctx, d))
	}
	return errors.Join(errs...)
}

func waitFor(ctx context.Context, limit time.Duration, done func() bool) error {
	deadline := time.Now().Add(limit)
	for !done() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
