package budget

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// Reconciler keeps each GPUBudget's status equal to what the claims of its
// namespace take. For a budget it computes
//
//	used = Σ charge(claim) over the ResourceClaims its informer holds in the namespace
//	     + Σ charge of the pending entries whose claim the informer does not hold
//
// and writes the status with UpdateStatus under the resourceVersion it
// computed from; on a conflict it reads the budget again and recomputes.
//
// A pending entry whose claim the informer holds, or a live read finds, is
// marked confirmed; one not confirmed by its ConfirmBy is dropped (no claim
// followed its admission: see Charger). A confirmed pending entry is never
// dropped merely because this replica's informer holds its claim: another replica, whose informer has not seen the claim
// yet, reads this write and must still count it. An entry leaves only once
// it has expired (TTL, at least MinTTL: past the API server's request
// timeout, so the claim's CREATE has ended one way or the other) and either
// this informer holds its claim (it is counted as a claim here, and every
// informer that lags less than the TTL holds it too) or a live read of the
// claim (Lookup) finds none of that uid (its creation failed, or it was
// deleted). An expired entry whose claim exists but is not in this informer
// stays and counts. So used never falls below a charge the webhook admitted,
// in either replica's write, as long as informers lag less than the TTL.
// Claims being deleted count until they are gone, as with ResourceQuota.
// Until it catches up, used may be above what the claims take (a claim
// deleted, a creation that failed, an entry whose claim is also counted by
// another replica), never below.
//
// No leader election: every write is a compare-and-swap on the
// resourceVersion of the object the status was computed from, so two
// replicas (or a replica and the Charger) never overwrite each other's
// charge; the loser recomputes from the fresh object.
//
// It recomputes a namespace on changes to its claims or budgets (debounced:
// changes within Debounce make one pass) and every Resync. Changing a
// budget's annotation gpu.tessera.dev/resync makes every replica
// recompute it at once and write its status (status.lastReconciled) even
// when nothing changed.
type Reconciler struct {
	Store  Store
	Pricer *Pricer
	// Claims lists the ResourceClaims of a namespace from a cache.
	Claims func(namespace string) ([]*resourceapi.ResourceClaim, error)
	// Lookup reads a claim from the API server (not a cache): its uid, or a
	// NotFound error. nil: no pending entry of a claim the informer does
	// not hold is ever dropped.
	Lookup func(ctx context.Context, namespace, name string) (types.UID, error)
	// Now is the clock; nil means time.Now.
	Now     func() time.Time
	Metrics *Metrics
	// Device, when set, finds a published device by pool and name: an
	// allocated claim is then counted at what it was allocated (see
	// count). nil: claims are counted at their price.
	Device func(pool, name string) (*resourceapi.Device, bool)
	// Enforced, when set, tells whether the budget webhook sees the claims
	// of namespace (its namespaceSelector) and, when not, why: the
	// budget's Enforced condition says it.
	Enforced func(ctx context.Context, namespace string) (bool, string, error)
	// Requeue, when set, asks for namespace to be reconciled again after
	// a while: called after each budget's pass with the time until its
	// earliest pending entry expires (plus a second), so that entries
	// leave on time and a full pending list frees up.
	Requeue func(namespace string, after time.Duration)

	mu sync.Mutex
	// forced is the resync annotation each budget had when it was last
	// written, by namespace/name.
	forced map[string]string
	// deleted are the uids of claims the informer saw deleted, with when
	// (ClaimDeleted); kept deletedKeep.
	deleted map[string]time.Time
}

// deletedKeep is how long the uid of a deleted claim is remembered: past
// the TTL of the pending entries it may have (DefaultTTL); an entry that
// outlives it is checked with a live read instead.
const deletedKeep = time.Hour

// ClaimDeleted records that the informer saw the claim of uid deleted: a
// pending entry of that uid is dropped once expired without a live read
// (a uid is never reused).
func (r *Reconciler) ClaimDeleted(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.deleted == nil {
		r.deleted = map[string]time.Time{}
	}
	r.deleted[string(uid)] = r.now()
}

