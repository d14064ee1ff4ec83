package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/metrics"
	"github.com/tessera-dev/tessera/pkg/publish"
)

// Specs is where the plugin writes one CDI spec per claim; [cdi.Dir] is the
// real one.
type Specs interface {
	// Write replaces the claim's spec and returns one CDI device ID per
	// device; record is kept in the spec (the claim's checkpoint entry).
	Write(claimUID types.UID, devices []cdi.Device, record []byte) ([]string, error)
	// Current reports whether the claim's spec is exactly what Write would
	// write now.
	Current(claimUID types.UID, devices []cdi.Device, record []byte) (bool, error)
	// Record returns the record kept in the claim's spec (nil if it has
	// none), or an error wrapping fs.ErrNotExist if there is no spec.
	Record(claimUID types.UID) ([]byte, error)
	// Remove deletes the claim's spec; a missing spec is not an error.
	Remove(claimUID types.UID) error
	// List returns the UIDs of the claims that have a spec.
	List() ([]types.UID, error)
}

// Toolkit finds the NVIDIA container toolkit's CDI device of a GPU;
// [cdi.ToolkitSpecs] is the real one, [cdi.StaticToolkit] a fake.
type Toolkit interface {
	DeviceID(uuid string, index, minor int) (id string, ok bool, err error)
	// CommonEdits are the spec's own edits (the driver's libraries and
	// hooks), which MIG devices copy: the spec has no device for them.
	// ok is false when there is no toolkit spec.
	CommonEdits() (edits cdispec.ContainerEdits, ok bool, err error)
}

// EventRecorder emits events on this node's Node object and on claims.
type EventRecorder interface {
	// Event records an event of type corev1.EventTypeNormal or Warning on
	// the Node.
	Event(eventType, reason, message string)
	// ClaimEvent records an event on a ResourceClaim.
	ClaimEvent(claim *resourceapi.ResourceClaim, eventType, reason, message string)
}

// Options wires the plugin. NodeName, GPUs, Store and Specs are required.
type Options struct {
	// NodeName is this node; it is also the name of the driver's pool.
	NodeName string
	// GPUs is the node's inventory as discovered.
	GPUs []gpu.GPU
	// Store is the checkpoint, Recovery what opening it found.
	Store    checkpoint.Store
	Recovery checkpoint.Recovery
	// Specs is the CDI root for the per-claim specs.
	Specs Specs
	// Mock is true on nodes whose GPUs come from a mock profile: containers
	// get environment only, no device nodes.
	Mock bool
	// Toolkit, when set (and not Mock), provides nvidia.com/gpu=<uuid>
	// devices; GPUs without one get DevNodes' nodes.
	Toolkit Toolkit
	// DevNodes describes the host's /dev/nvidia* nodes (required unless Mock).
	DevNodes isolation.DevNodes
	// MPS runs the MPS control daemons; required for MPS shares.
	MPS *isolation.MPS
	// HAMiCore is the node's HAMi-core installation, if any.
	HAMiCore isolation.HAMiCore
	// DriverMemory is whether (and how) the node can have the driver
	// enforce a share's memory; DriverMemory shares fail without it.
	DriverMemory isolation.DriverMemory
	// LegacyRuntime says the node's container runtime is the NVIDIA runtime
	// in legacy mode, configured to take device requests as volume mounts
	// (accept-nvidia-visible-devices-as-volume-mounts = true): it adds the
	// driver's libraries for a GPU whose device mounts /dev/null at
	// /var/run/nvidia-container-devices/<uuid> (isolation.DeviceEdits).
	// Without it, a real GPU without a device in the NVIDIA container
	// toolkit's CDI spec fails to prepare: its container would get device
	// nodes but no libcuda.
	LegacyRuntime bool
	// ToolkitSpecDirs are where Toolkit looks, for error messages.
	ToolkitSpecDirs []string
	// DefaultIsolation is used for shares whose class and claim configs
	// leave sharing.isolation unset; empty means Advisory.
	DefaultIsolation configapi.Isolation
	// Client writes ResourceClaim status; nil skips status.
	Client kubernetes.Interface
	// Events records events on the Node; nil records none.
	Events EventRecorder
	// Health is the GPUs' health; nil turns health reporting to the kubelet
	// off (WatchHealthStatus returns ErrHealthNotSupported).
	Health *health.Tracker
	// HealthResend is how often WatchHealthStatus re-sends an unchanged
	// report; zero means DefaultHealthResend.
	HealthResend time.Duration
	// Processes counts the compute processes on a GPU (by UUID); a stale
	// claim is released only while none run on its GPUs (besides its pods'
	// cgroups being gone, see PodCgroupRoot). nil: no GPU processes can be
	// seen (mock nodes), so none are assumed.
	Processes func(uuid string) (int, error)
	// PodCgroupRoot is where the host's cgroup filesystem is mounted in the
	// plugin (read-only is enough): a stale claim, one in the way of a
	// prepare that the API server no longer has, is released only when no
	// cgroup of its pods remains under it. Empty: no stale claim is
	// released; the kubelet unprepares it.
	PodCgroupRoot string
	// Metrics records prepare/unprepare latency and errors; nil records none.
	Metrics *metrics.Metrics
	// MIG creates, reads and destroys MIG instances (mig.NVML); nil: no
	// dynamic MIG device can be prepared, static ones are taken from GPUs.
	MIG MIGInstances
	// DynamicMIG names the GPUs published with dynamic MIG (--dynamic-mig).
	DynamicMIG publish.DynamicMIG
}

