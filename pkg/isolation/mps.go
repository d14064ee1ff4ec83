package isolation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
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

// DaemonKey names one MPS control daemon: the GPU it serves and the trust
// domain whose clients it serves. Domain is the claim's namespace; "" is the
// one GPU-wide daemon that Tessera releases before per-domain daemons ran
// for every namespace, kept only for claims prepared by such a release (their
// checkpoint records carry no domain) until they are unprepared.
type DaemonKey struct {
	GPU    string
	Domain string
}

// String is "<uuid>" for the GPU-wide daemon and "<uuid>/<domain>" otherwise.
func (k DaemonKey) String() string {
	if k.Domain == "" {
		return k.GPU
	}
	return k.GPU + "/" + k.Domain
}

// Daemon is the MPS control daemon of one (GPU, trust domain): which GPU it
// serves, for which domain, and its host directories. Clients get PipeDir
// (read-only) and ShmDir; LogDir (the control daemon's and server's logs) is
// only ever mounted into the daemon.
type Daemon struct {
	UUID   string
	Domain string
	// Dir holds the daemon's three directories; the plugin removes it when
	// the daemon's last claim goes (the GPU-wide daemon's is kept).
	Dir     string
	PipeDir string
	ShmDir  string
	LogDir  string
	// ServerReserve is the GPU memory, in bytes, that the daemon's MPS
	// server holds for its own CUDA context; every client's pinned-memory
	// limit leaves it out of the share (see mpsEdits).
	ServerReserve int64
}

// Key is the daemon's key.
func (d Daemon) Key() DaemonKey { return DaemonKey{GPU: d.UUID, Domain: d.Domain} }

// DaemonRunner starts and stops MPS control daemons. pkg/mpsdaemon runs each
// in a pod of its own, outside the plugin's lifecycle; [FakeRunner] records
// calls for tests.
type DaemonRunner interface {
	// Start returns once the daemon runs and is ready for clients,
	// starting it if needed. It is idempotent and adopts a daemon that is
	// already running (started by an earlier plugin instance) instead of
	// restarting it. inUse says that clients (prepared claims) may be
	// using a running daemon: it is then kept even if it was started with
	// another configuration, since replacing it would cut them off.
	Start(ctx context.Context, d Daemon, inUse bool) error
	// Stop stops the daemon if it is running (idempotent).
	Stop(ctx context.Context, d Daemon) error
	// Running lists the daemons that exist, so that daemons nobody holds
	// any more (after a crash) can be stopped.
	Running(ctx context.Context) ([]DaemonKey, error)
}

// ShmMounter mounts the size-bounded tmpfs that holds one daemon's shared
// memory (its clients' /dev/shm) and unmounts it again. [HostShm] is the
// real one; with none, each daemon's shared memory is a plain directory.
type ShmMounter interface {
	// Mount makes dir a tmpfs of at most size bytes, nosuid, nodev and
	// noexec, mode 1777. A dir that already is a mount point is kept as it
	// is (a restarted plugin finds its daemons' mounts; their clients use
	// them). It creates dir if needed.
	Mount(dir string, size int64) error
	// Unmount unmounts dir if it is a mount point (idempotent).
	Unmount(dir string) error
}

// MPSOptions configure [NewMPSWith].
type MPSOptions struct {
	// Shm mounts each daemon's shared-memory tmpfs; nil: plain directories
	// (mock nodes, where the plugin may not mount).
	Shm ShmMounter
	// ShmSize bounds each daemon's tmpfs; zero: DefaultMPSShmSize.
	ShmSize int64
	// ServerReserve is the memory an MPS server's own CUDA context holds
	// on the GPU, left out of each client's pinned-memory limit; zero on
	// mock nodes, DefaultMPSServerReserve on real ones.
	ServerReserve int64
}

// DefaultMPSShmSize bounds one daemon's shared memory: all of one trust
// domain's MPS clients on one GPU.
const DefaultMPSShmSize = 1 << 30

// DefaultMPSServerReserve is what an MPS server's CUDA context is assumed to
// hold on the GPU (about 0.5 GiB on an H100; docs/mps.md says where the
// figure comes from and that it was not measured here).
const DefaultMPSServerReserve = 512 << 20

