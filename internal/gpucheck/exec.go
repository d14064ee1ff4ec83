package gpucheck

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ExecProber runs each probe as a child process: Command plus "memory" or
// "compute --seconds S" (cmd/tessera-gpu-probe runs itself with "probe").
type ExecProber struct {
	Command []string
	// ProcessMemory returns the device memory NVML counts for the process
	// pid on the GPU uuid; nil or !ok leaves the probe's own figures.
	ProcessMemory func(uuid string, pid int) (bytes uint64, ok bool)
	// StartTimeout bounds the wait for a probe to load the driver and get
	// ready (or to allocate everything); zero: 30 seconds, so a probe that
	// hangs on the driver fails fast instead of eating the run.
	StartTimeout time.Duration
	// Observe, when set, is told of every message a probe process sends
	// (and, with gone, that it exited): the mock mode uses it to show the
	// simulated probes as processes in the mock NVML, as a driver would.
	Observe func(pid int, m probeMessage, gone bool)
}

// NVMLProcessMemory reads a process's used GPU memory from NVML: its
// compute processes, and on drivers that list them, its MPS clients.
func NVMLProcessMemory(lib nvml.Interface) func(uuid string, pid int) (uint64, bool) {
	return func(uuid string, pid int) (uint64, bool) {
		dev, ret := lib.DeviceGetHandleByUUID(uuid)
		if ret != nvml.SUCCESS {
			return 0, false
		}
		lists := []func() ([]nvml.ProcessInfo, nvml.Return){dev.GetComputeRunningProcesses}
		if ext := lib.Extensions(); ext != nil && ext.LookupSymbol("nvmlDeviceGetMPSComputeRunningProcesses") == nil {
			lists = append(lists, dev.GetMPSComputeRunningProcesses)
		}
		for _, list := range lists {
			procs, ret := list()
			if ret != nvml.SUCCESS {
				continue
			}
			for _, p := range procs {
				// NVML_VALUE_NOT_AVAILABLE (an MPS client, a process
				// NVML may not inspect) is no figure: the probe's own
				// then stand.
				if int(p.Pid) == pid && p.UsedGpuMemory > 0 && p.UsedGpuMemory != nvmlValueNotAvailable {
					return p.UsedGpuMemory, true
				}
			}
		}
		return 0, false
	}
}

func (e ExecProber) timeout() time.Duration {
	if e.StartTimeout <= 0 {
		return 30 * time.Second
	}
	return e.StartTimeout
}

// probeProcess is one running probe.
type probeProcess struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *bytes.Buffer
	msgs   chan probeMessage
	done   chan struct{} // closed when stdout ended
	mu     sync.Mutex
	exit   error
}

// command is the probe process for args (after e.Command) with env.
func (e ExecProber) command(ctx context.Context, env []string, args ...string) (*exec.Cmd, error) {
	if len(e.Command) == 0 {
		return nil, errors.New("no probe command")
	}
	cmd := exec.CommandContext(ctx, e.Command[0], append(append([]string{}, e.Command[1:]...), args...)...)
	cmd.Env = env
	return cmd, nil
}

func (e ExecProber) start(ctx context.Context, env []string, args ...string) (*probeProcess, error) {
	cmd, err := e.command(ctx, env, args...)
	if err != nil {
		return nil, err
	}
	return e.startCmd(cmd)
}

// startAll starts one probe with args in each of envs. On an error it
// kills those it started; otherwise the caller kills them (killProbes).
func (e ExecProber) startAll(ctx context.Context, envs [][]string, args ...string) ([]*probeProcess, error) {
	procs := make([]*probeProcess, 0, len(envs))
	for _, env := range envs {
		p, err := e.start(ctx, env, args...)
		if err != nil {
			killProbes(procs)
			return nil, err
		}
		procs = append(procs, p)
	}
	return procs, nil
}

// killProbes kills every probe of procs.
func killProbes(procs []*probeProcess) {
	for _, p := range procs {
		p.kill()
	}
}

// startCmd starts cmd (a probe, or a wrapper that runs one: a namespace
// shim, a container runtime) with its stdin and stdout as the protocol's.
func (e ExecProber) startCmd(cmd *exec.Cmd) (*probeProcess, error) {
	p := &probeProcess{cmd: cmd, stderr: &bytes.Buffer{}, msgs: make(chan probeMessage, 4), done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if cmd.WaitDelay == 0 {
		// A process the probe leaves behind with its stderr (a container
		// whose runtime was killed) must not hold Wait, and so the check.
		cmd.WaitDelay = 5 * time.Second
	}
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start probe %s: %w", strings.Join(cmd.Args, " "), err)
	}
	observe := e.Observe
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var m probeMessage
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				continue // not a probe line (a library's own output)
			}
			if observe != nil {
				observe(cmd.Process.Pid, m, false)
			}
			p.msgs <- m
		}
		err := cmd.Wait()
		if observe != nil {
			observe(cmd.Process.Pid, probeMessage{}, true)
		}
		p.mu.Lock()
		p.exit = err
		p.mu.Unlock()
	}()
	return p, nil
}

// send writes one line to the probe's stdin.
func (p *probeProcess) send(line string) error {
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	return nil
}

// next waits for the probe's next message; a probe that exits or reports
// an error ends the wait with an error carrying its message and stderr.
func (p *probeProcess) next(limit time.Duration, want string) (probeMessage, error) {
	m, err, _ := p.await(limit, want, true)
	return m, err
}

