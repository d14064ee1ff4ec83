package budget

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
	"github.com/tessera-dev/tessera/pkg/webhook/caller"
)

var clock = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// apiServer is the context of a review whose sender the server verified
// as the API server.
func apiServer() context.Context {
	return caller.WithVerified(context.Background(), "kube-apiserver")
}

func newCharger(f *fakeBudgets) *Charger {
	return &Charger{Store: NewDynamicStore(f.client, 0), Pricer: pricer(twoModels()), TTL: time.Minute,
		Now: func() time.Time { return clock }}
}

// chargeGPU is a charger of a single budget, gpu, of 40Gi.
func chargeGPU(t *testing.T) (*fakeBudgets, *Charger) {
	t.Helper()
	f := newFakeBudgets(t, budget("gpu", "", "40Gi", nil, nil))
	return f, newCharger(f)
}

func share(name, memory string) *resourceapi.ResourceClaim {
	return claim(name, exact("s", modelnames.SharedClassName, 1, map[string]string{"memory": memory, "cores": "10"}))
}

func review(t *testing.T, c *resourceapi.ResourceClaim, dryRun bool) *admissionv1.AdmissionRequest {
	t.Helper()
	raw, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return &admissionv1.AdmissionRequest{
		UID:       types.UID("review-" + c.Name),
		Operation: admissionv1.Create,
		Resource:  metav1.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaims"},
		Namespace: c.Namespace, Name: c.Name,
		Object: runtime.RawExtension{Raw: raw},
		DryRun: ptr.To(dryRun),
	}
}

func TestAdmitChargesAndRefuses(t *testing.T) {
	f, c := chargeGPU(t)
	ctx := apiServer()
	if resp := c.Admit(ctx, review(t, share("a", "30Gi"), false)); !resp.Allowed {
		t.Fatalf("30Gi of 40Gi refused: %v", resp.Result)
	}
	b := f.get(t, "gpu")
	if got := amount(b.Status.Used); got.Memory != gi(30) || got.Cores != 10 {
		t.Errorf("used %v after a 30Gi share, want memory 30Gi, cores 10", got)
	}
	if len(b.Status.Pending) != 1 || b.Status.Pending[0].UID != "uid-a" || b.Status.Pending[0].Claim != "a" ||
		!b.Status.Pending[0].Expires.Time.Equal(clock.Add(time.Minute)) {
		t.Errorf("pending %+v, want claim a, uid-a, expiring after the TTL", b.Status.Pending)
	}

	resp := c.Admit(ctx, review(t, share("b", "20Gi"), false))
	if resp.Allowed {
		t.Fatal("30Gi + 20Gi > 40Gi allowed")
	}
	if want := "GPU budget team-a/gpu: memory: used 30Gi + this claim 20Gi > hard 40Gi"; resp.Result.Message != want || resp.Result.Code != 403 {
		t.Errorf("refusal %d %q, want 403 %q", resp.Result.Code, resp.Result.Message, want)
	}
	if got := amount(f.get(t, "gpu").Status.Used); got.Memory != gi(30) {
		t.Errorf("used %v after a refusal, want 30Gi", got)
	}

	// The same review again (an API server retry) is not charged twice.
	if resp := c.Admit(ctx, review(t, share("a", "30Gi"), false)); !resp.Allowed {
		t.Errorf("the same claim again: %v", resp.Result)
	}
	if got := len(f.get(t, "gpu").Status.Pending); got != 1 {
		t.Errorf("%d pending after the same claim twice, want 1", got)
	}
}

func TestDryRunNotCharged(t *testing.T) {
	f, c := chargeGPU(t)
	ctx := context.Background()
	if resp := c.Admit(ctx, review(t, share("a", "30Gi"), true)); !resp.Allowed {
		t.Fatalf("dry run of 30Gi refused: %v", resp.Result)
	}
	if resp := c.Admit(ctx, review(t, share("b", "50Gi"), true)); resp.Allowed {
		t.Error("dry run of 50Gi of 40Gi allowed")
	}
	if f.updates != 0 {
		t.Errorf("%d status updates for dry runs, want none", f.updates)
	}
}

