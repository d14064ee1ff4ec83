package locality

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// fakeFences records the fenced GPUs.
type fakeFences struct{ on []GPU }

func (f *fakeFences) Fence(_ context.Context, g GPU) error {
	if !slices.Contains(f.on, g) {
		f.on = append(f.on, g)
	}
	return nil
}

func (f *fakeFences) Unfence(_ context.Context, g GPU) error {
	f.on = slices.DeleteFunc(f.on, func(o GPU) bool { return o == g })
	return nil
}

func (f *fakeFences) UnfenceAll(context.Context) error { f.on = nil; return nil }

// A claim rejected on a GPU fences it, so that its next allocation goes
// elsewhere; once it is accepted there, the fence goes.
func TestRejectionFencesTheGPUUntilAccepted(t *testing.T) {
	now := time.Unix(1000, 0)
	ff := &fakeFences{}
	s := newStore(allocated("a", 0, Labels{AntiAffinity: "n"}, false), allocated("b", 0, Labels{AntiAffinity: "n"}, false))
	c := &Controller{Writer: s, Fences: ff, Now: func() time.Time { return now }}
	syncAll(t, c, s, "a", "b")
	if !slices.Equal(ff.on, []GPU{gpuN(0)}) {
		t.Fatalf("fenced %v after b's rejection on gpu 0", ff.on)
	}
	b := allocated("b", 1, Labels{AntiAffinity: "n"}, false) // allocated again, away from the fence
	b.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("b-2"))
	s.put(b)
	syncAll(t, c, s, "b")
	if v := verdictOf(s.claims["b"]); v != "accepted" || len(ff.on) != 0 {
		t.Errorf("b on gpu 1: %s, fences %v", v, ff.on)
	}
}

// A fence nobody settles goes after its TTL; a claim deleted settles its
// fences; a claim that fits nowhere raises at most MaxFencesPerClaim.
func TestFencesExpireAndAreBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	ff := &fakeFences{}
	s := newStore(allocated("a", 0, Labels{Exclusion: "x"}, false), allocated("b", 0, Labels{}, false))
	c := &Controller{Writer: s, Fences: ff, Now: func() time.Time { return now }, FenceTTL: 10 * time.Second, MaxFencesPerClaim: 2}
	syncAll(t, c, s, "a", "b")
	if len(ff.on) != 1 {
		t.Fatalf("fences %v", ff.on)
	}
	now = now.Add(9 * time.Second)
	c.Expire(context.Background())
	if len(ff.on) != 1 {
		t.Fatalf("fence lifted before its TTL: %v", ff.on)
	}
	now = now.Add(2 * time.Second)
	c.Expire(context.Background())
	if len(ff.on) != 0 {
		t.Fatalf("fence outlived its TTL: %v", ff.on)
	}

	// b is allocated again and rejected on GPUs 1, 2, 3 in turn (each holds
	// a share of group x). Its rejection on gpu 0 was its first steered one,
	// so with MaxFencesPerClaim 2 only its rejection on gpu 1 fences (gpu 1,
	// and gpu 0, which would reject it too); after that it is not steered.
	for i := 1; i <= 3; i++ {
		holder := allocated("x"+string(rune('0'+i)), i, Labels{Exclusion: "x"}, true)
		s.put(holder)
		syncAll(t, c, s, holder.Name)
		b := allocated("b", i, Labels{}, false)
		b.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("b-" + string(rune('0'+i))))
		s.put(b)
		syncAll(t, c, s, "b")
		want := []GPU(nil)
		if i == 1 {
			want = []GPU{gpuN(0), gpuN(1)}
		}
		slices.SortFunc(ff.on, func(a, b GPU) int { return strings.Compare(a.String(), b.String()) })
		if !slices.Equal(ff.on, want) {
			t.Errorf("after b's rejection on gpu %d: fences %v, want %v", i, ff.on, want)
		}
	}
	// A fence stands while its claim waits again.
	s.put(allocated("c", 1, Labels{}, false))
	syncAll(t, c, s, "c")
	if len(ff.on) == 0 {
		t.Fatal("c's rejection raised no fence")
	}
	for _, name := range []string{"b", "c"} {
		delete(s.claims, name)
		if err := c.Sync(context.Background(), "ns/"+name, nil); err != nil {
			t.Fatal(err)
		}
	}
	if len(ff.on) != 0 {
		t.Errorf("fences %v stay after the claims were deleted", ff.on)
	}
}

// APIFences writes one DeviceTaintRule per fenced GPU, idempotently.
func TestAPIFences(t *testing.T) {
	client := fake.NewClientset()
	f := APIFences{Client: client}
	ctx := context.Background()
	for range 2 {
		if err := f.Fence(ctx, gpuN(3)); err != nil {
			t.Fatal(err)
		}
	}
	rule, err := client.ResourceV1().DeviceTaintRules().Get(ctx, FenceRuleName(gpuN(3)), metav1GetOptions)
	if err != nil {
		t.Fatal(err)
	}
	sel := rule.Spec.DeviceSelector
	if *sel.Driver != "gpu.tessera.dev" || *sel.Pool != "node" || *sel.Device != "gpu-3-shared" ||
		rule.Spec.Taint.Key != FenceTaintKey || rule.Spec.Taint.Effect != "NoSchedule" {
		t.Errorf("rule %+v", rule.Spec)
	}
	if err := f.Fence(ctx, gpuN(4)); err != nil {
		t.Fatal(err)
	}
	if err := f.Unfence(ctx, gpuN(3)); err != nil {
		t.Fatal(err)
	}
	if err := f.Unfence(ctx, gpuN(3)); err != nil {
		t.Fatal(err)
	}
	if err := f.UnfenceAll(ctx); err != nil {
		t.Fatal(err)
	}
	if list, _ := client.ResourceV1().DeviceTaintRules().List(ctx, metav1ListOptions); len(list.Items) != 0 {
		t.Errorf("rules left: %v", list.Items)
	}
}

var (
	metav1GetOptions  = metav1.GetOptions{}
	metav1ListOptions = metav1.ListOptions{}
)
