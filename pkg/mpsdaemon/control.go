package mpsdaemon

import (
	"bufio"
	"context"
	"encoding/json"
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

	"golang.org/x/sys/unix"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

// Options configure [Run], the program in a daemon pod.
type Options struct {
	// GPU is the UUID of the GPU the daemon serves (CUDA_VISIBLE_DEVICES).
	GPU string
	// DriverRoot is the container path of the driver root (read-only)
	// whose nvidia-cuda-mps-control the real daemon runs: chrooted into it
	// when it has a dynamic loader, else with its libraries on
	// LD_LIBRARY_PATH (see [planLaunch]). PipeDir, LogDir and ShmDir are
	// the pod's own mounts, outside it.
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
	// ShmTmpfs: ShmDir must be a tmpfs (the plugin's per-domain mount on a
	// real node); Run fails, and the pod never becomes Ready, while it is
	// not (after a reboot, before the plugin mounts it again, it is the
	// root disk's plain directory). The container's restart then binds it
	// again.
	ShmTmpfs bool
	// LogLimit is the size past which a log in the log directory is cut
	// (boundLogs); zero: DefaultLogLimit.
	LogLimit int64
	// LogCheckInterval is how often the logs are looked at; zero:
	// DefaultLogCheckInterval.
	LogCheckInterval time.Duration
}

// statfsType returns the filesystem type (f_type) of path; a seam for tests.
var statfsType = func(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Type), nil
}

// checkShmTmpfs fails unless dir is on a tmpfs.
func checkShmTmpfs(dir string) error {
	t, err := statfsType(dir)
	if err != nil {
		return fmt.Errorf("--shm-tmpfs: statfs %s: %w", dir, err)
	}
	if t != unix.TMPFS_MAGIC {
		return fmt.Errorf("--shm-tmpfs: %s is not a tmpfs (filesystem type %#x): the plugin has not mounted this domain's shared memory (yet, after a reboot?); not serving clients from the host's plain directory, the container's restart retries", dir, t)
	}
	return nil
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
	root := "/"
	if o.Fake && o.DriverRoot != "" {
		root = o.DriverRoot
	}
	pipe := filepath.Join(root, PipeDir)
	if o.ShmTmpfs {
		if err := checkShmTmpfs(filepath.Join(root, ShmDir)); err != nil {
			fmt.Fprintln(o.Log, err)
			return err
		}
	}
	// A ready file from before a container restart must not make the pod
	// Ready before this daemon is.
	if err := os.Remove(o.ReadyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale ready file: %w", err)
	}
	// The pipe directory holds only the daemon's sockets and pid file; the
	// previous daemon in this pod ended with its container, so what is left
	// of it is stale.
	if err := clearDir(root, pipe); err != nil {
		return err
	}
	// The control daemon runs as root, but it starts each MPS server with
	// the uid of the server's first client (runAsUser 1000, say), and the
	// server creates its pipes in the pipe directory, its log in the log
	// directory and its segments in /dev/shm: all three are sticky and
	// writable by all, as /dev/shm is (the kubelet creates them 0755).
	// Clients get the pipe directory read-only and never the log
	// directory, so only the daemon's own processes write there.
	for _, dir := range []string{pipe, filepath.Join(root, LogDir), filepath.Join(root, ShmDir)} {
		if err := chmodDir(root, dir, 0o777|unix.S_ISVTX); err != nil {
			return fmt.Errorf("make %s writable for MPS servers of any uid: %w", dir, err)
		}
	}
	if o.Fake {
		return runFake(ctx, o, pipe, filepath.Join(root, LogDir))
	}
	return runReal(ctx, o, pipe)
}

// Where the chrooted daemon finds its directories: the pod's /mps (pipe
// and log) is bound over the driver root's /tmp and its /dev/shm over the
// driver root's /dev/shm, both in the pod's own mount namespace, so the
// read-only driver root needs no mount point of Tessera's.
const (
	chrootScratch = "/tmp"
	chrootPipeDir = chrootScratch + "/pipe"
	chrootLogDir  = chrootScratch + "/log"
)