// await is next that, with kill false, leaves a probe that has not sent
// want within limit running (timedOut then says so), for a wait that is
// expected to last.
func (p *probeProcess) await(limit time.Duration, want string, kill bool) (_ probeMessage, _ error, timedOut bool) {
	m, err := p.awaitMsg(limit, want, kill)
	return m, err, errors.Is(err, errProbeTimeout)
}

var errProbeTimeout = errors.New("probe timed out")

func (p *probeProcess) awaitMsg(limit time.Duration, want string, kill bool) (probeMessage, error) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case m := <-p.msgs:
			if m.Event == "loading" && want != "loading" {
				continue // a progress report, not an answer
			}
			if m.Event == "error" {
				<-p.done
				return m, &probeError{msg: m, stderr: p.stderrTail()}
			}
			if m.Event != want {
				return m, fmt.Errorf("probe: got %q, want %q", m.Event, want)
			}
			return m, nil
		case <-p.done:
			for {
				select {
				case m := <-p.msgs:
					if m.Event == "error" {
						return m, &probeError{msg: m, stderr: p.stderrTail()}
					}
					if m.Event == want {
						return m, nil
					}
					continue
				default:
				}
				break
			}
			p.mu.Lock()
			exit := p.exit
			p.mu.Unlock()
			return probeMessage{}, fmt.Errorf("probe exited before %q: %v%s", want, exit, p.stderrTail())
		case <-timer.C:
			if !kill {
				return probeMessage{}, fmt.Errorf("%w: no %q within %s", errProbeTimeout, want, limit)
			}
			_ = p.cmd.Process.Kill()
			return probeMessage{}, fmt.Errorf("%w: no %q within %s%s", errProbeTimeout, want, limit, p.stderrTail())
		}
	}
}

// probeError is an "error" message of a probe, with its stderr's tail.
type probeError struct {
	msg    probeMessage
	stderr string
}

func (e *probeError) Error() string { return "probe: " + e.msg.Error + e.stderr }

// probeErrorCode is the Code of the probe error err wraps ("" if none).
func probeErrorCode(err error) string {
	var pe *probeError
	if errors.As(err, &pe) {
		return pe.msg.Code
	}
	return ""
}

func (p *probeProcess) stderrTail() string {
	<-p.done
	s := strings.TrimSpace(p.stderr.String())
	if s == "" {
		return ""
	}
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	return " (stderr: " + s + ")"
}

func (p *probeProcess) kill() {
	_ = p.cmd.Process.Kill()
	for {
		select {
		case <-p.msgs: // unblock the reader
		case <-p.done:
			return
		}
	}
}

// Memory implements [Prober].
func (e ExecProber) Memory(ctx context.Context, uuid string, env []string) (MemoryProbe, error) {
	return e.MemoryWith(ctx, uuid, env, MemoryOptions{})
}

// MemoryWith runs the memory probe with opts (an allocator, a bound).
func (e ExecProber) MemoryWith(ctx context.Context, uuid string, env []string, opts MemoryOptions) (MemoryProbe, error) {
	args := []string{"memory"}
	if opts.Allocator != "" {
		args = append(args, "--allocator", string(opts.Allocator))
	}
	if opts.StopAfterBytes > 0 {
		args = append(args, "--stop-after-mib", fmt.Sprint((opts.StopAfterBytes+mib-1)/mib))
	}
	p, err := e.start(ctx, env, args...)
	if err != nil {
		return MemoryProbe{}, err
	}
	defer p.kill()
	m, err := p.next(e.timeout(), "holding")
	if err != nil {
		return MemoryProbe{}, err
	}
	if m.Memory == nil {
		return MemoryProbe{}, errors.New("probe: \"holding\" without figures")
	}
	probe := *m.Memory
	if e.ProcessMemory != nil {
		probe.ProcessBytes, probe.ProcessBytesKnown = e.ProcessMemory(uuid, p.cmd.Process.Pid)
	}
	if _, err := io.WriteString(p.stdin, "release\n"); err != nil {
		return probe, fmt.Errorf("probe: %w", err)
	}
	if _, err := p.next(e.timeout(), "result"); err != nil {
		return probe, err
	}
	return probe, nil
}

// Compute implements [Prober]: every probe loads its kernel and reports
// ready; then all get the start signal at once.
func (e ExecProber) Compute(ctx context.Context, envs [][]string, d time.Duration) ([]ComputeProbe, error) {
	procs, err := e.startAll(ctx, envs, "compute", "--seconds", fmt.Sprint(d.Seconds()))
	if err != nil {
		return nil, err
	}
	defer killProbes(procs)
	for i, p := range procs {
		if _, err := p.next(e.timeout(), "ready"); err != nil {
			return nil, fmt.Errorf("compute probe %d: %w", i, err)
		}
	}
	for _, p := range procs {
		if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
			return nil, fmt.Errorf("probe: %w", err)
		}
	}
	out := make([]ComputeProbe, len(procs))
	for i, p := range procs {
		m, err := p.next(d+e.timeout(), "result")
		if err != nil {
			return nil, fmt.Errorf("compute probe %d: %w", i, err)
		}
		if m.Compute == nil {
			return nil, fmt.Errorf("compute probe %d: a result without figures", i)
		}
		out[i] = *m.Compute
	}
	return out, nil
}
