package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/lending"
	"github.com/tessera-dev/tessera/pkg/metrics"
	"github.com/tessera-dev/tessera/pkg/model"
)

// LenderOptions configure a [Lender].
type LenderOptions struct {
	Policy lending.Policy
	// BusyThreshold is the SM utilization (percent) at or above which an
	// owner's process is busy.
	BusyThreshold uint32
	// Sample looks at a GPU's processes (lending.Sampler.Sample).
	Sample func(uuid string) lending.Sample
	// Store keeps the GPUs' lending states across restarts, for this boot.
	Store  lending.Store
	BootID string
	// Republish is called when what the lending devices publish changed
	// (the inventory's Trigger).
	Republish func()
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// LockPath is the node lock the kubelet plugin helper takes around
	// prepare and unprepare (serialize.lock) during surge rolling updates;
	// Tick holds it, refreshes the checkpoint and rereads the state file,
	// so the two instances of an update step the same states in turn.
	// Empty: a single instance, no lock.
	LockPath string
	// ServicePods, when set, returns pods whose GPU processes belong to no
	// owner or borrower (the MPS control daemons' servers, which compute
	// for their clients); their processes are left out. It is called at
	// most every servicePodsTTL.
	ServicePods func(ctx context.Context) (map[types.UID]bool, error)
	// Kill ends a borrower pod's processes (lending.Cgroups.KillPod: the
	// pod's cgroups, else the containers of pids, its GPU processes) and
	// returns what it killed. The lender calls it for every pod of a
	// borrower that still holds its GPU KillMargin after its reclaim grace
	// ended, at every sample until the borrower is unprepared. Nil: nothing
	// is killed and such a borrower is only reported (BorrowerOutstayed).
	Kill func(pod types.UID, pids []uint32) ([]string, error)
	// KillMargin is how long after a borrower's reclaim grace (the
	// tolerationSeconds of its reclaim toleration) it is killed: time for
	// kube-controller-manager to delete its pod and for the pod's own
	// termination grace. Zero is DefaultKillMargin.
	KillMargin time.Duration
}

// DefaultKillMargin is the KillMargin of a node that sets none: the
// eviction controller deletes a pod within seconds of its toleration
// ending; what is left is a borrower's termination grace, which should be
// as short as its reclaim grace (docs/lending.md).
const DefaultKillMargin = 30 * time.Second

// waitingTTL is how long a claim refused at prepare (a non-lending owner on
// a GPU with borrowers) keeps the GPU closed without retrying: the kubelet
// retries a failed prepare within seconds to a few minutes while the pod
// exists.
const waitingTTL = 5 * time.Minute

// servicePodsTTL is how long a ServicePods answer is used.
const servicePodsTTL = 30 * time.Second

// Lender runs the lending policy (package lending) on the node's GPUs: it
// samples every GPU, steps its state, keeps the states in the state file,
// and has the inventory republish the lending devices when a GPU opens or
// closes. A GPU's owners and borrowers are the claims of the checkpoint, so
// a restart loses nothing: the states come back from the file and the
// claims from the checkpoint.
type Lender struct {
	host lendingHost
	opts LenderOptions

	mu     sync.Mutex
	states map[string]lending.State // by GPU UUID
	// warned are the borrowers already reported as outstaying their grace
	// (killed, or not killable).
	warned map[types.UID]bool
	// graces are the borrowers' reclaim graces (reclaimGrace), by claim;
	// a borrower without one (not yet seen since a restart) gets
	// MaxReclaimGrace.
	graces map[types.UID]time.Duration
	// waiting are the claims that do not lend refused at prepare on a GPU
	// with borrowers, by GPU UUID, with when they were last refused.
	waiting map[string]map[types.UID]time.Time

	// service caches ServicePods (used only by Tick, which does not run
	// concurrently with itself), with the GPUs that had MPS holders then:
	// a change (a daemon pod started or went) refreshes it at once.
	service    map[types.UID]bool
	serviceAt  time.Time
	serviceFor string
	// saved is what the state file holds.
	saved map[string]lending.State
	// kick asks Run for a Tick now (an owner or borrower was prepared or
	// unprepared).
	kick chan struct{}
}

