package budget

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// hookStore is a Store whose UpdateStatus runs before first: a test changes
// the cluster there (another writer racing the reconciler).
type hookStore struct {
	Store
	before func()
}

func (h *hookStore) UpdateStatus(ctx context.Context, b *configapi.GPUBudget) (*configapi.GPUBudget, error) {
	if h.before != nil {
		before := h.before
		h.before = nil
		before()
	}
	return h.Store.UpdateStatus(ctx, b)
}

// A budget whose deviceClassName changes (generation 2) while the
// reconciler writes it: the write conflicts, and the status written for
// generation 2 counts the claims of the new class, and a claim created
// meanwhile, not what was computed for the old spec.
func TestReconcilerConflictRecountsForNewSpec(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", modelnames.MIGClassName, "40Gi", nil, nil))
	ctx := context.Background()
	now := clock
	held := []*resourceapi.ResourceClaim{share("a", "10Gi")}
	r := newReconciler(f, &held, &now)
	store := &hookStore{Store: r.Store}
	r.Store = store
	// The first pass counts nothing of class mig; before its write the
	// budget is changed to the shared class and claim b appears.
	store.before = func() {
		b := f.get(t, "gpu")
		b.Spec.DeviceClassName = modelnames.SharedClassName
		b.Generation = 2
		u, err := ToUnstructured(b)
		if err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		f.rv++
		u.SetResourceVersion("changed")
		err = f.client.Tracker().Update(configapi.GPUBudgetResourceVersion, u, "team-a")
		f.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, share("b", "5Gi"))
	}
	// Make the first pass write: a stale used in its status.
	b := f.get(t, "gpu")
	b.Status.Used = apiAmount(Amount{Memory: gi(1)})
	if _, err := NewDynamicStore(f.client, 0).UpdateStatus(ctx, b); err != nil && !apierrors.IsConflict(err) {
		t.Fatal(err)
	}
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	st := f.get(t, "gpu").Status
	if st.ObservedGeneration != 2 || amount(st.Used).Memory != gi(15) {
		t.Errorf("status after a conflict with a spec change: observedGeneration %d, used %v; want 2 and 15Gi (a and b, shared)",
			st.ObservedGeneration, amount(st.Used))
	}
}

