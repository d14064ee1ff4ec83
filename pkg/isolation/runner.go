package isolation

import (
	"context"
	"slices"
	"sync"
)

// FakeRunner is a [DaemonRunner] for tests and benchmarks: it keeps the set
// of running daemons in memory and counts starts and stops. One FakeRunner
// shared by two plugin instances models daemons that outlive a plugin
// restart, as the daemon pods of pkg/mpsdaemon do.
type FakeRunner struct {
	mu      sync.Mutex
	running map[string]Daemon
	// starts and stops count calls that changed something.
	starts, stops int
	startErr      error
}

// NewFakeRunner returns a FakeRunner with no daemons running.
func NewFakeRunner() *FakeRunner { return &FakeRunner{running: map[string]Daemon{}} }

// FailStarts makes every following Start fail with err (nil: succeed again).
func (f *FakeRunner) FailStarts(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.startErr = err
}

// Start implements [DaemonRunner]; a running daemon is kept as it is.
func (f *FakeRunner) Start(_ context.Context, d Daemon, _ bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.startErr != nil {
		return f.startErr
	}
	if _, ok := f.running[d.UUID]; !ok {
		f.running[d.UUID] = d
		f.starts++
	}
	return nil
}

// Stop implements [DaemonRunner].
func (f *FakeRunner) Stop(_ context.Context, d Daemon) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.running[d.UUID]; ok {
		delete(f.running, d.UUID)
		f.stops++
	}
	return nil
}

// Running implements [DaemonRunner].
func (f *FakeRunner) Running(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.running))
	for uuid := range f.running {
		out = append(out, uuid)
	}
	slices.Sort(out)
	return out, nil
}

// Kill makes the GPU's daemon vanish without a Stop (someone deleted its
// pod), so that tests can check it is started again.
func (f *FakeRunner) Kill(uuid string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.running, uuid)
}

// Counts returns the number of daemons started and stopped so far.
func (f *FakeRunner) Counts() (starts, stops int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts, f.stops
}