// lendingHost is what a Lender needs of the plugin; *Plugin implements it.
type lendingHost interface {
	// claims are the prepared claims (the checkpoint); refresh rereads
	// them from the checkpoint file.
	claims() []checkpoint.Claim
	refresh(ctx context.Context) error
	// inventory is the node's GPUs by ascending minor.
	inventory() []gpu.GPU
	gpuByMinor(minor int) (gpu.GPU, bool)
	// podsOf are the pods a prepared claim is reserved for.
	podsOf(ctx context.Context, c checkpoint.Claim) []types.UID
	// getClaim reads a prepared claim from the API; nil and no error when
	// the plugin has no API client.
	getClaim(ctx context.Context, c checkpoint.Claim) (*resourceapi.ResourceClaim, error)
	// mpsHolders are the GPUs (by UUID) with MPS shares prepared.
	mpsHolders() []string
	// event records a Node event, claimEventFor one on a prepared claim.
	event(eventType, reason, message string)
	claimEventFor(c checkpoint.Claim, eventType, reason, message string)
	lendingMetrics() lendingMetrics
}

var (
	_ lendingHost = (*Plugin)(nil)
	_ lenderGate  = (*Lender)(nil)
)

// lendingMetrics are the lending counters (*metrics.Metrics; nil-safe).
type lendingMetrics interface {
	LendingOpened()
	ReclaimStarted(reason string)
	ReclaimDone(d time.Duration)
	BorrowerOutstayed()
}

// lenderGate is what prepare and unprepare ask of the lender; *Lender
// implements it.
type lenderGate interface {
	// admit says why a borrower may not be prepared on a GPU now.
	admit(uuid string, memory, held int64) error
	// rememberGrace keeps an admitted borrower's reclaim grace.
	rememberGrace(claim *resourceapi.ResourceClaim)
	// ownerWaits takes a lent GPU back for an owner refused at prepare;
	// ownerPrepared says the owner got it.
	ownerWaits(uuid string, claim types.UID)
	ownerPrepared(claim types.UID)
	// killMargin is LenderOptions.KillMargin.
	killMargin() time.Duration
	// Kick asks for a look at the GPUs now.
	Kick()
}

// NewLender attaches a lender to the plugin: from then on, prepare admits a
// borrower (a gpu-N-lent device) only while its GPU is lent. Without a
// lender, prepare refuses every borrower.
func NewLender(ctx context.Context, p *Plugin, opts LenderOptions) (*Lender, error) {
	if err := opts.Policy.Validate(); err != nil {
		return nil, err
	}
	if opts.Sample == nil {
		return nil, fmt.Errorf("lending: no sampler")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	states, err := opts.Store.Load(opts.BootID)
	if err != nil {
		// Every GPU starts NotHeld: whatever was lent is taken back.
		klog.FromContext(ctx).Error(err, "Lending state lost; every GPU starts not lent")
		p.event(corev1.EventTypeWarning, "LendingStateLost", fmt.Sprintf("%v; every GPU starts not lent, borrowers are reclaimed", err))
	}
	if opts.KillMargin <= 0 {
		opts.KillMargin = DefaultKillMargin
	}
	l := &Lender{host: p, opts: opts, states: states, saved: maps.Clone(states), warned: map[types.UID]bool{},
		graces: map[types.UID]time.Duration{}, waiting: map[string]map[types.UID]time.Time{}, kick: make(chan struct{}, 1)}
	p.setLender(l)
	return l, nil
}

// Lent is what each GPU's lending device publishes, by UUID
// (model.WithLending).
func (l *Lender) Lent() map[string]model.Lent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lentLocked()
}

func (l *Lender) lentLocked() map[string]model.Lent {
	out := make(map[string]model.Lent, len(l.states))
	for uuid, s := range l.states {
		// One taint value whatever the phase: a changed value would
		// republish the slices, reset the NoExecute taint's TimeAdded
		// (postponing evictions) and requeue every waiting borrower at
		// each phase change. The phase is in metrics and events.
		out[uuid] = model.Lent{Open: s.Open(), Memory: s.Lendable, Reason: lending.ReasonNotLent}
	}
	return out
}

// States returns every GPU's lending state, by UUID.
func (l *Lender) States() map[string]lending.State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.states)
}