// wasDeleted reports whether the informer saw the claim of uid deleted.
func (r *Reconciler) wasDeleted(uid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.deleted[uid]
	return ok
}

// pruneDeleted forgets the deleted uids older than deletedKeep.
func (r *Reconciler) pruneDeleted(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, at := range r.deleted {
		if now.Sub(at) > deletedKeep {
			delete(r.deleted, uid)
		}
	}
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile recomputes every budget of namespace. A panic is its error (see
// recovered): the Controller retries the namespace and goes on with others.
func (r *Reconciler) Reconcile(ctx context.Context, namespace string) (err error) {
	defer recovered(ctx, "GPU budgets of "+namespace, &err)
	budgets, err := r.Store.List(ctx, namespace)
	if err != nil {
		return err
	}
	// Series of budgets deleted since they were recorded go, also when the
	// namespace has none left.
	names := map[string]bool{}
	for _, b := range budgets {
		names[b.Name] = true
	}
	r.Metrics.retain(namespace, names)
	r.mu.Lock()
	for key := range r.forced {
		if ns, name, _ := strings.Cut(key, "/"); ns == namespace && !names[name] {
			delete(r.forced, key)
		}
	}
	r.mu.Unlock()
	if len(budgets) == 0 {
		return nil
	}
	r.pruneDeleted(r.now())
	pass := &pass{namespace: namespace, priced: map[types.UID]ClaimCharge{}, checked: map[string]bool{}, logged: map[string]bool{},
		known: classSizes(budgets), classes: map[string]bool{}}
	if r.Enforced != nil {
		// A failed read leaves the condition as it is: counting goes on.
		ok, why, err := r.Enforced(ctx, namespace)
		if err != nil {
			r.Metrics.failed("namespace_read")
			klog.FromContext(ctx).Error(err, "Cannot tell whether the budget webhook selects a namespace; its budgets' Enforced condition stays as it is", "namespace", namespace)
		} else {
			pass.enforced, pass.notEnforced = &ok, why
		}
	}
	var errs []error
	for _, b := range budgets {
		if err := r.reconcileBudget(ctx, pass, b); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("GPU budgets of %s: %v", namespace, errs)
	}
	return nil
}

// pass is what one Reconcile of a namespace keeps between its budgets: the
// charge of each claim priced so far, by uid (a claim's spec is immutable),
// and whether the claim of each pending entry read live so far is gone
// (checked, by uid), so that budgets sharing an entry cost one read.
type pass struct {
	namespace string
	priced    map[types.UID]ClaimCharge
	checked   map[string]bool
	// logged are the reasons of the read errors logged in this pass.
	logged map[string]bool
	// known are the class sizes the namespace's budgets declare and
	// persisted; classes, the classes its claims name.
	known   []configapi.ClassSize
	classes map[string]bool
	// enforced (nil: not known) and why not.
	enforced    *bool
	notEnforced string
}

// maxClassSizes bounds status.classSizes (the CRD's maxItems).
const maxClassSizes = 64

// maxOverrunsNamed bounds the claims an AllocationOverran message names.
const maxOverrunsNamed = 5

// count is what the claims the informer holds now take from budget b (as
// b's spec says now): used, the uids held, the dimensions in which some
// claim's size is unknown, and the claims allocated more than their price
// (overran). A claim is counted at its price (the Pricer's, with the class
// sizes the budgets know), or, once allocated and every device it got is
// published (Device), at what it was allocated: a claim priced at a small
// GPU and allocated a large one (a pool scaled up between) counts as the
// large one, so later claims see it.
func (r *Reconciler) count(ctx context.Context, p *pass, b *configapi.GPUBudget) (Amount, map[string]bool, map[Resource]bool, []string, error) {
	claims, err := r.Claims(p.namespace)
	if err != nil {
		return Amount{}, nil, nil, nil, fmt.Errorf("list the ResourceClaims of %s: %w", p.namespace, err)
	}
	var used Amount
	held := map[string]bool{}
	unknown := map[Resource]bool{}
	var overran []string
	for _, c := range claims {
		held[string(c.UID)] = true
		cc, ok := p.priced[c.UID]
		if !ok {
			cc, err = r.Pricer.Price(ctx, &c.Spec.Devices, p.known)
			var costly *CostError
			if errors.As(err, &costly) {
				// Created before the budget, or before this bound: its
				// size is unknown, used is not lowered for it.
				for _, res := range Resources {
					unknown[res] = true
				}
				continue
			}
			if err != nil {
				return Amount{}, nil, nil, nil, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
			}
			p.priced[c.UID] = cc
		}
		for _, req := range cc {
			for _, a := range req.Alternatives {
				if a.Class != "" && len(p.classes) < maxClassSizes {
					p.classes[a.Class] = true
				}
			}
		}
		charge := cc.For(b.Spec.DeviceClassName)
		if alloc, ok := r.allocated(ctx, c, b.Spec.DeviceClassName); ok {
			for _, res := range Resources {
				if alloc.Get(res) > charge.Get(res) {
					overran = append(overran, fmt.Sprintf("%s (%s %s, priced %s)", c.Name, res, format(res, alloc.Get(res)), format(res, charge.Get(res))))
					break
				}
			}
			charge = Charge{Amount: alloc}
		}
		used = used.Add(charge.Amount)
		for res := range charge.Unknown {
			unknown[res] = true
		}
	}
	return used, held, unknown, overran, nil
}

// allocated is what claim c was allocated of the devices a budget of class
// counts, false when it is not allocated or a device it got is not
// published now (it is then counted at its price).
func (r *Reconciler) allocated(ctx context.Context, c *resourceapi.ResourceClaim, class string) (Amount, bool) {
	if r.Device == nil || c.Status.Allocation == nil {
		return Amount{}, false
	}
	var out Amount
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver != modelnames.DriverName {
			continue
		}
		reqClass := requestClass(&c.Spec.Devices, res.Request)
		if class != "" && reqClass != class {
			continue
		}
		d, ok := r.Device(res.Pool, res.Device)
		if !ok {
			return Amount{}, false
		}
		memory, _ := capacityValue(d, modelnames.Memory)
		var a Amount
		switch typeOf(d) {
		case modelnames.TypeWhole:
			a = Amount{Memory: memory, Cores: modelnames.CoresPerGPU, GPUs: 1}
		case modelnames.TypeShared, modelnames.TypeLent:
			if q, ok := res.ConsumedCapacity[modelnames.Memory]; ok {
				memory = max(quantityValue(q), 0)
			}
			var cores int64
			if q, ok := res.ConsumedCapacity[modelnames.Cores]; ok {
				cores = max(quantityValue(q), 0)
			}
			var limit *int64
			if cls, err := r.Pricer.classes(ctx, reqClass); err == nil {
				limit = computeLimit(cls, c.Spec.Devices.Config, res.Request)
			}
			a = Amount{Memory: memory, Cores: shareCoresUsable(cores, limit)}
		default:
			cores, ok := capacityValue(d, modelnames.Cores)
			if !ok {
				cores = modelnames.CoresPerGPU
			}
			a = Amount{Memory: memory, Cores: cores}
		}
		out = out.Add(a)
	}
	return out, true
}

// requestClass is the DeviceClass of request name (request or
// request/subrequest) of devices, "" when there is none.
func requestClass(devices *resourceapi.DeviceClaim, name string) string {
	parent, sub, hasSub := strings.Cut(name, "/")
	for _, r := range devices.Requests {
		if r.Name != parent {
			continue
		}
		if !hasSub && r.Exactly != nil {
			return r.Exactly.DeviceClassName
		}
		for _, s := range r.FirstAvailable {
			if s.Name == sub {
				return s.DeviceClassName
			}
		}
	}
	return ""
}

// Status is the status of budget b given what the claims the informer
// holds take (claims), the uids it holds (held) and what live reads found
// for entries it does not hold (gone: uid → true when the claim is gone,
// false when a claim of that uid exists), at now. It also returns how many
// entries it dropped unconfirmed. Each pending entry is
//
//   - not confirmed yet (it has a ConfirmBy and not Confirmed): confirmed
//     when its claim is held or was found; else, past ConfirmBy, dropped
//     (no claim followed its admission in time: it counts no more); else
//     kept and counted;
//   - dropped once expired, when its claim is held or gone;
//   - kept, not counted, while its claim is held (the claim is counted);
//   - kept and counted otherwise.
func Status(b *configapi.GPUBudget, claims Amount, held, gone map[string]bool, now time.Time) (configapi.GPUBudgetStatus, int) {
	used := claims
	var pending []configapi.PendingCharge
	dropped := 0
	for _, p := range b.Status.Pending {
		isGone, read := gone[p.UID]
		var kept configapi.PendingCharge
		p.DeepCopyInto(&kept)
		if !p.Confirmed && p.ConfirmBy != nil {
			switch {
			case held[p.UID] || (read && !isGone):
				kept.Confirmed = true
			case isStale(&p, now):
				dropped++
				continue
			}
		}
		expired := !p.Expires.Time.After(now)
		if expired && (held[p.UID] || (read && isGone)) {
			continue
		}
		pending = append(pending, kept)
		if !held[p.UID] {
			used = used.Add(amount(p.Charge))
		}
	}
	return configapi.GPUBudgetStatus{
		Used:               apiAmount(used),
		Pending:            pending,
		ObservedGeneration: b.Generation,
		LastReconciled:     b.Status.LastReconciled,
		ClassSizes:         b.Status.ClassSizes,
		Conditions:         b.Status.Conditions,
	}, dropped
}

// gone reads, for each pending entry of b whose claim the informer does
// not hold and that has expired or is past its confirm window, whether the
// claim is gone (true: a live read finds none of its name, or one of
// another uid) or exists (false). An entry whose read fails is kept; the
// failure is counted (tessera_gpu_budget_errors_total, reason
// claim_read_forbidden or claim_read) and logged once per pass and reason.
// pass.checked holds the answers of earlier reads in this pass.
func (r *Reconciler) gone(ctx context.Context, pass *pass, b *configapi.GPUBudget, held map[string]bool, now time.Time) map[string]bool {
	checked := pass.checked
	out := map[string]bool{}
	for _, p := range b.Status.Pending {
		if held[p.UID] || r.Lookup == nil || (p.Expires.Time.After(now) && !isStale(&p, now)) {
			continue
		}
		isGone, ok := checked[p.UID]
		if !ok && r.wasDeleted(p.UID) {
			isGone, ok = true, true
		}
		if !ok {
			uid, err := r.Lookup(ctx, b.Namespace, p.Claim)
			switch {
			case apierrors.IsNotFound(err):
				isGone = true
			case err != nil:
				reason := "claim_read"
				if apierrors.IsForbidden(err) {
					reason = "claim_read_forbidden"
				}
				r.Metrics.failed(reason)
				if !pass.logged[reason] {
					pass.logged[reason] = true
					klog.FromContext(ctx).Error(err, "Cannot read the claim of an expired pending charge; keeping the charge (logged once per pass)",
						"budget", klog.KObj(b), "claim", p.Claim, "forbidden", apierrors.IsForbidden(err))
				}
				continue
			default:
				isGone = string(uid) != p.UID
			}
			checked[p.UID] = isGone
		}
		out[p.UID] = isGone
	}
	return out
}

func sameStatus(a, b configapi.GPUBudgetStatus) bool {
	a.LastReconciled, b.LastReconciled = nil, nil
	if len(a.Pending) == 0 && len(b.Pending) == 0 {
		a.Pending, b.Pending = nil, nil
	}
	return equality.Semantic.DeepEqual(a, b)
}

// reconcileBudget writes b's status (Status). In a dimension where some
// claim's size is unknown (unknown: no device its class matches is
// published now and this process never saw one), used is not lowered below
// what the status says: slices briefly gone must not free budget.
//
// used, held and unknown are computed from the informer for the budget as
// read in each attempt: after a conflict the budget read again may have
// another spec (deviceClassName) and generation, and claims may have come
// or gone since.
func (r *Reconciler) reconcileBudget(ctx context.Context, p *pass, b *configapi.GPUBudget) error {
	logger := klog.FromContext(ctx)
	key := b.Namespace + "/" + b.Name
	for attempt := 1; ; attempt++ {
		claims, held, unknown, overran, err := r.count(ctx, p, b)
		if err != nil {
			return err
		}
		token := b.Annotations[configapi.GPUBudgetResyncAnnotation]
		r.mu.Lock()
		seen, known := r.forced[key]
		r.mu.Unlock()
		forced := token != "" && (!known || seen != token)
		now := r.now()
		status, dropped := Status(b, claims, held, r.gone(ctx, p, b, held, now), now)
		if len(unknown) > 0 {
			used, was := amount(status.Used), amount(b.Status.Used)
			for res := range unknown {
				used.set(res, max(used.Get(res), was.Get(res)))
			}
			status.Used = apiAmount(used)
		}
		r.annotate(p, b, &status, overran, now)
		if !forced && sameStatus(status, b.Status) {
			r.Metrics.observe(b)
			r.requeue(b.Namespace, status.Pending, now)
			return nil
		}
		update := b.DeepCopy()
		update.Status = status
		update.Status.LastReconciled = &metav1.Time{Time: now.Truncate(time.Second)}
		written, err := r.Store.UpdateStatus(ctx, update)
		if err == nil {
			r.Metrics.unconfirmed(b.Namespace, b.Name, dropped)
			logger.V(3).Info("Reconciled a GPU budget", "budget", klog.KObj(b), "used", amount(status.Used).String(), "pending", len(status.Pending), "forced", forced)
			r.mu.Lock()
			if r.forced == nil {
				r.forced = map[string]string{}
			}
			r.forced[key] = token
			r.mu.Unlock()
			r.Metrics.observe(written)
			r.requeue(b.Namespace, status.Pending, now)
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("GPU budget %s: write status: %w", key, err)
		}
		if attempt >= maxAttempts {
			// The Controller retries the namespace, rate limited.
			return fmt.Errorf("GPU budget %s: write status: %d conflicts in a row: %w", key, attempt, err)
		}
		namespace, name := b.Namespace, b.Name
		b, err = r.Store.Get(ctx, namespace, name)
		if apierrors.IsNotFound(err) {
			r.Metrics.forget(namespace, name)
			r.mu.Lock()
			delete(r.forced, key)
			r.mu.Unlock()
			return nil
		}
		if err != nil {
			return fmt.Errorf("GPU budget %s: read after a conflict: %w", key, err)
		}
	}
}

// annotate sets status's classSizes (the largest seen for the classes of
// the namespace's claims and of the budget, merged into those persisted:
// never lowered) and its conditions: Enforced, and AllocationOverran while
// some claim was allocated more than its price.
func (r *Reconciler) annotate(p *pass, b *configapi.GPUBudget, status *configapi.GPUBudgetStatus, overran []string, now time.Time) {
	sizes := status.ClassSizes
	classes := slices.Sorted(maps.Keys(p.classes))
	if b.Spec.DeviceClassName != "" {
		classes = append(classes, b.Spec.DeviceClassName)
	}
	for _, class := range classes {
		sizes = MergeClassSizes(sizes, r.Pricer.Seen(class))
	}
	if len(sizes) > maxClassSizes {
		sizes = sizes[:maxClassSizes]
	}
	status.ClassSizes = sizes
	conditions := slices.Clone(status.Conditions)
	at := metav1.NewTime(now.Truncate(time.Second))
	if p.enforced != nil {
		c := metav1.Condition{Type: configapi.BudgetEnforced, Status: metav1.ConditionTrue, Reason: "Selected",
			Message: "the budget webhook charges this namespace's claims", ObservedGeneration: b.Generation, LastTransitionTime: at}
		if !*p.enforced {
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, configapi.BudgetNotEnforced, p.notEnforced
		}
		meta.SetStatusCondition(&conditions, c)
	}
	if len(overran) > 0 {
		named := overran[:min(len(overran), maxOverrunsNamed)]
		msg := fmt.Sprintf("%d claims were allocated more than they were priced at admission and count at their allocation: %s", len(overran), strings.Join(named, ", "))
		meta.SetStatusCondition(&conditions, metav1.Condition{Type: configapi.BudgetAllocationOverran, Status: metav1.ConditionTrue,
			Reason: "AllocatedLarger", Message: msg, ObservedGeneration: b.Generation, LastTransitionTime: at})
	} else {
		meta.RemoveStatusCondition(&conditions, configapi.BudgetAllocationOverran)
	}
	if len(conditions) == 0 {
		conditions = nil
	}
	status.Conditions = conditions
}

// maxAttempts bounds the status writes of one budget in one pass: under
// a stream of charges each write may conflict; the namespace is then
// retried later (rate limited) instead of holding a worker.
const maxAttempts = 5

// DefaultSyncTimeout is how long the Controller waits for its caches before
// it logs that they have not synced (missing list or watch permission
// never lets them), and again each time as long after.
const DefaultSyncTimeout = 2 * time.Minute

// Workers is how many namespaces a Controller reconciles at once; the
// workqueue never hands out one namespace to two workers at once.
const Workers = 4

// requeue calls Requeue for the earliest of pending to expire after now.
func (r *Reconciler) requeue(namespace string, pending []configapi.PendingCharge, now time.Time) {
	if r.Requeue == nil {
		return
	}
	var next time.Time
	for _, p := range pending {
		if t := p.Expires.Time; t.After(now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
		if p.ConfirmBy != nil && !p.Confirmed {
			if t := p.ConfirmBy.Time; t.After(now) && (next.IsZero() || t.Before(next)) {
				next = t
			}
		}
	}
	if !next.IsZero() {
		r.Requeue(namespace, next.Sub(now)+time.Second)
	}
}

// Controller runs a Reconciler on informers of ResourceClaims and
// GPUBudgets (Run).
type Controller struct {
	Reconciler *Reconciler
	// Resync is how often every namespace with a budget is recomputed.
	Resync time.Duration
	// Debounce is how long changes are gathered before a namespace is
	// recomputed.
	Debounce time.Duration
	// SyncTimeout is how often Run logs while the informers' first sync
	// has not happened (zero: DefaultSyncTimeout).
	SyncTimeout time.Duration

	budgets *DynamicStore
	claims  informers.SharedInformerFactory
	lister  resourcelisters.ResourceClaimLister
	synced  cache.InformerSynced
	queue   workqueue.TypedRateLimitingInterface[string]
	ready   atomic.Bool
}

// Synced reports whether the Controller's caches have synced and it
// reconciles: before, nothing confirms the charges this replica admits.
func (c *Controller) Synced() bool { return c.ready.Load() }

// NewController wires a Reconciler to informers over client's ResourceClaims
// and store's GPUBudgets. It needs get, list and watch on resourceclaims.
func NewController(client kubernetes.Interface, store *DynamicStore, pricer *Pricer, metrics *Metrics, resync time.Duration) *Controller {
	factory := informers.NewSharedInformerFactory(client, 0)
	informer := factory.Resource().V1().ResourceClaims()
	// Only what charges read: drop managed fields, and of the status all
	// but the devices allocated (what an allocated claim is counted at).
	_ = informer.Informer().SetTransform(func(obj any) (any, error) {
		if c, ok := obj.(*resourceapi.ResourceClaim); ok {
			c.ManagedFields = nil
			var allocation *resourceapi.AllocationResult
			if a := c.Status.Allocation; a != nil {
				allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: a.Devices.Results}}
			}
			c.Status = resourceapi.ResourceClaimStatus{Allocation: allocation}
		}
		return obj, nil
	})
	lister := informer.Lister()
	c := &Controller{
		Resync:   resync,
		Debounce: time.Second,
		budgets:  store,
		claims:   factory,
		lister:   lister,
		synced:   informer.Informer().HasSynced,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu-budgets"}),
	}
	c.Reconciler = &Reconciler{
		Store:   store,
		Pricer:  pricer,
		Metrics: metrics,
		Claims: func(namespace string) ([]*resourceapi.ResourceClaim, error) {
			return lister.ResourceClaims(namespace).List(labels.Everything())
		},
		// It needs get on resourceclaims.
		Lookup: func(ctx context.Context, namespace, name string) (types.UID, error) {
			c, err := client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			return c.UID, nil
		},
	}
	c.Reconciler.Requeue = func(namespace string, after time.Duration) { c.queue.AddAfter(namespace, after) }
	later := func(obj any) {
		if ns, ok := namespaceOf(obj); ok {
			c.queue.AddAfter(ns, c.Debounce)
		}
	}
	_, _ = informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: later,
		UpdateFunc: func(old, obj any) {
			o, ok1 := old.(*resourceapi.ResourceClaim)
			n, ok2 := obj.(*resourceapi.ResourceClaim)
			if ok1 && ok2 && !equality.Semantic.DeepEqual(o.Status.Allocation, n.Status.Allocation) {
				later(obj) // allocated (counted at its allocation) or deallocated
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if m, err := metaAccessor(obj); err == nil {
				c.Reconciler.ClaimDeleted(m.GetUID())
			}
			later(obj)
		},
	})
	_, _ = store.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueNow(obj) },
		DeleteFunc: later,
		UpdateFunc: func(old, obj any) {
			o, err1 := FromUnstructured(old)
			n, err2 := FromUnstructured(obj)
			if err1 == nil && err2 == nil && (o.Generation != n.Generation ||
				o.Annotations[configapi.GPUBudgetResyncAnnotation] != n.Annotations[configapi.GPUBudgetResyncAnnotation]) {
				c.enqueueNow(obj)
				return
			}
			later(obj)
		},
	})
	return c
}

