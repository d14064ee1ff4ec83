package budget

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
)

// chargerAt is a charger of budget gpu of memory whose clock is *now.
func chargerAt(t *testing.T, memory string, now *time.Time) (*fakeBudgets, *Charger) {
	t.Helper()
	f := newFakeBudgets(t, budget("gpu", "", memory, nil, nil))
	c := newCharger(f)
	c.Now = func() time.Time { return *now }
	c.Metrics = NewMetrics()
	return f, c
}

// A review no claim follows (forged: any pod may post one) charges the
// namespace's whole budget; the namespace's real claims are refused for
// the confirm window only, then admitted, and the forged entry is dropped
// and counted.
func TestForgedChargeStopsBlockingAfterConfirmWindow(t *testing.T) {
	now := clock
	f, c := chargerAt(t, "40Gi", &now)
	if resp := c.Admit(context.Background(), review(t, share("forged", "40Gi"), false)); !resp.Allowed {
		t.Fatalf("forged review refused: %v", resp.Result)
	}
	if resp := c.Admit(context.Background(), review(t, share("real", "1Gi"), false)); resp.Allowed {
		t.Fatal("within the confirm window, 40Gi + 1Gi > 40Gi allowed")
	}
	now = now.Add(DefaultConfirmWindow + time.Second)
	if resp := c.Admit(context.Background(), review(t, share("real", "1Gi"), false)); !resp.Allowed {
		t.Fatalf("after the confirm window the unconfirmed 40Gi still refuses: %v", resp.Result.Message)
	}
	b := f.get(t, "gpu")
	if got := amount(b.Status.Used); got.Memory != gi(1) {
		t.Errorf("used %v, want 1Gi (the forged 40Gi dropped)", got)
	}
	if len(b.Status.Pending) != 1 || b.Status.Pending[0].Claim != "real" {
		t.Errorf("pending %+v, want only the real claim's", b.Status.Pending)
	}
	if got := counterOf(t, c.Metrics, "tessera_gpu_budget_unconfirmed_charges_total"); got != 1 {
		t.Errorf("tessera_gpu_budget_unconfirmed_charges_total %v, want 1", got)
	}
}

