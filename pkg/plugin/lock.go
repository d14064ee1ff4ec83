package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// lockPoll is how often lockNode retries a lock held by the other instance.
const lockPoll = 50 * time.Millisecond

// lockNode takes the exclusive file lock at path, the one the kubelet plugin
// helper takes around every prepare and unprepare call when rolling updates
// are on (<plugin data dir>/serialize.lock). Holding it, an instance can read
// and repair the node's state while the other instance of a surge update is
// guaranteed not to be inside a call. It waits until the lock is free or ctx
// is done; the returned function releases it. An empty path locks nothing.
func lockNode(ctx context.Context, path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open node lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("waiting for lock %s (held by the other plugin instance): %w", path, context.Cause(ctx))
		case <-time.After(lockPoll):
		}
	}
}
