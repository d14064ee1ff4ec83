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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

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
//
// No daemon outlives the check: a daemon is recorded as soon as its start
// command returned (even when its control socket never came), and Stop ends
// it with "quit -t" (the daemon forces its servers down after that many
// seconds) under a timeout; whatever still runs then — the control daemon,
// its servers, any process whose CUDA_MPS_PIPE_DIRECTORY is the daemon's
// pipe directory (found in /proc/<pid>/environ) — is killed by PID. StopAll
// does the same for every daemon at once and then for every process whose
// pipe directory is under Root.
type LocalMPS struct {
	// Binary is nvidia-cuda-mps-control (a path, or a name in PATH).
	Binary string
	// Wait bounds the wait for the control socket after a start; zero:
	// 30s.
	Wait time.Duration
	// QuitAfter is quit's -t: seconds after which the daemon forces its
	// servers to shut down; zero: 5. Stop waits that long and 5 s more
	// before it kills what is left.
	QuitAfter int
	// Root is the directory the plugin puts every daemon's directories
	// under (the check's MPS root); StopAll kills any process left whose
	// CUDA_MPS_PIPE_DIRECTORY is under it. Empty: no such sweep.
	Root string
	// ShmDomains are the trust domains whose daemon gets its shared-memory
	// directory as /dev/shm (root only: a mount namespace); Self is this
	// program, whose nsexec does the mount.
	ShmDomains map[string]bool
	Self       string
	// ProcRoot is /proc (tests may point it elsewhere); empty: /proc.
	ProcRoot string

	mu      sync.Mutex
	running map[isolation.DaemonKey]isolation.Daemon
	// noNamespace is why a ShmDomains daemon could not get a mount
	// namespace (no CAP_SYS_ADMIN, and no user namespace either): the
	// container check skips its MPS step with it.
	noNamespace string
}

var _ isolation.DaemonRunner = (*LocalMPS)(nil)

// errNoNamespace is wrapped by Start when a ShmDomains daemon could get
// no mount namespace.
var errNoNamespace = errors.New("no mount namespace for the MPS daemon")

func (l *LocalMPS) wait() time.Duration {
	if l.Wait <= 0 {
		return 30 * time.Second
	}
	return l.Wait
}

func (l *LocalMPS) quitAfter() int {
	if l.QuitAfter <= 0 {
		return 5
	}
	return l.QuitAfter
}

func (l *LocalMPS) procRoot() string {
	if l.ProcRoot == "" {
		return "/proc"
	}
	return l.ProcRoot
}

// NoNamespace is why the daemons of ShmDomains cannot run here ("": they
// can, or none was tried).
func (l *LocalMPS) NoNamespace() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.noNamespace
}

func (l *LocalMPS) env(d isolation.Daemon) []string {
	return append(withoutCUDAEnv(os.Environ()),
		"CUDA_VISIBLE_DEVICES="+d.UUID,
		"CUDA_MPS_PIPE_DIRECTORY="+d.PipeDir,
		"CUDA_MPS_LOG_DIRECTORY="+d.LogDir)
}

func (l *LocalMPS) command(ctx context.Context, d isolation.Daemon, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, l.Binary, args...)
	cmd.Env = l.env(d)
	// A child that keeps the output pipes open (a daemon that did not
	// close them) must not hold Wait after the command exited.
	cmd.WaitDelay = time.Second
	return cmd
}

// The control daemon binds its sockets in the pipe directory; the longest
// name is control_privileged (seen with driver 580), and sun_path holds 107
// bytes and a NUL. A longer path makes "nvidia-cuda-mps-control -d" exit 1
// with nothing said.
const (
	mpsLongestSocket = "control_privileged"
	maxMPSSocketPath = 107
)

