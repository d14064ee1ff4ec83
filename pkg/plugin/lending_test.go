package plugin

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/lending"
	"github.com/tessera-dev/tessera/pkg/model"
)

const lendConfig = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","lending":{"lendWhenIdle":true}}`

// fakeActivity is a sampler the test sets: the pods computing on each GPU.
type fakeActivity struct {
	pods map[string]map[types.UID]lending.Activity
}

func (f *fakeActivity) sample(uuid string) lending.Sample {
	return lending.Sample{Observed: true, Pods: f.pods[uuid]}
}

type lendingEnv struct {
	*env
	i        *instance
	l        *Lender
	now      time.Time
	act      *fakeActivity
	republis int
}

func (e *lendingEnv) startLender(t *testing.T) {
	t.Helper()
	e.i = e.start(nil)
	l, err := NewLender(ctxFor(t), e.i.Plugin, LenderOptions{
		Policy:        lending.Policy{IdlePeriod: time.Minute, MinLend: 1 << 30, Reserve: 1 << 30, MemorySlack: 256 << 20},
		BusyThreshold: 5,
		Sample:        e.act.sample,
		Store:         lending.Store{Path: filepath.Join(filepath.Dir(e.checkpoint), lending.StateFile)},
		BootID:        e.bootID,
		Republish:     func() { e.republis++ },
		Now:           func() time.Time { return e.now },
	})
	if err != nil {
		t.Fatal(err)
	}
	e.l = l
}

func (e *lendingEnv) tick(t *testing.T, d time.Duration) {
	e.now = e.now.Add(d)
	e.l.Tick(ctxFor(t))
}

func TestLendingLifecycle(t *testing.T) {
	e := &lendingEnv{env: newEnv(t), now: time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC),
		act: &fakeActivity{pods: map[string]map[types.UID]lending.Activity{}}}
	e.startLender(t)
	uuid := uuidOf(0)
	lent := model.LentDeviceName(0)
	borrower := newClaim("borrower", []result{share("gpu", lent, "s-1", "8Gi", "50")})

	// Nothing holds GPU 0: a borrower is refused.
	e.tick(t, time.Second)
	if r := prepare(t, e.i.Plugin, borrower); r.Err == nil || !strings.Contains(r.Err.Error(), "not lent") {
		t.Fatalf("borrower on an unheld GPU: %v, want refused as not lent", r.Err)
	}
	// An owner that lends holds it whole, with a notebook idling on 10 GiB.
	mustPrepare(t, e.i.Plugin, newClaim("owner", []result{whole("gpu", model.WholeDeviceName(0))}, claimConfig(lendConfig)))
	e.act.pods[uuid] = map[types.UID]lending.Activity{"owner-pod": {Memory: 10 << 30, PIDs: []uint32{100}}}
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.WaitingForIdle {
		t.Fatalf("idle owner: %s, want %s", s.Phase, lending.WaitingForIdle)
	}
	e.tick(t, time.Minute)
	got := e.l.Lent()[uuid]
	if !got.Open || got.Memory <= 0 {
		t.Fatalf("after the idle period: %+v, want open with memory", got)
	}
	if e.republis == 0 {
		t.Error("opening a GPU did not republish")
	}
	devs := mustPrepare(t, e.i.Plugin, borrower)
	spec := inject(t, cdiIDs(devs), e.cdiRoot)
	if !slicesContain(spec.Process.Env, "TESSERA_PREEMPTIBLE=true") {
		t.Errorf("borrower env %v lacks TESSERA_PREEMPTIBLE=true", spec.Process.Env)
	}

	// A plugin restart keeps the loan.
	e.startLender(t)
	if s := e.l.States()[uuid]; s.Phase != lending.Lent {
		t.Fatalf("after a restart: %s, want %s", s.Phase, lending.Lent)
	}
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.Lent {
		t.Fatalf("first sample after a restart: %s, want %s", s.Phase, lending.Lent)
	}

	// The owner computes: the GPU is taken back, the borrower told.
	e.act.pods[uuid]["owner-pod"] = lending.Activity{SM: 80, Memory: 10 << 30, PIDs: []uint32{100}}
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.Reclaiming || s.Reason != lending.ReasonOwnerBusy {
		t.Fatalf("busy owner: %+v, want Reclaiming (OwnerBusy)", s)
	}
	if e.l.Lent()[uuid].Open {
		t.Error("a reclaimed GPU is still open")
	}
	if !eventsContain(e.events.list(), "claim default/claim-borrower: Warning Reclaimed") {
		t.Errorf("no Reclaimed event on the borrower claim: %v", e.events.list())
	}
	// A second borrower is refused while the GPU is taken back.
	if r := prepare(t, e.i.Plugin, newClaim("borrower-2", []result{share("gpu", lent, "s-2", "1Gi", "")})); r.Err == nil {
		t.Fatal("second borrower prepared on a reclaimed GPU")
	}
	// A borrower still there after the longest grace is reported, once.
	e.tick(t, MaxReclaimGrace)
	e.tick(t, 31*time.Second)
	e.tick(t, time.Second)
	outstayed := 0
	for _, ev := range e.events.list() {
		if strings.HasPrefix(ev, "claim default/claim-borrower: Warning BorrowerOutstayed") {
			outstayed++
		}
	}
	if outstayed != 1 {
		t.Errorf("%d BorrowerOutstayed events, want 1: %v", outstayed, e.events.list())
	}
	// The borrower's pod is evicted and its claim unprepared: the GPU is the owner's.
	mustUnprepare(t, e.i.Plugin, "borrower")
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.Busy {
		t.Fatalf("after the reclaim: %s, want %s", s.Phase, lending.Busy)
	}

	// The owner's unprepare ends lending on the GPU.
	mustUnprepare(t, e.i.Plugin, "owner")
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.NotHeld {
		t.Fatalf("after the owner left: %s, want %s", s.Phase, lending.NotHeld)
	}
}

