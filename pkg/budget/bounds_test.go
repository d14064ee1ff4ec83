package budget

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// manyDevices are n whole GPUs of 80Gi.
func manyDevices(n int) []resourceapi.Device {
	out := make([]resourceapi.Device, n)
	for i := range out {
		out[i] = device(fmt.Sprintf("gpu-%d", i), modelnames.TypeWhole, "80Gi", 100)
	}
	return out
}

// Pricing stops when its context ends, between device evaluations.
func TestCancelledContextStopsPricing(t *testing.T) {
	p := pricer(manyDevices(1000))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := p.Claim(ctx, &claim("c", exact("g", modelnames.WholeClassName, 1, nil)).Spec.Devices)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("pricing with a cancelled context: %v, want context.Canceled", err)
	}
}

// A selector over the scheduler's per-evaluation cost limit, or a claim
// whose selectors together exceed MaxCost, is refused as too costly to
// price, without evaluating on.
func TestCostlySelectorsRefused(t *testing.T) {
	costly := exact("g", modelnames.WholeClassName, 1, nil)
	costly.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20].all(a, [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20].all(b, [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20].all(c, [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20].all(d, [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20].all(e, a+b+c+d+e > 0)))))`}}}
	start := time.Now()
	_, err := pricer(manyDevices(100)).Claim(context.Background(), &claim("c", costly).Spec.Devices)
	var costErr *CostError
	if !errors.As(err, &costErr) {
		t.Fatalf("a selector over the per-evaluation limit: %v, want a CostError", err)
	}
	t.Logf("refused after %v: %v", time.Since(start), err)

	p := pricer(manyDevices(1000))
	p.MaxCost = 500
	requests := make([]resourceapi.DeviceRequest, 8)
	for i := range requests {
		requests[i] = exact(fmt.Sprintf("g%d", i), modelnames.WholeClassName, 1, nil)
		requests[i].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf(`device.attributes["gpu.tessera.dev"].type != "x%d"`, i)}}}
	}
	if _, err := p.Claim(context.Background(), &claim("c", requests...).Spec.Devices); !errors.As(err, &costErr) {
		t.Errorf("8 requests over 1000 devices with a total bound of 500: %v, want a CostError", err)
	}

	// The charger refuses such a claim with the reason.
	f := newFakeBudgets(t, budget("gpu", "", "40Gi", nil, nil))
	c := newCharger(f)
	c.Pricer = p
	resp := c.Admit(context.Background(), review(t, claim("c", requests...), false))
	if resp.Allowed || resp.Result.Code != 403 || !strings.Contains(resp.Result.Message, "too costly") {
		t.Errorf("costly claim: %+v, want refused as too costly to price", resp.Result)
	}
}

// A share is charged the cores it may use: its config's computeLimit above
// its guarantee, and a whole GPU's when it is guaranteed none.
func TestShareCoresChargedAtCap(t *testing.T) {
	capped := claim("c", exact("s", modelnames.SharedClassName, 1, map[string]string{"memory": "1Gi", "cores": "10"}))
	capped.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: modelnames.DriverName, Parameters: runtime.RawExtension{
			Raw: []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"computeLimit":80}}`)}}}}}
	bestEffort := claim("d", exact("s", modelnames.SharedClassName, 1, map[string]string{"memory": "1Gi", "cores": "0"}))
	for _, tc := range []struct {
		claim *resourceapi.ResourceClaim
		want  int64
	}{{capped, 80}, {bestEffort, 100}, {share("e", "1Gi"), 10}} {
		cc, err := pricer(twoModels()).Claim(context.Background(), &tc.claim.Spec.Devices)
		if err != nil {
			t.Fatal(err)
		}
		if got := cc.For("").Cores; got != tc.want {
			t.Errorf("claim %s: cores %d, want %d", tc.claim.Name, got, tc.want)
		}
	}
}

// With no device of its class published, a whole GPU is priced at the
// size a budget declares or persisted, not refused as unknown.
func TestKnownSizeUsedWhenNothingPublished(t *testing.T) {
	whole := claim("c", exact("g", modelnames.WholeClassName, 1, nil))
	known := []configapi.ClassSize{{DeviceClassName: modelnames.WholeClassName, Type: modelnames.TypeWhole, Memory: resource.MustParse("80Gi")}}
	cc, err := pricer(nil).Price(context.Background(), &whole.Spec.Devices, known)
	if err != nil {
		t.Fatal(err)
	}
	if ch := cc.For(""); ch.Memory != gi(80) || len(ch.Unknown) != 0 {
		t.Errorf("charge %v unknown %v, want 80Gi known", ch.Amount, ch.Unknown)
	}

	for _, where := range []string{"declared", "persisted"} {
		b := budget("gpu", "", "100Gi", nil, nil)
		if where == "declared" {
			b.Spec.ClassSizes = known
		} else {
			b.Status.ClassSizes = known
		}
		f := newFakeBudgets(t, b)
		c := newCharger(f)
		c.Pricer = pricer(nil) // a restart with the pool at zero
		if resp := c.Admit(context.Background(), review(t, whole, false)); !resp.Allowed {
			t.Errorf("%s size: %v", where, resp.Result.Message)
		}
		if got := amount(f.get(t, "gpu").Status.Used); got.Memory != gi(80) {
			t.Errorf("%s size: used %v, want 80Gi", where, got)
		}
	}
}