// admit reports why a borrower holding memory bytes may not be prepared on
// the GPU now: it may only while the GPU is lent, and only within what is
// lent now (a borrower allocated during an earlier, larger loan may retry
// its prepare during a smaller one). held is what the GPU's other
// prepared borrowers hold.
func (l *Lender) admit(uuid string, memory, held int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.states[uuid]
	if !s.Open() {
		return fmt.Errorf("the GPU is not lent now (%s since %s): its owners use it or do not lend it", s.TaintValue(), s.Since.Format(time.RFC3339))
	}
	if held+memory > s.Lendable {
		return fmt.Errorf("the GPU lends %d MiB now and its borrowers hold %d MiB: %d MiB more do not fit (allocated during an earlier loan)", s.Lendable>>20, held>>20, memory>>20)
	}
	return nil
}

func (l *Lender) killMargin() time.Duration { return l.opts.KillMargin }

// Kick asks Run for a Tick now.
func (l *Lender) Kick() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Run samples every interval until ctx ends.
func (l *Lender) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		l.Tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.kick:
		}
	}
}

// holders are a GPU's owners and borrowers in the checkpoint.
type holders struct {
	owners    []lending.Owner
	borrowers []checkpoint.Claim
}

// holdersByGPU reads the checkpoint: owners hold gpu-N or gpu-N-shared
// (admin access holds nothing), borrowers gpu-N-lent.
func (l *Lender) holdersByGPU() map[int]*holders {
	out := map[int]*holders{}
	for _, c := range l.host.claims() {
		for _, d := range c.Devices {
			minor, kind, err := model.ParseDevice(d.Device)
			if err != nil || d.AdminAccess {
				continue
			}
			h := out[minor]
			if h == nil {
				h = &holders{}
				out[minor] = h
			}
			if kind == model.KindLent {
				if !slices.ContainsFunc(h.borrowers, func(b checkpoint.Claim) bool { return b.UID == c.UID }) {
					h.borrowers = append(h.borrowers, c)
				}
				continue
			}
			mps := kind == model.KindShared && d.Isolation == string(configapi.IsolationMPS)
			whole := kind == model.KindWhole
			var memory int64
			if kind == model.KindShared {
				memory = d.ConsumedMemory
			}
			if i := slices.IndexFunc(h.owners, func(o lending.Owner) bool { return o.Claim == c.UID }); i >= 0 {
				h.owners[i].Lend = h.owners[i].Lend && d.Lend
				h.owners[i].MPS = h.owners[i].MPS || mps
				h.owners[i].Whole = h.owners[i].Whole || whole
				h.owners[i].Memory += memory
			} else {
				h.owners = append(h.owners, lending.Owner{Claim: c.UID, Lend: d.Lend, MPS: mps, Whole: whole, Memory: memory})
			}
		}
	}
	return out
}

