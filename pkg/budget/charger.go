package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

	"github.com/tessera-dev/tessera/pkg/webhook/caller"
)

// Path is where tessera-webhook serves the Charger's admission.
const Path = "/budget"

// DefaultTTL is how long a pending charge is kept at least (see
// Reconciler): above MinTTL and the usual watch lag.
const DefaultTTL = 2 * time.Minute

// MinTTL is the least TTL a pending charge may have: the API server's
// request timeout (kube-apiserver --request-timeout, 60s by default), after
// which the CREATE the charge was admitted for has ended (the claim exists
// or never will), plus a 30s margin for clock skew between the replica
// that wrote the entry and the one that drops it. Only then does a live
// read that finds no claim prove that the charge is not needed. Assumed: a
// cluster that raises --request-timeout raises the TTL too.
const MinTTL = 90 * time.Second

// maxPending bounds status.pending (the CRD's maxItems): beyond it claims
// get a Busy refusal (429, retry) until entries have expired and the
// reconciler has dropped them. Entries past their confirm window and not
// confirmed are not counted: the next write evicts them.
const maxPending = 1024

// maxUnconfirmed bounds the entries of one budget that no claim has
// confirmed yet and whose confirm window is still open: beyond it claims
// get a Busy refusal. Real claims are confirmed within a reconciler pass
// (about a second), so only a burst of forged reviews reaches it, and they
// can never hold more than this share of maxPending.
const maxUnconfirmed = 128

// maxStaleReads bounds the live reads of one charge for entries past their
// window (Charger.Lookup); those beyond it are dropped unread, as forged
// entries most likely are (the reconciler confirms real ones within a
// second or two).
const maxStaleReads = 32

// DefaultConfirmWindow is how long an admitted charge counts without a
// claim that confirms it (see PendingCharge.ConfirmBy). It assumes that
// the API server writes a claim within this long of its validating
// admission (milliseconds in practice: the admission is the last step
// before the etcd write). A write slower than that, or a reconciler that
// has not confirmed the entry by then, lets the next claim be charged
// without it: at worst one claim is admitted over the budget, and the late
// claim counts in used as soon as the informer holds it.
const DefaultConfirmWindow = 10 * time.Second

// rollbackTimeout bounds the removal of charges a later budget's refusal
// left behind; what it cannot remove expires with the TTL.
const rollbackTimeout = 5 * time.Second

// Charger is the admission of ResourceClaims against GPUBudgets (Admit).
// For each budget of the claim's namespace that the claim's charge touches,
// in name order, it reads the budget, refuses the claim when used + charge
// would exceed hard in a dimension the budget limits, else writes
// status.used += charge and a status.pending entry (claim, uid, charge,
// expires now+TTL) with UpdateStatus under the object's resourceVersion: a
// compare-and-swap, so two admissions (of this process, of another replica,
// or a reconciler's write) never both charge the same used. On a conflict
// it reads the budget again and retries until the review's context ends.
//
// Each entry carries a confirm window (ConfirmWindow, seconds): the
// reconciler marks it confirmed once a ResourceClaim of that namespace,
// name and uid is seen (its informer, or a live read). An entry not
// confirmed by the end of its window counts no more: the next charge reads
// used without it and drops it (tessera_gpu_budget_unconfirmed_charges_total
// counts it), so a review that no claim follows, such as one forged by a
// pod that reaches the webhook's Service, blocks the namespace's real
// claims for that window at most. Entries past their window are not
// counted against maxPending, and at most maxUnconfirmed entries of a
// budget may be unconfirmed at once.
//
// Within one process a budget's charges that find its lock free start from
// the object the last successful write returned, so charges in a row cost
// one write each; a charge that finds the lock taken does not wait for it
// (no review waits on another while holding a review slot): it starts from
// the cache and retries on conflicts, as replicas race through the
// resourceVersion. A refusal is only given on an object read from the API
// server in this admission (never on a cached one), so a stale cache does
// not refuse a claim that fits.
//
// A budget whose status.observedGeneration is not its generation (the
// reconciler has not counted it since it was created or changed) refuses
// every claim it would charge with a Busy error ("is being counted, retry
// in a few seconds"), read fresh before refusing, dry runs too.
//
// Dry runs are checked, never written. A claim already in a budget's
// pending list (a retried review) is not charged twice. If a later budget
// refuses, the entries written for the earlier ones are removed (best
// effort within rollbackTimeout; otherwise they expire).
//
// The budgets are listed from a cache (Store.List): a budget created a
// moment before a claim may not be charged for it; the reconciler counts
// the claim from then on.
type Charger struct {
	Store  Store
	Pricer *Pricer
	// TTL of pending entries; zero means DefaultTTL.
	TTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Metrics, when set, counts refusals.
	Metrics *Metrics
	// ConfirmWindow is how long a charge counts before a claim confirms
	// it; zero means DefaultConfirmWindow.
	ConfirmWindow time.Duration
	// Lookup, when set, reads a claim from the API server (its uid, or a
	// NotFound error): a charge past its confirm window whose claim it
	// finds keeps counting (and is confirmed), so that a reconciler that
	// has fallen behind never lets a real claim's charge go. An entry whose
	// read fails keeps counting. nil: such entries are dropped unread.
	Lookup func(ctx context.Context, namespace, name string) (types.UID, error)
	// Ready, when set, reports whether this process reconciles budgets
	// (Controller.Synced): until then nothing here would confirm the
	// charges it writes, so a claim a budget would charge gets a Busy
	// refusal (retry: another replica may answer).
	Ready func() bool

	mu    sync.Mutex
	locks map[string]*budgetLock
}

