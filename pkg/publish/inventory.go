package publish

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/metrics"
	"github.com/tessera-dev/tessera/pkg/model"
)

// Publisher publishes the node's ResourceSlices; kubeletplugin.Helper is the
// real one.
type Publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// EventRecorder records events on this node's Node object (the plugin's
// EventRecorder is one).
type EventRecorder interface {
	// Event records an event of type corev1.EventTypeNormal or Warning on
	// the Node.
	Event(eventType, reason, message string)
}

// DiscoveryFailedTaint is the device taint on both devices of a GPU that
// failed discovery but is published all the same (see Inventory). It has the
// health tracker's key, so that one toleration of gpu.tessera.dev/unhealthy
// (a diagnostic pod's) covers every GPU Tessera considers broken; the value
// tells the cause apart from the XIDs. NoSchedule: the GPU may still work
// for the pods already using it, but nothing new is allocated on it.
var DiscoveryFailedTaint = resourceapi.DeviceTaint{
	Key: health.TaintKey, Value: "DiscoveryFailed", Effect: resourceapi.DeviceTaintEffectNoSchedule,
}

// NVMLDiscovery returns an Inventory.DiscoverNode over lib (gpu.DiscoverNode).
// When NVML could not be opened (lib nil; openErr says why, e.g. the
// library is missing) every discovery fails with openErr: the node runs
// without GPUs, and its status and events say why.
func NVMLDiscovery(lib nvml.Interface, openErr error) func() (gpu.Discovery, error) {
	if lib == nil {
		if openErr == nil {
			openErr = fmt.Errorf("no NVML library")
		}
		return func() (gpu.Discovery, error) { return gpu.Discovery{}, openErr }
	}
	return func() (gpu.Discovery, error) { return gpu.DiscoverNode(lib) }
}