// Tick samples every GPU once and acts on what changed. The samples and
// API reads happen before the states are locked, so prepare (admit) never
// waits on them.
func (l *Lender) Tick(ctx context.Context) {
	logger := klog.FromContext(ctx)
	lockCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	unlock, err := lockNode(lockCtx, l.opts.LockPath)
	cancel()
	if err != nil {
		logger.Error(err, "Lending skips a sample")
		return
	}
	defer unlock()
	// What this instance published last: a phase change the other instance
	// of a surge update made (read below) must republish here too, or the
	// two instances publish different taints.
	l.mu.Lock()
	before := l.lentLocked()
	l.mu.Unlock()
	if l.opts.LockPath != "" {
		// The other instance of a surge update may have prepared,
		// unprepared or stepped since this one looked.
		if err := l.host.refresh(ctx); err != nil {
			logger.Error(err, "Refreshing the checkpoint failed; lending uses what this instance knows")
		}
		if states, err := l.opts.Store.Load(l.opts.BootID); err == nil {
			l.mu.Lock()
			l.states, l.saved = states, maps.Clone(states)
			l.mu.Unlock()
		}
	}
	now := l.opts.Now()
	byGPU := l.holdersByGPU()
	gpus := l.host.inventory()
	service := l.servicePods(ctx, now)

	waiting := l.waitingGPUs(now)
	observations := make(map[string]lending.Observation, len(gpus))
	// The borrowers' pods and their GPU processes, for killing those
	// that outstay their reclaim.
	pods := map[types.UID][]types.UID{}
	pids := map[types.UID][]uint32{}
	for _, g := range gpus {
		h := byGPU[g.Minor]
		if h == nil {
			h = &holders{}
			byGPU[g.Minor] = h
		}
		if len(h.owners) == 0 && len(h.borrowers) == 0 {
			observations[g.UUID] = lending.Observation{Observed: true, Memory: int64(g.MemoryBytes)}
			continue
		}
		borrowerPods := map[types.UID]bool{}
		var borrowers []types.UID
		for _, b := range h.borrowers {
			borrowers = append(borrowers, b.UID)
			l.learnGrace(ctx, b)
			pods[b.UID] = l.host.podsOf(ctx, b)
			for _, pod := range pods[b.UID] {
				borrowerPods[pod] = true
			}
		}
		sample := l.opts.Sample(g.UUID)
		for pod, a := range sample.Pods {
			if borrowerPods[pod] {
				pids[pod] = append(pids[pod], a.PIDs...)
			}
		}
		o := lending.Observe(sample, int64(g.MemoryBytes), h.owners, borrowers, service, borrowerPods, l.opts.BusyThreshold)
		// A waiting claim keeps the GPU closed also once its borrowers are
		// gone, until the kubelet's retry prepares it (or waitingTTL).
		o.OwnerWaiting = waiting[g.UUID]
		observations[g.UUID] = o
	}

	type change struct {
		g        gpu.GPU
		from, to lending.State
		h        *holders
	}
	var changes []change
	// outstaying are the borrowers past their reclaim bound.
	var outstaying []checkpoint.Claim
	l.mu.Lock()
	next := make(map[string]lending.State, len(gpus))
	for _, g := range gpus {
		h := byGPU[g.Minor]
		from := l.states[g.UUID]
		to := lending.Step(l.opts.Policy, from, observations[g.UUID], now)
		next[g.UUID] = to
		if to.Phase != from.Phase {
			changes = append(changes, change{g: g, from: from, to: to, h: h})
		}
		if to.Phase == lending.Reclaiming {
			for _, b := range h.borrowers {
				if !now.Before(l.killAtLocked(to, b.UID)) {
					outstaying = append(outstaying, b)
				}
			}
		}
	}
	l.states = next
	after := l.lentLocked()
	l.mu.Unlock()

	// The file is written outside the lock too (only Tick writes it), and
	// only when a state changed.
	if !reflect.DeepEqual(next, l.saved) {
		if err := l.opts.Store.Save(l.opts.BootID, next); err != nil {
			logger.Error(err, "Saving the lending state failed; a restart would take back what is lent")
		} else {
			l.saved = next
		}
	}
	// Borrowers no longer reclaiming need no warning.
	for uid := range l.warned {
		if !slices.ContainsFunc(outstaying, func(c checkpoint.Claim) bool { return c.UID == uid }) && !l.reclaiming(byGPU, uid) {
			delete(l.warned, uid)
		}
	}
	for uid := range l.graces {
		if !l.isBorrower(byGPU, uid) {
			delete(l.graces, uid)
		}
	}
	if !maps.Equal(before, after) && l.opts.Republish != nil {
		l.opts.Republish()
	}
	for _, c := range changes {
		l.report(ctx, c.g, c.from, c.to, c.h)
	}
	for _, b := range outstaying {
		l.killBorrower(ctx, b, pods[b.UID], pids)
	}
}

// killAtLocked is when a borrower of a GPU being taken back (s) is killed:
// its reclaim grace and the kill margin after the reclaim began.
func (l *Lender) killAtLocked(s lending.State, borrower types.UID) time.Time {
	grace, ok := l.graces[borrower]
	if !ok {
		grace = MaxReclaimGrace
	}
	return s.Since.Add(grace + l.opts.KillMargin)
}