// The reconciler persists the largest size it saw a class of the
// namespace's claims select, and keeps it when the devices are gone.
func TestReconcilerPersistsClassSizes(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "100Gi", nil, nil))
	now := clock
	held := []*resourceapi.ResourceClaim{claim("c", exact("g", modelnames.WholeClassName, 1, nil))}
	r := newReconciler(f, &held, &now)
	if err := r.Reconcile(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	want := resource.MustParse("80Gi")
	sizes := f.get(t, "gpu").Status.ClassSizes
	i := -1
	for j, s := range sizes {
		if s.DeviceClassName == modelnames.WholeClassName && s.Type == modelnames.TypeWhole {
			i = j
		}
	}
	if i < 0 || sizes[i].Memory.Cmp(want) != 0 {
		t.Fatalf("status.classSizes %+v, want %s of %s at 80Gi", sizes, modelnames.TypeWhole, modelnames.WholeClassName)
	}
	// A restarted webhook with nothing published keeps it.
	r.Pricer = pricer(nil)
	now = now.Add(time.Minute)
	if err := r.Reconcile(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	b := f.get(t, "gpu")
	if len(b.Status.ClassSizes) != len(sizes) || amount(b.Status.Used).Memory != gi(80) {
		t.Errorf("after a restart with nothing published: classSizes %+v, used %v; want kept, 80Gi", b.Status.ClassSizes, amount(b.Status.Used))
	}
}

// A claim priced at the 40Gi GPU published at admission and allocated an
// 80Gi one (the pool scaled between) counts at 80Gi, and the budget says it
// overran; later claims are refused against it.
func TestAllocatedLargerRecounted(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "100Gi", nil, nil))
	now := clock
	c := claim("c", exact("g", modelnames.WholeClassName, 1, nil))
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "g", Driver: modelnames.DriverName, Pool: "node-b", Device: "gpu-0"}}}}
	held := []*resourceapi.ResourceClaim{c}
	r := newReconciler(f, &held, &now)
	small := []resourceapi.Device{device("gpu-0", modelnames.TypeWhole, "40Gi", 100)}
	r.Pricer = pricer(small)
	large := device("gpu-0", modelnames.TypeWhole, "80Gi", 100)
	r.Device = func(pool, name string) (*resourceapi.Device, bool) {
		if pool == "node-b" && name == "gpu-0" {
			return &large, true
		}
		return nil, false
	}
	if err := r.Reconcile(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	b := f.get(t, "gpu")
	if got := amount(b.Status.Used); got.Memory != gi(80) {
		t.Errorf("used %v, want the 80Gi allocated", got)
	}
	cond := meta.FindStatusCondition(b.Status.Conditions, configapi.BudgetAllocationOverran)
	if cond == nil || !strings.Contains(cond.Message, "c (memory 80Gi, priced 40Gi)") {
		t.Errorf("conditions %+v, want AllocationOverran naming claim c", b.Status.Conditions)
	}
	ch := newCharger(f)
	ch.Pricer = r.Pricer
	if resp := ch.Admit(context.Background(), review(t, claim("d", exact("g", modelnames.WholeClassName, 1, nil)), false)); resp.Allowed {
		t.Error("80Gi allocated + 40Gi > 100Gi allowed")
	}
}

// A budget in a namespace the budget webhook does not see says so.
func TestNotEnforcedCondition(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "100Gi", nil, nil))
	now := clock
	var held []*resourceapi.ResourceClaim
	r := newReconciler(f, &held, &now)
	enforced := false
	r.Enforced = func(context.Context, string) (bool, string, error) {
		return enforced, `namespace team-a lacks the label gpu.tessera.dev/budgets=enforced`, nil
	}
	if err := r.Reconcile(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(f.get(t, "gpu").Status.Conditions, configapi.BudgetEnforced)
	if cond == nil || cond.Status != "False" || cond.Reason != configapi.BudgetNotEnforced || !strings.Contains(cond.Message, "lacks the label") {
		t.Errorf("condition %+v, want Enforced False NotEnforced", cond)
	}
	enforced = true
	now = now.Add(time.Minute)
	if err := r.Reconcile(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(f.get(t, "gpu").Status.Conditions, configapi.BudgetEnforced); cond == nil || cond.Status != "True" {
		t.Errorf("condition %+v once selected, want Enforced True", cond)
	}
}
