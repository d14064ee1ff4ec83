package budget

import (
	"context"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

func newReconciler(f *fakeBudgets, claims *[]*resourceapi.ResourceClaim, now *time.Time) *Reconciler {
	return &Reconciler{
		Store:  NewDynamicStore(f.client, 0),
		Pricer: pricer(twoModels()),
		Claims: func(string) ([]*resourceapi.ResourceClaim, error) { return *claims, nil },
		Now:    func() time.Time { return *now },
	}
}

// The reconciler keeps a charge in flight (its claim not in the informer
// yet) until the claim is seen or the entry expires, and never writes used
// below it.
func TestReconcilerKeepsChargesInFlight(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "40Gi", nil, nil))
	charger := newCharger(f)
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

	// The informer holds a: its entry goes, it is counted as a claim.
	held = []*resourceapi.ResourceClaim{a}
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	st = f.get(t, "gpu").Status
	if got := amount(st.Used); got.Memory != gi(15) || len(st.Pending) != 1 || st.Pending[0].UID != "uid-b" {
		t.Errorf("a seen: used %v, pending %+v; want 15Gi and b pending", got, st.Pending)
	}
	if st.LastReconciled == nil || st.ObservedGeneration != 1 {
		t.Errorf("lastReconciled %v, observedGeneration %d", st.LastReconciled, st.ObservedGeneration)
	}

	// b's creation failed after admission: its entry expires with the TTL.
	now = clock.Add(time.Minute + time.Second)
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	st = f.get(t, "gpu").Status
	if got := amount(st.Used); got.Memory != gi(10) || len(st.Pending) != 0 {
		t.Errorf("b expired: used %v, %d pending; want 10Gi, none", got, len(st.Pending))
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
	if err := r.reconcileBudget(ctx, stale, Amount{}, map[string]bool{}); err != nil {
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