// Inventory keeps the published ResourceSlices in line with the GPUs
// discovery finds and their health: [Inventory.Sync] publishes only when the
// inventory or the taints changed since the last successful publish,
// [Inventory.Run] syncs periodically and whenever [Inventory.Trigger] is
// called (the health tracker does on every change). Sync and Run are safe
// for concurrent use.
//
// A node whose GPUs cannot all be discovered keeps working (see Sync): the
// GPUs that were described are published, a GPU that failed is reported
// (Node event, [Inventory.Status], the discovery metrics) and, when it can be
// described, published tainted [DiscoveryFailedTaint]; a node without GPUs,
// or without usable NVML, publishes nothing (with NVML and no GPUs: an empty
// pool). The plugin keeps running
// in every case, so that claims prepared earlier can be unprepared.
type Inventory struct {
	NodeName string
	// DiscoverNode lists the GPUs it could describe and those it could not
	// (gpu.DiscoverNode; NVMLDiscovery makes one). Its error is a failure of
	// the whole discovery (NVML unavailable, no GPU count).
	DiscoverNode func() (gpu.Discovery, error)
	Publisher    Publisher
	// OnChange, when set, gets every newly published inventory (the plugin's
	// SetGPUs): the described GPUs and the failed ones published tainted.
	OnChange func([]gpu.GPU)
	// Taints, when set, returns the device taints by GPU UUID (the health
	// tracker's Taints); they go on both devices of the GPU.
	Taints func() map[string][]resourceapi.DeviceTaint
	// NodeTaints, when set, returns taints that every GPU of the node gets
	// on all of its devices (UnclaimedAccess.Taints); it is called before
	// each publication, with Taints.
	NodeTaints func(context.Context) []resourceapi.DeviceTaint
	// DeviceTaints, when set, returns taints by device name for the GPUs
	// being published, whose dynamic-MIG ones dynamic names (the health
	// tracker's MIGTaints: XIDs that name one MIG device); they are added
	// to those devices only (health.TaintDevices). It is called after
	// Taints, which re-reads the tracker's state.
	DeviceTaints func(gpus []gpu.GPU, dynamic func(gpu.GPU) bool) map[string][]resourceapi.DeviceTaint
	// Lending, when set, returns what each GPU's lending device publishes
	// (the Lender's Lent); with it every GPU also publishes gpu-N-lent.
	Lending func() map[string]model.Lent
	// Model are more options for model.Resources (model.WithPCIeRoots).
	Model []model.Option
	// DynamicMIG names the GPUs published with dynamic MIG while they are
	// in MIG mode (model.WithDynamicMIG); a named GPU not in MIG mode, and
	// a name that is no GPU of the node, get a Warning event
	// DynamicMIGNotApplied.
	DynamicMIG DynamicMIG
	// MIGHeld, when set, returns the MIG instances (profile and placement)
	// prepared claims hold (the plugin's MIGHeld), for model.WithMIGHeld:
	// every other instance of a dynamic-MIG GPU is foreign, its slices
	// published as taken; a static instance no claim holds that runs
	// processes is tainted model.MIGInUseTaintKey. It is read after
	// discovery, so that an instance discovery saw is never missed
	// (prepare records it before creating it).
	MIGHeld func() map[string][]model.MIGHold
	// ComputeModes says which compute mode each GPU is expected in (the
	// zero value: Default); a GPU in another is published tainted (see
	// gpu.Conditions, which also decides the MIG, NVLink and fabric
	// conditions reported here).
	ComputeModes gpu.ComputeModePolicy
	// Events, when set, gets Node events about discovery, each when its
	// message changes: Warning GPUDiscoveryFailed (a GPU failed; says whether
	// it is published tainted) and Normal GPUDiscoveryRecovered (it is
	// described again); Warning NoGPUs (nothing to publish: no usable NVML,
	// or NVML reports no GPU), Warning GPUDiscoveryError (discovery failed as
	// a whole; the earlier publication stays) and Normal GPUsDiscovered (GPUs
	// are published again after either). Every gpu.Condition of a
	// described GPU gets a Warning GPU<reason> (GPUMIGEnabled,
	// GPUNVLinkUnknown, GPUFabricNotReady, GPUComputeMode) and, once it no
	// longer holds, a Normal GPUConditionCleared.
	Events EventRecorder

	mu        sync.Mutex
	published []gpu.GPU
	taints    map[string][]resourceapi.DeviceTaint
	lent      map[string]model.Lent
	dynamic   []string
	held      map[string][]model.MIGHold
	devTaints map[string][]resourceapi.DeviceTaint
	synced    bool
	// known are the last full descriptions of the GPUs by UUID, and uuids
	// their UUIDs by NVML index (stable while NVML stays initialised), so
	// that a GPU described before keeps its facts when it fails.
	known map[string]gpu.GPU
	uuids map[int]string
	// failed are the GPUs that failed the latest successful discovery.
	failed []failedGPU
	// conditions are gpu.Conditions of the GPUs the latest successful
	// discovery described.
	conditions []gpu.Condition
	// reported is the last event message by key ("" node, "gpu-<index>").
	reported map[string]string

	statusMu sync.Mutex
	status   discoveryStatus

	trigger chan struct{}
	once    sync.Once
}

// failedGPU is a GPU that failed discovery and what became of it.
type failedGPU struct {
	gpu.Failure
	// published is set when it is published tainted, with these facts.
	published bool
	facts     gpu.GPU
}

// discoveryStatus is what Status and DiscoverySnapshot report.
type discoveryStatus struct {
	ran       bool // a discovery was made
	synced    bool
	err       error // of the whole discovery, latest sync
	described int   // GPUs the latest successful discovery described
	published int
	mig       int // of published, those in MIG mode
	failed    []failedGPU
	// conditions as in Inventory.conditions.
	conditions []gpu.Condition
	errors     uint64
}