// With no device of this driver published and none ever seen (a restart
// while the slices are gone), a class is free only when its selectors
// require another driver; any other class's size is unknown, and a budget
// that limits the dimension refuses it.
func TestClassNotProvablyAnotherDriversIsUnknown(t *testing.T) {
	cs := classes()
	add := func(name string, exprs ...string) {
		c := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, e := range exprs {
			c.Spec.Selectors = append(c.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
		}
		cs[name] = c
	}
	add("all.example.com")
	add("attr.example.com", `device.attributes["gpu.tessera.dev"].type == "gpu"`)
	add("either.example.com", `device.driver == "other.example.com" || device.capacity.size() > 0`)
	add("and.example.com", `device.attributes["x.example.com"].y && 'other.example.com' == device.driver`)
	add("two.example.com", `true`, `(device.driver == "other.example.com")`)
	p := NewPricer(func(context.Context) ([]resourceapi.Device, uint64, error) { return nil, 1, nil },
		func(_ context.Context, name string) (*resourceapi.DeviceClass, error) { return cs[name], nil })
	for class, free := range map[string]bool{
		"all.example.com": false, "attr.example.com": false, "either.example.com": false,
		"other.example.com": true, "and.example.com": true, "two.example.com": true,
	} {
		cc, err := p.Claim(context.Background(), &claim("c", exact("g", class, 1, nil)).Spec.Devices)
		if err != nil {
			t.Fatal(err)
		}
		got := cc.For("")
		if free && (len(got.Unknown) != 0 || !got.IsZero()) {
			t.Errorf("%s: %+v, want nothing (another driver's)", class, got)
		}
		if !free && len(got.Unknown) != 3 {
			t.Errorf("%s: %+v, want every dimension unknown", class, got)
		}
		if r := Check("team-a", "gpu", Limits{Memory: ptr.To(gi(40))}, Amount{}, got); (r == nil) != free {
			t.Errorf("%s: refusal %v, want refused %v", class, r, !free)
		}
	}
}

// chargeTwoSharesThenReconcile charges shares x and y of 10Gi and returns a
// reconciler an hour later, when their entries have expired, whose informer
// holds no claim.
func chargeTwoSharesThenReconcile(t *testing.T, f *fakeBudgets) *Reconciler {
	t.Helper()
	for _, name := range []string{"x", "y"} {
		if resp := newCharger(f).Admit(context.Background(), review(t, share(name, "10Gi"), false)); !resp.Allowed {
			t.Fatal(resp.Result)
		}
	}
	confirmAll(t, f)
	now := clock.Add(time.Hour)
	var held []*resourceapi.ResourceClaim
	return newReconciler(f, &held, &now)
}

// Two budgets hold the same expired entry of a claim the informer does not
// hold: one pass reads the claim once. A claim the informer saw deleted is
// gone without a read.
func TestExpiredEntryReadOncePerPass(t *testing.T) {
	f := newFakeBudgets(t, budget("a", "", "40Gi", nil, nil), budget("b", "", "40Gi", nil, nil))
	ctx := context.Background()
	r := chargeTwoSharesThenReconcile(t, f)
	reads := map[string]int{}
	lookup := r.Lookup
	r.Lookup = func(ctx context.Context, namespace, name string) (types.UID, error) {
		reads[name]++
		return lookup(ctx, namespace, name)
	}
	r.ClaimDeleted("uid-y")
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if reads["x"] != 1 || reads["y"] != 0 {
		t.Errorf("live reads %v, want x once (two budgets, one pass) and y never (seen deleted)", reads)
	}
	for _, name := range []string{"a", "b"} {
		if st := f.get(t, name).Status; len(st.Pending) != 0 || !amount(st.Used).IsZero() {
			t.Errorf("budget %s: used %v, pending %+v; want both entries dropped", name, amount(st.Used), st.Pending)
		}
	}
}

// A full pending list is a Busy refusal (429, retry), and the reconciler
// asks to come back when the earliest entry expires.
func TestFullPendingListIsBusy(t *testing.T) {
	b := budget("gpu", "", "4000Gi", nil, nil)
	for i := range maxPending {
		b.Status.Pending = append(b.Status.Pending, configapi.PendingCharge{Claim: fmt.Sprint("p", i), UID: fmt.Sprint("uid-p", i),
			Charge: apiAmount(Amount{Memory: gi(1)}), Expires: metav1.NewTime(clock.Add(time.Duration(i+30) * time.Second))})
	}
	b.Status.Used = apiAmount(Amount{Memory: gi(maxPending)})
	f := newFakeBudgets(t, b)
	ctx := context.Background()
	resp := newCharger(f).Admit(ctx, review(t, share("x", "1Gi"), false))
	if resp.Allowed || resp.Result.Code != 429 || !strings.Contains(resp.Result.Message, "retry") {
		t.Errorf("a full pending list: %+v, want 429 and retry", resp.Result)
	}
	now := clock
	var held []*resourceapi.ResourceClaim
	r := newReconciler(f, &held, &now)
	var after []time.Duration
	r.Requeue = func(ns string, d time.Duration) { after = append(after, d) }
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if len(after) != 1 || after[0] != 31*time.Second {
		t.Errorf("requeued after %v, want once after 31s (the earliest entry expires in 30s)", after)
	}
}

// Conflicts without end: the reconciler gives up after maxAttempts writes
// and returns an error (the Controller retries the namespace later).
func TestReconcilerConflictsBounded(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "40Gi", nil, nil))
	f.inject = 1000
	ctx := context.Background()
	now := clock
	held := []*resourceapi.ResourceClaim{share("a", "10Gi")}
	r := newReconciler(f, &held, &now)
	done := make(chan error, 1)
	go func() { done <- r.Reconcile(ctx, "team-a") }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("no error after endless conflicts")
		}
	case <-time.After(5 * time.Second):
		f.mu.Lock()
		f.inject = 0
		f.mu.Unlock()
		<-done
		t.Fatal("the reconciler retried conflicts for 5s")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if tried := 1000 - f.inject; tried != maxAttempts {
		t.Errorf("%d writes tried, want %d", tried, maxAttempts)
	}
}

