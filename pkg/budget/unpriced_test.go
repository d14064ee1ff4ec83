package budget

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// A claim of a class that does not exist is refused by a namespace whose
// budgets limit anything (it could not be allocated anyway), and allowed
// where no budget limits anything.
func TestMissingClassRefused(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", modelnames.SharedClassName, "40Gi", nil, nil))
	c := newCharger(f)
	resp := c.Admit(context.Background(), review(t, claim("x", exact("g", "missing.example.com", 1, nil)), false))
	if resp.Allowed || !strings.Contains(resp.Result.Message, "DeviceClass missing.example.com not found") {
		t.Errorf("a claim of a missing class: %+v", resp.Result)
	}
	f = newFakeBudgets(t, budget("count-only", "", "", nil, nil))
	c = newCharger(f)
	if resp := c.Admit(context.Background(), review(t, claim("x", exact("g", "missing.example.com", 1, nil)), false)); !resp.Allowed {
		t.Errorf("a budget that limits nothing refused a missing class: %+v", resp.Result)
	}
}

// mutableDevices is a Devices function over a list a test changes, each
// change a new version.
type mutableDevices struct {
	devices []resourceapi.Device
	version uint64
}

func (m *mutableDevices) set(d []resourceapi.Device) { m.devices, m.version = d, m.version+1 }
func (m *mutableDevices) list(context.Context) ([]resourceapi.Device, uint64, error) {
	return m.devices, m.version, nil
}

// Slices gone for a while (node pool scaled to zero, plugin restarting):
// a class of this driver is charged the largest size it was seen with.
func TestClassOfThisDriverMatchingNothing(t *testing.T) {
	cs := classes()
	cs["custom.example.com"] = &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "custom.example.com"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "gpu"`}}}}}
	m := &mutableDevices{}
	m.set(twoModels())
	p := NewPricer(m.list, func(ctx context.Context, name string) (*resourceapi.DeviceClass, error) {
		if c, ok := cs[name]; ok {
			return c, nil
		}
		return pricer(nil).classes(ctx, name)
	})
	price := func(r resourceapi.DeviceRequest) Charge {
		t.Helper()
		cc, err := p.Claim(context.Background(), &claim("c", r).Spec.Devices)
		if err != nil {
			t.Fatal(err)
		}
		return cc.For("")
	}
	// Never seen: its size is unknown in every dimension.
	m.set(nil)
	if got := price(exact("g", "custom.example.com", 1, nil)); len(got.Unknown) != 3 {
		t.Errorf("a class of this driver never seen: %+v, want every dimension unknown", got)
	}
	m.set(twoModels())
	want := Amount{Memory: gi(80), Cores: 100, GPUs: 1}
	for _, class := range []string{"custom.example.com", modelnames.WholeClassName} {
		if got := price(exact("g", class, 1, nil)); got.Amount != want {
			t.Fatalf("%s: %+v, want %+v", class, got, want)
		}
	}
	m.set(nil) // every slice gone
	for _, class := range []string{"custom.example.com", modelnames.WholeClassName} {
		if got := price(exact("g", class, 1, nil)); got.Amount != want || len(got.Unknown) != 0 {
			t.Errorf("%s with its slices gone: %+v, want %+v (the largest seen)", class, got, want)
		}
	}
	// Never lowered: a smaller model comes back alone, priced while it is
	// the only one published, and after it is gone again.
	m.set([]resourceapi.Device{device("gpu-1", modelnames.TypeWhole, "40Gi", 100)})
	for _, class := range []string{"custom.example.com", modelnames.WholeClassName} {
		if got := price(exact("g", class, 1, nil)); got.Amount != want {
			t.Errorf("%s with only a smaller GPU published: %+v, want %+v (the largest seen)", class, got, want)
		}
	}
	m.set(nil)
	if got := price(exact("g", modelnames.WholeClassName, 1, nil)); got.Amount != want {
		t.Errorf("after a smaller GPU: %+v, want %+v", got, want)
	}
	// Another driver's class still takes nothing.
	if got := price(exact("x", "other.example.com", 1, nil)); !got.IsZero() || len(got.Unknown) != 0 {
		t.Errorf("another driver's class: %+v", got)
	}
}

// A reconciler whose pricer never saw the slices (restarted while they are
// gone) does not lower used in a dimension whose size it cannot know.
func TestReconcilerKeepsUsedWhenSizeUnknown(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "200Gi", nil, nil))
	ctx := context.Background()
	now := clock
	g := claim("g", exact("g", modelnames.WholeClassName, 1, nil))
	held := []*resourceapi.ResourceClaim{g}
	r := newReconciler(f, &held, &now)
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if got := amount(f.get(t, "gpu").Status.Used); got.Memory != gi(80) {
		t.Fatalf("used %v, want 80Gi", got)
	}
	r.Pricer = pricer([]resourceapi.Device{})
	if err := r.Reconcile(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if got := amount(f.get(t, "gpu").Status.Used); got.Memory != gi(80) || got.GPUs != 1 {
		t.Errorf("used %v with the slices gone, want 80Gi and 1 GPU kept", got)
	}
}