// launch is how the daemon's binary runs.
type launch struct {
	// Chroot is the driver root the binary runs chrooted in; empty: none.
	Chroot string
	// Path is the binary as executed (inside Chroot if set).
	Path string
	Env  []string
	// Binds are (source, target) pairs to bind before the daemon starts.
	Binds [][2]string
	// Why says which way was chosen and why, for the pod's log.
	Why string
}

// loaders are the dynamic loaders a driver root's binaries may ask for.
var loaders = []string{
	"lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "usr/lib64/ld-linux-x86-64.so.2",
	"lib/ld-linux-aarch64.so.1", "lib/aarch64-linux-gnu/ld-linux-aarch64.so.1", "usr/lib/ld-linux-aarch64.so.1",
}

// libDirs are the driver root's library directories, for LD_LIBRARY_PATH
// when the daemon cannot run chrooted.
var libDirs = []string{
	"usr/local/nvidia/lib64", "usr/local/nvidia/lib", "lib64", "usr/lib64",
	"usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib/aarch64-linux-gnu",
	"usr/lib", "lib",
}

// planLaunch decides how to run the driver root's control daemon for gpu.
// Chrooted when the driver root is a whole root filesystem: it has a
// dynamic loader (its binaries' ELF interpreter), /tmp and /dev/shm. Driver
// roots that hold only the driver's files (COS's /home/kubernetes/bin/nvidia,
// with bin/ and lib64/ and no loader) cannot be chrooted into: the binary
// then runs from the pod's own root, with the image's loader and the driver
// root's library directories on LD_LIBRARY_PATH (the way GKE's own GPU
// containers run these binaries).
func planLaunch(driverRoot, gpu string) (launch, error) {
	bin, err := ControlBinary(driverRoot)
	if err != nil {
		return launch{}, err
	}
	env := []string{"CUDA_VISIBLE_DEVICES=" + gpu}
	loader, hasLoader := findInRoot(driverRoot, loaders)
	tmp := isDir(filepath.Join(driverRoot, chrootScratch))
	shm := isDir(filepath.Join(driverRoot, ShmDir))
	if hasLoader && tmp && shm {
		return launch{
			Chroot: driverRoot,
			Path:   bin,
			Env: append(env,
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/nvidia/bin",
				"CUDA_MPS_PIPE_DIRECTORY="+chrootPipeDir,
				"CUDA_MPS_LOG_DIRECTORY="+chrootLogDir),
			Binds: [][2]string{
				{ScratchDir, filepath.Join(driverRoot, chrootScratch)},
				{ShmDir, filepath.Join(driverRoot, ShmDir)},
			},
			Why: fmt.Sprintf("chrooted into %s (dynamic loader %s)", driverRoot, loader),
		}, nil
	}
	var missing []string
	if !hasLoader {
		missing = append(missing, "no dynamic loader")
	}
	if !tmp {
		missing = append(missing, "no /tmp")
	}
	if !shm {
		missing = append(missing, "no /dev/shm")
	}
	var libs []string
	for _, d := range libDirs {
		if p := filepath.Join(driverRoot, d); isDir(p) {
			libs = append(libs, p)
		}
	}
	if len(libs) == 0 {
		return launch{}, fmt.Errorf("driver root %s cannot be chrooted into (%s) and has no library directory (looked for %s)", driverRoot, strings.Join(missing, ", "), strings.Join(libDirs, ", "))
	}
	path := []string{filepath.Dir(filepath.Join(driverRoot, bin))}
	path = append(path, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
	return launch{
		Path: filepath.Join(driverRoot, bin),
		Env: append(env,
			"PATH="+strings.Join(path, ":"),
			"LD_LIBRARY_PATH="+strings.Join(libs, ":"),
			"CUDA_MPS_PIPE_DIRECTORY="+PipeDir,
			"CUDA_MPS_LOG_DIRECTORY="+LogDir),
		Why: fmt.Sprintf("not chrooted: driver root %s has %s; its libraries are on LD_LIBRARY_PATH", driverRoot, strings.Join(missing, ", ")),
	}, nil
}

// findInRoot returns the first of names (relative paths) that exists in
// root, following symbolic links inside root (an absolute link target is
// relative to root, as it is for a process chrooted there).
func findInRoot(root string, names []string) (string, bool) {
	for _, name := range names {
		if fileInRoot(root, name) {
			return name, true
		}
	}
	return "", false
}

func fileInRoot(root, name string) bool {
	p := filepath.Join(root, name)
	for range 16 {
		fi, err := os.Lstat(p)
		if err != nil {
			return false
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return fi.Mode().IsRegular()
		}
		target, err := os.Readlink(p)
		if err != nil {
			return false
		}
		if filepath.IsAbs(target) {
			p = filepath.Join(root, target)
		} else {
			p = filepath.Join(filepath.Dir(p), target)
		}
		if rel, err := filepath.Rel(root, p); err != nil || strings.HasPrefix(rel, "..") {
			return false
		}
	}
	return false
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
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
	l, err := planLaunch(o.DriverRoot, o.GPU)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.Log, "running %s %s\n", l.Path, l.Why)
	if err := bindAll(l.Binds); err != nil {
		return err
	}
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(l.Path, args...)
		cmd.Env = l.Env
		cmd.Dir = "/"
		if l.Chroot != "" {
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: l.Chroot}
		}
		return cmd
	}
	bin := l.Path
	daemon := command("-f")
	daemon.Stdout, daemon.Stderr = o.Log, o.Log
	if err := daemon.Start(); err != nil {
		return fmt.Errorf("start %s -f (%s): %w", bin, l.Why, err)
	}
	fmt.Fprintf(o.Log, "started %s -f (pid %d) for GPU %s\n", bin, daemon.Process.Pid, o.GPU)
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()

	if err := waitForSocket(ctx, filepath.Join(pipe, ControlSocket), o.StartTimeout, exited); err != nil {
		_ = daemon.Process.Kill()
		return err
	}
	// The defaults before the first client: every server gets them.
	if cmds, err := limitCommands(LogDir); err != nil {
		_ = daemon.Process.Kill()
		return err
	} else if cmds != "" {
		set := command()
		set.Stdin = strings.NewReader(cmds)
		set.Stdout, set.Stderr = o.Log, o.Log
		if err := set.Run(); err != nil {
			_ = daemon.Process.Kill()
			return fmt.Errorf("set the clients' limits (%s| %s): %w", strings.ReplaceAll(cmds, "\n", "; "), bin, err)
		}
		fmt.Fprintf(o.Log, "MPS clients' limits set: %s\n", strings.TrimSpace(strings.ReplaceAll(cmds, "\n", "; ")))
	}
	if err := writeReady(o.ReadyFile, filepath.Join(pipe, ControlSocket)); err != nil {
		_ = daemon.Process.Kill()
		return err
	}
	fmt.Fprintf(o.Log, "MPS control daemon for GPU %s ready\n", o.GPU)
	logsCtx, stopLogs := context.WithCancel(ctx)
	defer stopLogs()
	go watchLogs(logsCtx, LogDir, o.LogLimit, o.LogCheckInterval, o.Log)
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