// Sync discovers and, if anything changed (or nothing was published yet),
// publishes model.Resources of the GPUs with their taints. changed says
// whether it published.
//
//   - GPUs that fail discovery do not fail Sync. One that was fully
//     described before (by this process) keeps those facts; one whose UUID,
//     minor number and memory size could be read is published with what
//     was read; either is tainted DiscoveryFailedTaint on both devices (and
//     keeps its health taints) and is in no NVLink domain. One that cannot
//     be described is not published at all: its devices would have no
//     name, UUID or capacity to publish. The taint goes as soon as the GPU
//     is described again.
//   - When discovery fails as a whole (no usable NVML, no GPU count), the
//     last published GPUs are republished if their taints changed (a GPU
//     that fell off the bus can make discovery fail, and its taint must
//     still go out); before the first publication nothing is published, so
//     that an instance that cannot see the GPUs (a wrong driver root in a
//     rolling update) never replaces the node's slices with an empty pool.
//     The error is returned.
//   - On any other error (model, publishing) the previous publication stays.
//
// Either way the next Sync tries again.
func (i *Inventory) Sync(ctx context.Context) (changed bool, err error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	var healthTaints map[string][]resourceapi.DeviceTaint
	if i.Taints != nil {
		healthTaints = i.Taints()
	}
	var nodeTaints []resourceapi.DeviceTaint
	if i.NodeTaints != nil {
		nodeTaints = i.NodeTaints(ctx)
	}
	d, discoverErr := i.discover()
	var gpus []gpu.GPU
	if discoverErr != nil {
		discoverErr = fmt.Errorf("%w: %w", ErrDiscovery, discoverErr)
		if !i.synced {
			// Nothing to publish is not "no devices": a misconfigured
			// instance (a wrong driver root in a rolling update) must not
			// replace the slices another instance published with an empty
			// pool. On a node without GPUs there are none to replace.
			i.report(ctx, d, discoverErr, 0)
			return false, discoverErr
		}
		gpus = i.published
	} else {
		gpus, i.failed = i.withFailed(d)
		i.conditions = gpu.Conditions(d.GPUs, i.ComputeModes)
	}
	taints := withNodeTaints(withConditionTaints(withDiscoveryTaints(healthTaints, i.failed), i.conditions), gpus, nodeTaints)
	i.report(ctx, d, discoverErr, countPublished(gpus))
	opts := append(slices.Clone(i.Model), model.WithTaints(taints))
	var lent map[string]model.Lent
	if i.Lending != nil {
		lent = i.Lending()
		opts = append(opts, model.WithLending(lent))
	}
	dynamic := i.dynamicMIG(ctx, gpus, discoverErr == nil)
	var held map[string][]model.MIGHold
	if i.MIGHeld != nil {
		held = i.MIGHeld()
	}
	opts = append(opts, model.WithDynamicMIG(dynamic...), model.WithMIGHeld(held))
	var devTaints map[string][]resourceapi.DeviceTaint
	if i.DeviceTaints != nil {
		devTaints = i.DeviceTaints(gpus, func(g gpu.GPU) bool { return slices.Contains(dynamic, g.UUID) })
		if len(devTaints) == 0 {
			devTaints = nil
		}
	}
	if i.synced && reflect.DeepEqual(gpus, i.published) && reflect.DeepEqual(taints, i.taints) && reflect.DeepEqual(lent, i.lent) &&
		slices.Equal(dynamic, i.dynamic) && reflect.DeepEqual(held, i.held) && reflect.DeepEqual(devTaints, i.devTaints) {
		return false, discoverErr
	}
	resources, err := model.Resources(i.NodeName, gpus, opts...)
	if err != nil {
		return false, fmt.Errorf("model of %d GPUs: %w", len(gpus), err)
	}
	health.TaintDevices(&resources, devTaints)
	if err := i.Publisher.PublishResources(ctx, resources); err != nil {
		return false, fmt.Errorf("publish ResourceSlices: %w", err)
	}
	klog.FromContext(ctx).Info("Published GPU inventory", "gpus", len(gpus), "tainted", len(taints), "failedDiscovery", len(i.failed), "first", !i.synced)
	gpusChanged := !i.synced || !reflect.DeepEqual(gpus, i.published)
	if gpusChanged {
		for _, g := range gpus {
			if g.MemoryReservedUnknown != "" {
				klog.FromContext(ctx).Info("GPU published with NVML's total memory, driver-reserved memory included: its shares can add up to more than processes can allocate",
					"gpu", g.UUID, "reason", g.MemoryReservedUnknown)
			}
		}
	}
	i.published, i.taints, i.lent, i.dynamic, i.held, i.devTaints, i.synced = gpus, taints, lent, dynamic, held, devTaints, true
	i.statusMu.Lock()
	i.status.synced, i.status.published = true, countPublished(gpus)
	i.status.mig = countMIG(gpus)
	i.statusMu.Unlock()
	if gpusChanged && i.OnChange != nil {
		i.OnChange(gpus)
	}
	return true, discoverErr
}

