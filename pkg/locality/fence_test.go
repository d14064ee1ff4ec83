package locality

import (
	"context"
	"fmt"
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

// A fence keeps every share off its GPU, so a claim's fences never close
// the GPU a claim rejected before it waits for, and its rejection lifts
// fences that only younger claims hold on GPUs it would be accepted on. The
// oldest waiting claim has its way: a late affinity share whose group's GPU
// also refuses an exclusive tenant still gets there, and two claims cannot
// hold each other's GPU open for ever.
func TestFencesLeaveWantedGPUsOpen(t *testing.T) {
	setup := func() (*Controller, *store, *fakeFences, *time.Time) {
		now := time.Unix(1000, 0)
		ff := &fakeFences{}
		s := newStore(
			allocated("q0", 0, Labels{}, true),                   // unlabelled, on gpu 0
			allocated("q1", 1, Labels{}, true),                   // unlabelled, on gpu 1
			allocated("stage-a", 1, Labels{Affinity: "p"}, true), // the group p, on gpu 1
		)
		c := &Controller{Writer: s, Fences: ff, Now: func() time.Time { return now }}
		syncAll(t, c, s, "q0", "q1", "stage-a")
		return c, s, ff, &now
	}
	fenced := func(ff *fakeFences) []GPU {
		slices.SortFunc(ff.on, func(a, b GPU) int { return strings.Compare(a.String(), b.String()) })
		return ff.on
	}
	place := func(t *testing.T, c *Controller, s *store, name string, minor int, l Labels, try int) string {
		t.Helper()
		claim := allocated(name, minor, l, false)
		claim.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID(fmt.Sprintf("%s-%d", name, try)))
		s.put(claim)
		syncAll(t, c, s, name)
		return verdictOf(s.claims[name])
	}
	// step places claim name on gpu minor, its try-th allocation, a second
	// after the step before when later. Its verdict must be want and, where
	// fences is not nil, the fenced GPUs fences.
	type step struct {
		name       string
		minor, try int
		later      bool
		want       string
		fences     []GPU
	}
	labels := map[string]Labels{"tenant": {Exclusion: "x"}, "stage-b": {Affinity: "p"}}
	run := func(t *testing.T, steps []step) {
		c, s, ff, now := setup()
		for _, st := range steps {
			if st.later {
				*now = now.Add(time.Second)
			}
			if v := place(t, c, s, st.name, st.minor, labels[st.name], st.try); v != st.want {
				t.Fatalf("%s on gpu %d: %s, want %s", st.name, st.minor, v, st.want)
			}
			if st.fences != nil && !slices.Equal(fenced(ff), st.fences) {
				t.Fatalf("after %s on gpu %d: fences %v, want %v", st.name, st.minor, ff.on, st.fences)
			}
		}
	}

	t.Run("stage first", func(t *testing.T) {
		run(t, []step{
			// A late stage of p lands on the empty gpu 2: rejected, its group
			// is on gpu 1. Fenced: gpu 2 and gpu 0 (it refuses the stage too).
			{name: "stage-b", minor: 2, try: 1, want: "rejected:Affinity", fences: []GPU{gpuN(0), gpuN(2)}},
			// A tenant, rejected on gpu 0, is refused by gpu 1 too (unlabelled
			// shares), but gpu 1 is what the older stage waits for: left open.
			// Nor does it lift the stage's fence on gpu 2.
			{name: "tenant", minor: 0, try: 1, later: true, want: "rejected:Exclusion", fences: []GPU{gpuN(0), gpuN(2)}},
			// The stage gets to gpu 1; its fences go. The tenant, rejected on
			// gpu 1, now fences it and gpu 0.
			{name: "stage-b", minor: 1, try: 2, later: true, want: "accepted"},
			{name: "tenant", minor: 1, try: 2, want: "rejected:Exclusion", fences: []GPU{gpuN(0), gpuN(1)}},
		})
	})

	t.Run("tenant first", func(t *testing.T) {
		run(t, []step{
			{name: "tenant", minor: 0, try: 1, want: "rejected:Exclusion", fences: []GPU{gpuN(0), gpuN(1)}},
			// The younger stage, rejected on gpu 2, does not fence gpu 2 (the
			// older tenant would be accepted there) and does not lift the
			// tenant's fence on gpu 1: it waits for the tenant to be placed.
			{name: "stage-b", minor: 2, try: 1, later: true, want: "rejected:Affinity", fences: []GPU{gpuN(0), gpuN(1)}},
			// The tenant is accepted on gpu 2; its fence on gpu 1 goes (gpu 0
			// stays fenced for the stage, which it refuses too), and gpu 1 is
			// open for the stage.
			{name: "tenant", minor: 2, try: 2, later: true, want: "accepted", fences: []GPU{gpuN(0)}},
			{name: "stage-b", minor: 1, try: 2, want: "accepted"},
		})
	})
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
	// and gpu 0, which would reject it too). Those fences stay while b is
	// allocated again (lifted, they would let it go straight back), but are
	// not renewed by the rejections past its budget.
	for i := 1; i <= 3; i++ {
		holder := allocated("x"+string(rune('0'+i)), i, Labels{Exclusion: "x"}, true)
		s.put(holder)
		syncAll(t, c, s, holder.Name)
		b := allocated("b", i, Labels{}, false)
		b.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("b-" + string(rune('0'+i))))
		s.put(b)
		syncAll(t, c, s, "b")
		slices.SortFunc(ff.on, func(a, b GPU) int { return strings.Compare(a.String(), b.String()) })
		if want := []GPU{gpuN(0), gpuN(1)}; !slices.Equal(ff.on, want) {
			t.Errorf("after b's rejection on gpu %d: fences %v, want %v", i, ff.on, want)
		}
		now = now.Add(time.Second)
	}
	now = now.Add(9 * time.Second) // 11 s after the last rejection that fenced
	c.Expire(context.Background())
	if len(ff.on) != 0 {
		t.Fatalf("fences outlived their TTL: %v", ff.on)
	}
	// Still rejected after its fences expired and a cool-down of one TTL
	// since its budget ran out: a new budget, it is steered again.
	now = now.Add(10 * time.Second)
	b := allocated("b", 0, Labels{}, false)
	b.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("b-4"))
	s.put(b)
	syncAll(t, c, s, "b")
	if len(ff.on) == 0 {
		t.Errorf("b's rejection after its cool-down raised no fence")
	}
	now = now.Add(11 * time.Second)
	c.Expire(context.Background())

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