// Plugin implements kubeletplugin.DRAPlugin for gpu.tessera.dev.
type Plugin struct {
	opts Options

	gpusMu sync.RWMutex
	gpus   map[int]gpu.GPU // by minor; replaced by SetGPUs

	// claimLocks serialize work on one claim: one mutex per claim UID in
	// use, so that prepares of different claims never wait for each other
	// here (a striped lock made unrelated claims queue behind one another).
	claimLocks claimLocks

	// grants is the double-grant index, guarded by its own mutex.
	grants grants

	// admission serializes the lending admission of prepares with the
	// recording of their claims (admitAndStart). Lock order: a claim's
	// lock, then admission, then the grants', lender's and checkpoint's
	// own mutexes; nothing that waits on I/O beyond the checkpoint write
	// runs under it.
	admission sync.Mutex
	// admitted, when set (tests), is called under admission once a
	// claim is admitted, before it is recorded.
	admitted func(types.UID)

	// complete is set at start when every CDI spec on disk is accounted for
	// in the checkpoint, so that orphaned MPS daemons may be stopped.
	complete bool

	// facts are the allocations and pods of prepared claims, for metrics.
	facts facts

	// lender admits borrowers; nil while lending is off (NewLender sets it).
	lenderMu sync.Mutex
	lender   lenderGate

	// migChange runs after a MIG instance was created or destroyed
	// (OnMIGChange).
	migChangeMu sync.Mutex
	migChange   func()
	// migReported are what MIG events were emitted for already, so each is
	// emitted once: foreign instances (by GPU, instance ID, profile,
	// placement and MIG UUIDs) and pods whose claims mix MIG-only claims
	// with others (by pod and claim UID).
	migReportedMu sync.Mutex
	migReported   map[string]bool
	// failpoint is envFailpoint; tests replace it.
	failpoint func(ctx context.Context, name string)
}

var _ kubeletplugin.DRAPlugin = (*Plugin)(nil)