// ErrDiscovery wraps the errors of a discovery that failed as a whole; Sync
// returns them after publishing what it could (or, before the first
// publication, nothing).
var ErrDiscovery = errors.New("discover GPUs")

// Synced reports whether a Sync has published.
func (i *Inventory) Synced() bool {
	i.statusMu.Lock()
	defer i.statusMu.Unlock()
	return i.status.synced
}

func (i *Inventory) discover() (gpu.Discovery, error) {
	if i.DiscoverNode == nil {
		return gpu.Discovery{}, fmt.Errorf("no discovery configured")
	}
	return i.DiscoverNode()
}

// withFailed returns the GPUs to publish, sorted by minor (nil for none),
// and what became of each failed one; it remembers the described GPUs.
func (i *Inventory) withFailed(d gpu.Discovery) ([]gpu.GPU, []failedGPU) {
	if i.known == nil {
		i.known, i.uuids = map[string]gpu.GPU{}, map[int]string{}
	}
	minors, uuids := map[int]bool{}, map[string]bool{}
	gpus := make([]gpu.GPU, 0, len(d.GPUs)+len(d.Failed))
	for _, g := range d.GPUs {
		i.known[g.UUID], i.uuids[g.Index] = g, g.UUID
		minors[g.Minor], uuids[g.UUID] = true, true
		gpus = append(gpus, g)
	}
	var failed []failedGPU
	for _, f := range d.Failed {
		fg := failedGPU{Failure: f}
		uuid := f.UUID
		if uuid == "" {
			uuid = i.uuids[f.Index]
		}
		facts, ok := i.known[uuid]
		if !ok && f.Partial != nil {
			facts, ok = *f.Partial, true
		}
		// Published only if it is not confused with a described GPU.
		if ok && !minors[facts.Minor] && !uuids[facts.UUID] {
			facts.NVLinkDomain = ""
			fg.published, fg.facts = true, facts
			minors[facts.Minor], uuids[facts.UUID] = true, true
			gpus = append(gpus, facts)
		}
		failed = append(failed, fg)
	}
	if len(gpus) == 0 {
		return nil, failed
	}
	slices.SortFunc(gpus, func(a, b gpu.GPU) int { return cmp.Compare(a.Minor, b.Minor) })
	return gpus, failed
}