// MPS keeps one control daemon per (GPU, trust domain) running while at
// least one claim of that domain holds an MPS share of the GPU: every
// [MPS.Acquire] makes sure the daemon runs and is ready (starting it for the
// first holder, and again if it vanished), the last [MPS.Release] stops it,
// unmounts its shared memory and removes its directories. Two domains never
// share a daemon, a pipe directory or shared memory. Holders are claim UIDs,
// so acquire and release are idempotent per claim; the holder sets are not
// persisted here but rebuilt from the plugin's checkpoint (which records each
// share's domain) with [MPS.Restore] at start. Safe for concurrent use.
type MPS struct {
	root   string
	runner DaemonRunner
	opts   MPSOptions

	// mu serializes all changes, including the runner calls, so that a
	// release stopping a daemon cannot race an acquire starting it.
	mu      sync.Mutex
	holders map[DaemonKey]map[types.UID]struct{}
	// incomplete is set by Restore when the holders may be incomplete (a
	// checkpoint that could not account for every prepared claim): a
	// daemon without known holders may still have clients then, so it is
	// never treated as unused.
	incomplete bool
}

// NewMPS returns the daemon lifecycle with its directories under root and
// plain directories for shared memory (see [NewMPSWith]).
func NewMPS(root string, runner DaemonRunner) *MPS {
	return NewMPSWith(root, runner, MPSOptions{})
}

// NewMPSWith returns the daemon lifecycle with per-daemon directories under
// root (host paths): root/<uuid>/domains/<domain>/{pipe,shm,log}, and
// root/<uuid>/{pipe,shm,log} for the GPU-wide daemon of earlier releases.
func NewMPSWith(root string, runner DaemonRunner, o MPSOptions) *MPS {
	if o.ShmSize <= 0 {
		o.ShmSize = DefaultMPSShmSize
	}
	return &MPS{root: root, runner: runner, opts: o, holders: map[DaemonKey]map[types.UID]struct{}{}}
}

// domainsDir is the directory of a GPU's per-domain daemons.
const domainsDir = "domains"

// Daemon returns the daemon of the GPU for the trust domain (it need not be
// running).
func (m *MPS) Daemon(uuid, domain string) Daemon {
	dir := filepath.Join(m.root, uuid)
	if domain != "" {
		dir = filepath.Join(dir, domainsDir, domain)
	}
	return Daemon{
		UUID:          uuid,
		Domain:        domain,
		Dir:           dir,
		PipeDir:       filepath.Join(dir, "pipe"),
		ShmDir:        filepath.Join(dir, "shm"),
		LogDir:        filepath.Join(dir, "log"),
		ServerReserve: m.opts.ServerReserve,
	}
}

// ValidateDomain accepts a trust domain that can name a directory and a pod
// annotation: a namespace name (an RFC 1123 label).
func ValidateDomain(domain string) error {
	if domain == "" {
		return errors.New("empty MPS trust domain")
	}
	if errs := validation.IsDNS1123Label(domain); len(errs) > 0 {
		return fmt.Errorf("MPS trust domain %q: %s", domain, strings.Join(errs, "; "))
	}
	return nil
}

// MPSLimits are the limits every client of one MPS control daemon is held
// to: the daemon sets them as its defaults (set_default_device_pinned_mem_limit,
// set_default_active_thread_percentage) before it accepts a client, so that
// every MPS server it starts has them, and a client's own environment can
// only lower them (NVIDIA's MPS documentation: the client's variables
// "further constrain" the control daemon's setting), never lift them. The
// zero value sets none.
type MPSLimits struct {
	// PinnedMemoryMiB is each client's pinned device memory limit, MiB.
	PinnedMemoryMiB int64 `json:"pinnedDeviceMemoryMiB"`
	// ActiveThreadPercentage is each client's share of the GPU's threads.
	ActiveThreadPercentage int64 `json:"activeThreadPercentage"`
}

// IsZero reports whether l sets no limit.
func (l MPSLimits) IsZero() bool { return l == MPSLimits{} }

func (l MPSLimits) String() string {
	return fmt.Sprintf("pinned device memory %d MiB, active threads %d%%", l.PinnedMemoryMiB, l.ActiveThreadPercentage)
}