func TestLendingNeedsEveryOwnersConsent(t *testing.T) {
	e := &lendingEnv{env: newEnv(t), now: time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC),
		act: &fakeActivity{pods: map[string]map[types.UID]lending.Activity{}}}
	e.startLender(t)
	shared := model.SharedDeviceName(1)
	mustPrepare(t, e.i.Plugin, newClaim("a", []result{share("gpu", shared, "a-1", "10Gi", "20")}, claimConfig(lendConfig)))
	mustPrepare(t, e.i.Plugin, newClaim("b", []result{share("gpu", shared, "b-1", "10Gi", "20")}))
	e.tick(t, time.Second)
	e.tick(t, 2*time.Minute)
	if s := e.l.States()[uuidOf(1)]; s.Phase != lending.NotLending {
		t.Fatalf("one owner does not lend: %s, want %s", s.Phase, lending.NotLending)
	}
	mustUnprepare(t, e.i.Plugin, "b")
	e.tick(t, time.Second)
	e.tick(t, 2*time.Minute)
	if s := e.l.States()[uuidOf(1)]; s.Phase != lending.Lent {
		t.Fatalf("the lending owner alone: %s, want %s", s.Phase, lending.Lent)
	}
}

func TestBorrowerRefusedWithoutLending(t *testing.T) {
	i := newEnv(t).start(nil)
	r := prepare(t, i.Plugin, newClaim("borrower", []result{share("gpu", model.LentDeviceName(0), "s", "1Gi", "")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "lending is off") {
		t.Fatalf("borrower without a lender: %v, want refused (lending is off)", r.Err)
	}
}

func slicesContain(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func eventsContain(events []string, prefix string) bool {
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}

// The MPS daemons' processes compute for their clients: they are nobody's
// activity, while a process of an unknown pod is the owners'.
func TestLendingIgnoresServicePods(t *testing.T) {
	e := &lendingEnv{env: newEnv(t), now: time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC),
		act: &fakeActivity{pods: map[string]map[types.UID]lending.Activity{}}}
	e.i = e.start(nil)
	calls := 0
	l, err := NewLender(ctxFor(t), e.i.Plugin, LenderOptions{
		Policy: lending.Policy{IdlePeriod: time.Minute, MinLend: 1 << 30, Reserve: 1 << 30, MemorySlack: 256 << 20},
		Sample: e.act.sample,
		Store:  lending.Store{Path: filepath.Join(t.TempDir(), lending.StateFile)},
		BootID: e.bootID,
		Now:    func() time.Time { return e.now },
		ServicePods: func(context.Context) (map[types.UID]bool, error) {
			calls++
			return map[types.UID]bool{"mps-daemon": true}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.l = l
	uuid := uuidOf(0)
	mustPrepare(t, e.i.Plugin, newClaim("owner", []result{whole("gpu", model.WholeDeviceName(0))}, claimConfig(lendConfig)))
	e.act.pods[uuid] = map[types.UID]lending.Activity{"mps-daemon": {SM: 90, Memory: 1 << 30, PIDs: []uint32{7}}}
	e.tick(t, time.Second)
	e.tick(t, time.Minute)
	if s := e.l.States()[uuid]; s.Phase != lending.Lent {
		t.Fatalf("an MPS server computing: %s, want %s (it is nobody's activity)", s.Phase, lending.Lent)
	}
	e.act.pods[uuid]["unknown"] = lending.Activity{SM: 90, PIDs: []uint32{8}}
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.Busy {
		t.Fatalf("an unknown pod computing: %s, want %s", s.Phase, lending.Busy)
	}
	if calls != 2 {
		t.Errorf("ServicePods called %d times by ticks at 1 s, 61 s and 62 s; want 2 (answers are kept 30 s)", calls)
	}
}

// A borrower is admitted only within what is lent now, counting the GPU's
// other borrowers.
func TestBorrowersFitWhatIsLent(t *testing.T) {
	e := &lendingEnv{env: newEnv(t), now: time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC),
		act: &fakeActivity{pods: map[string]map[types.UID]lending.Activity{}}}
	e.startLender(t)
	uuid := uuidOf(0)
	mustPrepare(t, e.i.Plugin, newClaim("owner", []result{whole("gpu", model.WholeDeviceName(0))}, claimConfig(lendConfig)))
	e.act.pods[uuid] = map[types.UID]lending.Activity{"owner-pod": {Memory: 10 << 30, PIDs: []uint32{100}}}
	e.tick(t, time.Second)
	e.tick(t, time.Minute)
	lent := e.l.States()[uuid].Lendable
	if lent == 0 {
		t.Fatal("not lent")
	}
	lentDev := model.LentDeviceName(0)
	mustPrepare(t, e.i.Plugin, newClaim("b1", []result{share("gpu", lentDev, "s1", resourceMiB(lent-(2<<30)), "")}))
	mustPrepare(t, e.i.Plugin, newClaim("b2", []result{share("gpu", lentDev, "s2", "1Gi", "")}))
	r := prepare(t, e.i.Plugin, newClaim("b3", []result{share("gpu", lentDev, "s3", "2Gi", "")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "do not fit") {
		t.Fatalf("a borrower beyond what is lent: %v, want refused", r.Err)
	}
}

func resourceMiB(b int64) string { return strconv.FormatInt(b>>20, 10) + "Mi" }