// withDiscoveryTaints adds DiscoveryFailedTaint to the health taints of the
// failed GPUs that are published; nil when there is no taint at all.
func withDiscoveryTaints(healthTaints map[string][]resourceapi.DeviceTaint, failed []failedGPU) map[string][]resourceapi.DeviceTaint {
	out := maps.Clone(healthTaints)
	for _, f := range failed {
		if !f.published {
			continue
		}
		if out == nil {
			out = map[string][]resourceapi.DeviceTaint{}
		}
		out[f.facts.UUID] = append(slices.Clone(out[f.facts.UUID]), DiscoveryFailedTaint)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// countPublished is how many of gpus model.Resources publishes: all of
// them, those in MIG mode as MIG devices.
func countPublished(gpus []gpu.GPU) int { return len(gpus) }

// countMIG is how many of gpus are published as MIG devices.
func countMIG(gpus []gpu.GPU) int {
	n := 0
	for _, g := range gpus {
		if g.MIGEnabled {
			n++
		}
	}
	return n
}

// dynamicMIG resolves DynamicMIG against the GPUs to publish and, after a
// successful discovery (report), emits a Warning DynamicMIGNotApplied for
// each named GPU not in MIG mode and each name that is no GPU, once per
// message.
func (i *Inventory) dynamicMIG(ctx context.Context, gpus []gpu.GPU, report bool) []string {
	dynamic, notMIG, unknown := i.DynamicMIG.Resolve(gpus)
	if !report {
		return dynamic
	}
	if i.reported == nil {
		i.reported = map[string]string{}
	}
	var msgs []string
	for _, g := range notMIG {
		msgs = append(msgs, fmt.Sprintf("GPU index %d (%s) is named for dynamic MIG (--dynamic-mig) but is not in MIG mode: it is published whole and in shares. "+
			"To hand it out in MIG slices, enable MIG mode while it is idle (nvidia-smi -i %d -mig 1, then a GPU reset if nvidia-smi asks for one).", g.Index, g.UUID, g.Index))
	}
	for _, n := range unknown {
		msgs = append(msgs, fmt.Sprintf("--dynamic-mig names GPU %q, which NVML does not report on this node.", n))
	}
	msg := strings.Join(msgs, " ")
	if i.reported["dynamic-mig"] != msg {
		if msg != "" {
			klog.FromContext(ctx).Info("Dynamic MIG not applied to some GPUs", "message", msg)
			if i.Events != nil {
				i.Events.Event(corev1.EventTypeWarning, "DynamicMIGNotApplied", msg)
			}
		}
		i.reported["dynamic-mig"] = msg
	}
	return dynamic
}

// withConditionTaints adds the taint of every condition that has one
// (health.TaintKey=<condition's taint>:NoSchedule) to taints; nil when there
// is no taint at all.
func withConditionTaints(taints map[string][]resourceapi.DeviceTaint, conds []gpu.Condition) map[string][]resourceapi.DeviceTaint {
	for _, c := range conds {
		if c.Taint == "" {
			continue
		}
		if taints == nil {
			taints = map[string][]resourceapi.DeviceTaint{}
		}
		taints[c.UUID] = append(slices.Clone(taints[c.UUID]), conditionTaint(c))
	}
	return taints
}

// withNodeTaints adds nodeTaints to the taints of every GPU of gpus.
func withNodeTaints(taints map[string][]resourceapi.DeviceTaint, gpus []gpu.GPU, nodeTaints []resourceapi.DeviceTaint) map[string][]resourceapi.DeviceTaint {
	if len(nodeTaints) == 0 {
		return taints
	}
	out := maps.Clone(taints)
	if out == nil {
		out = map[string][]resourceapi.DeviceTaint{}
	}
	for _, g := range gpus {
		out[g.UUID] = append(slices.Clone(out[g.UUID]), nodeTaints...)
	}
	return out
}

// conditionTaint is the device taint of a condition: NoSchedule, like
// DiscoveryFailedTaint, since the pods already on the GPU may still work.
func conditionTaint(c gpu.Condition) resourceapi.DeviceTaint {
	return resourceapi.DeviceTaint{Key: health.TaintKey, Value: c.Taint, Effect: resourceapi.DeviceTaintEffectNoSchedule}
}

// report updates the status and emits the events and logs of one discovery.
func (i *Inventory) report(ctx context.Context, d gpu.Discovery, discoverErr error, publishing int) {
	logger := klog.FromContext(ctx)
	i.statusMu.Lock()
	i.status.ran, i.status.err = true, discoverErr
	if discoverErr == nil {
		i.status.described = len(d.GPUs)
		i.status.failed = slices.Clone(i.failed)
		i.status.conditions = slices.Clone(i.conditions)
	}
	if discoverErr != nil || len(d.Failed) > 0 {
		i.status.errors++
	}
	i.statusMu.Unlock()

	if i.reported == nil {
		i.reported = map[string]string{}
	}
	emit := func(key, eventType, reason, message string) {
		if i.reported[key] == reason+message {
			return
		}
		i.reported[key] = reason + message
		if i.Events != nil {
			i.Events.Event(eventType, reason, message)
		}
	}

	const unprepare = "Claims prepared earlier can still be unprepared."
	switch {
	case discoverErr != nil && publishing == 0:
		msg := fmt.Sprintf("No GPU is published: %v. %s", discoverErr, unprepare)
		if i.reported[""] != "NoGPUs"+msg {
			logger.Error(discoverErr, "No GPU is published; the plugin keeps running so that claims prepared earlier can be unprepared")
		}
		emit("", corev1.EventTypeWarning, "NoGPUs", msg)
	case discoverErr != nil:
		msg := fmt.Sprintf("GPU discovery failed: %v. The %d GPUs published before stay published.", discoverErr, publishing)
		emit("", corev1.EventTypeWarning, "GPUDiscoveryError", msg)
	case publishing == 0 && len(d.Failed) == 0 && len(d.GPUs) == 0:
		msg := "NVML reports no GPU on this node: no GPU is published. " + unprepare
		if i.reported[""] != "NoGPUs"+msg {
			logger.Info("NVML reports no GPU on this node; publishing none")
		}
		emit("", corev1.EventTypeWarning, "NoGPUs", msg)
	default:
		// Only after NoGPUs or GPUDiscoveryError: a node that was fine all
		// along gets no event.
		if r := i.reported[""]; r != "" && !strings.HasPrefix(r, "GPUsDiscovered") {
			emit("", corev1.EventTypeNormal, "GPUsDiscovered", fmt.Sprintf("GPU discovery works again: %d GPUs published.", publishing))
		}
	}
	if discoverErr != nil {
		return // which GPUs fail is not known now
	}

	failing := map[string]bool{}
	for _, f := range i.failed {
		key := fmt.Sprintf("gpu-%d", f.Index)
		failing[key] = true
		msg := f.Error() + "; " + f.outcome()
		if i.reported[key] != "GPUDiscoveryFailed"+msg {
			logger.Error(f.Err, "GPU failed discovery", "index", f.Index, "uuid", f.UUID, "published", f.published)
		}
		emit(key, corev1.EventTypeWarning, "GPUDiscoveryFailed", msg)
	}
	holding := map[string]bool{}
	for _, c := range i.conditions {
		key := "condition/" + c.UUID + "/" + string(c.Reason)
		holding[key] = true
		reason := "GPU" + string(c.Reason)
		if i.reported[key] != reason+c.Message {
			logger.Info("GPU condition", "index", c.Index, "uuid", c.UUID, "reason", c.Reason, "published", c.Published, "taint", c.Taint, "message", c.Message)
		}
		emit(key, corev1.EventTypeWarning, reason, c.Message)
	}
	for _, key := range slices.Sorted(maps.Keys(i.reported)) {
		rest, ok := strings.CutPrefix(key, "condition/")
		if !ok || holding[key] {
			continue
		}
		delete(i.reported, key)
		uuid, reason, _ := strings.Cut(rest, "/")
		logger.Info("GPU condition cleared", "uuid", uuid, "reason", reason)
		if i.Events != nil {
			i.Events.Event(corev1.EventTypeNormal, "GPUConditionCleared", fmt.Sprintf("GPU %s: %s no longer holds.", uuid, reason))
		}
	}
	for _, key := range slices.Sorted(maps.Keys(i.reported)) {
		if key == "" || key == "dynamic-mig" || failing[key] || strings.HasPrefix(key, "condition/") {
			continue
		}
		delete(i.reported, key)
		msg := fmt.Sprintf("GPU index %s is discovered again.", strings.TrimPrefix(key, "gpu-"))
		logger.Info("GPU discovered again", "index", strings.TrimPrefix(key, "gpu-"))
		if i.Events != nil {
			i.Events.Event(corev1.EventTypeNormal, "GPUDiscoveryRecovered", msg)
		}
	}
}

// outcome says what became of a failed GPU, for events and the status.
func (f failedGPU) outcome() string {
	if f.published {
		t := DiscoveryFailedTaint
		return fmt.Sprintf("published as %s with taint %s=%s:%s", model.WholeDeviceName(f.facts.Minor), t.Key, t.Value, t.Effect)
	}
	return "not published (its UUID, minor number or memory size could not be read)"
}

// Status is a one-line summary of the latest discovery for /healthz:
// "ok: 8 GPUs published", "ok: 7 GPUs published; GPU index 3 (…) failed
// discovery: …", "ok: no GPUs: <why>", or "starting: …" before the first
// publication.
func (i *Inventory) Status() string {
	i.statusMu.Lock()
	defer i.statusMu.Unlock()
	s := i.status
	if !s.synced {
		if errors.Is(s.err, gpu.ErrUnavailable) || errors.Is(s.err, gpu.ErrLibraryNotFound) {
			return "ok: no GPUs: " + s.err.Error() + " (nothing published)"
		}
		if s.err != nil {
			return "starting: GPU inventory not published yet: " + s.err.Error()
		}
		return "starting: GPU inventory not published yet"
	}
	var b strings.Builder
	switch {
	case s.published == 0 && s.err != nil:
		fmt.Fprintf(&b, "ok: no GPUs: %v", s.err)
	case s.published == 0 && len(s.failed) == 0 && s.described == 0:
		b.WriteString("ok: no GPUs: NVML reports none on this node")
	case s.err != nil:
		fmt.Fprintf(&b, "ok: %d GPUs published (from an earlier discovery; the latest failed: %v)", s.published, s.err)
	default:
		fmt.Fprintf(&b, "ok: %d GPUs published", s.published)
	}
	if s.mig > 0 {
		fmt.Fprintf(&b, " (%d as MIG devices)", s.mig)
	}
	for _, f := range s.failed {
		fmt.Fprintf(&b, "; %v, %s", f.Failure, f.outcome())
	}
	for _, c := range s.conditions {
		fmt.Fprintf(&b, "; GPU index %d (%s): %s", c.Index, c.UUID, c.Reason)
		switch {
		case !c.Published:
			b.WriteString(", not published")
		case c.Taint != "":
			t := conditionTaint(c)
			fmt.Fprintf(&b, ", published with taint %s=%s:%s", t.Key, t.Value, t.Effect)
		}
	}
	return b.String()
}

// HealthzHandler serves Status for the liveness probe. It always answers
// 200 while the plugin runs: a node without GPUs or with a broken GPU is
// reported, not restarted, since a restart fixes neither and the plugin
// must stay up to unprepare claims (and a failing readiness would stall
// surge rolling updates on such nodes).
func (i *Inventory) HealthzHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintln(w, i.Status())
	})
}

