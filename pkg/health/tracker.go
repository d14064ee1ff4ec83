package health

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// TaintKey is the key of the device taint on an unhealthy GPU's devices.
const TaintKey = "gpu.tessera.dev/unhealthy"

// Kind is what an Event reports.
type Kind string

const (
	// KindXID is a critical XID error (nvmlEventTypeXidCriticalError); Event.XID
	// holds the code.
	KindXID Kind = "XID"
	// KindDoubleBitECC is an uncorrectable (double-bit) ECC error
	// (nvmlEventTypeDoubleBitEccError).
	KindDoubleBitECC Kind = "DoubleBitECC"
	// KindGPULost means NVML answers ERROR_GPU_IS_LOST for the GPU.
	KindGPULost Kind = "GPULost"
)

// Event is one error report about one GPU.
type Event struct {
	// UUID names the GPU.
	UUID string
	Kind Kind
	// XID is the XID code of a KindXID event.
	XID uint64
	// MIG, when set, is the MIG device of the GPU the event concerns (the
	// instance IDs of an XID on a GPU in MIG mode): only that device turns
	// unhealthy, unless the event is fatal (see mig.go).
	MIG *MIGScope
}

func (e Event) String() string {
	if e.Kind == KindXID {
		return fmt.Sprintf("XID %d", e.XID)
	}
	return string(e.Kind)
}

// Default XID lists; see the package documentation for why.
var (
	DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}
	DefaultFatalXIDs   = []uint64{48, 64, 79, 95, 119, 120, 140}
)

// DefaultRecoveryPeriod is how long a GPU must stay quiet before its taint goes.
const DefaultRecoveryPeriod = 5 * time.Minute

// Policy classifies events. The zero value ignores nothing, treats no XID as
// fatal, uses NoExecute for fatal events and recovers at once; use
// DefaultPolicy for the documented defaults.
type Policy struct {
	// IgnoredXIDs never change a GPU's health.
	IgnoredXIDs []uint64
	// FatalXIDs taint with FatalEffect; other XIDs (not ignored) with NoSchedule.
	FatalXIDs []uint64
	// FatalEffect is the effect of fatal events (fatal XIDs, double-bit ECC,
	// GPU lost): NoExecute evicts the pods using the GPU, NoSchedule only keeps
	// new ones away, None only marks the device. Empty means NoExecute.
	FatalEffect resourceapi.DeviceTaintEffect
	// RecoveryPeriod is how long a GPU must go without a counting event before
	// it is healthy again.
	RecoveryPeriod time.Duration
}

// DefaultPolicy is the policy described in the package documentation.
func DefaultPolicy() Policy {
	return Policy{
		IgnoredXIDs:    slices.Clone(DefaultIgnoredXIDs),
		FatalXIDs:      slices.Clone(DefaultFatalXIDs),
		FatalEffect:    resourceapi.DeviceTaintEffectNoExecute,
		RecoveryPeriod: DefaultRecoveryPeriod,
	}
}

// Validate checks the effect and the period.
func (p Policy) Validate() error {
	switch p.FatalEffect {
	case "", resourceapi.DeviceTaintEffectNoExecute, resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNone:
	default:
		return fmt.Errorf("fatal effect %q: want NoExecute, NoSchedule or None", p.FatalEffect)
	}
	if p.RecoveryPeriod < 0 {
		return fmt.Errorf("recovery period %v is negative", p.RecoveryPeriod)
	}
	for _, x := range p.IgnoredXIDs {
		if slices.Contains(p.FatalXIDs, x) {
			return fmt.Errorf("XID %d is both ignored and fatal", x)
		}
	}
	return nil
}

// Classify returns the taint effect of an event, or ok=false when the event
// does not count against the GPU.
func (p Policy) Classify(e Event) (effect resourceapi.DeviceTaintEffect, ok bool) {
	fatal := p.FatalEffect
	if fatal == "" {
		fatal = resourceapi.DeviceTaintEffectNoExecute
	}
	switch e.Kind {
	case KindDoubleBitECC, KindGPULost:
		return fatal, true
	case KindXID:
		switch {
		case slices.Contains(p.IgnoredXIDs, e.XID):
			return "", false
		case slices.Contains(p.FatalXIDs, e.XID):
			return fatal, true
		default:
			return resourceapi.DeviceTaintEffectNoSchedule, true
		}
	}
	return "", false
}