// Open is how a plugin process starts: holding the node lock at lockPath
// (the kubelet plugin helper's serialize.lock, which it takes around every
// prepare and unprepare call), it opens the checkpoint at checkpointPath,
// fills in opts.Store and opts.Recovery and calls [New]. So the other
// instance of a surge update is never inside a call while this one reads,
// upgrades or repairs the checkpoint and cleans up after it. An empty
// lockPath takes no lock (a single instance per node).
func Open(ctx context.Context, lockPath, checkpointPath, bootID string, opts Options) (*Plugin, error) {
	unlock, err := lockNode(ctx, lockPath)
	if err != nil {
		return nil, fmt.Errorf("plugin: %w", err)
	}
	defer unlock()
	store, recovery, err := checkpoint.Open(ctx, checkpointPath, bootID)
	if err != nil {
		return nil, err
	}
	opts.Store, opts.Recovery = store, recovery
	return New(ctx, opts)
}

// New checks opts, recovers from what the checkpoint says (see the package
// documentation) and returns the plugin. Recovery problems are logged and
// reported as events but do not fail New; only missing options do. Recovery
// changes the node's state: call New under the node lock ([Open] does).
func New(ctx context.Context, opts Options) (*Plugin, error) {
	switch {
	case opts.NodeName == "":
		return nil, errors.New("plugin: node name is required")
	case opts.Store == nil:
		return nil, errors.New("plugin: checkpoint store is required")
	case opts.Specs == nil:
		return nil, errors.New("plugin: CDI spec directory is required")
	case !opts.Mock && opts.DevNodes == nil:
		return nil, errors.New("plugin: device nodes are required on real GPUs")
	}
	if opts.DefaultIsolation != "" && !slices.Contains(configapi.SupportedIsolations, opts.DefaultIsolation) {
		return nil, fmt.Errorf("plugin: unknown default isolation %q (want %s)", opts.DefaultIsolation,
			configapi.FormatIsolations(configapi.SupportedIsolations))
	}
	p := &Plugin{opts: opts, grants: newGrants(), failpoint: envFailpoint}
	p.SetGPUs(opts.GPUs)
	p.recover(ctx)
	return p, nil
}

// SetGPUs replaces the inventory that prepare checks devices against (after a
// rediscovery). Claims prepared before keep working: unprepare needs only the
// checkpoint.
func (p *Plugin) SetGPUs(gpus []gpu.GPU) {
	m := make(map[int]gpu.GPU, len(gpus))
	for _, g := range gpus {
		m[g.Minor] = g
	}
	p.gpusMu.Lock()
	defer p.gpusMu.Unlock()
	p.gpus = m
}

func (p *Plugin) gpuByMinor(minor int) (gpu.GPU, bool) {
	p.gpusMu.RLock()
	defer p.gpusMu.RUnlock()
	g, ok := p.gpus[minor]
	return g, ok
}

func (p *Plugin) lockClaim(uid types.UID) func() { return p.claimLocks.lock(uid) }

// claimLocks is a mutex per key, created on first use and dropped when its
// last holder or waiter is done. The zero value is ready.
type claimLocks struct {
	mu    sync.Mutex
	locks map[types.UID]*claimLock
}

type claimLock struct {
	sync.Mutex
	users int // holders and waiters; guarded by claimLocks.mu
}

// lock locks uid's mutex and returns its unlock.
func (l *claimLocks) lock(uid types.UID) func() {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[types.UID]*claimLock{}
	}
	m := l.locks[uid]
	if m == nil {
		m = &claimLock{}
		l.locks[uid] = m
	}
	m.users++
	l.mu.Unlock()
	m.Lock()
	return func() {
		m.Unlock()
		l.mu.Lock()
		if m.users--; m.users == 0 {
			delete(l.locks, uid)
		}
		l.mu.Unlock()
	}
}

// HandleError implements kubeletplugin.DRAPlugin: background errors (such as
// ResourceSlice publishing) are logged; all of them are recoverable for us,
// since publishing is retried by the helper's controller.
func (p *Plugin) HandleError(ctx context.Context, err error, msg string) {
	runtime.HandleErrorWithContext(ctx, err, msg)
}