// killBorrower kills the pods of a borrower that outstayed its reclaim,
// at every sample until it is unprepared (a container the kubelet restarts
// is killed again), and says so once in an event on its claim.
func (l *Lender) killBorrower(ctx context.Context, b checkpoint.Claim, pods []types.UID, pids map[types.UID][]uint32) {
	logger := klog.FromContext(ctx)
	first := !l.warned[b.UID]
	l.warned[b.UID] = true
	bound := fmt.Sprintf("its reclaim grace (%s) plus %s", l.grace(b.UID), l.opts.KillMargin)
	if l.opts.Kill == nil {
		if first {
			l.host.claimEventFor(b, corev1.EventTypeWarning, "BorrowerOutstayed",
				fmt.Sprintf("the GPU was taken back and this borrower still holds it after %s: its pod's termination grace or a stuck eviction keeps it, and this node does not kill borrowers", bound))
			l.host.lendingMetrics().BorrowerOutstayed()
		}
		return
	}
	var killed []string
	var errs []error
	for _, pod := range pods {
		dirs, err := l.opts.Kill(pod, pids[pod])
		killed = append(killed, dirs...)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", pod, err))
		}
	}
	if len(pods) == 0 {
		errs = append(errs, fmt.Errorf("no pod is known to hold the claim"))
	}
	err := errors.Join(errs...)
	if !first {
		if len(killed) > 0 || err != nil {
			logger.V(2).Info("Killed an outstaying borrower again", "claim", klog.KRef(b.Namespace, b.Name), "cgroups", killed, "err", err)
		}
		return
	}
	l.host.lendingMetrics().BorrowerOutstayed()
	switch {
	case len(killed) > 0:
		logger.Info("Killed a borrower that outstayed its reclaim", "claim", klog.KRef(b.Namespace, b.Name), "cgroups", killed, "err", err)
		msg := fmt.Sprintf("the GPU was taken back and this borrower still held it after %s: its processes were killed (cgroup.kill of %s)", bound, strings.Join(killed, ", "))
		if err != nil {
			msg += fmt.Sprintf("; not killed: %v", err)
		}
		l.host.claimEventFor(b, corev1.EventTypeWarning, "BorrowerKilled", msg)
	default:
		logger.Error(err, "A borrower outstayed its reclaim and could not be killed", "claim", klog.KRef(b.Namespace, b.Name))
		l.host.claimEventFor(b, corev1.EventTypeWarning, "BorrowerOutstayed",
			fmt.Sprintf("the GPU was taken back and this borrower still holds it after %s; killing it failed (retried at every sample): %v", bound, err))
	}
}

// grace is the borrower's reclaim grace (MaxReclaimGrace when unknown).
func (l *Lender) grace(borrower types.UID) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g, ok := l.graces[borrower]; ok {
		return g
	}
	return MaxReclaimGrace
}

// isBorrower reports whether the claim borrows a GPU in byGPU.
func (l *Lender) isBorrower(byGPU map[int]*holders, uid types.UID) bool {
	for _, h := range byGPU {
		if slices.ContainsFunc(h.borrowers, func(c checkpoint.Claim) bool { return c.UID == uid }) {
			return true
		}
	}
	return false
}

// rememberGrace keeps a borrower claim's reclaim grace.
func (l *Lender) rememberGrace(claim *resourceapi.ResourceClaim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.graces[claim.UID] = reclaimGrace(claim)
}

// learnGrace reads the reclaim grace of a borrower prepared before this
// instance started (or by the other instance of a surge update) from its
// claim in the API; until it is known the borrower gets MaxReclaimGrace.
func (l *Lender) learnGrace(ctx context.Context, b checkpoint.Claim) {
	l.mu.Lock()
	_, known := l.graces[b.UID]
	l.mu.Unlock()
	if known {
		return
	}
	claim, err := l.host.getClaim(ctx, b)
	if claim == nil && err == nil {
		return // no API client
	}
	if err != nil || claim.UID != b.UID {
		klog.FromContext(ctx).V(2).Info("Borrower's claim not read; its reclaim grace is taken as the longest allowed", "claim", klog.KRef(b.Namespace, b.Name), "err", err)
		return
	}
	l.rememberGrace(claim)
}

// reclaimGrace is how long a borrower claim may stay once its GPU is taken
// back: the longest tolerationSeconds of its allocation's tolerations of
// the reclaim taint (kube-controller-manager evicts after the shortest; the
// longest never cuts a borrower short), at most MaxReclaimGrace (a
// toleration without seconds, which the chart's admission policy refuses,
// included). Without a toleration it is evicted at once: 0.
func reclaimGrace(claim *resourceapi.ResourceClaim) time.Duration {
	var grace time.Duration
	if claim.Status.Allocation == nil {
		return 0
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != model.DriverName {
			continue
		}
		for _, t := range r.Tolerations {
			if t.Key != model.ReclaimTaintKey && (t.Key != "" || t.Operator != resourceapi.DeviceTolerationOpExists) {
				continue
			}
			if t.Effect != "" && t.Effect != resourceapi.DeviceTaintEffectNoExecute {
				continue
			}
			d := MaxReclaimGrace
			if t.TolerationSeconds != nil {
				d = min(time.Duration(max(*t.TolerationSeconds, 0))*time.Second, MaxReclaimGrace)
			}
			grace = max(grace, d)
		}
	}
	return grace
}