func TestChargeRetriesConflicts(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "40Gi", nil, nil))
	f.inject = 3
	c := newCharger(f)
	if resp := c.Admit(context.Background(), review(t, share("a", "10Gi"), false)); !resp.Allowed {
		t.Fatalf("refused after conflicts: %v", resp.Result)
	}
	if got := amount(f.get(t, "gpu").Status.Used); got.Memory != gi(10) {
		t.Errorf("used %v, want 10Gi charged once", got)
	}

	// Conflicts until the review's context ends: refused, not charged.
	f.inject = 1 << 30
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if resp := c.Admit(ctx, review(t, share("b", "1Gi"), false)); resp.Allowed {
		t.Error("allowed although no write succeeded")
	}
	f.inject = 0
	if got := amount(f.get(t, "gpu").Status.Used); got.Memory != gi(10) {
		t.Errorf("used %v, want 10Gi", got)
	}
}

// A stale cached object (another writer lowered used) does not refuse: the
// charger reads the budget before refusing.
func TestRefusesOnlyOnFreshObject(t *testing.T) {
	f, c := chargeGPU(t)
	ctx := context.Background()
	if resp := c.Admit(ctx, review(t, share("a", "30Gi"), false)); !resp.Allowed {
		t.Fatal(resp.Result)
	}
	// The reconciler found claim a gone: used back to 0.
	b := f.get(t, "gpu")
	b.Status.Used, b.Status.Pending = apiAmount(Amount{}), nil
	if _, err := NewDynamicStore(f.client, 0).UpdateStatus(ctx, b); err != nil {
		t.Fatal(err)
	}
	if resp := c.Admit(ctx, review(t, share("b", "20Gi"), false)); !resp.Allowed {
		t.Errorf("20Gi refused although used is 0: %v", resp.Result)
	}
}

func TestLaterBudgetRefusalRollsBack(t *testing.T) {
	f := newFakeBudgets(t, budget("a-memory", "", "40Gi", nil, nil), budget("b-cores", "", "", ptrInt(5), nil))
	c := newCharger(f)
	resp := c.Admit(apiServer(), review(t, share("x", "10Gi"), false))
	if resp.Allowed || !strings.Contains(resp.Result.Message, "team-a/b-cores: cores: used 0 + this claim 10 > hard 5") {
		t.Fatalf("want the cores budget's refusal, got %+v", resp.Result)
	}
	b := f.get(t, "a-memory")
	if len(b.Status.Pending) != 0 || !amount(b.Status.Used).IsZero() {
		t.Errorf("a-memory after the rollback: used %v, pending %+v; want nothing", amount(b.Status.Used), b.Status.Pending)
	}
}

// Two chargers ("replicas") over one API server, 100 claims at once: the
// sum admitted never exceeds hard, and every admitted claim is in used.
func TestConcurrentChargesNeverExceed(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "37Gi", nil, nil))
	replicas := []*Charger{newCharger(f), newCharger(f)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for i := range 100 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(apiServer(), 10*time.Second)
			defer cancel()
			resp := replicas[i%2].Admit(ctx, review(t, share(fmt.Sprintf("c%d", i), "1Gi"), false))
			if resp.Allowed {
				mu.Lock()
				admitted++
				mu.Unlock()
			} else if !strings.Contains(resp.Result.Message, "> hard 37Gi") {
				t.Errorf("claim c%d refused for another reason: %s", i, resp.Result.Message)
			}
		})
	}
	wg.Wait()
	b := f.get(t, "gpu")
	used := amount(b.Status.Used)
	if int64(admitted)*gi(1) > gi(37) {
		t.Errorf("admitted %d claims of 1Gi into 37Gi", admitted)
	}
	if used.Memory != int64(admitted)*gi(1) || len(b.Status.Pending) != admitted {
		t.Errorf("used %v with %d pending for %d admitted claims", used, len(b.Status.Pending), admitted)
	}
	if admitted != 37 {
		t.Errorf("admitted %d, want 37: a claim that fit was refused", admitted)
	}
	t.Logf("admitted %d of 100 in %d status writes", admitted, f.updates)
}