// MPSLimitsFile is the file in a daemon's log directory that holds its
// MPSLimits (JSON), written by the plugin before the daemon starts and read
// by the daemon (pkg/mpsdaemon) at each start, before it accepts clients.
// The log directory is mounted into the daemon's pod only, never into a
// client.
const MPSLimitsFile = "tessera-limits.json"

// MPSClientLimits are the limits of the MPS clients of share g served by
// daemon d: its memory limit less the server's own context, and its cores.
// The client's variables (mpsEdits) and the daemon's defaults come from here.
func MPSClientLimits(g GPU, d Daemon) (MPSLimits, error) {
	pinned := g.MemoryLimit - d.ServerReserve
	if d.ServerReserve > 0 && pinned < 1<<20 {
		return MPSLimits{}, fmt.Errorf("isolation MPS: the share's memory (%d MiB, capacity memory or sharing.memoryLimit) leaves nothing beside the %d MiB its MPS server's CUDA context holds; request more memory",
			g.MemoryLimit>>20, d.ServerReserve>>20)
	}
	return MPSLimits{PinnedMemoryMiB: pinned >> 20, ActiveThreadPercentage: g.CoresLimit}, nil
}

// readLimits reads a daemon's MPSLimitsFile; ok is false when there is none.
func readLimits(d Daemon) (l MPSLimits, ok bool, err error) {
	data, err := os.ReadFile(filepath.Join(d.LogDir, MPSLimitsFile))
	if errors.Is(err, os.ErrNotExist) {
		return MPSLimits{}, false, nil
	}
	if err != nil {
		return MPSLimits{}, false, err
	}
	if err := json.Unmarshal(data, &l); err != nil {
		return MPSLimits{}, false, fmt.Errorf("%s: %w", filepath.Join(d.LogDir, MPSLimitsFile), err)
	}
	return l, true, nil
}