// waitingGPUs are the GPUs for which a claim that does not lend was
// refused at prepare within waitingTTL; older entries are dropped.
func (l *Lender) waitingGPUs(now time.Time) map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]bool{}
	for uuid, claims := range l.waiting {
		for uid, at := range claims {
			if now.Sub(at) > waitingTTL {
				delete(claims, uid)
			}
		}
		if len(claims) == 0 {
			delete(l.waiting, uuid)
			continue
		}
		out[uuid] = true
	}
	return out
}

// ownerWaits records that a claim that does not lend was refused on the GPU
// and has Run look again now: the GPU is taken back at once.
func (l *Lender) ownerWaits(uuid string, claim types.UID) {
	l.mu.Lock()
	if l.waiting[uuid] == nil {
		l.waiting[uuid] = map[types.UID]time.Time{}
	}
	l.waiting[uuid][claim] = l.opts.Now()
	l.mu.Unlock()
	l.Kick()
}

// ownerPrepared forgets a claim that waited: it is an owner now.
func (l *Lender) ownerPrepared(claim types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for uuid, claims := range l.waiting {
		delete(claims, claim)
		if len(claims) == 0 {
			delete(l.waiting, uuid)
		}
	}
}

// reclaiming reports whether the borrower claim is on a GPU being taken back.
func (l *Lender) reclaiming(byGPU map[int]*holders, uid types.UID) bool {
	for minor, h := range byGPU {
		if !slices.ContainsFunc(h.borrowers, func(c checkpoint.Claim) bool { return c.UID == uid }) {
			continue
		}
		if g, ok := l.host.gpuByMinor(minor); ok {
			return l.States()[g.UUID].Phase == lending.Reclaiming
		}
	}
	return false
}

// servicePods is ServicePods, cached for servicePodsTTL or until the GPUs
// with MPS holders change; on an error the last answer is kept.
func (l *Lender) servicePods(ctx context.Context, now time.Time) map[types.UID]bool {
	if l.opts.ServicePods == nil {
		return nil
	}
	mpsGPUs := strings.Join(l.host.mpsHolders(), ",")
	if now.Sub(l.serviceAt) < servicePodsTTL && mpsGPUs == l.serviceFor {
		return l.service
	}
	pods, err := l.opts.ServicePods(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing the MPS daemon pods failed; their processes may count as owner activity")
		return l.service
	}
	l.service, l.serviceAt, l.serviceFor = pods, now, mpsGPUs
	return pods
}

// MaxReclaimGrace is the longest tolerationSeconds of the reclaim taint that
// the admission webhook lets a borrower claim carry.
const MaxReclaimGrace = 10 * time.Minute

func (l *Lender) report(ctx context.Context, g gpu.GPU, from, to lending.State, h *holders) {
	logger := klog.FromContext(ctx)
	logger.Info("GPU lending changed", "gpu", g.UUID, "minor", g.Minor, "from", from.Phase, "to", to.Phase, "reason", to.Reason, "lendable", to.Lendable)
	m := l.host.lendingMetrics()
	switch {
	case to.Phase == lending.Lent:
		m.LendingOpened()
		l.host.event(corev1.EventTypeNormal, "GPULent", fmt.Sprintf("GPU %s (gpu-%d) is lent: its owners have been idle for %s; %d MiB may be borrowed through %s",
			g.UUID, g.Minor, l.opts.Policy.IdlePeriod, to.Lendable>>20, model.LentDeviceName(g.Minor)))
	case to.Phase == lending.Reclaiming:
		m.ReclaimStarted(to.Reason)
		msg := fmt.Sprintf("GPU %s (gpu-%d) is taken back (%s): its borrowers are evicted after the tolerationSeconds of their %s toleration",
			g.UUID, g.Minor, to.Reason, model.ReclaimTaintKey)
		l.host.event(corev1.EventTypeNormal, "GPUReclaimed", msg)
		for _, b := range h.borrowers {
			l.host.claimEventFor(b, corev1.EventTypeWarning, "Reclaimed", msg)
		}
	case from.Phase == lending.Reclaiming:
		m.ReclaimDone(to.Since.Sub(from.Since))
		l.host.event(corev1.EventTypeNormal, "GPUReclaimDone", fmt.Sprintf("GPU %s (gpu-%d) is its owners' alone again after %s", g.UUID, g.Minor, to.Since.Sub(from.Since).Round(time.Millisecond)))
	}
}

