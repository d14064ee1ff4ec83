package isolation

import (
	"context"
	"errors"
	"os"
	"testing"
)

// failingStopRunner fails to stop the daemon of one key.
type failingStopRunner struct {
	loggingRunner
	fail DaemonKey
}

func (r failingStopRunner) Stop(ctx context.Context, d Daemon) error {
	if d.Key() == r.fail {
		*r.log = append(*r.log, "stop "+d.Key().String()+" failed")
		return errors.New("the API server is unreachable")
	}
	return r.loggingRunner.Stop(ctx, d)
}

// TestMPSRestoreKeepsShmOfDaemonNotStopped: a complete restore stops the
// daemons nobody holds and removes their directories, but one whose stop
// failed may still run with clients that map its shared memory: its tmpfs
// stays mounted and its directories stay, until a later restore stops it.
func TestMPSRestoreKeepsShmOfDaemonNotStopped(t *testing.T) {
	ctx := context.Background()
	var log []string
	stuck := DaemonKey{GPU: "GPU-1", Domain: "team-a"}
	r := failingStopRunner{loggingRunner: loggingRunner{FakeRunner: NewFakeRunner(), log: &log}, fail: stuck}
	m := NewMPSWith(t.TempDir(), r, MPSOptions{Shm: shmRecorder{log: &log}, ShmSize: 64 << 20})
	for _, key := range []DaemonKey{stuck, {GPU: "GPU-2", Domain: "team-b"}} {
		d := m.Daemon(key.GPU, key.Domain)
		if err := os.MkdirAll(d.ShmDir, 0o755); err != nil {
			t.Fatal(err)
		}
		_ = r.FakeRunner.Start(ctx, d, false)
	}
	log = nil
	if err := m.Restore(ctx, nil, true); err == nil {
		t.Fatal("restore hid the failed stop")
	}
	gone := m.Daemon("GPU-2", "team-b")
	wantCalls(t, "calls of restore", log, "stop GPU-1/team-a failed", "stop GPU-2/team-b", "unmount "+gone.ShmDir)
	wantGone(t, gone.Dir, "the stopped orphan's directory")
	if _, err := os.Stat(m.Daemon(stuck.GPU, stuck.Domain).ShmDir); err != nil {
		t.Errorf("the shared memory of the daemon whose stop failed: %v, want it kept", err)
	}

	// Once it stops, the next restore cleans up after it.
	r.fail = DaemonKey{}
	m.runner = r
	log = nil
	if err := m.Restore(ctx, nil, true); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, "calls of the next restore", log, "stop GPU-1/team-a", "unmount "+m.Daemon(stuck.GPU, stuck.Domain).ShmDir)
	wantGone(t, m.Daemon(stuck.GPU, stuck.Domain).Dir, "the orphan's directory once stopped")
}
