package locality

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
)

// FieldManager names the controller as the writer of its verdicts.
const FieldManager = configapi.GroupName + "/locality"

// StatusWriter writes a claim's status.devices, guarded by the claim's
// resourceVersion: a claim changed since it was read is a Conflict error and
// nothing is written.
type StatusWriter interface {
	WriteDevices(ctx context.Context, claim *resourceapi.ResourceClaim, devices []resourceapi.AllocatedDeviceStatus) error
}

// APIWriter is the StatusWriter of the API server: a JSON merge patch of the
// claim's status.devices with its uid and resourceVersion as preconditions.
// Not server-side apply, for the reason pkg/plugin's patchDevices gives (an
// apply re-encodes status.allocation and is refused).
type APIWriter struct {
	Client kubernetes.Interface
}

// WriteDevices implements StatusWriter.
func (w APIWriter) WriteDevices(ctx context.Context, claim *resourceapi.ResourceClaim, devices []resourceapi.AllocatedDeviceStatus) error {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": claim.ResourceVersion, "uid": claim.UID},
		"status":   map[string]any{"devices": devices},
	})
	if err != nil {
		return err
	}
	_, err = w.Client.ResourceV1().ResourceClaims(claim.Namespace).Patch(ctx, claim.Name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: FieldManager}, "status")
	return err
}

// Controller judges the shares of every claim allocated on a shared device
// with the locality binding conditions, one claim at a time.
//
// What the caller may assume:
//
//   - Two claims placed on one GPU at the same time are never both accepted
//     when together they break a rule: sync is the only place that accepts,
//     it runs on one goroutine, and it records an accepted claim in the
//     ledger before it writes the verdict, so the next claim is judged
//     against it even when the write fails or is slow (a claim reserved this
//     way and not written is written again when its claim is synced again).
//   - At start (Run), the ledger is rebuilt from every claim before the
//     first verdict: accepted claims, claims the node prepared (the kubelet
//     plugin drops the verdict from the status when it writes its own) and
//     shares of devices without binding conditions all count.
//   - Only one Controller may run at a time (leader election, RunLeader).
//   - A claim deallocated or deleted leaves the ledger when its change is
//     synced; until then it still counts (a later claim may be rejected
//     needlessly and is allocated again; never the other way round).
type Controller struct {
	Writer StatusWriter
	// Now is the clock of condition timestamps and fences; nil is time.Now.
	Now func() time.Time
	// Fences steers a rejected claim away from the GPU it was rejected on
	// (see fence.go); nil: no steering.
	Fences FenceWriter
	// FenceTTL and MaxFencesPerClaim; zero: DefaultFenceTTL and
	// DefaultMaxFencesPerClaim.
	FenceTTL          time.Duration
	MaxFencesPerClaim int

	fenced   fences
	ran      atomic.Bool
	ledger   Ledger
	uids     map[string]types.UID
	rejected map[types.UID]rejection
	claims   resourcelisters.ResourceClaimLister
}

// rejection remembers a verdict written, so that a claim synced again
// before its rejection shows in the cache gets the same verdict.
type rejection struct {
	shares  []Share
	verdict Verdict
	// since is the claim's first rejection since it was last placed, its
	// rank among the claims waiting to be allocated again (the oldest
	// first); last is its latest rejection.
	since, last time.Time
}

func (c *Controller) init() {
	if c.uids == nil {
		c.uids = map[string]types.UID{}
		c.rejected = map[types.UID]rejection{}
	}
}

