package budget

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// Version 0 of the devices (what a fresh Inventory reported before it had
// seen a slice) must not crash the Pricer: its cache map was nil then.
func TestPricerVersionZero(t *testing.T) {
	p := NewPricer(func(context.Context) ([]resourceapi.Device, uint64, error) { return nil, 0, nil }, pricer(nil).classes)
	for range 2 {
		if _, err := p.Claim(context.Background(), &claim("c", exact("s", modelnames.SharedClassName, 1, map[string]string{"memory": "1Gi"})).Spec.Devices); err != nil {
			t.Fatal(err)
		}
	}
	// The zero Pricer's cache too (a Pricer made without NewPricer).
	z := &Pricer{devices: p.devices, classes: p.classes, cel: p.cel}
	if _, err := z.Claim(context.Background(), &claim("c", exact("g", modelnames.WholeClassName, 1, nil)).Spec.Devices); err != nil {
		t.Fatal(err)
	}
}

// An Inventory over a cluster without Tessera slices, before its informer
// runs: no devices, and a version the Pricer does not cache under.
func TestInventoryNoSlices(t *testing.T) {
	inv := NewInventory(fake.NewClientset())
	devices, version, err := inv.Devices(context.Background())
	if err != nil || len(devices) != 0 {
		t.Fatalf("devices %v, err %v", devices, err)
	}
	if version != 0 {
		t.Errorf("version %d of an uncached LIST, want 0 (not cacheable)", version)
	}
	p := NewPricer(inv.Devices, pricer(nil).classes)
	if _, err := p.Claim(context.Background(), &claim("c", exact("g", modelnames.WholeClassName, 1, nil)).Spec.Devices); err != nil {
		t.Fatal(err)
	}
}

// panicking is a Pricer whose device list panics.
func panicking() *Pricer {
	return NewPricer(func(context.Context) ([]resourceapi.Device, uint64, error) { panic("boom") }, pricer(nil).classes)
}

// A panic while pricing is an error of the review (refused), not a crash.
func TestAdmitRecoversPanic(t *testing.T) {
	_, c := chargeGPU(t)
	c.Pricer = panicking()
	resp := c.Admit(context.Background(), review(t, share("a", "1Gi"), false))
	if resp.Allowed || resp.Result.Code != 500 || !strings.Contains(resp.Result.Message, "boom") {
		t.Errorf("panic in the pricer: %+v", resp.Result)
	}
}

// A panic while reconciling is the namespace's error, not a crash.
func TestReconcileRecoversPanic(t *testing.T) {
	f := newFakeBudgets(t, budget("gpu", "", "40Gi", nil, nil))
	now := clock
	held := []*resourceapi.ResourceClaim{share("a", "1Gi")}
	r := newReconciler(f, &held, &now)
	r.Pricer = panicking()
	if err := r.Reconcile(context.Background(), "team-a"); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("panic in the pricer: err %v", err)
	}
}

// Once its informer has synced, the Inventory flattens the slices once per
// change, not once per call.
func TestInventoryCachesPerVersion(t *testing.T) {
	slice := func(name string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceSliceSpec{Driver: modelnames.DriverName, Pool: resourceapi.ResourcePool{Name: name}, Devices: devices}}
	}
	client := fake.NewClientset(slice("a", twoModels()...))
	inv := NewInventory(client)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inv.Start(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inv.synced) {
		t.Fatal("not synced")
	}
	first, v1, err := inv.Devices(ctx)
	if err != nil || len(first) != len(twoModels()) || v1 == 0 {
		t.Fatalf("devices %d, version %d, err %v", len(first), v1, err)
	}
	again, v2, _ := inv.Devices(ctx)
	if v2 != v1 || &again[0] != &first[0] {
		t.Errorf("a second call at version %d copied the devices again (version %d)", v1, v2)
	}
	if _, err := client.ResourceV1().ResourceSlices().Create(ctx, slice("b", device("gpu-9", modelnames.TypeWhole, "96Gi", 100)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, v, _ := inv.Devices(ctx)
		if len(got) == len(twoModels())+1 && v > v1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new slice never seen: %d devices, version %d", len(got), v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
