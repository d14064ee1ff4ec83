package mpsdaemon

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRunFake: the fake daemon creates a control socket clients can connect
// to and a pid file, is Ready only while it runs, clears what a previous
// daemon left and removes its files when stopped.
func TestRunFake(t *testing.T) {
	root := t.TempDir()
	pipe := filepath.Join(root, PipeDir)
	if err := os.MkdirAll(pipe, 0o755); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(pipe, "mps_0")
	if err := os.WriteFile(stale, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	shm := filepath.Join(root, ShmDir)
	if err := os.MkdirAll(shm, 0o755); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(root, "state", "ready")
	// A ready file from before a container restart.
	if err := writeReady(ready, "/nonexistent"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Options{GPU: "GPU-1", Fake: true, DriverRoot: root, ReadyFile: ready}) }()

	deadline := time.Now().Add(5 * time.Second)
	for Ready(ready) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %v", Ready(ready))
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := net.Dial("unix", filepath.Join(pipe, ControlSocket))
	if err != nil {
		t.Fatalf("connect to the control socket: %v", err)
	}
	_ = conn.Close()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale file in the pipe directory: %v", err)
	}
	// The MPS server runs as its first client's uid (runAsUser 1000, say)
	// and writes its pipes, its log and its segments: all three are
	// writable by any uid, sticky as /dev/shm is.
	for _, dir := range []string{shm, pipe, filepath.Join(root, LogDir)} {
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
			t.Errorf("%s: %v, %v: want drwxrwxrwt so an MPS server of any uid can use it", dir, fi.Mode(), err)
		}
	}
	if pid, err := os.ReadFile(filepath.Join(pipe, "nvidia-cuda-mps-control.pid")); err != nil || strings.TrimSpace(string(pid)) == "" {
		t.Errorf("pid file: %q, %v", pid, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := Ready(ready); err == nil {
		t.Error("ready after the daemon stopped")
	}
	if _, err := os.Stat(filepath.Join(pipe, ControlSocket)); !os.IsNotExist(err) {
		t.Errorf("control socket after stop: %v", err)
	}
	if log, err := os.ReadFile(filepath.Join(root, LogDir, "control.log")); err != nil || !strings.Contains(string(log), "GPU-1") {
		t.Errorf("control.log: %q, %v", log, err)
	}
}

// TestRunRealWithoutBinary: a driver root without nvidia-cuda-mps-control
// is an error naming the root; bad options name the flag.
func TestRunRealWithoutBinary(t *testing.T) {
	root := t.TempDir()
	err := Run(context.Background(), Options{GPU: "GPU-1", DriverRoot: root, ReadyFile: filepath.Join(root, "ready")})
	if err == nil || !strings.Contains(err.Error(), root) || !strings.Contains(err.Error(), "nvidia-cuda-mps-control") {
		t.Errorf("Run = %v", err)
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{ReadyFile: "r", Fake: true}, "--gpu"},
		{Options{GPU: "g", Fake: true}, "--ready-file"},
		{Options{GPU: "g", ReadyFile: "r"}, "--driver-root"},
	} {
		if err := Run(context.Background(), tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%+v) = %v, want %s", tc.o, err, tc.want)
		}
	}
}

func TestReadyRefuses(t *testing.T) {
	dir := t.TempDir()
	notSocket := filepath.Join(dir, "file")
	_ = os.WriteFile(notSocket, nil, 0o644)
	for name, content := range map[string]string{
		"dead process": "999999999\n" + notSocket + "\n",
		"no socket":    "1\n" + filepath.Join(dir, "missing") + "\n",
		"not a socket": "1\n" + notSocket + "\n",
		"garbage":      "x\n",
	} {
		path := filepath.Join(dir, "ready")
		_ = os.WriteFile(path, []byte(content), 0o644)
		if err := Ready(path); err == nil {
			t.Errorf("%s: Ready = nil", name)
		}
	}
	if err := Ready(filepath.Join(dir, "none")); err == nil {
		t.Error("no ready file: Ready = nil")
	}
}