// Run watches ResourceClaims, rebuilds the ledger once the cache is synced
// and then judges claims until ctx ends. It returns nil when ctx ends, an
// error when the cache does not sync.
func (c *Controller) Run(ctx context.Context, client kubernetes.Interface) error {
	c.init()
	c.ran.Store(true)
	logger := klog.FromContext(ctx)
	factory := informers.NewSharedInformerFactory(client, 0)
	informer := factory.Resource().V1().ResourceClaims()
	c.claims = informer.Lister()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "locality"})
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("ResourceClaim cache did not sync")
	}

	all, err := c.claims.List(labels.Everything())
	if err != nil {
		return err
	}
	if c.Fences != nil {
		// A previous leader's fences: nobody knows which claims they steer.
		if err := c.Fences.UnfenceAll(ctx); err != nil {
			logger.Error(err, "Removing the fences of a previous leader failed")
		}
	}
	c.Rebuild(all)
	logger.Info("Locality ledger rebuilt", "claims", len(all), "holders", len(c.ledger.claims))
	for _, claim := range all {
		queue.Add(claim.Namespace + "/" + claim.Name)
	}

	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for {
		key, shutdown := queue.Get()
		if shutdown {
			return nil
		}
		var err error
		if key == expireKey {
			c.Expire(ctx)
		} else {
			err = c.syncKey(ctx, key)
		}
		if next := c.fenced.next(); !next.IsZero() {
			queue.AddAfter(expireKey, next.Sub(c.now())+10*time.Millisecond)
		}
		switch {
		case err == nil:
			queue.Forget(key)
		case ctx.Err() != nil:
		default:
			logger.Error(err, "Writing a locality verdict failed; trying again", "claim", key)
			queue.AddRateLimited(key)
		}
		queue.Done(key)
	}
}

// LiftFences deletes every fence (also those of an earlier leader). A
// controller that stops for good calls it, so that no GPU stays fenced
// with nobody to lift it; one that only lost its lease does not (the next
// leader lifts them when it starts).
func (c *Controller) LiftFences(ctx context.Context) error {
	if c.Fences == nil || !c.ran.Load() {
		// A replica that never led raised no fence; the leader's are not
		// its to lift.
		return nil
	}
	return c.Fences.UnfenceAll(ctx)
}

// Rebuild records in the ledger every claim that holds shares without
// waiting for a verdict: accepted, prepared, or on devices without binding
// conditions. Claims waiting for a verdict are left to Sync.
func (c *Controller) Rebuild(claims []*resourceapi.ResourceClaim) {
	c.init()
	for _, claim := range claims {
		v := viewClaim(claim)
		switch v.phase {
		case unjudged, accepted, prepared:
			c.uids[claim.Namespace+"/"+claim.Name] = claim.UID
			c.ledger.Set(claim.UID, v.shares)
		}
	}
}

// expireKey is the queue's key for "lift the fences whose time is up"; no
// claim has an empty key.
const expireKey = ""

func (c *Controller) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Expire lifts the fences that outlived FenceTTL.
func (c *Controller) Expire(ctx context.Context) {
	c.lift(ctx, c.fenced.expire(c.now()))
}

func (c *Controller) lift(ctx context.Context, gpus []GPU) {
	for _, g := range gpus {
		if err := c.Fences.Unfence(ctx, g); err != nil {
			klog.FromContext(ctx).Error(err, "Lifting a fence failed; trying again", "gpu", g)
			c.fenced.retry(g, c.now().Add(5*time.Second))
		}
	}
}