// writeLimits writes a daemon's MPSLimitsFile atomically, creating its log
// directory.
func writeLimits(d Daemon, l MPSLimits) error {
	if err := os.MkdirAll(d.LogDir, 0o755); err != nil {
		return err
	}
	data, _ := json.Marshal(l) // two numbers always encode
	path := filepath.Join(d.LogDir, MPSLimitsFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ErrMPSLimitsDiffer is AcquireLimited's error for a share whose memory
// limit is not that of the daemon its domain already runs on the GPU.
var ErrMPSLimitsDiffer = errors.New("MPS shares of one namespace on one GPU must have the same memory limit")

// AcquireLimited is [MPS.Acquire] for a share whose clients are held to
// limits: the first holder of a per-domain daemon writes them into the
// daemon's MPSLimitsFile before the daemon starts, so the daemon sets them
// as its defaults before any client connects. A client's own variables can
// only lower the daemon's defaults (NVIDIA's documentation: they "further
// constrain" them).
//
// The control daemon of a (GPU, domain) runs one MPS server at a time (the
// uid of the first client; a client of another uid waits until that
// server's clients are done) and its defaults are per daemon, so every
// client of the domain on the GPU gets the same defaults:
//
//   - memory is the daemon's share's pinned memory limit, and a later share
//     whose memory limit differs is refused (ErrMPSLimitsDiffer, naming
//     both): memory is what one domain could take from the others on the
//     GPU, so no client may lift its own, nor be held to another share's;
//   - the active thread percentage default is 100: a client's variable sets
//     its own share's, and one that lifts it takes threads only from the
//     clients of its own server (its own namespace), never from another
//     domain, whose server runs in time slices of its own. Shares of one
//     namespace with the same memory and different cores therefore join.
//
// A daemon with no limits file (started by a release before it, and kept
// while its clients run) holds none until its next start; the first share
// after the upgrade writes its limits, and later shares are checked against
// them.
func (m *MPS) AcquireLimited(ctx context.Context, uuid, domain string, claim types.UID, limits MPSLimits) (Daemon, error) {
	return m.acquire(ctx, uuid, domain, claim, limits)
}

// Acquire records claim as a holder of the daemon of (uuid, domain) and
// returns once the daemon is ready: the first holder mounts its shared
// memory and starts it (or adopts a running one), later holders make sure it
// still runs. Acquiring twice is a no-op. If the daemon cannot be made
// ready, the claim is not a holder afterwards. New claims always name a
// domain; only [MPS.Restore] brings back the GPU-wide daemon.
func (m *MPS) Acquire(ctx context.Context, uuid, domain string, claim types.UID) (Daemon, error) {
	return m.acquire(ctx, uuid, domain, claim, MPSLimits{})
}

func (m *MPS) acquire(ctx context.Context, uuid, domain string, claim types.UID, limits MPSLimits) (Daemon, error) {
	if uuid == "" || claim == "" {
		return Daemon{}, errors.New("mps: empty GPU uuid or claim uid")
	}
	if err := ValidateDomain(domain); err != nil {
		return Daemon{}, fmt.Errorf("mps: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.Daemon(uuid, domain)
	key := d.Key()
	set := m.holders[key]
	if _, ok := set[claim]; ok {
		return d, nil
	}
	if err := m.mountShm(d); err != nil {
		return Daemon{}, fmt.Errorf("mps: control daemon for GPU %s, domain %s: %w", uuid, domain, err)
	}
	if !limits.IsZero() {
		daemonLimits := MPSLimits{PinnedMemoryMiB: limits.PinnedMemoryMiB, ActiveThreadPercentage: 100}
		if err := m.holdLimits(ctx, d, len(set) > 0 || m.incomplete, daemonLimits); err != nil {
			return Daemon{}, fmt.Errorf("mps: control daemon for GPU %s, domain %s: %w", uuid, domain, err)
		}
	}
	if err := m.runner.Start(ctx, d, len(set) > 0 || m.incomplete); err != nil {
		if len(set) == 0 && !m.incomplete {
			// Nobody uses what the failed start left; the next acquire
			// starts from nothing.
			if cerr := m.cleanup(d); cerr != nil {
				klog.FromContext(ctx).Error(cerr, "Removing the directories of an MPS daemon that did not start failed", "gpu", uuid, "domain", domain)
			}
		}
		return Daemon{}, fmt.Errorf("mps: control daemon for GPU %s, domain %s: %w", uuid, domain, err)
	}
	if set == nil {
		klog.FromContext(ctx).V(2).Info("MPS control daemon ready", "gpu", uuid, "domain", domain, "pipeDir", d.PipeDir)
		set = map[types.UID]struct{}{}
		m.holders[key] = set
	}
	set[claim] = struct{}{}
	return d, nil
}

// holdLimits makes sure the daemon's clients are held to limits. A daemon
// that may be in use (it has holders, or the holders are not all known)
// must already hold its clients to the same limits; one nobody holds gets
// them written before it starts. A daemon without a limits file (started by
// an earlier release, which wrote none) gets this share's: it sets them at
// its next start, and until then the shares beside it are checked against
// them.
func (m *MPS) holdLimits(ctx context.Context, d Daemon, inUse bool, limits MPSLimits) error {
	have, ok, err := readLimits(d)
	if err != nil {
		return fmt.Errorf("read the clients' limits: %w", err)
	}
	if ok && inUse {
		if have.PinnedMemoryMiB != limits.PinnedMemoryMiB {
			return fmt.Errorf("%w: this share's clients would get pinned device memory %d MiB, the daemon of namespace %s on this GPU holds its clients to %d MiB (one MPS server serves them all); "+
				"give the namespace's MPS shares on a GPU the same memory, or wait until the other shares are gone", ErrMPSLimitsDiffer, limits.PinnedMemoryMiB, d.Domain, have.PinnedMemoryMiB)
		}
		return nil
	}
	if !ok && inUse {
		klog.FromContext(ctx).Info("MPS control daemon without client limits (started by an earlier release): they take effect at its next start", "gpu", d.UUID, "domain", d.Domain, "limits", limits.String())
	}
	if err := writeLimits(d, limits); err != nil {
		return fmt.Errorf("write the clients' limits: %w", err)
	}
	return nil
}

// mountShm gives a per-domain daemon its tmpfs before the daemon or any
// client mounts the directory (both bind it, so both see the tmpfs). The
// GPU-wide daemon of earlier releases keeps its plain directory: its
// running daemon and clients already share that one.
func (m *MPS) mountShm(d Daemon) error {
	if d.Domain == "" || m.opts.Shm == nil {
		return nil
	}
	if err := m.opts.Shm.Mount(d.ShmDir, m.opts.ShmSize); err != nil {
		return fmt.Errorf("shared memory %s: %w", d.ShmDir, err)
	}
	return nil
}

// cleanup unmounts a stopped per-domain daemon's shared memory and removes
// its directories, so that a domain's segments never outlive its last claim
// and the next daemon of the domain starts empty.
func (m *MPS) cleanup(d Daemon) error {
	if d.Domain == "" {
		return nil
	}
	if m.opts.Shm != nil {
		if err := m.opts.Shm.Unmount(d.ShmDir); err != nil {
			return fmt.Errorf("unmount %s: %w", d.ShmDir, err)
		}
	}
	if err := os.RemoveAll(d.Dir); err != nil {
		return fmt.Errorf("remove %s: %w", d.Dir, err)
	}
	return nil
}

// Release removes claim from the holders of the daemon of (uuid, domain)
// and, when it was the last one, stops the daemon, unmounts its shared memory
// and removes its directories. Releasing a non-holder is a no-op. If the
// stop fails, the holder is gone anyway and the error is returned; the
// daemon is stopped again by the next [MPS.Restore] that may stop orphans.
func (m *MPS) Release(ctx context.Context, uuid, domain string, claim types.UID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.release(ctx, DaemonKey{GPU: uuid, Domain: domain}, claim)
}

// ReleaseClaim releases claim from every daemon it holds (a claim whose
// checkpoint record is gone).
func (m *MPS) ReleaseClaim(ctx context.Context, claim types.UID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, key := range slices.SortedFunc(maps.Keys(m.holders), compareKeys) {
		if _, ok := m.holders[key][claim]; ok {
			errs = append(errs, m.release(ctx, key, claim))
		}
	}
	return errors.Join(errs...)
}

func (m *MPS) release(ctx context.Context, key DaemonKey, claim types.UID) error {
	set := m.holders[key]
	if _, ok := set[claim]; !ok {
		return nil
	}
	delete(set, claim)
	if len(set) > 0 {
		return nil
	}
	delete(m.holders, key)
	d := m.Daemon(key.GPU, key.Domain)
	if err := m.runner.Stop(ctx, d); err != nil {
		return fmt.Errorf("mps: stop control daemon %s: %w", key, err)
	}
	if err := m.cleanup(d); err != nil {
		return fmt.Errorf("mps: control daemon %s: %w", key, err)
	}
	klog.FromContext(ctx).V(2).Info("Stopped MPS control daemon", "gpu", key.GPU, "domain", key.Domain)
	return nil
}

func compareKeys(a, b DaemonKey) int {
	if c := strings.Compare(a.GPU, b.GPU); c != 0 {
		return c
	}
	return strings.Compare(a.Domain, b.Domain)
}

// Holders returns, per GPU UUID, the claims holding one of its daemons
// (sorted), whatever their domain.
func (m *MPS) Holders() map[string][]types.UID {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]types.UID{}
	for key, set := range m.holders {
		out[key.GPU] = append(out[key.GPU], slices.Collect(maps.Keys(set))...)
	}
	for uuid := range out {
		slices.Sort(out[uuid])
	}
	return out
}

// DaemonHolders returns, per daemon, the claims holding it (sorted).
func (m *MPS) DaemonHolders() map[DaemonKey][]types.UID {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[DaemonKey][]types.UID, len(m.holders))
	for key, set := range m.holders {
		out[key] = slices.Sorted(maps.Keys(set))
	}
	return out
}

// Restore replaces the holder sets with holders (from the checkpoint), makes
// sure every held daemon runs (adopting the one a previous plugin instance
// started; its clients are in use, so it is never replaced) and, with
// stopOrphans, stops the daemons nobody holds and removes the directories of
// per-domain daemons nobody holds (only right when holders is known to be
// complete). It returns the joined errors and keeps going past each one.
func (m *MPS) Restore(ctx context.Context, holders map[DaemonKey][]types.UID, stopOrphans bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	m.holders = map[DaemonKey]map[types.UID]struct{}{}
	m.incomplete = !stopOrphans
	for _, key := range slices.SortedFunc(maps.Keys(holders), compareKeys) {
		claims := holders[key]
		if len(claims) == 0 {
			continue
		}
		d := m.Daemon(key.GPU, key.Domain)
		if err := m.mountShm(d); err != nil {
			errs = append(errs, fmt.Errorf("mps: control daemon %s: %w", key, err))
		} else if err := m.runner.Start(ctx, d, true); err != nil {
			errs = append(errs, fmt.Errorf("mps: control daemon %s: %w", key, err))
		}
		set := map[types.UID]struct{}{}
		for _, c := range claims {
			set[c] = struct{}{}
		}
		m.holders[key] = set
	}
	if !stopOrphans {
		return errors.Join(errs...)
	}
	running, err := m.runner.Running(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("mps: list running control daemons: %w", err))
	}
	// A daemon whose stop failed may still run, with clients that map its
	// shared memory: its directories stay until a later Restore stops it.
	stillRunning := map[DaemonKey]bool{}
	for _, key := range running {
		if _, held := m.holders[key]; held {
			continue
		}
		d := m.Daemon(key.GPU, key.Domain)
		if err := m.runner.Stop(ctx, d); err != nil {
			errs = append(errs, fmt.Errorf("mps: stop orphaned control daemon %s: %w", key, err))
			stillRunning[key] = true
			continue
		}
		klog.FromContext(ctx).Info("Stopped orphaned MPS control daemon", "gpu", key.GPU, "domain", key.Domain)
	}
	if err == nil {
		errs = append(errs, m.removeOrphanDirs(ctx, stillRunning))
	}
	return errors.Join(errs...)
}

// removeOrphanDirs unmounts and removes the directories of per-domain
// daemons that nobody holds: left by a plugin that stopped a daemon and
// crashed before cleaning up after it. Those of daemons in skip (still
// running) are kept.
func (m *MPS) removeOrphanDirs(ctx context.Context, skip map[DaemonKey]bool) error {
	gpus, err := os.ReadDir(m.root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mps: list %s: %w", m.root, err)
	}
	var errs []error
	for _, g := range gpus {
		domains, err := os.ReadDir(filepath.Join(m.root, g.Name(), domainsDir))
		if err != nil {
			continue
		}
		for _, dom := range domains {
			key := DaemonKey{GPU: g.Name(), Domain: dom.Name()}
			if _, held := m.holders[key]; held || skip[key] || ValidateDomain(key.Domain) != nil {
				continue
			}
			if err := m.cleanup(m.Daemon(key.GPU, key.Domain)); err != nil {
				errs = append(errs, fmt.Errorf("mps: orphaned daemon directory %s: %w", key, err))
				continue
			}
			klog.FromContext(ctx).Info("Removed an orphaned MPS daemon's directories", "gpu", key.GPU, "domain", key.Domain)
		}
	}
	return errors.Join(errs...)
}

// mpsEdits are the edits of an MPS client of share g served by daemon d:
//
//	CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps        the daemon's pipe directory, mounted read-only
//	CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<percent>    the share's compute limit
//	CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M      the share's memory limit less the server's context, for CUDA device 0
//
// and the daemon's shared-memory directory as the container's /dev/shm. The
// daemon's log directory is never mounted: logs and the server's files stay
// out of clients' reach. Both limits are per client process, not per claim
// (a container with N CUDA processes may pin N times the memory limit, and
// each may use the thread percentage at once). The daemon holds its
// clients to the same limits as its defaults (MPSLimits, [MPS.AcquireLimited]),
// so a client that unsets or raises the variables gets no more.
//
// Every trust domain on a GPU has its own MPS server, and each server holds a
// CUDA context of its own (d.ServerReserve) outside any client's pinned
// memory. A domain has at most as many servers as it has claims on the GPU,
// so charging each claim one server's context keeps the shares the scheduler
// fitted into the GPU's memory inside it, however the claims fall into
// domains.
func mpsEdits(g GPU, d Daemon) (cdispec.ContainerEdits, error) {
	if d.PipeDir == "" || d.ShmDir == "" {
		return cdispec.ContainerEdits{}, errors.New("isolation MPS: no MPS daemon for the share")
	}
	limits, err := MPSClientLimits(g, d)
	if err != nil {
		return cdispec.ContainerEdits{}, err
	}
	return cdispec.ContainerEdits{
		Env: []string{
			"CUDA_MPS_PIPE_DIRECTORY=" + MPSPipeContainerDir,
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=" + itoa(limits.PinnedMemoryMiB) + "M",
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + itoa(limits.ActiveThreadPercentage),
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