// budgetLock keeps, for one budget, the object the last write of this
// process returned (last: read and written only while sem is held), so
// that charges in a row cost one write each.
type budgetLock struct {
	sem  chan struct{}
	last *configapi.GPUBudget
}

// tryLock takes the lock of a budget if it is free, never waiting: a review
// that finds it held goes on without it (unlock nil), reading the budget
// from the cache and, on a conflict, from the API server, as a charge of
// another replica does. No review waits on another while it holds one of
// the server's review slots.
func (c *Charger) tryLock(namespace, name string) (l *budgetLock, unlock func()) {
	c.mu.Lock()
	if c.locks == nil {
		c.locks = map[string]*budgetLock{}
	}
	key := namespace + "/" + name
	l, ok := c.locks[key]
	if !ok {
		l = &budgetLock{sem: make(chan struct{}, 1)}
		c.locks[key] = l
	}
	c.mu.Unlock()
	select {
	case l.sem <- struct{}{}:
		return l, func() { <-l.sem }
	default:
		return nil, nil
	}
}

// Forget drops what the Charger keeps for a budget (its lock): called when
// the budget is deleted (WatchDeletions) or found gone.
func (c *Charger) Forget(namespace, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.locks, namespace+"/"+name)
}

// WatchDeletions makes the Charger Forget each budget that informer (of
// GPUBudgets) sees deleted.
func (c *Charger) WatchDeletions(informer cache.SharedIndexInformer) error {
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if m, err := metaAccessor(obj); err == nil {
			c.Forget(m.GetNamespace(), m.GetName())
		}
	}})
	return err
}

func (c *Charger) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Charger) confirmWindow() time.Duration {
	if c.ConfirmWindow > 0 {
		return c.ConfirmWindow
	}
	return DefaultConfirmWindow
}

func (c *Charger) ttl() time.Duration {
	if c.TTL > 0 {
		return c.TTL
	}
	return DefaultTTL
}