// steer fences the GPUs of a claim just rejected, and settles an accepted
// (or gone) claim's fences.
func (c *Controller) steer(ctx context.Context, uid types.UID, shares []Share, accepted bool) {
	if c.Fences == nil {
		return
	}
	if accepted {
		c.lift(ctx, c.fenced.settle(uid))
		return
	}
	ttl, max := c.FenceTTL, c.MaxFencesPerClaim
	if ttl == 0 {
		ttl = DefaultFenceTTL
	}
	if max == 0 {
		max = DefaultMaxFencesPerClaim
	}
	var gpus []GPU
	for _, s := range shares {
		if !slices.Contains(gpus, s.GPU) {
			gpus = append(gpus, s.GPU)
		}
	}
	// Then every other GPU that would reject it too.
	for _, g := range c.ledger.Refusing(uid, shares) {
		if !slices.Contains(gpus, g) {
			gpus = append(gpus, g)
		}
	}
	// A fence keeps every share off its GPU, not just the ones it steers.
	// So a GPU that a rejected claim waiting longer than this one would be
	// accepted on (the GPU of its affinity group, say) is left open for it,
	// and this claim's rejection lifts the fences that only younger claims
	// hold on GPUs it would be accepted on: without that, a tenant's fence
	// could close the one GPU a late affinity share may go to. The oldest
	// claim waiting always has its way, so two claims that each want the
	// GPU the other is fenced from cannot hold each other open for ever.
	now := c.now()
	w := c.waiting(uid, now, ttl)
	gpus = slices.DeleteFunc(gpus, w.wantedByOlder)
	if !c.fenced.resting(uid, now) {
		var open []GPU
		for _, g := range c.fenced.gpus() {
			if c.ledger.Accepts(uid, shares, g) && !c.fenced.steers(g, w.older) {
				open = append(open, g)
			}
		}
		c.lift(ctx, c.fenced.drop(open))
	}
	for _, g := range c.fenced.reject(uid, gpus, now, ttl, max) {
		if err := c.Fences.Fence(ctx, g); err != nil {
			klog.FromContext(ctx).Error(err, "Fencing a GPU failed; the rejected claim may land on it again", "gpu", g)
		}
	}
}

// waitingClaims are the rejected claims that wait longer than one claim
// to be allocated again, as seen when that claim is steered.
type waitingClaims struct {
	c      *Controller
	self   rejection
	selfID types.UID
	// claims are the older rejected claims still trying (rejected within
	// two fence TTLs) and not resting; memo caches, per GPU and label set,
	// whether one of them would be accepted there.
	claims []rejection
	memo   map[GPU]map[string]bool
}

func (c *Controller) waiting(uid types.UID, now time.Time, ttl time.Duration) waitingClaims {
	w := waitingClaims{c: c, self: c.rejected[uid], selfID: uid, memo: map[GPU]map[string]bool{}}
	for other, r := range c.rejected {
		if other == uid || r.verdict.Reason == ReasonInvalidConfig || now.Sub(r.last) > 2*ttl ||
			c.fenced.resting(other, now) || !w.older(other) {
			continue
		}
		w.claims = append(w.claims, r)
	}
	return w
}

// older reports whether the claim other waits longer than the claim being
// steered (ties: by UID).
func (w waitingClaims) older(other types.UID) bool {
	r, ok := w.c.rejected[other]
	if !ok || other == w.selfID {
		return false
	}
	if !r.since.Equal(w.self.since) {
		return r.since.Before(w.self.since)
	}
	return other < w.selfID
}

// wantedByOlder reports whether an older waiting claim would be accepted
// on gpu (capacity aside). Claims with the same labels get the same answer,
// so each label set is judged once per GPU.
func (w waitingClaims) wantedByOlder(gpu GPU) bool {
	if w.memo[gpu] == nil {
		w.memo[gpu] = map[string]bool{}
	}
	for _, r := range w.claims {
		key := labelKey(r.shares)
		wanted, seen := w.memo[gpu][key]
		if !seen {
			wanted = w.c.ledger.Accepts(r.shares[0].UID, r.shares, gpu)
			w.memo[gpu][key] = wanted
		}
		if wanted {
			return true
		}
	}
	return false
}

// labelKey names the locality groups of a claim's shares, in order: the
// labels with their namespace, since equal labels of two namespaces are
// different groups.
func labelKey(shares []Share) string {
	groups := make([][3]group, len(shares))
	for i, s := range shares {
		groups[i] = [3]group{s.group(affinity), s.group(antiAffinity), s.group(exclusion)}
	}
	return fmt.Sprintf("%+v", groups)
}

func (c *Controller) syncKey(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	claim, err := c.claims.ResourceClaims(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		claim = nil
	} else if err != nil {
		return err
	}
	return c.Sync(ctx, key, claim)
}