// A charge whose claim the reconciler sees is confirmed and keeps counting
// past the window; one whose claim never appears is dropped by the
// reconciler once the window has passed.
func TestReconcilerConfirmsSeenClaims(t *testing.T) {
	now := clock
	f, c := chargerAt(t, "40Gi", &now)
	for _, name := range []string{"seen", "never"} {
		if resp := c.Admit(context.Background(), review(t, share(name, "10Gi"), false)); !resp.Allowed {
			t.Fatal(resp.Result)
		}
	}
	// The informer does not hold "seen" yet, but a live read finds it.
	var held []*resourceapi.ResourceClaim
	r := newReconciler(f, &held, &now)
	r.Metrics = NewMetrics()
	if err := r.Reconcile(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	held = []*resourceapi.ResourceClaim{share("seen", "10Gi")}
	now = now.Add(time.Second)
	if err := r.Reconcile(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	b := f.get(t, "gpu")
	for _, p := range b.Status.Pending {
		if p.Confirmed != (p.Claim == "seen") {
			t.Errorf("entry %s confirmed %v", p.Claim, p.Confirmed)
		}
	}
	held = nil // the informer lags: only a live read finds "seen"
	r.Lookup = func(_ context.Context, _, name string) (types.UID, error) { return lookupOnly(name, "seen") }
	now = now.Add(DefaultConfirmWindow)
	if err := r.Reconcile(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	b = f.get(t, "gpu")
	if len(b.Status.Pending) != 1 || b.Status.Pending[0].Claim != "seen" {
		t.Errorf("pending %+v past the window, want only the confirmed entry", b.Status.Pending)
	}
	if got := amount(b.Status.Used); got.Memory != gi(10) {
		t.Errorf("used %v, want the confirmed 10Gi", got)
	}
	if got := counterOf(t, r.Metrics, "tessera_gpu_budget_unconfirmed_charges_total"); got != 1 {
		t.Errorf("tessera_gpu_budget_unconfirmed_charges_total %v, want 1", got)
	}
	// A later charge keeps the confirmed entry counting.
	if resp := c.Admit(context.Background(), review(t, share("more", "31Gi"), false)); resp.Allowed {
		t.Error("10Gi confirmed + 31Gi > 40Gi allowed")
	}
}

// Forged reviews cannot fill a budget's ledger: at most maxUnconfirmed
// entries are unconfirmed at once, and entries past their window neither
// count against maxPending nor stay once the next charge is written.
func TestUnconfirmedCannotFillLedger(t *testing.T) {
	now := clock
	f, c := chargerAt(t, "100000Gi", &now)
	ctx := context.Background()
	for i := range maxUnconfirmed {
		if resp := c.Admit(ctx, review(t, share(fmt.Sprintf("forged-%d", i), "1Gi"), false)); !resp.Allowed {
			t.Fatalf("forged %d: %v", i, resp.Result)
		}
	}
	resp := c.Admit(ctx, review(t, share("one-more", "1Gi"), false))
	if resp.Allowed || resp.Result.Code != 429 {
		t.Fatalf("%d unconfirmed entries and one more: %+v, want a retry refusal", maxUnconfirmed, resp.Result)
	}
	// A ledger full of entries past their window (as the old cap of 1024
	// let forged reviews fill it) admits the next claim.
	b := f.get(t, "gpu")
	for len(b.Status.Pending) < maxPending {
		p := b.Status.Pending[0]
		p.UID = fmt.Sprintf("forged-uid-%d", len(b.Status.Pending))
		b.Status.Pending = append(b.Status.Pending, p)
	}
	if _, err := NewDynamicStore(f.client, 0).UpdateStatus(ctx, b); err != nil {
		t.Fatal(err)
	}
	now = now.Add(DefaultConfirmWindow + time.Second)
	if resp := c.Admit(ctx, review(t, share("real", "1Gi"), false)); !resp.Allowed {
		t.Fatalf("real claim after the window with %d stale entries: %v", maxPending, resp.Result.Message)
	}
	if b := f.get(t, "gpu"); len(b.Status.Pending) != 1 || amount(b.Status.Used).Memory != gi(1) {
		t.Errorf("%d pending, used %v; want the real claim alone", len(b.Status.Pending), amount(b.Status.Used))
	}
}

// A review whose sender the server did not verify gets no figure of the
// budget (used, hard), only which budget and dimension refused and where to
// read them; the API server's gets them.
func TestUnverifiedRefusalHasNoFigures(t *testing.T) {
	f, c := chargeGPU(t)
	if resp := c.Admit(apiServer(), review(t, share("a", "30Gi"), false)); !resp.Allowed {
		t.Fatal(resp.Result)
	}
	confirmAll(t, f)
	resp := c.Admit(context.Background(), review(t, share("b", "20Gi"), true))
	if resp.Allowed {
		t.Fatal("30Gi + 20Gi > 40Gi allowed")
	}
	msg := resp.Result.Message
	for _, figure := range []string{"30Gi", "40Gi", "used", "hard 4"} {
		if strings.Contains(msg, figure) {
			t.Errorf("unverified refusal %q names %q", msg, figure)
		}
	}
	for _, want := range []string{"GPU budget team-a/gpu", "memory", "kubectl get gpubudget -n team-a gpu"} {
		if !strings.Contains(msg, want) {
			t.Errorf("unverified refusal %q lacks %q", msg, want)
		}
	}
	verified := c.Admit(apiServer(), review(t, share("b", "20Gi"), true))
	if want := "used 30Gi + this claim 20Gi > hard 40Gi"; verified.Allowed || !strings.Contains(verified.Result.Message, want) {
		t.Errorf("verified refusal %+v, want %q", verified.Result, want)
	}
}

// counterOf sums every series of the counter name in m's registry.
func counterOf(t *testing.T, m *Metrics, name string) float64 {
	t.Helper()
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, s := range f.GetMetric() {
				sum += s.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// lookupOnly is a live read that finds only the claim called found.
func lookupOnly(name, found string) (types.UID, error) {
	if name == found {
		return types.UID("uid-" + name), nil
	}
	return "", apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), name)
}

// A charge past its window whose claim exists (the reconciler fell behind)
// keeps counting: the charger reads the claim before it drops the entry.
func TestStaleEntryOfRealClaimKeepsCounting(t *testing.T) {
	now := clock
	f, c := chargerAt(t, "40Gi", &now)
	if resp := c.Admit(context.Background(), review(t, share("real", "30Gi"), false)); !resp.Allowed {
		t.Fatal(resp.Result)
	}
	if resp := c.Admit(context.Background(), review(t, share("forged", "5Gi"), false)); !resp.Allowed {
		t.Fatal(resp.Result)
	}
	reads := 0
	c.Lookup = func(_ context.Context, _, name string) (types.UID, error) {
		reads++
		return lookupOnly(name, "real")
	}
	now = now.Add(DefaultConfirmWindow + time.Second)
	if resp := c.Admit(context.Background(), review(t, share("next", "20Gi"), false)); resp.Allowed {
		t.Error("30Gi of a real claim + 20Gi > 40Gi allowed once the reconciler fell behind")
	}
	if resp := c.Admit(context.Background(), review(t, share("next", "10Gi"), false)); !resp.Allowed {
		t.Errorf("30Gi + 10Gi (the forged 5Gi dropped): %v", resp.Result.Message)
	}
	b := f.get(t, "gpu")
	if got := amount(b.Status.Used); got.Memory != gi(40) {
		t.Errorf("used %v, want 40Gi", got)
	}
	for _, p := range b.Status.Pending {
		if p.Claim == "forged" || (p.Claim == "real" && !p.Confirmed) {
			t.Errorf("entry %+v after the charge", p)
		}
	}
	if reads == 0 || reads > 4 {
		t.Errorf("%d live reads, want one or two per stale entry", reads)
	}
}