// A budget the reconciler has not counted yet for its generation (new, or
// its deviceClassName changed) would enforce against a used it never
// computed: claims are refused with a retry until it has.
func TestUnreconciledBudgetRefusesWithRetry(t *testing.T) {
	b := budget("gpu", "", "40Gi", nil, nil)
	b.Generation, b.Status.ObservedGeneration = 2, 1
	f := newFakeBudgets(t, b)
	c := newCharger(f)
	ctx := context.Background()
	for _, dryRun := range []bool{false, true} {
		resp := c.Admit(ctx, review(t, share("a", "1Gi"), dryRun))
		if resp.Allowed || resp.Result.Code != 429 || !strings.Contains(resp.Result.Message, "GPU budget team-a/gpu is being counted, retry in a few seconds") {
			t.Errorf("dry run %v: %+v, want a retry refusal", dryRun, resp.Result)
		}
	}
	now := clock
	held := []*resourceapi.ResourceClaim{share("old", "39Gi")}
	if err := newReconciler(f, &held, &now).Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if resp := c.Admit(ctx, review(t, share("a", "2Gi"), false)); resp.Allowed {
		t.Error("39Gi counted + 2Gi > 40Gi allowed")
	}
	if resp := c.Admit(ctx, review(t, share("a", "1Gi"), false)); !resp.Allowed {
		t.Errorf("counted budget: %+v", resp.Result)
	}
}

// A review that finds its budget's lock held by another review does not
// wait for it (it would hold a review slot meanwhile): it charges through
// the compare-and-swap path at once.
func TestHeldLockDoesNotWait(t *testing.T) {
	f, c := chargeGPU(t)
	ctx := context.Background()
	_, unlock := c.tryLock("team-a", "gpu")
	if unlock == nil {
		t.Fatal("the lock of an idle budget is taken")
	}
	defer unlock()
	start := time.Now()
	resp := c.Admit(ctx, review(t, share("a", "1Gi"), false))
	if !resp.Allowed {
		t.Errorf("lock held by another review: %+v, want charged without waiting", resp.Result)
	}
	if waited := time.Since(start); waited > 500*time.Millisecond {
		t.Errorf("waited %v with the lock held", waited)
	}
	if got := amount(f.get(t, "gpu").Status.Used); got.Memory != gi(1) {
		t.Errorf("used %v, want 1Gi", got)
	}
}

// A dry run after another writer changed the budget (here its hard, and
// the reconciler its used) is checked against the changed budget, not the
// object this process last wrote.
func TestDryRunAfterOtherWriterSeesTheirChange(t *testing.T) {
	f, c := chargeGPU(t)
	ctx := context.Background()
	if resp := c.Admit(ctx, review(t, share("a", "1Gi"), false)); !resp.Allowed {
		t.Fatal(resp.Result)
	}
	b := f.get(t, "gpu")
	b.Spec.Hard.Memory = ptr.To(resource.MustParse("2Gi"))
	b.Generation++
	b.Status.ObservedGeneration = b.Generation
	b.Status.Used = apiAmount(Amount{Memory: gi(1)})
	u, err := ToUnstructured(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.Resource(configapi.GPUBudgetResourceVersion).Namespace("team-a").Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if resp := c.Admit(ctx, review(t, share("b", "5Gi"), true)); resp.Allowed {
		t.Error("dry run of 1Gi used + 5Gi against a hard lowered to 2Gi allowed")
	}
}
