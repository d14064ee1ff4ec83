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
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Container paths of an MPS client.
const (
	// MPSPipeContainerDir is where a client finds its GPU's MPS pipe
	// directory (CUDA_MPS_PIPE_DIRECTORY), mounted read-only.
	MPSPipeContainerDir = "/tmp/nvidia-mps"
	// MPSShmContainerDir is the client's /dev/shm: the MPS server maps its
	// clients' shared memory, so clients and the daemon share one directory.
	MPSShmContainerDir = "/dev/shm"
)

// Daemon is the MPS control daemon of one GPU: which GPU it serves and its
// host directories. Clients get PipeDir (read-only) and ShmDir; LogDir (the
// control daemon's and server's logs) is only ever mounted into the daemon.
type Daemon struct {
	UUID    string
	PipeDir string
	ShmDir  string
	LogDir  string
}

// DaemonRunner starts and stops MPS control daemons. pkg/mpsdaemon runs each
// in a pod of its own, outside the plugin's lifecycle; [FakeRunner] records
// calls for tests.
type DaemonRunner interface {
	// Start returns once the GPU's daemon runs and is ready for clients,
	// starting it if needed. It is idempotent and adopts a daemon that is
	// already running (started by an earlier plugin instance) instead of
	// restarting it. inUse says that clients (prepared claims) may be
	// using a running daemon: it is then kept even if it was started with
	// another configuration, since replacing it would cut them off.
	Start(ctx context.Context, d Daemon, inUse bool) error
	// Stop stops the daemon if it is running (idempotent).
	Stop(ctx context.Context, d Daemon) error
	// Running lists the UUIDs of the GPUs whose daemons exist, so that
	// daemons nobody holds any more (after a crash) can be stopped.
	Running(ctx context.Context) ([]string, error)
}

// MPS keeps one control daemon per GPU running while at least one claim holds
// an MPS share of it: every [MPS.Acquire] makes sure the GPU's daemon runs
// and is ready (starting it for the first holder, and again if it vanished),
// the last [MPS.Release] stops it. Holders are claim UIDs, so acquire and
// release are idempotent per claim; the holder set is not persisted here but
// rebuilt from the plugin's checkpoint with [MPS.Restore] at start. Safe for
// concurrent use.
type MPS struct {
	root   string
	runner DaemonRunner

	// mu serializes all changes, including the runner calls, so that a
	// release stopping a daemon cannot race an acquire starting it.
	mu      sync.Mutex
	holders map[string]map[types.UID]struct{}
	// incomplete is set by Restore when the holders may be incomplete (a
	// checkpoint that could not account for every prepared claim): a
	// daemon of a GPU without known holders may still have clients then,
	// so it is never treated as unused.
	incomplete bool
}

// NewMPS returns the daemon lifecycle with per-GPU directories under root
// (root/<uuid>/pipe, root/<uuid>/shm and root/<uuid>/log, host paths).
func NewMPS(root string, runner DaemonRunner) *MPS {
	return &MPS{root: root, runner: runner, holders: map[string]map[types.UID]struct{}{}}
}

// Daemon returns the daemon of the GPU (it need not be running).
func (m *MPS) Daemon(uuid string) Daemon {
	dir := filepath.Join(m.root, uuid)
	return Daemon{
		UUID:    uuid,
		PipeDir: filepath.Join(dir, "pipe"),
		ShmDir:  filepath.Join(dir, "shm"),
		LogDir:  filepath.Join(dir, "log"),
	}
}

// Acquire records claim as a holder of the GPU's daemon and returns once the
// daemon is ready: the first holder starts it (or adopts a running one),
// later holders make sure it still runs. Acquiring twice is a no-op. If the
// daemon cannot be made ready, the claim is not a holder afterwards.
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
	if err := m.runner.Start(ctx, d, len(set) > 0 || m.incomplete); err != nil {
		return Daemon{}, fmt.Errorf("mps: control daemon for GPU %s: %w", uuid, err)
	}
	if set == nil {
		klog.FromContext(ctx).V(2).Info("MPS control daemon ready", "gpu", uuid, "pipeDir", d.PipeDir)
		set = map[types.UID]struct{}{}
		m.holders[uuid] = set
	}
	set[claim] = struct{}{}
	return d, nil
}

// Release removes claim from the holders of the GPU's daemon and stops the
// daemon when it was the last one. Releasing a non-holder is a no-op. If the
// stop fails, the holder is gone anyway and the error is returned; the
// daemon is stopped again by the next [MPS.Restore] that may stop orphans.
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
// sure the daemon of every held GPU runs (adopting the one a previous plugin
// instance started; its clients are in use, so it is never replaced) and,
// with stopOrphans, stops daemons that nobody holds (only right when holders
// is known to be complete). It returns the joined errors and keeps going
// past each one.
func (m *MPS) Restore(ctx context.Context, holders map[string][]types.UID, stopOrphans bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	m.holders = map[string]map[types.UID]struct{}{}
	m.incomplete = !stopOrphans
	for _, uuid := range slices.Sorted(maps.Keys(holders)) {
		claims := holders[uuid]
		if len(claims) == 0 {
			continue
		}
		if err := m.runner.Start(ctx, m.Daemon(uuid), true); err != nil {
			errs = append(errs, fmt.Errorf("mps: control daemon for GPU %s: %w", uuid, err))
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

// mpsEdits are the edits of an MPS client of share g served by daemon d:
//
//	CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps        the daemon's pipe directory, mounted read-only
//	CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<percent>    the share's compute limit
//	CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M      the share's memory limit, for CUDA device 0
//
// and the daemon's shared-memory directory as the container's /dev/shm. The
// daemon's log directory is never mounted: logs and the server's files stay
// out of clients' reach. Both limits are per client process, not per claim
// (a container with N CUDA processes may pin N times the memory limit, and
// each may use the thread percentage at once), and read from the client's
// own environment (see docs/mps.md for what that means).
func mpsEdits(g GPU, d Daemon) (cdispec.ContainerEdits, error) {
	if d.PipeDir == "" || d.ShmDir == "" {
		return cdispec.ContainerEdits{}, errors.New("isolation MPS: no MPS daemon for the share")
	}
	return cdispec.ContainerEdits{
		Env: []string{
			"CUDA_MPS_PIPE_DIRECTORY=" + MPSPipeContainerDir,
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=" + itoa(g.MemoryLimit>>20) + "M",
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + itoa(g.CoresLimit),
		},
		// connect(2) on a unix socket needs no write access to the mount,
		// so clients reach the daemon through a read-only pipe directory
		// and cannot replace its sockets or pid file.
		Mounts: []*cdispec.Mount{
			bindMount(d.PipeDir, MPSPipeContainerDir, "ro"),
			bindMount(d.ShmDir, MPSShmContainerDir, "rw"),
		},
	}, nil
}
