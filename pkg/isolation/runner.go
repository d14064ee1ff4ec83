package isolation

import (
	"context"
	"maps"
	"slices"
	"sync"
)

// FakeRunner is a [DaemonRunner] for tests and benchmarks: it keeps the set
// of running daemons in memory and counts starts and stops. One FakeRunner
// shared by two plugin instances models daemons that outlive a plugin
// restart, as the daemon pods of pkg/mpsdaemon do.
type FakeRunner struct {
	mu      sync.Mutex
	running map[DaemonKey]Daemon
	// starts and stops count calls that changed something.
	starts, stops int
	startErr      error
}

// NewFakeRunner returns a FakeRunner with no daemons running.
func NewFakeRunner() *FakeRunner { return &FakeRunner{running: map[DaemonKey]Daemon{}} }

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
	if _, ok := f.running[d.Key()]; !ok {
		f.running[d.Key()] = d
		f.starts++
	}
	return nil
}

// Stop implements [DaemonRunner].
func (f *FakeRunner) Stop(_ context.Context, d Daemon) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.running[d.Key()]; ok {
		delete(f.running, d.Key())
		f.stops++
	}
	return nil
}

// Running implements [DaemonRunner].
func (f *FakeRunner) Running(context.Context) ([]DaemonKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.SortedFunc(maps.Keys(f.running), compareKeys), nil
}

// Kill makes the daemon vanish without a Stop (someone deleted its pod), so
// that tests can check it is started again.
func (f *FakeRunner) Kill(key DaemonKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.running, key)
}

// Counts returns the number of daemons started and stopped so far.
func (f *FakeRunner) Counts() (starts, stops int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts, f.stops
}
