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
// directories the plugin chose, made mode 1777 as the daemon program makes
// them (a server started for a client of another uid writes there). It uses
// the host's /dev/shm, as the probes (which run on the host too) do, except
// for the domains in ShmDomains: their daemon runs in a mount namespace of
// its own with the domain's shared-memory directory as /dev/shm, as the
// daemon pod has it, so that a client in a container (which the spec gives
// that directory as /dev/shm) meets its server.
type LocalMPS struct {
	// Binary is nvidia-cuda-mps-control (a path, or a name in PATH).
	Binary string
	// Wait bounds the wait for the control socket after a start and for
	// its removal after a stop; zero: 30s.
	Wait time.Duration
	// ShmDomains are the trust domains whose daemon gets its shared-memory
	// directory as /dev/shm (root only: a mount namespace); Self is this
	// program, whose nsexec does the mount.
	ShmDomains map[string]bool
	Self       string

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
	if err := makeDaemonDirs(d); err != nil {
		return err
	}
	var out bytes.Buffer
	cmd := l.command(ctx, d, "-d")
	how := ""
	if l.ShmDomains[d.Domain] {
		if os.Geteuid() != 0 || l.Self == "" {
			return fmt.Errorf("mps daemon for GPU %s, domain %s: giving it %s as /dev/shm needs root", d.UUID, d.Domain, d.ShmDir)
		}
		bin, err := exec.LookPath(l.Binary)
		if err != nil {
			return fmt.Errorf("mps daemon for GPU %s: %w", d.UUID, err)
		}
		cfg := NSExec{Mounts: []NSMount{{Type: "bind", Source: d.ShmDir, Destination: "/dev/shm"}}, Args: []string{bin, "-d"}, Env: cmd.Env}
		path := filepath.Join(d.LogDir, "nsexec.json")
		if err := WriteNSExec(path, cfg); err != nil {
			return err
		}
		cmd = NSExecCommand(l.Self, path, false)
		how = fmt.Sprintf(" (in a mount namespace with %s as /dev/shm)", d.ShmDir)
	}
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s -d for GPU %s%s: %w: %s", l.Binary, d.UUID, how, err, strings.TrimSpace(out.String()))
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

// Query sends one command to the daemon's control program (its interactive
// commands: get_server_list, get_client_list <pid>, …; NVIDIA MPS
// documentation, "Legacy MPS v2 Interface") and returns its answer.
func (l *LocalMPS) Query(ctx context.Context, d isolation.Daemon, command string) (string, error) {
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := l.command(c, d)
	cmd.Stdin = strings.NewReader(command + "\n")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("echo %s | %s: %w: %s", command, l.Binary, err, strings.TrimSpace(errOut.String()+" "+out.String()))
	}
	return out.String(), nil
}

// makeDaemonDirs creates a daemon's pipe, shared-memory and log
// directories, mode 1777 (sticky, writable by any uid), as pkg/mpsdaemon's
// "mps-daemon run" makes them: the server the daemon starts for a client
// of another uid writes its pipes, log and segments there.
func makeDaemonDirs(d isolation.Daemon) error {
	for _, dir := range []string{d.PipeDir, d.ShmDir, d.LogDir} {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("mps daemon for %s: %w", d.UUID, err)
		}
		if err := os.Chmod(dir, 0o1777); err != nil {
			return fmt.Errorf("mps daemon for %s: %w", d.UUID, err)
		}
	}
	return nil
}

// mockMPSRunner is the mock run's daemon runner: isolation's FakeRunner
// (no daemon runs) that creates the daemon's directories as a daemon
// would, so that a container can mount them.
type mockMPSRunner struct{ *isolation.FakeRunner }

func (m mockMPSRunner) Start(ctx context.Context, d isolation.Daemon, inUse bool) error {
	if err := makeDaemonDirs(d); err != nil {
		return err
	}
	return m.FakeRunner.Start(ctx, d, inUse)
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
