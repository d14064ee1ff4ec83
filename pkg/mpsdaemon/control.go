package mpsdaemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Options configure [Run], the program in a daemon pod.
type Options struct {
	// GPU is the UUID of the GPU the daemon serves (CUDA_VISIBLE_DEVICES).
	GPU string
	// DriverRoot is the container path of the driver root that the real
	// daemon runs chrooted in; PipeDir, LogDir and ShmDir are under it.
	DriverRoot string
	// Fake runs the fake daemon of mock nodes instead, with its directories
	// under DriverRoot if set, else under /.
	Fake bool
	// ReadyFile is written once the daemon accepts clients; [Ready] reads it.
	ReadyFile string
	// Log receives the program's own messages and the daemon's output.
	Log io.Writer
	// StartTimeout bounds the wait for the control socket; zero: 60s.
	StartTimeout time.Duration
}

// mpsControl is the control program, looked for in these directories of
// the driver root.
const mpsControl = "nvidia-cuda-mps-control"

var binDirs = []string{"/usr/bin", "/usr/local/bin", "/bin", "/usr/local/nvidia/bin", "/usr/sbin", "/sbin"}

// Run runs the daemon until ctx ends (the pod's SIGTERM), then stops it and
// returns. It returns an error if the daemon cannot start or exits on its
// own; the pod's restart policy then starts the program again.
func Run(ctx context.Context, o Options) error {
	if o.GPU == "" {
		return errors.New("--gpu is required")
	}
	if o.ReadyFile == "" {
		return errors.New("--ready-file is required")
	}
	if !o.Fake && o.DriverRoot == "" {
		return errors.New("--driver-root is required without --fake")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = time.Minute
	}
	root := o.DriverRoot
	if o.Fake && root == "" {
		root = "/"
	}
	pipe := filepath.Join(root, PipeDir)
	// A ready file from before a container restart must not make the pod
	// Ready before this daemon is.
	if err := os.Remove(o.ReadyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale ready file: %w", err)
	}
	// The pipe directory holds only the daemon's sockets and pid file; the
	// previous daemon in this pod ended with its container, so what is left
	// of it is stale.
	if err := clearDir(pipe); err != nil {
		return err
	}
	// Clients of any user share the daemon's /dev/shm (the MPS server
	// creates its segments there with the client's UID): sticky and
	// writable by all, as /dev/shm is; the kubelet creates it 0755.
	if err := os.Chmod(filepath.Join(root, ShmDir), 0o777|os.ModeSticky); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("make the shared-memory directory writable for clients: %w", err)
	}
	if o.Fake {
		return runFake(ctx, o, pipe, filepath.Join(root, LogDir))
	}
	return runReal(ctx, o, pipe)
}

// ControlBinary returns the path, inside driverRoot, of the driver's
// nvidia-cuda-mps-control: the first regular file of that name in the usual
// bin directories. The daemon pods run it chrooted into the driver root;
// tessera doctor looks for it the same way.
func ControlBinary(driverRoot string) (string, error) {
	for _, dir := range binDirs {
		p := filepath.Join(dir, mpsControl)
		if fi, err := os.Stat(filepath.Join(driverRoot, p)); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in the driver root %s (looked in %s)", mpsControl, driverRoot, strings.Join(binDirs, ", "))
}

func runReal(ctx context.Context, o Options, pipe string) error {
	bin, err := ControlBinary(o.DriverRoot)
	if err != nil {
		return err
	}
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"CUDA_VISIBLE_DEVICES=" + o.GPU,
		"CUDA_MPS_PIPE_DIRECTORY=" + PipeDir,
		"CUDA_MPS_LOG_DIRECTORY=" + LogDir,
	}
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: o.DriverRoot}
		return cmd
	}
	daemon := command("-f")
	daemon.Stdout, daemon.Stderr = o.Log, o.Log
	if err := daemon.Start(); err != nil {
		return fmt.Errorf("start %s -f in %s: %w", bin, o.DriverRoot, err)
	}
	fmt.Fprintf(o.Log, "started %s -f (pid %d) for GPU %s\n", bin, daemon.Process.Pid, o.GPU)
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()

	if err := waitForSocket(ctx, filepath.Join(pipe, ControlSocket), o.StartTimeout, exited); err != nil {
		_ = daemon.Process.Kill()
		return err
	}
	if err := writeReady(o.ReadyFile, filepath.Join(pipe, ControlSocket)); err != nil {
		_ = daemon.Process.Kill()
		return err
	}
	fmt.Fprintf(o.Log, "MPS control daemon for GPU %s ready\n", o.GPU)
	select {
	case err := <-exited:
		_ = os.Remove(o.ReadyFile)
		return fmt.Errorf("%s -f exited: %v", bin, err)
	case <-ctx.Done():
	}
	_ = os.Remove(o.ReadyFile)
	quit := command()
	quit.Stdin = strings.NewReader("quit\n")
	quit.Stdout, quit.Stderr = o.Log, o.Log
	if err := quit.Run(); err != nil {
		fmt.Fprintf(o.Log, "echo quit | %s: %v\n", bin, err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = daemon.Process.Kill()
		<-exited
	}
	fmt.Fprintf(o.Log, "MPS control daemon for GPU %s stopped\n", o.GPU)
	return nil
}