// Status is the health of one GPU, or of one MIG device of it (MIG set).
type Status struct {
	// UUID is the GPU's.
	UUID string
	// MIG is the MIG device the status is of; nil for the whole GPU.
	MIG     *MIGScope
	Healthy bool
	// Effect is the taint effect while unhealthy: the strongest effect of the
	// events since the GPU became unhealthy.
	Effect resourceapi.DeviceTaintEffect
	// Reason names the events, e.g. "XID 79" or "XID 94, DoubleBitECC" (the
	// first and the latest kind, at most).
	Reason string
	// Since is when the GPU became unhealthy; LastEvent when the latest
	// counting event came; RecoversAt when it will be healthy again unless
	// another event comes.
	Since, LastEvent, RecoversAt time.Time
	// Events counts the counting events since the GPU became unhealthy.
	Events int
	// Lost is set once NVML reported the GPU lost while unhealthy.
	Lost bool
}

// Taint is the device taint for the status, or nil when healthy. TimeAdded
// is left to the API server (and kept by the ResourceSlice controller), so
// republishing the same taint changes nothing.
func (s Status) Taint() *resourceapi.DeviceTaint {
	if s.Healthy {
		return nil
	}
	return &resourceapi.DeviceTaint{Key: TaintKey, Value: taintValue(s.Reason), Effect: s.Effect}
}

// taintValue turns a reason into a label value ("XID-79", "DoubleBitECC").
func taintValue(reason string) string {
	first, _, _ := cutComma(reason)
	out := make([]byte, 0, len(first))
	for i := 0; i < len(first); i++ {
		c := first[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
			out = append(out, c)
		case c == ' ':
			out = append(out, '-')
		}
	}
	if len(out) > 63 {
		out = out[:63]
	}
	return string(out)
}