// Start implements isolation.DaemonRunner: "nvidia-cuda-mps-control -d"
// (a daemon it started is kept as it is), then it waits for the control
// socket, at most Wait. The start command's output goes to a file in the
// log directory, not a pipe: the daemon it forks may keep the descriptors
// it inherited, and a pipe would hold the wait until the daemon exits.
func (l *LocalMPS) Start(ctx context.Context, d isolation.Daemon, _ bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.running[d.Key()]; ok {
		return nil
	}
	if sock := filepath.Join(d.PipeDir, mpsLongestSocket); len(sock) > maxMPSSocketPath {
		return fmt.Errorf("mps daemon for GPU %s: its socket %s has %d bytes, more than a Unix socket path may (%d): run the check from a shorter directory (TMPDIR)", d.UUID, sock, len(sock), maxMPSSocketPath)
	}
	if err := makeDaemonDirs(d); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, l.wait())
	defer cancel()
	logPath := filepath.Join(d.LogDir, "tessera-gpu-check-start.log")
	type attempt struct {
		how string
		cmd func() (*exec.Cmd, error)
	}
	attempts := []attempt{{"", func() (*exec.Cmd, error) { return l.command(ctx, d, "-d"), nil }}}
	if l.ShmDomains[d.Domain] {
		if os.Geteuid() != 0 || l.Self == "" {
			return fmt.Errorf("mps daemon for GPU %s, domain %s: giving it %s as /dev/shm needs root", d.UUID, d.Domain, d.ShmDir)
		}
		bin, err := exec.LookPath(l.Binary)
		if err != nil {
			return fmt.Errorf("mps daemon for GPU %s: %w", d.UUID, err)
		}
		nsCmd := func(userns bool) func() (*exec.Cmd, error) {
			return func() (*exec.Cmd, error) {
				cfg := NSExec{Mounts: []NSMount{{Type: "bind", Source: d.ShmDir, Destination: "/dev/shm"}}, Args: []string{bin, "-d"}, Env: l.env(d)}
				path := filepath.Join(d.LogDir, "nsexec.json")
				if err := WriteNSExec(path, cfg); err != nil {
					return nil, err
				}
				cmd := NSExecCommand(l.Self, path, userns)
				cmd.WaitDelay = time.Second
				return cmd, nil
			}
		}
		// As root without CAP_SYS_ADMIN (a GPU machine that is itself a
		// container) the mount namespace is refused; a user namespace
		// (root mapped to root) may still be allowed.
		attempts = []attempt{
			{fmt.Sprintf(" (in a mount namespace with %s as /dev/shm)", d.ShmDir), nsCmd(false)},
			{fmt.Sprintf(" (in a user and mount namespace with %s as /dev/shm)", d.ShmDir), nsCmd(true)},
		}
	}
	var permErrs []string
	for i, a := range attempts {
		cmd, err := a.cmd()
		if err != nil {
			return err
		}
		out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("mps daemon for GPU %s: %w", d.UUID, err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		err = cmd.Run()
		_ = out.Close()
		if cmd.Process != nil {
			// Whatever it forked is this runner's to stop, whether or
			// not the daemon came up.
			if l.running == nil {
				l.running = map[isolation.DaemonKey]isolation.Daemon{}
			}
			l.running[d.Key()] = d
		}
		if err == nil {
			control := filepath.Join(d.PipeDir, "control")
			if werr := waitFor(ctx, l.wait(), func() bool { _, err := os.Stat(control); return err == nil }); werr != nil {
				return fmt.Errorf("mps daemon for GPU %s%s: no control socket %s after %s (see %s)", d.UUID, a.how, control, l.wait(), d.LogDir)
			}
			return nil
		}
		output := readTail(logPath, 2000)
		if ctl := readTail(filepath.Join(d.LogDir, "control.log"), 1000); ctl != "" {
			output += " (control.log: " + ctl + ")"
		}
		if i+1 < len(attempts) && permissionDenied(err, output) {
			permErrs = append(permErrs, fmt.Sprintf("%s%s: %v %s", l.Binary, a.how, err, output))
			continue
		}
		if len(attempts) > 1 && permissionDenied(err, output) {
			permErrs = append(permErrs, fmt.Sprintf("%s%s: %v %s", l.Binary, a.how, err, output))
			l.noNamespace = "neither a mount namespace nor a user and mount namespace can be created here (root without CAP_SYS_ADMIN, as in a container, and user namespaces refused): " + strings.Join(permErrs, "; ")
			return fmt.Errorf("mps daemon for GPU %s, domain %s: %w: %s", d.UUID, d.Domain, errNoNamespace, l.noNamespace)
		}
		return fmt.Errorf("%s -d for GPU %s%s: %w: %s", l.Binary, d.UUID, a.how, err, output)
	}
	return nil
}

// permissionDenied reports whether a start failed for want of privilege:
// clone or unshare refused (EPERM), or the namespace shim's mount refused.
func permissionDenied(err error, output string) bool {
	return errors.Is(err, syscall.EPERM) || strings.Contains(output, "operation not permitted")
}