// TestClearDirRefusesSymlinks: the daemon runs as root and clears its pipe
// directory and chmods its directories at start; a symbolic link there (or
// in a component below the root) must not make it clear or chmod what the
// link names, and a link inside the directory is removed, not followed.
func TestClearDirRefusesSymlinks(t *testing.T) {
	victim := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "victim")
		if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "sub", "keep"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	intact := func(t *testing.T, dir string) {
		t.Helper()
		if _, err := os.Stat(filepath.Join(dir, "sub", "keep")); err != nil {
			t.Errorf("the link's target was cleared: %v", err)
		}
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 || fi.Mode()&os.ModeSticky != 0 {
			t.Errorf("the link's target was chmodded: %v %v", fi.Mode(), err)
		}
	}

	t.Run("the directory is a link", func(t *testing.T) {
		root, v := t.TempDir(), victim(t)
		if err := os.MkdirAll(filepath.Join(root, "mps"), 0o755); err != nil {
			t.Fatal(err)
		}
		pipe := filepath.Join(root, "mps", "pipe")
		if err := os.Symlink(v, pipe); err != nil {
			t.Fatal(err)
		}
		if err := clearDir(root, pipe); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("clearDir of a link: %v; want a refusal", err)
		}
		if err := chmodDir(root, pipe, 0o777|unix.S_ISVTX); err == nil {
			t.Error("chmodDir of a link: no error")
		}
		intact(t, v)
	})
	t.Run("a component is a link", func(t *testing.T) {
		root, v := t.TempDir(), victim(t)
		if err := os.Symlink(filepath.Dir(v), filepath.Join(root, "mps")); err != nil {
			t.Fatal(err)
		}
		if err := clearDir(root, filepath.Join(root, "mps", "victim")); err == nil {
			t.Error("clearDir through a linked component: no error")
		}
		intact(t, v)
	})
	t.Run("an entry is a link", func(t *testing.T) {
		root, v := t.TempDir(), victim(t)
		pipe := filepath.Join(root, "mps", "pipe")
		if err := os.MkdirAll(filepath.Join(pipe, "stale"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pipe, "stale", "control"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(v, filepath.Join(pipe, "link")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(v, filepath.Join(pipe, "stale", "link")); err != nil {
			t.Fatal(err)
		}
		if err := clearDir(root, pipe); err != nil {
			t.Fatal(err)
		}
		if entries, err := os.ReadDir(pipe); err != nil || len(entries) != 0 {
			t.Errorf("pipe after clearDir: %v %v; want empty", entries, err)
		}
		intact(t, v)
	})
	t.Run("missing directories are created", func(t *testing.T) {
		root := t.TempDir()
		pipe := filepath.Join(root, "mps", "pipe")
		if err := clearDir(root, pipe); err != nil {
			t.Fatal(err)
		}
		if err := chmodDir(root, pipe, 0o777|unix.S_ISVTX); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(pipe); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
			t.Errorf("pipe: %v %v; want a sticky 0777 directory", fi.Mode(), err)
		}
		if err := clearDir(root, filepath.Join(root, "..", "elsewhere")); err == nil {
			t.Error("clearDir outside root: no error")
		}
	})
}

// TestRunShmTmpfs: with --shm-tmpfs the daemon refuses to start (and so
// never becomes Ready) while its /dev/shm is not a tmpfs: after a reboot,
// before the plugin mounts the domain's tmpfs again, it is the root disk's
// plain directory.
func TestRunShmTmpfs(t *testing.T) {
	real := statfsType
	t.Cleanup(func() { statfsType = real })
	var asked string
	fsType := int64(0xEF53) // ext4
	statfsType = func(p string) (int64, error) { asked = p; return fsType, nil }

	root := t.TempDir()
	var log strings.Builder
	o := Options{GPU: "GPU-1", Fake: true, DriverRoot: root, ReadyFile: filepath.Join(root, "ready"), ShmTmpfs: true, Log: &log}
	err := Run(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "is not a tmpfs") {
		t.Fatalf("Run on a plain shm directory: %v; want a refusal", err)
	}
	if want := filepath.Join(root, ShmDir); asked != want {
		t.Errorf("statfs of %q; want %q", asked, want)
	}
	if !strings.Contains(log.String(), "is not a tmpfs") {
		t.Errorf("log %q: want the refusal", log.String())
	}
	if _, err := os.Stat(o.ReadyFile); err == nil {
		t.Error("ready file written")
	}

	fsType = unix.TMPFS_MAGIC
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	deadline := time.Now().Add(10 * time.Second)
	for Ready(o.ReadyFile) != nil {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("not ready on a tmpfs: %v", <-done)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
