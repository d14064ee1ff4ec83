package isolation

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Daemon is the MPS control daemon of one GPU: which GPU it serves and the
// host directories its clients and it communicate and log through.
type Daemon struct {
	UUID    string
	PipeDir string
	LogDir  string
}

// DaemonRunner starts and stops MPS control daemons. [ExecRunner] runs the
// real nvidia-cuda-mps-control; [FakeRunner] records calls for tests.
type DaemonRunner interface {
	// Start starts the daemon unless it is already running (idempotent).
	Start(ctx context.Context, d Daemon) error
	// Stop stops the daemon if it is running (idempotent).
	Stop(ctx context.Context, d Daemon) error
	// Running lists the UUIDs of the GPUs whose daemons are running, so
	// that daemons nobody holds any more (after a crash) can be stopped.
	Running(ctx context.Context) ([]string, error)
}

// MPS keeps one control daemon per GPU running while at least one claim holds
// an MPS share of it: the first [MPS.Acquire] of a GPU starts its daemon, the
// last [MPS.Release] stops it. Holders are claim UIDs, so acquire and release
// are idempotent per claim; the holder set is not persisted here but rebuilt
// from the plugin's checkpoint with [MPS.Restore] at start. Safe for
// concurrent use.
type MPS struct {
	root   string
	runner DaemonRunner

	// mu serializes all changes, including the runner calls, so that a
	// release stopping a daemon cannot race an acquire starting it.
	mu      sync.Mutex
	holders map[string]map[types.UID]struct{}
}

// NewMPS returns the daemon lifecycle with per-GPU directories under root
// (root/<uuid>/pipe and root/<uuid>/log).
func NewMPS(root string, runner DaemonRunner) *MPS {
	return &MPS{root: root, runner: runner, holders: map[string]map[types.UID]struct{}{}}
}

// Daemon returns the daemon of the GPU (it need not be running).
func (m *MPS) Daemon(uuid string) Daemon {
	dir := filepath.Join(m.root, uuid)
	return Daemon{UUID: uuid, PipeDir: filepath.Join(dir, "pipe"), LogDir: filepath.Join(dir, "log")}
}

// Acquire records claim as a holder of the GPU's daemon and starts the daemon
// if the claim is its first holder. Acquiring twice is a no-op. If the start
// fails, the claim is not a holder afterwards.
func (m *MPS) Acquire(ctx context.Context, uuid string, claim types.UID) (Daemon, error) {
	if uuid == "" || claim == "" {
		return Daemon{}, errors.New("mps: empty GPU uuid or claim uid")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.Daemon(uuid)
	set := m.holders[uuid]
	if _, ok := set[claim]; ok {
		return d, nil
	}
	if len(set) == 0 {
		if err := m.runner.Start(ctx, d); err != nil {
			return Daemon{}, fmt.Errorf("mps: start control daemon for GPU %s: %w", uuid, err)
		}
		klog.FromContext(ctx).V(2).Info("Started MPS control daemon", "gpu", uuid, "pipeDir", d.PipeDir)
		set = map[types.UID]struct{}{}
		m.holders[uuid] = set
	}
	set[claim] = struct{}{}
	return d, nil
}

// Release removes claim from the holders of the GPU's daemon and stops the
// daemon when it was the last one. Releasing a non-holder is a no-op. If the
// stop fails, the holder is gone anyway and the error is returned; the
// daemon is stopped again by the next [MPS.Restore].
func (m *MPS) Release(ctx context.Context, uuid string, claim types.UID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.holders[uuid]
	if _, ok := set[claim]; !ok {
		return nil
	}
	delete(set, claim)
	if len(set) > 0 {
		return nil
	}
	delete(m.holders, uuid)
	if err := m.runner.Stop(ctx, m.Daemon(uuid)); err != nil {
		return fmt.Errorf("mps: stop control daemon for GPU %s: %w", uuid, err)
	}
	klog.FromContext(ctx).V(2).Info("Stopped MPS control daemon", "gpu", uuid)
	return nil
}

// Holders returns, per GPU UUID, the claims holding its daemon (sorted).
func (m *MPS) Holders() map[string][]types.UID {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]types.UID, len(m.holders))
	for uuid, set := range m.holders {
		out[uuid] = slices.Sorted(maps.Keys(set))
	}
	return out
}

// Restore replaces the holder sets with holders (from the checkpoint), makes
// sure the daemon of every held GPU runs (after a plugin restart they may
// have died with the old container) and, with stopOrphans, stops running
// daemons that nobody holds (only right when holders is known to be
// complete). It returns the joined errors and keeps going past each one.
func (m *MPS) Restore(ctx context.Context, holders map[string][]types.UID, stopOrphans bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	m.holders = map[string]map[types.UID]struct{}{}
	for uuid, claims := range holders {
		if len(claims) == 0 {
			continue
		}
		if err := m.runner.Start(ctx, m.Daemon(uuid)); err != nil {
			errs = append(errs, fmt.Errorf("mps: restart control daemon for GPU %s: %w", uuid, err))
		}
		set := map[types.UID]struct{}{}
		for _, c := range claims {
			set[c] = struct{}{}
		}
		m.holders[uuid] = set
	}
	if !stopOrphans {
		return errors.Join(errs...)
	}
	running, err := m.runner.Running(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("mps: list running control daemons: %w", err))
	}
	for _, uuid := range running {
		if _, held := m.holders[uuid]; held {
			continue
		}
		if err := m.runner.Stop(ctx, m.Daemon(uuid)); err != nil {
			errs = append(errs, fmt.Errorf("mps: stop orphaned control daemon for GPU %s: %w", uuid, err))
			continue
		}
		klog.FromContext(ctx).Info("Stopped orphaned MPS control daemon", "gpu", uuid)
	}
	return errors.Join(errs...)
}
