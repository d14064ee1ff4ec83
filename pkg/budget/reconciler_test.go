package budget

import (
	"context"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

func newReconciler(f *fakeBudgets, claims *[]*resourceapi.ResourceClaim, now *time.Time) *Reconciler {
	return &Reconciler{
		Store:  NewDynamicStore(f.client, 0),
		Pricer: pricer(twoModels()),
		Claims: func(string) ([]*resourceapi.ResourceClaim, error) { return *claims, nil },
		// The cluster's claims are the informer's.
		Lookup: func(_ context.Context, _, name string) (types.UID, error) {
			for _, c := range *claims {
				if c.Name == name {
					return c.UID, nil
				}
			}
			return "", apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), name)
		},
		Now: func() time.Time { return *now },
	}
}

// The reconciler keeps a charge in flight (its claim not in the informer
// yet) until the claim is seen or the entry expires, and never writes used
// below it.
func TestReconcilerKeepsChargesInFlight(t *testing.T) {
	f, charger := chargeGPU(t)
	ctx := context.Background()
	now := clock
	var held []*resourceapi.ResourceClaim
	r := newReconciler(f, &held, &now)

	a, b := share("a", "10Gi"), share("b", "5Gi")
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		if resp := charger.Admit(ctx, review(t, c, false)); !resp.Allowed {
			t.Fatal(resp.Result)
		}
	}
	// The informer has seen neither: both stay pending and counted.
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	st := f.get(t, "gpu").Status
	if got := amount(st.Used); got.Memory != gi(15) || len(st.Pending) != 2 {
		t.Errorf("nothing seen: used %v, %d pending; want 15Gi, 2", got, len(st.Pending))
	}

	// The informer holds a: it is counted as a claim, its entry stays
	// (uncounted) until it expires, for replicas that have not seen a.
	held = []*resourceapi.ResourceClaim{a}
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	st = f.get(t, "gpu").Status
	if got := amount(st.Used); got.Memory != gi(15) || len(st.Pending) != 2 {
		t.Errorf("a seen: used %v, pending %+v; want 15Gi and both pending", got, st.Pending)
	}

	// b's creation failed after admission: its entry expires with the TTL
	// (a live read finds no b), and a's too (held).
	now = clock.Add(time.Minute + time.Second)
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	st = f.get(t, "gpu").Status
	if got := amount(st.Used); got.Memory != gi(10) || len(st.Pending) != 0 {
		t.Errorf("b expired: used %v, %d pending; want 10Gi, none", got, len(st.Pending))
	}
	if st.LastReconciled == nil || st.ObservedGeneration != 1 {
		t.Errorf("lastReconciled %v, observedGeneration %d", st.LastReconciled, st.ObservedGeneration)
	}

	// a deleted: used drops to nothing.
	held = nil
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if got := amount(f.get(t, "gpu").Status.Used); !got.IsZero() {
		t.Errorf("no claims: used %v", got)
	}
}

// A charge written between the reconciler's read and its write makes the
// write conflict; the reconciler recomputes from the fresh object and keeps
// the charge.
func TestReconcilerConflictKeepsNewCharge(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "40Gi", nil, nil))
	ctx := context.Background()
	now := clock
	var held []*resourceapi.ResourceClaim
	r := newReconciler(f, &held, &now)
	stale := f.get(t, "gpu")
	if resp := newCharger(f).Admit(ctx, review(t, share("a", "10Gi"), false)); !resp.Allowed {
		t.Fatal(resp.Result)
	}
	// Reconcile from the stale copy (as an informer that lags would).
	if err := r.reconcileBudget(ctx, &pass{namespace: "team-a", priced: map[types.UID]ClaimCharge{}, checked: map[string]bool{}, logged: map[string]bool{}}, stale); err != nil {
		t.Fatal(err)
	}
	if got := amount(f.get(t, "gpu").Status.Used); got.Memory != gi(10) {
		t.Errorf("used %v after reconciling a stale copy, want the 10Gi in flight kept", got)
	}
}

func TestReconcilerResyncAnnotationForcesWrite(t *testing.T) {
	b := budget("gpu", "", "40Gi", nil, nil)
	b.Annotations = map[string]string{configapi.GPUBudgetResyncAnnotation: "1"}
	f := newFakeBudgets(t, b)
	ctx := context.Background()
	now := clock
	var held []*resourceapi.ResourceClaim
	r := newReconciler(f, &held, &now)
	for range 2 {
		if err := r.Reconcile(ctx, "team-a"); err != nil {
			t.Fatal(err)
		}
	}
	if f.updates != 1 {
		t.Errorf("%d writes for one resync annotation, want 1", f.updates)
	}
	if lr := f.get(t, "gpu").Status.LastReconciled; lr == nil || !lr.Time.Equal(clock) {
		t.Errorf("lastReconciled %v, want %v", lr, clock)
	}
}