// DiscoverySnapshot implements metrics.DiscoverySource.
func (i *Inventory) DiscoverySnapshot() metrics.Discovery {
	i.statusMu.Lock()
	defer i.statusMu.Unlock()
	s := i.status
	out := metrics.Discovery{Up: s.ran && s.err == nil, GPUs: s.described, Errors: s.errors}
	for _, f := range s.failed {
		uuid := f.UUID
		if f.published {
			uuid = f.facts.UUID
		}
		out.Failed = append(out.Failed, metrics.FailedGPU{Index: f.Index, UUID: uuid, Published: f.published})
	}
	for _, c := range s.conditions {
		out.Conditions = append(out.Conditions, metrics.GPUCondition{Index: c.Index, UUID: c.UUID, Reason: string(c.Reason), Published: c.Published, Taint: c.Taint})
	}
	return out
}

// Trigger asks Run for a Sync soon; calls coalesce.
func (i *Inventory) Trigger() {
	select {
	case i.triggerChan() <- struct{}{}:
	default:
	}
}

func (i *Inventory) triggerChan() chan struct{} {
	i.once.Do(func() { i.trigger = make(chan struct{}, 1) })
	return i.trigger
}

// Run calls Sync every interval and after every Trigger until ctx is done;
// errors are logged.
func (i *Inventory) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	trigger := i.triggerChan()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-trigger:
		}
		if _, err := i.Sync(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "GPU inventory sync failed")
		}
	}
}