func (c *Controller) enqueueNow(obj any) {
	if ns, ok := namespaceOf(obj); ok {
		c.queue.Add(ns)
	}
}

func namespaceOf(obj any) (string, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := metaAccessor(obj)
	if err != nil {
		return "", false
	}
	return m.GetNamespace(), true
}

func metaAccessor(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", obj)
	}
	return m, nil
}

// Run starts the informers (and the store's) and reconciles until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("gpu-budgets")
	ctx = klog.NewContext(ctx, logger)
	defer c.queue.ShutDown()
	c.claims.Start(ctx.Done())
	c.budgets.Start(ctx)
	timeout := c.SyncTimeout
	if timeout <= 0 {
		timeout = DefaultSyncTimeout
	}
	for {
		syncCtx, cancel := context.WithTimeout(ctx, timeout)
		synced := cache.WaitForCacheSync(syncCtx.Done(), c.synced, c.budgets.Informer().HasSynced)
		cancel()
		if synced {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// Keep waiting, and serving: until then the Charger answers
		// budget reviews with a retry (Synced), the other paths as usual.
		logger.Error(nil, "The caches of ResourceClaims and GPUBudgets have not synced yet; budget reviews get a retry until they have: may the service account list and watch resourceclaims and gpubudgets?", "waited", timeout)
	}
	c.ready.Store(true)
	logger.Info("Reconciling GPU budgets", "resync", c.Resync)
	go func() {
		if c.Resync <= 0 {
			return
		}
		ticker := time.NewTicker(c.Resync)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				c.enqueueAll()
			}
		}
	}()
	c.enqueueAll()
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	var wg sync.WaitGroup
	for range Workers {
		wg.Go(func() {
			for c.next(ctx) {
			}
		})
	}
	wg.Wait()
	return nil
}

// next reconciles the next namespace of the queue; false once the queue is
// shut down.
func (c *Controller) next(ctx context.Context) bool {
	ns, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(ns)
	if err := c.Reconciler.Reconcile(ctx, ns); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot reconcile the GPU budgets of a namespace; retrying", "namespace", ns)
		c.queue.AddRateLimited(ns)
		return true
	}
	c.queue.Forget(ns)
	return true
}

// enqueueAll queues every namespace that has a budget now.
func (c *Controller) enqueueAll() {
	var namespaces []string
	for _, obj := range c.budgets.Informer().GetStore().List() {
		if ns, ok := namespaceOf(obj); ok && !slices.Contains(namespaces, ns) {
			namespaces = append(namespaces, ns)
		}
	}
	for _, ns := range namespaces {
		c.queue.Add(ns)
	}
}