// Admit is the validating admission of a ResourceClaim CREATE (a
// webhook.AdmitFunc). Anything else is allowed. A refusal names used and
// hard only when the server verified that the review came from the API
// server (caller.Verified); otherwise it names the budget and the
// dimension, and where to read the figures (Refusal.Redacted).
func (c *Charger) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	allow := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation != admissionv1.Create || req.Resource.Group != resourceapi.GroupName || req.Resource.Resource != "resourceclaims" {
		return allow
	}
	var claim resourceapi.ResourceClaim
	if err := json.Unmarshal(req.Object.Raw, &claim); err != nil {
		return deny(req, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("GPU budgets: decode the ResourceClaim: %v", err))
	}
	if claim.Namespace == "" {
		claim.Namespace = req.Namespace
	}
	if claim.Name == "" {
		claim.Name = req.Name
	}
	dryRun := req.DryRun != nil && *req.DryRun
	err := c.ChargeClaim(ctx, &claim, dryRun)
	if err == nil {
		return allow
	}
	var refusal *Refusal
	if errors.As(err, &refusal) {
		c.Metrics.refused(refusal)
		message := err.Error()
		if _, verified := caller.Verified(ctx); !verified {
			// The review may come from any pod that reaches the Service:
			// no figure of the namespace's budget goes back to it.
			message = refusal.Redacted()
		}
		return deny(req, http.StatusForbidden, metav1.StatusReasonForbidden, message)
	}
	var busy *Busy
	if errors.As(err, &busy) {
		return deny(req, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, err.Error())
	}
	return deny(req, http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
}

func deny(req *admissionv1.AdmissionRequest, code int32, reason metav1.StatusReason, message string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: false,
		Result: &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: message}}
}

// Busy is the error of a claim that cannot be checked against a budget
// now, and may be created again in a few seconds.
type Busy struct {
	Namespace, Budget, Why string
}

func (b *Busy) Error() string {
	return fmt.Sprintf("GPU budget %s/%s %s, retry in a few seconds", b.Namespace, b.Budget, b.Why)
}