// Two replicas whose informers differ: A holds claim x, B does not yet. A's
// write must keep x's pending entry, so that B, counting from A's write
// without x, still counts x, and a second claim over hard is refused.
func TestTwoReconcilersDifferentViews(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "10Gi", nil, nil))
	ctx := context.Background()
	now := clock
	x := share("x", "8Gi")
	heldA := []*resourceapi.ResourceClaim{x}
	var heldB []*resourceapi.ResourceClaim
	a, b := newReconciler(f, &heldA, &now), newReconciler(f, &heldB, &now)
	charger := newCharger(f)
	if resp := charger.Admit(ctx, review(t, x, false)); !resp.Allowed {
		t.Fatal(resp.Result)
	}
	for _, r := range []*Reconciler{a, b, a, b} {
		if err := r.Reconcile(ctx, "team-a"); err != nil {
			t.Fatal(err)
		}
		if got := amount(f.get(t, "gpu").Status.Used); got.Memory != gi(8) {
			t.Fatalf("used %v after a reconciler pass, want x's 8Gi", got)
		}
	}
	if resp := charger.Admit(ctx, review(t, share("y", "8Gi"), false)); resp.Allowed {
		t.Fatal("8Gi + 8Gi admitted under a 10Gi budget")
	}

	// Once expired, the entry leaves through A (its informer holds x), not
	// through B while the claim exists (a live GET finds it).
	now = clock.Add(2 * time.Minute)
	live := map[string]*resourceapi.ResourceClaim{"x": x}
	for _, r := range []*Reconciler{a, b} {
		r.Lookup = func(_ context.Context, _, name string) (types.UID, error) {
			if c, ok := live[name]; ok {
				return c.UID, nil
			}
			return "", apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), name)
		}
	}
	if err := b.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if st := f.get(t, "gpu").Status; amount(st.Used).Memory != gi(8) || len(st.Pending) != 1 {
		t.Errorf("B, x expired but alive: used %v, %d pending; want 8Gi, 1", amount(st.Used), len(st.Pending))
	}
	if err := a.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if st := f.get(t, "gpu").Status; amount(st.Used).Memory != gi(8) || len(st.Pending) != 0 {
		t.Errorf("A, x expired and held: used %v, %d pending; want 8Gi, 0", amount(st.Used), len(st.Pending))
	}

	// A claim whose creation failed: B's GET finds nothing, the entry goes.
	if resp := charger.Admit(ctx, review(t, share("z", "1Gi"), false)); !resp.Allowed {
		t.Fatal(resp.Result)
	}
	now = clock.Add(4 * time.Minute)
	heldB = []*resourceapi.ResourceClaim{x}
	if err := b.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if st := f.get(t, "gpu").Status; amount(st.Used).Memory != gi(8) || len(st.Pending) != 0 {
		t.Errorf("B, z never created: used %v, %d pending; want 8Gi (x), 0", amount(st.Used), len(st.Pending))
	}
	// A claim of the same name but another uid is not the one charged.
	live["w"] = share("w", "1Gi")
	live["w"].UID = "other"
	if resp := charger.Admit(ctx, review(t, share("w", "1Gi"), false)); !resp.Allowed {
		t.Fatal(resp.Result)
	}
	now = clock.Add(6 * time.Minute)
	if err := b.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if st := f.get(t, "gpu").Status; len(st.Pending) != 0 {
		t.Errorf("w recreated with another uid: %d pending, want 0", len(st.Pending))
	}
}

// A deleted budget's series go at the next pass over its namespace, also
// when it was the namespace's last budget.
func TestMetricsOfDeletedBudgetRemoved(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "40Gi", ptrInt(100), nil), budget("more", "", "80Gi", nil, nil))
	ctx := context.Background()
	now := clock
	var held []*resourceapi.ResourceClaim
	r := newReconciler(f, &held, &now)
	r.Metrics = NewMetrics()
	r.Metrics.refused(&Refusal{Namespace: "team-a", Budget: "gpu", Resource: Memory})
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if n := series(t, r.Metrics)["tessera_gpu_budget_used"]; n != 6 {
		t.Fatalf("%d used series for 2 budgets, want 6", n)
	}
	for _, name := range []string{"gpu", "more"} {
		if err := f.client.Tracker().Delete(configapi.GPUBudgetResourceVersion, "team-a", name); err != nil {
			t.Fatal(err)
		}
		if err := r.Reconcile(ctx, "team-a"); err != nil {
			t.Fatal(err)
		}
	}
	if n := series(t, r.Metrics); len(n) != 0 {
		t.Errorf("series after both budgets were deleted: %v, want none", n)
	}
}

// series counts m's series by metric name.
func series(t *testing.T, m *Metrics) map[string]int {
	t.Helper()
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, f := range families {
		if len(f.GetMetric()) > 0 {
			out[f.GetName()] = len(f.GetMetric())
		}
	}
	return out
}