// bindAll binds each source over its target in the pod's own mount
// namespace (the pod's volumes propagate nothing to the host), making the
// new mounts private first so that nothing leaks into the host's driver
// root. A target that already is the bind (a restarted container of the
// same pod keeps no mounts, but be safe) is bound again on top.
func bindAll(binds [][2]string) error {
	for _, b := range binds {
		if err := unix.Mount(b[0], b[1], "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s over %s: %w", b[0], b[1], err)
		}
		if err := unix.Mount("", b[1], "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("make %s private: %w", b[1], err)
		}
	}
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
	// The fake has no servers: it records the defaults a real daemon sets.
	cmds, err := limitCommands(logDir)
	if err != nil {
		return err
	}
	for line := range strings.Lines(cmds) {
		logLine("control: " + strings.TrimSpace(line))
	}
	if err := writeReady(o.ReadyFile, socket); err != nil {
		return err
	}
	defer os.Remove(o.ReadyFile)
	logLine(fmt.Sprintf("fake MPS control daemon for GPU %s ready (pid %d)", o.GPU, os.Getpid()))
	go watchLogs(ctx, logDir, o.LogLimit, o.LogCheckInterval, o.Log)
	<-ctx.Done()
	logLine(fmt.Sprintf("fake MPS control daemon for GPU %s stopped", o.GPU))
	return nil
}