// runFake is the daemon of mock nodes: it listens on the control socket
// (accepting and closing connections), writes the pid file and a log line,
// and removes them again when it stops.
func runFake(ctx context.Context, o Options, pipe, logDir string) error {
	for _, dir := range []string{pipe, logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	socket := filepath.Join(pipe, ControlSocket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("fake MPS daemon: %w", err)
	}
	defer l.Close()
	// Clients of any user connect to the real daemon's socket too.
	if err := os.Chmod(socket, 0o666); err != nil {
		return err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	pidFile := filepath.Join(pipe, "nvidia-cuda-mps-control.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile)
	logLine := func(msg string) {
		f, err := os.OpenFile(filepath.Join(logDir, "control.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintf(f, "[%s] %s\n", time.Now().UTC().Format(time.RFC3339), msg)
			_ = f.Close()
		}
		fmt.Fprintln(o.Log, msg)
	}
	if err := writeReady(o.ReadyFile, socket); err != nil {
		return err
	}
	defer os.Remove(o.ReadyFile)
	logLine(fmt.Sprintf("fake MPS control daemon for GPU %s ready (pid %d)", o.GPU, os.Getpid()))
	<-ctx.Done()
	logLine(fmt.Sprintf("fake MPS control daemon for GPU %s stopped", o.GPU))
	return nil
}

func waitForSocket(ctx context.Context, socket string, timeout time.Duration, exited <-chan error) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if fi, err := os.Stat(socket); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the MPS control daemon exited before creating %s: %v", socket, err)
		case <-deadline.C:
			return fmt.Errorf("the MPS control daemon did not create %s within %v", socket, timeout)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// writeReady records this process and the control socket; [Ready] checks
// that both still exist.
func writeReady(path, socket string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d\n%s\n", os.Getpid(), socket), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Ready is the pod's probe: nil when the ready file names a live process
// and an existing control socket.
func Ready(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("not ready: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var lines []string
	for sc.Scan() {
		lines = append(lines, strings.TrimSpace(sc.Text()))
	}
	if len(lines) != 2 {
		return fmt.Errorf("ready file %s: want 2 lines (pid, socket), got %d", path, len(lines))
	}
	pid, err := strconv.Atoi(lines[0])
	if err != nil || pid <= 0 {
		return fmt.Errorf("ready file %s: bad pid %q", path, lines[0])
	}
	// Signal 0 checks that the process exists.
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return fmt.Errorf("daemon process %d: %w", pid, err)
	}
	fi, err := os.Stat(lines[1])
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("control socket %s is not a socket (mode %s)", lines[1], fi.Mode())
	}
	return nil
}

// clearDir removes everything in dir (creating dir if missing).
func clearDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("clear %s: %w", dir, err)
		}
	}
	return nil
}