func cutComma(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ',' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// Tracker holds the health of every GPU it has heard of; GPUs it has not
// heard of are healthy. It is safe for concurrent use.
//
// The caller may assume: a GPU turns unhealthy on the first event the policy
// counts; its effect only escalates (NoSchedule → NoExecute) while it stays
// unhealthy; it turns healthy in the first Recover call at or after
// LastEvent+RecoveryPeriod; every change of any GPU's Status (other than
// Events, LastEvent and RecoversAt of an already unhealthy GPU) wakes every
// subscriber. With a store (Persist), the state also survives restarts and
// is shared with the other instance of a surge update (see Persist).
type Tracker struct {
	policy Policy
	clock  clock.PassiveClock

	mu   sync.Mutex
	gpus map[string]*Status
	subs map[int]chan struct{}
	next int

	// store, when set (Persist), gets the state after every change;
	// storeMu serialises its read-merge-write within this process.
	store   *Store
	storeMu sync.Mutex
	logger  klog.Logger
}

// NewTracker returns a tracker with the policy, reading time from clk (nil:
// the real clock).
func NewTracker(policy Policy, clk clock.PassiveClock) *Tracker {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Tracker{policy: policy, clock: clk, gpus: map[string]*Status{}, subs: map[int]chan struct{}{}}
}

// Policy returns the tracker's policy.
func (t *Tracker) Policy() Policy { return t.policy }

// Observe records an event and reports whether a GPU's health changed. With
// a store (Persist), every counted event is saved before Observe returns.
func (t *Tracker) Observe(e Event) (changed bool) {
	effect, counts := t.policy.Classify(e)
	if !counts || e.UUID == "" {
		return false
	}
	if e.MIG != nil && t.policy.fatal(e) {
		// The GPU needs a reset, which destroys every instance.
		e.MIG = nil
	}
	changed = t.observe(e, effect)
	t.save()
	return changed
}

func (t *Tracker) observe(e Event, effect resourceapi.DeviceTaintEffect) (changed bool) {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	key := statusKey(e.UUID, e.MIG)
	s, ok := t.gpus[key]
	if !ok || s.Healthy {
		s = &Status{UUID: e.UUID, MIG: e.MIG, Effect: effect, Reason: e.String(), Since: now}
		t.gpus[key] = s
		changed = true
	} else {
		if stronger(effect, s.Effect) {
			s.Effect = effect
			changed = true
		}
		if first, _, _ := cutComma(s.Reason); first != e.String() {
			reason := first + ", " + e.String()
			changed = changed || reason != s.Reason
			s.Reason = reason
		}
	}
	s.Events++
	s.Lost = s.Lost || e.Kind == KindGPULost
	s.LastEvent = now
	s.RecoversAt = now.Add(t.policy.RecoveryPeriod)
	if changed {
		t.notifyLocked()
	}
	return changed
}

// Recover turns every unhealthy GPU whose recovery time has come healthy
// again and reports whether any did (and then saves, with a store).
func (t *Tracker) Recover() (changed bool) {
	if changed = t.recover(); changed {
		t.save()
	}
	return changed
}

func (t *Tracker) recover() (changed bool) {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for uuid, s := range t.gpus {
		if !s.RecoversAt.After(now) {
			delete(t.gpus, uuid)
			changed = true
		}
	}
	if changed {
		t.notifyLocked()
	}
	return changed
}

// Restore merges statuses (a Store's content, by the keys Unhealthy gives)
// into the tracker and reports
// whether a GPU's health changed (subscribers are woken then, as for
// Observe). Only the faults count, not who saw them:
//
//   - A status whose recovery time (LastEvent + this tracker's
//     RecoveryPeriod) has passed is dropped: the GPU is healthy.
//   - A GPU the tracker holds healthy becomes unhealthy with the status as
//     it is, so that its recovery period continues from its last fault.
//   - For a GPU unhealthy on both sides: the stronger effect, the later
//     LastEvent (and RecoversAt), the larger Events, Lost of either, and
//     Since and Reason of the side that turned unhealthy first (ties: the
//     smaller Reason). Both instances of a surge update thus converge on
//     the same status and publish the same taint.
//
// Restore never turns a GPU healthy: a GPU missing from statuses keeps its
// status.
func (t *Tracker) Restore(statuses map[string]Status) (changed bool) {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, key := range slices.Sorted(maps.Keys(statuses)) {
		in := statuses[key]
		if key == "" || in.LastEvent.IsZero() || in.Effect == "" {
			continue
		}
		uuid, scope := in.UUID, in.MIG
		if uuid == "" {
			var err error
			if uuid, scope, err = parseStatusKey(key); err != nil {
				continue
			}
		}
		recovers := in.LastEvent.Add(t.policy.RecoveryPeriod)
		if !recovers.After(now) {
			continue
		}
		s, ok := t.gpus[key]
		if !ok || s.Healthy {
			since := in.Since
			if since.IsZero() || since.After(in.LastEvent) {
				since = in.LastEvent
			}
			t.gpus[key] = &Status{UUID: uuid, MIG: scope, Effect: in.Effect, Reason: in.Reason, Since: since, LastEvent: in.LastEvent,
				RecoversAt: recovers, Events: in.Events, Lost: in.Lost}
			changed = true
			continue
		}
		if stronger(in.Effect, s.Effect) {
			s.Effect = in.Effect
			changed = true
		}
		if in.LastEvent.After(s.LastEvent) {
			s.LastEvent, s.RecoversAt = in.LastEvent, recovers
		}
		if !in.Since.IsZero() && (in.Since.Before(s.Since) || in.Since.Equal(s.Since) && in.Reason < s.Reason) {
			changed = changed || in.Reason != s.Reason
			s.Since, s.Reason = in.Since, in.Reason
		}
		s.Events = max(s.Events, in.Events)
		s.Lost = s.Lost || in.Lost
	}
	if changed {
		t.notifyLocked()
	}
	return changed
}

// Persist makes the tracker keep its state in store, so that a GPU's health
// survives restarts of the plugin and is shared by the two instances of a
// surge rolling update, which run side by side on one data directory. It
// merges what the store holds now (Refresh); call it once, before the
// tracker is shared. The rules:
//
//   - Every instance saves after every change it makes (each counted event,
//     each recovery), and re-reads the file whenever Refresh is called (the
//     plugin does at every inventory sync, so at least every
//     --rediscover-interval). Saving is itself a Refresh: under the file's
//     lock, read, merge (Restore), write the union back. So no instance
//     overwrites a fault it has not seen.
//   - What is in the file is decided by the faults alone: a GPU stays in it
//     until the recovery period has passed since its last fault, then the
//     next writer drops it. A new instance thus keeps a GPU tainted until
//     the period has passed since the fault the old one saw.
//   - A file that cannot be read or parsed is logged and ignored, never
//     fatal; the next save replaces it. A failed save is logged; the
//     tracker's own state is unaffected.
//
// Log messages go to the logger of ctx.
func (t *Tracker) Persist(ctx context.Context, store Store) {
	t.logger = klog.FromContext(ctx)
	t.store = &store
	t.Refresh()
}

// Refresh merges the store's content into the tracker (Restore) and writes
// the union back when it differs from the file. It reports whether a GPU's
// health changed. Without a store (Persist) it does nothing.
func (t *Tracker) Refresh() (changed bool) {
	if t.store == nil {
		return false
	}
	t.storeMu.Lock()
	defer t.storeMu.Unlock()
	unlock, err := t.store.lock()
	if err != nil {
		t.logger.Error(err, "Locking the GPU health state failed; reading and writing it unlocked")
	} else {
		defer unlock()
	}
	states, old, err := t.store.load()
	if err != nil {
		t.logger.Error(err, "Ignoring the GPU health state file; it is rewritten from this instance's state")
	}
	if changed = t.Restore(states); changed {
		t.logger.Info("GPU health restored from the state file", "path", t.store.Path, "unhealthy", len(t.Unhealthy()))
	}
	// Recovery is due here too: the event watcher, which otherwise drives
	// it, may not run (NVML events unsupported), and restored taints must
	// not outlive their period.
	if t.recover() {
		changed = true
	}
	data, err := encode(t.Unhealthy())
	if err == nil && !bytes.Equal(data, old) {
		err = t.store.write(data)
	}
	if err != nil {
		t.logger.Error(err, "Saving the GPU health state failed; it is lost if the plugin restarts before the next save")
	}
	return changed
}

// save is Refresh after a change of the tracker's own.
func (t *Tracker) save() {
	if t.store != nil {
		t.Refresh()
	}
}

// NextRecovery is the earliest RecoversAt of the unhealthy GPUs.
func (t *Tracker) NextRecovery() (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var next time.Time
	for _, s := range t.gpus {
		if next.IsZero() || s.RecoversAt.Before(next) {
			next = s.RecoversAt
		}
	}
	return next, !next.IsZero()
}

// Status returns the health of one GPU.
func (t *Tracker) Status(uuid string) Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.gpus[uuid]; ok {
		return *s
	}
	return Status{UUID: uuid, Healthy: true}
}