// limitCommands are the control daemon's commands that make the limits in
// logDir's isolation.MPSLimitsFile the defaults of every MPS server it
// starts (device 0: CUDA_VISIBLE_DEVICES names the daemon's one GPU); ""
// without the file (a daemon the plugin of an earlier release started). A
// file that cannot be read or parsed is an error: the daemon must not serve
// clients without the limits the plugin asked for.
func limitCommands(logDir string) (string, error) {
	path := filepath.Join(logDir, isolation.MPSLimitsFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("the clients' limits: %w", err)
	}
	var l isolation.MPSLimits
	if err := json.Unmarshal(data, &l); err != nil {
		return "", fmt.Errorf("the clients' limits %s: %w", path, err)
	}
	if l.PinnedMemoryMiB <= 0 || l.ActiveThreadPercentage <= 0 || l.ActiveThreadPercentage > 100 {
		return "", fmt.Errorf("the clients' limits %s: %s: want memory > 0 and threads in 1..100", path, l)
	}
	return fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM\nset_default_active_thread_percentage %d\n", l.PinnedMemoryMiB, l.ActiveThreadPercentage), nil
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

// openDir opens dir, a directory below root, creating what is missing of
// it, without following a symbolic link in any component below root: the
// daemon runs as root, and a directory that is a link (a hostPath the
// kubelet mounted through a tenant's link is not one, but a link inside a
// mount may be) must not make it clear or chmod what the link names.
func openDir(root, dir string) (*os.File, error) {
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("%s is not below %s", dir, root)
	}
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Open(root, flags&^unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", root, err)
	}
	at := root
	if rel != "." {
		for _, name := range strings.Split(rel, "/") {
			at = filepath.Join(at, name)
			next, err := unix.Openat(fd, name, flags, 0)
			if errors.Is(err, unix.ENOENT) {
				if err := unix.Mkdirat(fd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
					unix.Close(fd)
					return nil, fmt.Errorf("create %s: %w", at, err)
				}
				next, err = unix.Openat(fd, name, flags, 0)
			}
			unix.Close(fd)
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return nil, fmt.Errorf("refusing %s: a symbolic link or not a directory (%w)", at, err)
			}
			if err != nil {
				return nil, fmt.Errorf("open %s: %w", at, err)
			}
			fd = next
		}
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// chmodDir sets the mode of dir (below root, created if missing) without
// following symbolic links.
func chmodDir(root, dir string, mode uint32) error {
	f, err := openDir(root, dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fchmod(int(f.Fd()), mode)
}

// clearDir removes everything in dir (below root, created if missing)
// without following symbolic links: dir and its components below root
// must be directories, not links, and an entry that is a link is removed
// itself, never descended into.
func clearDir(root, dir string) error {
	f, err := openDir(root, dir)
	if err != nil {
		return err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("clear %s: %w", dir, err)
	}
	fd := int(f.Fd())
	for _, name := range names {
		if err := removeAt(fd, name); err != nil {
			return fmt.Errorf("clear %s: %s: %w", dir, name, err)
		}
	}
	return nil
}

// removeAt removes name in the directory dirfd and, if it is a directory
// (not a link to one), everything in it.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	sub, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(sub), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(sub, n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}