// Sync brings the ledger in line with one claim (nil: deleted) and, when
// the claim waits for a verdict, judges it and writes the verdict.
func (c *Controller) Sync(ctx context.Context, key string, claim *resourceapi.ResourceClaim) error {
	c.init()
	if prev, ok := c.uids[key]; ok && (claim == nil || prev != claim.UID) {
		c.forget(key, prev)
		c.steer(ctx, prev, nil, true)
	}
	if claim == nil {
		return nil
	}
	c.uids[key] = claim.UID
	v := viewClaim(claim)
	switch v.phase {
	case unallocated, rejected:
		c.ledger.Remove(claim.UID)
		return nil
	case unjudged, accepted:
		c.ledger.Set(claim.UID, v.shares)
		delete(c.rejected, claim.UID)
		c.steer(ctx, claim.UID, v.shares, true)
		return nil
	case prepared:
		// Bound and on the node: a fact. The verdict goes back into the
		// status, so that a second pod of the claim can bind too.
		if !c.ledger.Holds(claim.UID, v.shares) {
			if verdict := c.ledger.Judge(claim.UID, v.shares); !verdict.Accepted {
				klog.FromContext(ctx).Info("A prepared claim breaks a locality rule; it was placed before this controller judged it",
					"claim", klog.KObj(claim), "reason", verdict.Reason, "message", verdict.Message)
			}
		}
		c.ledger.Set(claim.UID, v.shares)
		delete(c.rejected, claim.UID)
		c.steer(ctx, claim.UID, v.shares, true)
		return c.write(ctx, claim, Verdict{Accepted: true})
	}

	var verdict Verdict
	replay := false
	r, ok := c.rejected[claim.UID]
	switch {
	case v.configErr != nil:
		verdict = Verdict{Reason: ReasonInvalidConfig, Message: fmt.Sprintf("claim %s/%s: %v", claim.Namespace, claim.Name, v.configErr)}
	case c.ledger.Holds(claim.UID, v.shares):
		verdict = Verdict{Accepted: true}
	case ok && sameShares(r.shares, v.shares):
		// Synced again before the cache shows the verdict: the same
		// verdict, and no second steering for one rejection.
		verdict, replay = r.verdict, true
	default:
		// A new allocation. The fences that sent it here stay until it is
		// accepted: lifted now, they would let a share rejected here again
		// go straight back to the GPU it came from.
		verdict = c.ledger.Judge(claim.UID, v.shares)
	}
	if verdict.Accepted {
		c.ledger.Set(claim.UID, v.shares)
		delete(c.rejected, claim.UID)
	} else {
		c.ledger.Remove(claim.UID)
		since := c.now()
		if ok {
			since = r.since
		}
		c.rejected[claim.UID] = rejection{shares: v.shares, verdict: verdict, since: since, last: c.now()}
	}
	klog.FromContext(ctx).V(2).Info("Locality verdict", "claim", klog.KObj(claim), "accepted", verdict.Accepted,
		"reason", verdict.Reason, "message", verdict.Message)
	err := c.write(ctx, claim, verdict)
	if verdict.Reason != ReasonInvalidConfig && !replay {
		// A claim whose config does not decode is rejected on every GPU:
		// steering it would only close GPUs.
		c.steer(ctx, claim.UID, v.shares, verdict.Accepted)
	}
	return err
}

func (c *Controller) forget(key string, uid types.UID) {
	c.ledger.Remove(uid)
	delete(c.rejected, uid)
	delete(c.uids, key)
}

func (c *Controller) write(ctx context.Context, claim *resourceapi.ResourceClaim, verdict Verdict) error {
	err := c.Writer.WriteDevices(ctx, claim, withVerdict(claim, verdict, metav1.NewTime(c.now())))
	if apierrors.IsNotFound(err) {
		// Deleted: its deletion event forgets it.
		return nil
	}
	return err
}

func sameShares(a, b []Share) bool {
	var l Ledger
	if len(a) == 0 {
		return len(b) == 0
	}
	l.Set(a[0].UID, a)
	return l.Holds(a[0].UID, b)
}

// Holders returns the shares the ledger holds on gpu (for tests and
// diagnostics; call it only from the goroutine that runs Sync).
func (c *Controller) Holders(gpu GPU) []Share { return c.ledger.Shares(gpu) }