// Unhealthy returns the status of every unhealthy GPU, by UUID, and of
// every unhealthy MIG device, by "<GPU UUID>/mig-…" (what Restore and the
// store take).
func (t *Tracker) Unhealthy() map[string]Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]Status, len(t.gpus))
	for uuid, s := range t.gpus {
		out[uuid] = *s
	}
	return out
}

// Taints returns the device taints of the unhealthy GPUs by UUID, in the form
// model.WithTaints takes. Unhealthy MIG devices are not among them: see
// MIGTaints.
func (t *Tracker) Taints() map[string][]resourceapi.DeviceTaint {
	out := map[string][]resourceapi.DeviceTaint{}
	for uuid, s := range t.Unhealthy() {
		if s.MIG == nil {
			out[uuid] = []resourceapi.DeviceTaint{*s.Taint()}
		}
	}
	return out
}

// Subscribe returns a channel that receives a value after every health
// change (changes coalesce while the subscriber is busy) and a function that
// ends the subscription.
func (t *Tracker) Subscribe() (<-chan struct{}, func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id := t.next
	t.next++
	ch := make(chan struct{}, 1)
	t.subs[id] = ch
	return ch, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		delete(t.subs, id)
	}
}

func (t *Tracker) notifyLocked() {
	for _, id := range slices.Sorted(maps.Keys(t.subs)) {
		select {
		case t.subs[id] <- struct{}{}:
		default:
		}
	}
}

// stronger reports whether effect a evicts or excludes more than b.
func stronger(a, b resourceapi.DeviceTaintEffect) bool {
	rank := func(e resourceapi.DeviceTaintEffect) int {
		switch e {
		case resourceapi.DeviceTaintEffectNoExecute:
			return 2
		case resourceapi.DeviceTaintEffectNoSchedule:
			return 1
		}
		return 0
	}
	return rank(a) > rank(b)
}
