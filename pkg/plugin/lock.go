package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
)

// lockPoll is how often lockNode retries a lock held by the other instance.
const lockPoll = 50 * time.Millisecond

// lockNode takes the exclusive lock on the file at path that the kubelet
// plugin helper takes around every prepare and unprepare call when rolling
// updates are on (<plugin data dir>/serialize.lock), with the same library
// (etcd's fileutil: open-file-description fcntl locks on Linux, which do not
// exclude flock(2) locks, so no other call would do). Holding it, an instance
// can read and repair the node's state while the other instance of a surge
// update is guaranteed not to be inside a call. It waits until the lock is
// free or ctx is done; the returned function releases it. An empty path
// locks nothing.
func lockNode(ctx context.Context, path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	for {
		f, err := fileutil.TryLockFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err == nil {
			return func() { _ = f.Close() }, nil
		}
		if !errors.Is(err, fileutil.ErrLocked) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for lock %s (held by the other plugin instance): %w", path, context.Cause(ctx))
		case <-time.After(lockPoll):
		}
	}
}