// podsOf returns the UIDs of the pods a claim is reserved for: what prepare
// saw, or after a restart the claim's status in the API.
func (p *Plugin) podsOf(ctx context.Context, c checkpoint.Claim) []types.UID {
	p.facts.mu.Lock()
	f, ok := p.facts.claims[c.UID]
	p.facts.mu.Unlock()
	if !ok && p.opts.Client != nil {
		claim, err := p.opts.Client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
		if err == nil && claim.UID == c.UID {
			p.rememberClaim(claim)
			f = factsOf(claim)
		}
	}
	var out []types.UID
	for _, ref := range f.pods {
		out = append(out, ref.UID)
	}
	return out
}

// claimEventFor records an event on a checkpointed claim.
func (p *Plugin) claimEventFor(c checkpoint.Claim, eventType, reason, message string) {
	if p.opts.Events == nil {
		return
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, UID: c.UID}}
	p.opts.Events.ClaimEvent(claim, eventType, reason, message)
}

// claims implements lendingHost.
func (p *Plugin) claims() []checkpoint.Claim { return p.opts.Store.List() }

// getClaim implements lendingHost.
func (p *Plugin) getClaim(ctx context.Context, c checkpoint.Claim) (*resourceapi.ResourceClaim, error) {
	if p.opts.Client == nil {
		return nil, nil
	}
	return p.opts.Client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
}

// mpsHolders implements lendingHost: the GPUs with MPS holders, sorted.
func (p *Plugin) mpsHolders() []string {
	if p.opts.MPS == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(p.opts.MPS.Holders()))
}

// lendingMetrics implements lendingHost.
func (p *Plugin) lendingMetrics() lendingMetrics { return p.opts.Metrics }

// inventory is the GPUs prepare knows, by ascending minor.
func (p *Plugin) inventory() []gpu.GPU {
	p.gpusMu.RLock()
	defer p.gpusMu.RUnlock()
	out := slices.Collect(maps.Values(p.gpus))
	slices.SortFunc(out, func(a, b gpu.GPU) int { return a.Minor - b.Minor })
	return out
}

// LendingSnapshot implements metrics.LendingSource.
func (l *Lender) LendingSnapshot() []metrics.LentGPU {
	byGPU := l.holdersByGPU()
	states := l.States()
	var out []metrics.LentGPU
	for _, g := range l.host.inventory() {
		s := states[g.UUID]
		n := 0
		if h := byGPU[g.Minor]; h != nil {
			n = len(h.borrowers)
		}
		out = append(out, metrics.LentGPU{UUID: g.UUID, Minor: g.Minor, Phase: s.TaintValue(), LendableBytes: s.Lendable, Borrowers: n})
	}
	return out
}

// setLender attaches the lender.
func (p *Plugin) setLender(l lenderGate) {
	p.lenderMu.Lock()
	defer p.lenderMu.Unlock()
	p.lender = l
}

// currentLender is the plugin's lender, nil while lending is off.
func (p *Plugin) currentLender() lenderGate {
	p.lenderMu.Lock()
	defer p.lenderMu.Unlock()
	return p.lender
}

// lendingChanged has the lender look again now: an owner or a borrower was
// prepared or unprepared (a new owner takes a lent GPU back at once).
func (p *Plugin) lendingChanged() {
	if l := p.currentLender(); l != nil {
		l.Kick()
	}
}