// ChargeClaim charges claim against every budget of its namespace that its
// charge touches (see Charger). The error is a *Refusal when a budget
// refuses it.
func (c *Charger) ChargeClaim(ctx context.Context, claim *resourceapi.ResourceClaim, dryRun bool) (err error) {
	defer recovered(ctx, fmt.Sprintf("GPU budgets: claim %s/%s", claim.Namespace, claim.Name), &err)
	logger := klog.FromContext(ctx)
	budgets, err := c.Store.List(ctx, claim.Namespace)
	if err != nil {
		return fmt.Errorf("GPU budgets of namespace %s: %w", claim.Namespace, err)
	}
	if len(budgets) == 0 {
		return nil
	}
	slices.SortFunc(budgets, func(a, b *configapi.GPUBudget) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	cc, err := c.Pricer.Price(ctx, &claim.Spec.Devices, classSizes(budgets))
	var costly *CostError
	if errors.As(err, &costly) {
		return &Refusal{Namespace: budgets[0].Namespace, Budget: budgets[0].Name, TooCostly: costly.Error()}
	}
	if err != nil {
		return fmt.Errorf("GPU budgets: claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	if missing := cc.MissingClass(); missing != nil {
		for _, b := range budgets {
			if limits(b.Spec.Hard).Any() {
				return &Refusal{Namespace: b.Namespace, Budget: b.Name, MissingClass: missing.Class, Request: missing.Name}
			}
		}
	}
	var charged []*configapi.GPUBudget
	for _, b := range budgets {
		charge := cc.For(b.Spec.DeviceClassName)
		if charge.IsZero() && len(charge.Unknown) == 0 {
			continue
		}
		if c.Ready != nil && !c.Ready() {
			if !dryRun {
				c.rollback(ctx, claim, charged)
			}
			return &Busy{Namespace: b.Namespace, Budget: b.Name, Why: "cannot be checked by this webhook replica yet (it is still reading the cluster's claims)"}
		}
		if err := c.charge(ctx, b, claim, charge, dryRun); err != nil {
			if !dryRun {
				c.rollback(ctx, claim, charged)
			}
			return err
		}
		logger.V(4).Info("Charged a GPU budget", "budget", klog.KObj(b), "claim", klog.KObj(claim), "uid", claim.UID, "charge", charge.Amount.String(), "dryRun", dryRun)
		charged = append(charged, b)
	}
	return nil
}

// ledger is a budget's status as a charge at now reads it: used without
// the entries that no claim confirmed within their window (stale), which
// count no more and which the next write drops, and the entries kept.
type ledger struct {
	used        Amount
	kept        []configapi.PendingCharge
	stale       int
	unconfirmed int
}

// isStale reports whether p stopped counting at now: not confirmed by a
// claim within its window.
func isStale(p *configapi.PendingCharge, now time.Time) bool {
	return !p.Confirmed && p.ConfirmBy != nil && !p.ConfirmBy.After(now)
}

// readLedger reads b at now; found holds what live reads found for stale
// entries (uid → the claim exists, or the read failed: it keeps counting).
func readLedger(b *configapi.GPUBudget, now time.Time, found map[string]bool) ledger {
	l := ledger{used: amount(b.Status.Used)}
	for i := range b.Status.Pending {
		p := &b.Status.Pending[i]
		var kept configapi.PendingCharge
		p.DeepCopyInto(&kept)
		if isStale(p, now) {
			if !found[p.UID] {
				l.used = l.used.Sub(amount(p.Charge))
				l.stale++
				continue
			}
			kept.Confirmed = true
		}
		if !kept.Confirmed && kept.ConfirmBy != nil {
			l.unconfirmed++
		}
		l.kept = append(l.kept, kept)
	}
	return l
}

// lookStale reads, for each entry of b past its window that found does not
// answer yet, whether its claim exists (Lookup), into found.
func (c *Charger) lookStale(ctx context.Context, b *configapi.GPUBudget, now time.Time, found map[string]bool) {
	if c.Lookup == nil {
		return
	}
	reads := 0
	for i := range b.Status.Pending {
		p := &b.Status.Pending[i]
		if _, ok := found[p.UID]; ok || !isStale(p, now) {
			continue
		}
		if reads >= maxStaleReads {
			found[p.UID] = false // past the bound: dropped unread
			continue
		}
		reads++
		uid, err := c.Lookup(ctx, b.Namespace, p.Claim)
		switch {
		case apierrors.IsNotFound(err):
			found[p.UID] = false
		case err != nil:
			found[p.UID] = true // unknown: keep counting it
		default:
			found[p.UID] = string(uid) == p.UID
		}
	}
}

// charge charges one budget (see Charger).
func (c *Charger) charge(ctx context.Context, cached *configapi.GPUBudget, claim *resourceapi.ResourceClaim, charge Charge, dryRun bool) error {
	l, unlock := c.tryLock(cached.Namespace, cached.Name)
	if unlock != nil {
		defer unlock()
	}
	gone := func() error {
		c.Forget(cached.Namespace, cached.Name)
		return nil
	}
	base := cached
	if l != nil && l.last != nil && l.last.UID == cached.UID && !dryRun {
		// A write from a stale object fails (its resourceVersion) and the
		// budget is read again; a dry run writes nothing, so it starts
		// from the cache, which another writer's change reaches.
		base = l.last
	}
	fresh := false
	found := map[string]bool{}
	reread := func() error {
		got, err := c.Store.Get(ctx, cached.Namespace, cached.Name)
		if err != nil {
			return err
		}
		base, fresh = got, true
		return nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("GPU budget %s/%s: %w", cached.Namespace, cached.Name, err)
		}
		if claim.UID != "" && slices.ContainsFunc(base.Status.Pending, func(p configapi.PendingCharge) bool { return p.UID == string(claim.UID) }) {
			return nil // charged by an earlier review of this claim
		}
		if base.Status.ObservedGeneration != base.Generation {
			// Never counted for this spec (a new budget, a changed
			// deviceClassName): used is not what the claims take yet.
			if !fresh {
				if err := reread(); err != nil {
					if apierrors.IsNotFound(err) {
						return gone()
					}
					return fmt.Errorf("GPU budget %s/%s: read: %w", cached.Namespace, cached.Name, err)
				}
				continue
			}
			return &Busy{Namespace: base.Namespace, Budget: base.Name, Why: "is being counted"}
		}
		now := c.now()
		c.lookStale(ctx, base, now, found)
		ledger := readLedger(base, now, found)
		refusal := Check(base.Namespace, base.Name, limits(base.Spec.Hard), ledger.used, charge)
		var busy *Busy
		switch {
		case refusal != nil:
		case len(ledger.kept) >= maxPending:
			// The pending list is full: its entries leave as they expire
			// (the reconciler requeues the namespace at the earliest).
			busy = &Busy{Namespace: base.Namespace, Budget: base.Name, Why: "has as many claims being admitted as it records"}
		case ledger.unconfirmed >= maxUnconfirmed:
			// Unconfirmed entries leave (or are confirmed) within the
			// confirm window.
			busy = &Busy{Namespace: base.Namespace, Budget: base.Name, Why: "has as many admitted claims not seen yet as it records"}
		}
		if busy != nil {
			if fresh {
				return busy
			}
			refusal = &Refusal{} // read again before refusing
		}
		if refusal != nil {
			if fresh {
				return refusal
			}
			if err := reread(); err != nil {
				if apierrors.IsNotFound(err) {
					return gone()
				}
				return fmt.Errorf("GPU budget %s/%s: read: %w", cached.Namespace, cached.Name, err)
			}
			continue
		}
		if dryRun {
			return nil
		}
		update := base.DeepCopy()
		update.Status.Used = apiAmount(ledger.used.Add(charge.Amount))
		update.Status.Pending = ledger.kept
		update.Status.Pending = append(update.Status.Pending, configapi.PendingCharge{
			Claim:     claim.Name,
			UID:       string(claim.UID),
			Charge:    apiAmount(charge.Amount),
			Expires:   metav1.NewTime(now.Add(c.ttl()).Truncate(time.Second)),
			ConfirmBy: ptr.To(metav1.NewTime(now.Add(c.confirmWindow()).Truncate(time.Second))),
		})
		written, err := c.Store.UpdateStatus(ctx, update)
		if err == nil {
			c.Metrics.unconfirmed(base.Namespace, base.Name, ledger.stale)
			if l != nil {
				l.last = written
			}
			return nil
		}
		if apierrors.IsNotFound(err) {
			return gone() // deleted since it was read: nothing to charge
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("GPU budget %s/%s: charge claim %s: %w", cached.Namespace, cached.Name, claim.Name, err)
		}
		if err := reread(); err != nil {
			if apierrors.IsNotFound(err) {
				return gone()
			}
			return fmt.Errorf("GPU budget %s/%s: read after a conflict: %w", cached.Namespace, cached.Name, err)
		}
	}
}

// classSizes are the sizes budgets declare and persisted, merged.
func classSizes(budgets []*configapi.GPUBudget) []configapi.ClassSize {
	var out []configapi.ClassSize
	for _, b := range budgets {
		out = MergeClassSizes(out, MergeClassSizes(b.Spec.ClassSizes, b.Status.ClassSizes))
	}
	return out
}

// rollback removes the pending entries of claim from budgets, and their
// charges from used.
func (c *Charger) rollback(ctx context.Context, claim *resourceapi.ResourceClaim, budgets []*configapi.GPUBudget) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	for _, b := range budgets {
		if err := c.uncharge(ctx, b, claim); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot remove a charge; it expires with its TTL", "budget", klog.KObj(b), "claim", klog.KObj(claim))
		}
	}
}

func (c *Charger) uncharge(ctx context.Context, cached *configapi.GPUBudget, claim *resourceapi.ResourceClaim) error {
	l, unlock := c.tryLock(cached.Namespace, cached.Name)
	var base *configapi.GPUBudget
	if unlock != nil {
		defer unlock()
		base = l.last
	}
	for {
		if base == nil || base.UID != cached.UID {
			got, err := c.Store.Get(ctx, cached.Namespace, cached.Name)
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			base = got
		}
		i := slices.IndexFunc(base.Status.Pending, func(p configapi.PendingCharge) bool { return p.UID == string(claim.UID) })
		if i < 0 {
			return nil
		}
		update := base.DeepCopy()
		update.Status.Used = apiAmount(amount(update.Status.Used).Sub(amount(update.Status.Pending[i].Charge)))
		update.Status.Pending = slices.Delete(update.Status.Pending, i, i+1)
		written, err := c.Store.UpdateStatus(ctx, update)
		if err == nil {
			if l != nil {
				l.last = written
			}
			return nil
		}
		if !apierrors.IsConflict(err) {
			return err
		}
		base = nil
	}
}