// Without list permission on resourceclaims the caches never sync: Run
// keeps waiting (the process serves on) instead of failing, and until it
// has synced the charger answers claims a budget would charge with a retry.
func TestRunWaitsWhenCachesDoNotSync(t *testing.T) {
	client := kubefake.NewClientset()
	client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(resourceapi.Resource("resourceclaims"), "", fmt.Errorf("RBAC"))
	})
	f := newFakeBudgets(t, budget("gpu", "", "40Gi", nil, nil))
	c := NewController(client, NewDynamicStore(f.client, 0), pricer(twoModels()), nil, time.Minute)
	c.SyncTimeout = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	charger := newCharger(f)
	charger.Ready = c.Synced
	time.Sleep(300 * time.Millisecond)
	resp := charger.Admit(context.Background(), review(t, share("a", "1Gi"), false))
	if resp.Allowed || resp.Result.Code != 429 || !strings.Contains(resp.Result.Message, "retry") {
		t.Errorf("before the caches synced: %+v, want a retry refusal", resp.Result)
	}
	if err := <-done; ctx.Err() == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run: %v before its context ended, want it to wait until then", err)
	}
	if c.Synced() {
		t.Error("Synced without the caches")
	}
}

// A live claim read refused (403) keeps the entry and counts
// tessera_gpu_budget_errors_total{reason="claim_read_forbidden"}.
func TestForbiddenClaimReadCounted(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "40Gi", nil, nil))
	ctx := context.Background()
	r := chargeTwoSharesThenReconcile(t, f)
	r.Metrics = NewMetrics()
	r.Lookup = func(_ context.Context, _, name string) (types.UID, error) {
		return "", apierrors.NewForbidden(resourceapi.Resource("resourceclaims"), name, fmt.Errorf("RBAC"))
	}
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, r.Metrics, "tessera_gpu_budget_errors_total", "claim_read_forbidden"); got != 2 {
		t.Errorf("tessera_gpu_budget_errors_total{reason=claim_read_forbidden} %v, want 2", got)
	}
	if st := f.get(t, "gpu").Status; len(st.Pending) != 2 {
		t.Errorf("%d entries pending, want both kept", len(st.Pending))
	}
}

// counter is the value of the series of counter name whose first label is
// label, from m's registry.
func counter(t *testing.T, m *Metrics, name, label string) float64 {
	t.Helper()
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			if len(s.GetLabel()) > 0 && s.GetLabel()[0].GetValue() == label {
				return s.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A budget deleted leaves nothing behind: the Charger's lock (Forget, or a
// NotFound while charging) and the Reconciler's resync record.
func TestDeletedBudgetForgotten(t *testing.T) {
	b := budget("gpu", "", "40Gi", nil, nil)
	b.Annotations = map[string]string{configapi.GPUBudgetResyncAnnotation: "1"}
	f := newFakeBudgets(t, b)
	ctx := context.Background()
	c := newCharger(f)
	if resp := c.Admit(ctx, review(t, share("a", "1Gi"), false)); !resp.Allowed {
		t.Fatal(resp.Result)
	}
	if len(c.locks) != 1 {
		t.Fatalf("%d locks after one charge, want 1", len(c.locks))
	}
	c.Forget("team-a", "gpu")
	if len(c.locks) != 0 {
		t.Errorf("%d locks after Forget, want 0", len(c.locks))
	}
	cached := f.get(t, "gpu")
	now := clock
	held := []*resourceapi.ResourceClaim{share("a", "1Gi")}
	r := newReconciler(f, &held, &now)
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if len(r.forced) != 1 {
		t.Fatalf("%d resync records after a write, want 1", len(r.forced))
	}
	if err := f.client.Tracker().Delete(configapi.GPUBudgetResourceVersion, "team-a", "gpu"); err != nil {
		t.Fatal(err)
	}
	// Charged from a cache that still holds it: the write finds it gone.
	cached.Status.Used = apiAmount(Amount{})
	if err := c.charge(ctx, cached, share("b", "1Gi"), Charge{Amount: Amount{Memory: gi(1)}}, false); err != nil {
		t.Errorf("charging a budget deleted meanwhile: %v, want nothing to charge", err)
	}
	if len(c.locks) != 0 {
		t.Errorf("%d locks after the budget was found gone, want 0", len(c.locks))
	}
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if len(r.forced) != 0 {
		t.Errorf("%d resync records after the budget was deleted, want 0", len(r.forced))
	}
}