// admitOwners refuses a claim that does not lend on a GPU that borrowers
// hold. The scheduler may place it there (the lending device holds none of
// the GPU's counters, so consent is seen only here); it would then run
// beside the borrowers until they leave. Instead the GPU is taken back at
// once (lending.Observation.OwnerWaiting: the borrowers are evicted after
// their grace and killed at the kill margin) and prepare fails with an
// error and an event on the claim; the kubelet retries until the GPU is
// free. It never waits here: the kubelet gives a prepare 45 s.
func (p *Plugin) admitOwners(claim *resourceapi.ResourceClaim, pl *plan) error {
	l := p.currentLender()
	for _, d := range pl.devices {
		if d.lent || d.adminAccess || d.lend || d.mig != nil {
			continue
		}
		var borrowers []string
		for _, c := range p.opts.Store.List() {
			if c.UID == claim.UID {
				continue
			}
			for _, cd := range c.Devices {
				if cd.Device == model.LentDeviceName(d.gpu.Minor) && !cd.AdminAccess {
					borrowers = append(borrowers, c.Namespace+"/"+c.Name)
					break
				}
			}
		}
		if len(borrowers) == 0 {
			continue
		}
		var err error
		if l == nil {
			err = deviceError(d.device, "GPU %s is lent to %s and this claim does not lend it (GpuConfig lending.lendWhenIdle): waiting until they are evicted (lending is off on node %s: its lending device is tainted); the kubelet retries", d.gpu.UUID, strings.Join(borrowers, ", "), p.opts.NodeName)
		} else {
			l.ownerWaits(d.gpu.UUID, claim.UID)
			err = deviceError(d.device, "GPU %s is lent to %s and this claim does not lend it (GpuConfig lending.lendWhenIdle): the GPU is being taken back (borrowers are evicted after their reclaim grace, killed %s later at the latest); the kubelet retries", d.gpu.UUID, strings.Join(borrowers, ", "), l.killMargin())
		}
		p.claimEvent(claim, corev1.EventTypeWarning, "WaitingForBorrowers", err.Error())
		return err
	}
	if l != nil {
		l.ownerPrepared(claim.UID)
	}
	return nil
}

// admitBorrowers refuses a claim with a borrower's device on a GPU that is
// not lent now. Such a claim was allocated just before its GPU was taken
// back (or on a node without lending): its pod is evicted through the
// reclaim taint, or runs once the GPU is lent again. An admitted borrower's
// reclaim grace is remembered (the kill deadline).
func (p *Plugin) admitBorrowers(claimObj *resourceapi.ResourceClaim, pl *plan) error {
	claim := claimObj.UID
	l := p.currentLender()
	for _, d := range pl.devices {
		if !d.lent || d.adminAccess {
			continue
		}
		if l == nil {
			return deviceError(d.device, "borrower refused: lending is off on node %s (the kubelet plugin runs without --lending)", p.opts.NodeName)
		}
		// What the GPU's other borrowers hold, and this claim's other
		// shares of the same lending device. An owner that does not lend,
		// prepared (or being prepared) since the lender last looked, closes
		// the GPU now: the lender would take it back at its next sample.
		var held int64
		var refusing []string
		for _, c := range p.opts.Store.List() {
			if c.UID == claim {
				continue
			}
			for _, cd := range c.Devices {
				if cd.AdminAccess {
					continue
				}
				if cd.Device == d.device {
					held += cd.ConsumedMemory
					continue
				}
				if minor, kind, err := model.ParseDevice(cd.Device); err == nil && minor == d.gpu.Minor && kind != model.KindLent && !cd.Lend &&
					!slices.Contains(refusing, c.Namespace+"/"+c.Name) {
					refusing = append(refusing, c.Namespace+"/"+c.Name)
				}
			}
		}
		if len(refusing) > 0 {
			return deviceError(d.device, "borrower refused: the GPU is not lent now: %s hold it and do not lend it (GpuConfig lending.lendWhenIdle)", strings.Join(refusing, ", "))
		}
		for _, o := range pl.devices {
			if o.device == d.device && o.shareID != d.shareID && !o.adminAccess {
				held += o.consumedMemory
			}
		}
		if err := l.admit(d.gpu.UUID, d.consumedMemory, held); err != nil {
			return deviceError(d.device, "borrower refused: %v", err)
		}
		l.rememberGrace(claimObj)
	}
	return nil
}

// StrandedBorrowers is the inventory's Lending while lending is off (the
// flag, or no usable NVML): nil — no lending devices — unless the
// checkpoint still holds borrowers (lending was on before a restart), whose
// lending devices are then published tainted, so that kube-controller-manager
// evicts them instead of leaving them on their owners' GPUs.
func (p *Plugin) StrandedBorrowers() map[string]model.Lent {
	for _, c := range p.opts.Store.List() {
		for _, d := range c.Devices {
			if _, kind, err := model.ParseDevice(d.Device); err == nil && kind == model.KindLent {
				return map[string]model.Lent{}
			}
		}
	}
	return nil
}