// readTail is the end of the file at path, trimmed, on one line.
func readTail(path string, n int) string {
	data, _ := os.ReadFile(path)
	s := strings.Join(strings.Fields(string(data)), " ")
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

// Stop implements isolation.DaemonRunner: "quit -t N" on the control
// program's stdin, under a timeout; then it waits for the daemon's
// processes to go, and kills by PID whatever is left (see LocalMPS). It
// does not hold the runner's lock while it waits, so daemons stop in
// parallel.
func (l *LocalMPS) Stop(ctx context.Context, d isolation.Daemon) error {
	l.mu.Lock()
	_, ok := l.running[d.Key()]
	l.mu.Unlock()
	if !ok {
		return nil
	}
	if err := l.stop(ctx, d); err != nil {
		return err
	}
	l.mu.Lock()
	delete(l.running, d.Key())
	l.mu.Unlock()
	return nil
}

func (l *LocalMPS) stop(ctx context.Context, d isolation.Daemon) error {
	grace := time.Duration(l.quitAfter())*time.Second + 5*time.Second
	qctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	var out bytes.Buffer
	cmd := l.command(qctx, d)
	cmd.Stdin = strings.NewReader(fmt.Sprintf("quit -t %d\n", l.quitAfter()))
	cmd.Stdout, cmd.Stderr = &out, &out
	quitErr := cmd.Run()
	mine := func() []int {
		return mpsProcesses(l.procRoot(), func(pipe string) bool { return pipe == d.PipeDir })
	}
	// A daemon that quit removes its control socket and exits with its
	// servers.
	if waitFor(qctx, grace, func() bool { return len(mine()) == 0 }) == nil {
		return nil
	}
	left := mine()
	killed := killAll(left)
	if err := waitFor(context.WithoutCancel(ctx), 5*time.Second, func() bool { return len(mine()) == 0 }); err != nil {
		return fmt.Errorf("mps daemon for GPU %s: processes %v still run after quit (%v: %s) and SIGKILL", d.UUID, mine(), quitErr, strings.TrimSpace(out.String()))
	}
	klog.Background().Info("Killed the MPS daemon's processes that outlived quit", "gpu", d.UUID, "domain", d.Domain, "pids", killed, "quit", quitErr)
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

// StopAll stops every daemon still running, all at once (the check's
// cleanup), then kills any process left whose pipe directory is under Root.
func (l *LocalMPS) StopAll(ctx context.Context) error {
	l.mu.Lock()
	daemons := make([]isolation.Daemon, 0, len(l.running))
	for _, d := range l.running {
		daemons = append(daemons, d)
	}
	l.mu.Unlock()
	errs := make([]error, len(daemons))
	var wg sync.WaitGroup
	for i, d := range daemons {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Stop(ctx, d)
		}()
	}
	wg.Wait()
	if l.Root != "" {
		root := strings.TrimSuffix(l.Root, "/") + "/"
		under := func() []int {
			return mpsProcesses(l.procRoot(), func(pipe string) bool { return strings.HasPrefix(pipe, root) })
		}
		if left := under(); len(left) > 0 {
			killAll(left)
			if err := waitFor(context.WithoutCancel(ctx), 5*time.Second, func() bool { return len(under()) == 0 }); err != nil {
				errs = append(errs, fmt.Errorf("mps: processes %v of the check's MPS directories still run after SIGKILL", under()))
			}
		}
	}
	return errors.Join(errs...)
}

// mpsProcesses are the processes (but this one) whose environment has a
// CUDA_MPS_PIPE_DIRECTORY that match accepts, and their descendants (an
// MPS server is the control daemon's child). It reads procRoot/<pid>/environ
// and procRoot/<pid>/stat; processes it may not read are not listed.
func mpsProcesses(procRoot string, match func(pipe string) bool) []int {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	self := os.Getpid()
	found := map[int]bool{}
	parent := map[int]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "stat")); err == nil {
			// pid (comm) state ppid …; comm may hold spaces and parentheses.
			if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
				if f := strings.Fields(string(stat[i+1:])); len(f) >= 2 {
					if ppid, err := strconv.Atoi(f[1]); err == nil {
						parent[pid] = ppid
					}
				}
			}
		}
		env, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "environ"))
		if err != nil {
			continue
		}
		for kv := range bytes.SplitSeq(env, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte("CUDA_MPS_PIPE_DIRECTORY=")); ok && match(string(v)) {
				found[pid] = true
				break
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for pid, ppid := range parent {
			if !found[pid] && found[ppid] && pid != self {
				found[pid], changed = true, true
			}
		}
	}
	out := make([]int, 0, len(found))
	for pid := range found {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// killAll sends SIGKILL to each pid and returns those it reached.
func killAll(pids []int) []int {
	var out []int
	for _, pid := range pids {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			out = append(out, pid)
		}
	}
	return out
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
