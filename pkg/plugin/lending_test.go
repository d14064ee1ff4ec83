package plugin

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/lending"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
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

// newLendingEnv is a plugin environment at a fixed time with no GPU activity;
// startLender starts its plugin and lender.
func newLendingEnv(t *testing.T) *lendingEnv {
	return &lendingEnv{env: newEnv(t), now: time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC),
		act: &fakeActivity{pods: map[string]map[types.UID]lending.Activity{}}}
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

// startLenderWith starts a plugin and a Lender of the default policy, with
// its lending state in a directory of its own, no busy threshold and no
// republishing; mutate sets the options a test is about.
func (e *lendingEnv) startLenderWith(t *testing.T, mutate func(*LenderOptions)) {
	t.Helper()
	e.i = e.start(nil)
	o := LenderOptions{
		Policy: lending.Policy{IdlePeriod: time.Minute, MinLend: 1 << 30, Reserve: 1 << 30, MemorySlack: 256 << 20},
		Sample: e.act.sample,
		Store:  lending.Store{Path: filepath.Join(t.TempDir(), lending.StateFile)},
		BootID: e.bootID,
		Now:    func() time.Time { return e.now },
	}
	mutate(&o)
	l, err := NewLender(ctxFor(t), e.i.Plugin, o)
	if err != nil {
		t.Fatal(err)
	}
	e.l = l
}

func (e *lendingEnv) tick(t *testing.T, d time.Duration) {
	e.now = e.now.Add(d)
	e.l.Tick(ctxFor(t))
}

// prepareAndIdle prepares owner, a claim on GPU 0 that lends, sets pods as
// the activity on GPU 0 and samples it at once and after the idle period.
func (e *lendingEnv) prepareAndIdle(t *testing.T, owner *resourceapi.ResourceClaim, pods map[types.UID]lending.Activity) {
	t.Helper()
	mustPrepare(t, e.i.Plugin, owner)
	e.act.pods[publishtest.UUID(0)] = pods
	e.tick(t, time.Second)
	e.tick(t, time.Minute)
}

func TestLendingLifecycle(t *testing.T) {
	e := newLendingEnv(t)
	e.startLender(t)
	uuid := publishtest.UUID(0)
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
	if !slices.Contains(spec.Process.Env, "TESSERA_PREEMPTIBLE=true") {
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
	if !publishtest.HasEvent(e.events.List(), "claim default/claim-borrower: Warning Reclaimed") {
		t.Errorf("no Reclaimed event on the borrower claim: %v", e.events.List())
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
	for _, ev := range e.events.List() {
		if strings.HasPrefix(ev, "claim default/claim-borrower: Warning BorrowerOutstayed") {
			outstayed++
		}
	}
	if outstayed != 1 {
		t.Errorf("%d BorrowerOutstayed events, want 1: %v", outstayed, e.events.List())
	}
	// The borrower's pod is evicted and its claim unprepared: the GPU is the owner's.
	mustUnprepare(t, e.i.Plugin, "borrower")
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.OwnerBusy {
		t.Fatalf("after the reclaim: %s, want %s", s.Phase, lending.OwnerBusy)
	}

	// The owner's unprepare ends lending on the GPU.
	mustUnprepare(t, e.i.Plugin, "owner")
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.NotHeld {
		t.Fatalf("after the owner left: %s, want %s", s.Phase, lending.NotHeld)
	}
}

func TestLendingNeedsEveryOwnersConsent(t *testing.T) {
	e := newLendingEnv(t)
	e.startLender(t)
	shared := model.SharedDeviceName(1)
	mustPrepare(t, e.i.Plugin, newClaim("a", []result{share("gpu", shared, "a-1", "10Gi", "20")}, claimConfig(lendConfig)))
	mustPrepare(t, e.i.Plugin, newClaim("b", []result{share("gpu", shared, "b-1", "10Gi", "20")}))
	e.tick(t, time.Second)
	e.tick(t, 2*time.Minute)
	if s := e.l.States()[publishtest.UUID(1)]; s.Phase != lending.OwnerDoesNotLend {
		t.Fatalf("one owner does not lend: %s, want %s", s.Phase, lending.OwnerDoesNotLend)
	}
	mustUnprepare(t, e.i.Plugin, "b")
	e.tick(t, time.Second)
	e.tick(t, 2*time.Minute)
	if s := e.l.States()[publishtest.UUID(1)]; s.Phase != lending.Lent {
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

// The MPS daemons' processes compute for their clients: they are nobody's
// activity, while a process of an unknown pod is the owners'.
func TestLendingIgnoresServicePods(t *testing.T) {
	e := newLendingEnv(t)
	calls := 0
	e.startLenderWith(t, func(o *LenderOptions) {
		o.ServicePods = func(context.Context) (map[types.UID]bool, error) {
			calls++
			return map[types.UID]bool{"mps-daemon": true}, nil
		}
	})
	uuid := publishtest.UUID(0)
	e.prepareAndIdle(t, newClaim("owner", []result{whole("gpu", model.WholeDeviceName(0))}, claimConfig(lendConfig)),
		map[types.UID]lending.Activity{"mps-daemon": {SM: 90, Memory: 1 << 30, PIDs: []uint32{7}}})
	if s := e.l.States()[uuid]; s.Phase != lending.Lent {
		t.Fatalf("an MPS server computing: %s, want %s (it is nobody's activity)", s.Phase, lending.Lent)
	}
	e.act.pods[uuid]["unknown"] = lending.Activity{SM: 90, PIDs: []uint32{8}}
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.OwnerBusy {
		t.Fatalf("an unknown pod computing: %s, want %s", s.Phase, lending.OwnerBusy)
	}
	if calls != 2 {
		t.Errorf("ServicePods called %d times by ticks at 1 s, 61 s and 62 s; want 2 (answers are kept 30 s)", calls)
	}
}

// A borrower is admitted only within what is lent now, counting the GPU's
// other borrowers.
func TestBorrowersFitWhatIsLent(t *testing.T) {
	e := newLendingEnv(t)
	e.startLender(t)
	uuid := publishtest.UUID(0)
	e.prepareAndIdle(t, newClaim("owner", []result{whole("gpu", model.WholeDeviceName(0))}, claimConfig(lendConfig)),
		map[types.UID]lending.Activity{"owner-pod": {Memory: 10 << 30, PIDs: []uint32{100}}})
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

// borrowerFor is a borrower claim of memory on GPU 0's lending device,
// reserved for pod, tolerating the reclaim taint for grace seconds.
func borrowerFor(uid, pod, memory string, grace int64) *resourceapi.ResourceClaim {
	c := newClaim(uid, []result{share("gpu", model.LentDeviceName(0), uid+"-1", memory, "")})
	c.Status.Allocation.Devices.Results[0].Tolerations = []resourceapi.DeviceToleration{
		{Key: model.ReclaimTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoExecute, TolerationSeconds: &grace},
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID(pod)}}
	return c
}

type killCall struct {
	pod  types.UID
	pids []uint32
}

// A borrower whose pod ignores its eviction (a long termination grace, a
// process that ignores SIGTERM) is killed by the plugin its reclaim grace
// plus the kill margin after the reclaim began, again at every sample
// while it holds the GPU, and its claim is told once.
func TestOutstayingBorrowerIsKilled(t *testing.T) {
	e := newLendingEnv(t)
	var calls []killCall
	e.startLenderWith(t, func(o *LenderOptions) {
		o.KillMargin = 20 * time.Second
		o.Kill = func(pod types.UID, pids []uint32) ([]string, error) {
			calls = append(calls, killCall{pod, pids})
			return []string{"/sys/fs/cgroup/kubepods/pod" + string(pod)}, nil
		}
	})
	uuid := publishtest.UUID(0)
	e.prepareAndIdle(t, newClaim("owner", []result{whole("gpu", model.WholeDeviceName(0))}, claimConfig(lendConfig)),
		map[types.UID]lending.Activity{"owner-pod": {Memory: 10 << 30, PIDs: []uint32{100}}})
	mustPrepare(t, e.i.Plugin, borrowerFor("borrower", "borrower-pod", "8Gi", 10))
	e.act.pods[uuid]["borrower-pod"] = lending.Activity{Memory: 4 << 30, PIDs: []uint32{200, 201}}

	e.act.pods[uuid]["owner-pod"] = lending.Activity{SM: 80, Memory: 10 << 30, PIDs: []uint32{100}}
	e.tick(t, time.Second)
	reclaimed := e.now
	if s := e.l.States()[uuid]; s.Phase != lending.Reclaiming {
		t.Fatalf("busy owner: %s, want Reclaiming", s.Phase)
	}
	// Within the grace (10 s) plus the margin (20 s): nothing is killed.
	e.tick(t, 29*time.Second)
	if len(calls) != 0 {
		t.Fatalf("killed %v %s after the reclaim began, before its grace and margin (30 s)", calls, e.now.Sub(reclaimed))
	}
	e.tick(t, time.Second)
	if len(calls) != 1 || calls[0].pod != "borrower-pod" || !slices.Equal(calls[0].pids, []uint32{200, 201}) {
		t.Fatalf("at grace + margin: kills %v, want borrower-pod with its GPU processes 200, 201", calls)
	}
	// Killed again while it holds the GPU (a restarted container), told once.
	e.tick(t, time.Second)
	if len(calls) != 2 {
		t.Fatalf("next sample: %d kills, want 2", len(calls))
	}
	var killed []string
	for _, ev := range e.events.List() {
		if strings.HasPrefix(ev, "claim default/claim-borrower: Warning BorrowerKilled") {
			killed = append(killed, ev)
		}
	}
	if len(killed) != 1 || !strings.Contains(killed[0], "cgroup.kill of /sys/fs/cgroup/kubepods/podborrower-pod") || !strings.Contains(killed[0], "reclaim grace (10s) plus 20s") {
		t.Fatalf("BorrowerKilled events %q, want one naming the cgroup and the bound", killed)
	}
	// Gone: no more kills, and the GPU is the owner's.
	mustUnprepare(t, e.i.Plugin, "borrower")
	e.tick(t, time.Second)
	if len(calls) != 2 {
		t.Errorf("kills after the borrower was unprepared: %v", calls[2:])
	}
	if s := e.l.States()[uuid]; s.Phase != lending.OwnerBusy {
		t.Fatalf("after the kill: %s, want %s", s.Phase, lending.OwnerBusy)
	}
}

// A borrower the plugin cannot kill (no cgroup found) is reported with the
// reason, and tried again.
func TestOutstayingBorrowerNotKillable(t *testing.T) {
	e := newLendingEnv(t)
	tries := 0
	e.startLenderWith(t, func(o *LenderOptions) {
		o.Kill = func(types.UID, []uint32) ([]string, error) {
			tries++
			return nil, fmt.Errorf("no cgroup v2 hierarchy")
		}
	})
	uuid := publishtest.UUID(0)
	e.prepareAndIdle(t, newClaim("owner", []result{whole("gpu", model.WholeDeviceName(0))}, claimConfig(lendConfig)),
		map[types.UID]lending.Activity{"owner-pod": {Memory: 10 << 30, PIDs: []uint32{100}}})
	mustPrepare(t, e.i.Plugin, borrowerFor("borrower", "borrower-pod", "8Gi", 0))
	e.act.pods[uuid]["owner-pod"] = lending.Activity{SM: 80, Memory: 10 << 30, PIDs: []uint32{100}}
	e.tick(t, time.Second)
	e.tick(t, DefaultKillMargin)
	e.tick(t, time.Second)
	if tries != 2 {
		t.Fatalf("%d kill attempts, want 2 (one per sample from the default margin on)", tries)
	}
	if ev := e.events.List(); !publishtest.HasEvent(ev, "claim default/claim-borrower: Warning BorrowerOutstayed") || !strings.Contains(strings.Join(ev, "\n"), "no cgroup v2 hierarchy") {
		t.Fatalf("events %v: want BorrowerOutstayed with the reason", ev)
	}
}

// The scheduler may place a claim that does not lend on a GPU with
// borrowers (the lending device holds no counters): its prepare takes the
// GPU back at once and fails, with an event, until the borrowers are gone.
func TestNonLendingOwnerReclaimsAtPrepare(t *testing.T) {
	e := newLendingEnv(t)
	e.startLender(t)
	uuid := publishtest.UUID(0)
	shared := model.SharedDeviceName(0)
	e.prepareAndIdle(t, newClaim("owner", []result{share("gpu", shared, "o-1", "20Gi", "20")}, claimConfig(lendConfig)),
		map[types.UID]lending.Activity{"owner-pod": {Memory: 2 << 30, PIDs: []uint32{100}}})
	mustPrepare(t, e.i.Plugin, borrowerFor("borrower", "borrower-pod", "8Gi", 5))

	select { // the prepares so far asked for a sample too
	case <-e.l.kick:
	default:
	}
	second := newClaim("second", []result{share("gpu", shared, "s-1", "10Gi", "20")})
	r := prepare(t, e.i.Plugin, second)
	if r.Err == nil || !strings.Contains(r.Err.Error(), "is being taken back") || !strings.Contains(r.Err.Error(), "default/claim-borrower") {
		t.Fatalf("a claim that does not lend on a lent GPU: %v, want refused while default/claim-borrower is taken back", r.Err)
	}
	if !publishtest.HasEvent(e.events.List(), "claim default/claim-second: Warning WaitingForBorrowers") {
		t.Errorf("no WaitingForBorrowers event on the waiting claim: %v", e.events.List())
	}
	// The refusal asked for a sample now (Run's kick), which takes the GPU back.
	select {
	case <-e.l.kick:
	default:
		t.Error("the refused prepare did not ask the lender to look again")
	}
	e.tick(t, 0)
	if s := e.l.States()[uuid]; s.Phase != lending.Reclaiming || s.Reason != lending.ReasonOwnerDoesNotLend {
		t.Fatalf("after the refused prepare: %s (%s), want Reclaiming (%s)", s.Phase, s.Reason, lending.ReasonOwnerDoesNotLend)
	}
	if e.l.Lent()[uuid].Open {
		t.Error("the GPU is still open to borrowers")
	}
	// Retries fail until the borrower is gone, then succeed.
	if r := prepare(t, e.i.Plugin, second); r.Err == nil {
		t.Fatal("retry prepared beside the borrower")
	}
	mustUnprepare(t, e.i.Plugin, "borrower")
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.OwnerDoesNotLend {
		t.Fatalf("borrower gone, owner still waiting: %s, want %s", s.Phase, lending.OwnerDoesNotLend)
	}
	mustPrepare(t, e.i.Plugin, second)
	e.tick(t, time.Second)
	if s := e.l.States()[uuid]; s.Phase != lending.OwnerDoesNotLend {
		t.Fatalf("with the second owner: %s, want %s", s.Phase, lending.OwnerDoesNotLend)
	}
	// A claim that lends is not refused on a lent GPU (the loan ends by
	// OwnersChanged instead), nor one on another GPU.
	mustPrepare(t, e.i.Plugin, newClaim("elsewhere", []result{share("gpu", model.SharedDeviceName(1), "e-1", "10Gi", "20")}))
}

// What a GPU held in shares lends is its memory less what the shares are
// entitled to, not less what they use.
func TestLendableLeavesSharesTheirMemory(t *testing.T) {
	e := newLendingEnv(t)
	e.startLender(t)
	uuid := publishtest.UUID(0)
	mustPrepare(t, e.i.Plugin, newClaim("a", []result{share("gpu", model.SharedDeviceName(0), "a-1", "20Gi", "20")}, claimConfig(lendConfig)))
	mustPrepare(t, e.i.Plugin, newClaim("b", []result{share("gpu", model.SharedDeviceName(0), "b-1", "30Gi", "20")}, claimConfig(lendConfig)))
	e.act.pods[uuid] = map[types.UID]lending.Activity{"a-pod": {Memory: 1 << 30, PIDs: []uint32{100}}, "b-pod": {Memory: 1 << 30, PIDs: []uint32{101}}}
	e.tick(t, time.Second)
	e.tick(t, time.Minute)
	s := e.l.States()[uuid]
	if want := int64(80-20-30-1) << 30; s.Phase != lending.Lent || s.Lendable != want {
		t.Fatalf("%s lending %d MiB; want Lent, %d MiB (80Gi - 20Gi - 30Gi - the 1Gi reserve)", s.Phase, s.Lendable>>20, want>>20)
	}
}

// An owner that does not lend and a borrower of the same lent GPU prepared
// at once: admission and the recording of the claim are one step, so the
// one admitted second sees the other and is refused; never are both
// prepared. The seam (Plugin.admitted) starts the other prepare right after
// the first is admitted and before it is recorded, the window in which
// both used to be admitted.
func TestOwnerAndBorrowerPreparedAtOnce(t *testing.T) {
	for _, first := range []string{"owner", "borrower"} {
		t.Run(first+" first", func(t *testing.T) {
			e := newLendingEnv(t)
			e.startLender(t)
			uuid := publishtest.UUID(0)
			shared := model.SharedDeviceName(0)
			e.prepareAndIdle(t, newClaim("lender", []result{share("gpu", shared, "l-1", "20Gi", "20")}, claimConfig(lendConfig)),
				map[types.UID]lending.Activity{"lender-pod": {Memory: 2 << 30, PIDs: []uint32{100}}})
			if !e.l.Lent()[uuid].Open {
				t.Fatalf("GPU not lent: %v", e.l.States()[uuid])
			}

			claims := map[string]*resourceapi.ResourceClaim{
				"owner":    newClaim("owner", []result{share("gpu", shared, "o-1", "10Gi", "20")}),
				"borrower": borrowerFor("borrower", "borrower-pod", "8Gi", 5),
			}
			second := "borrower"
			if first == "borrower" {
				second = "owner"
			}
			ctx := ctxFor(t)
			errs := map[string]error{}
			done := make(chan error, 1)
			var once bool
			e.i.Plugin.admitted = func(uid types.UID) {
				if uid != claims[first].UID || once {
					return
				}
				once = true
				go func() {
					res, err := e.i.Plugin.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claims[second]})
					if err == nil {
						err = res[claims[second].UID].Err
					}
					done <- err
				}()
				// Let the other prepare run as far as it can while this
				// one is admitted but not yet recorded.
				select {
				case err := <-done:
					done <- err
				case <-time.After(time.Second):
				}
			}
			errs[first] = prepare(t, e.i.Plugin, claims[first]).Err
			errs[second] = <-done
			if !once {
				t.Fatal("the seam did not run")
			}
			if errs["owner"] == nil && errs["borrower"] == nil {
				t.Fatalf("an owner that does not lend and a borrower were both prepared on GPU %s", uuid)
			}
			if errs[first] != nil {
				t.Errorf("the %s admitted first was refused: %v", first, errs[first])
			}
			t.Logf("%s refused: %v", second, errs[second])
		})
	}
}

// TestSurgeLendingChangeRepublishes: during a surge update two plugin
// instances share the checkpoint and lending state. A phase change made by
// one must make the other republish, or the two publish different taints
// (the other would keep a NoExecute reclaim taint lifted, or a GPU closed).
func TestSurgeLendingChangeRepublishes(t *testing.T) {
	e := newLendingEnv(t)
	lock := filepath.Join(t.TempDir(), "plugin.lock")
	republished := map[string]int{}
	newLender := func(name string, i *instance) *Lender {
		l, err := NewLender(ctxFor(t), i.Plugin, LenderOptions{
			Policy:        lending.Policy{IdlePeriod: time.Minute, MinLend: 1 << 30, Reserve: 1 << 30, MemorySlack: 256 << 20},
			BusyThreshold: 5,
			Sample:        e.act.sample,
			Store:         lending.Store{Path: filepath.Join(filepath.Dir(e.checkpoint), lending.StateFile)},
			BootID:        e.bootID,
			LockPath:      lock,
			Republish:     func() { republished[name]++ },
			Now:           func() time.Time { return e.now },
		})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	oldI, newI := e.start(nil), e.start(nil)
	old, surge := newLender("old", oldI), newLender("new", newI)
	uuid := publishtest.UUID(0)
	mustPrepare(t, oldI.Plugin, newClaim("owner", []result{whole("gpu", model.WholeDeviceName(0))}, claimConfig(lendConfig)))
	e.act.pods[uuid] = map[types.UID]lending.Activity{"owner-pod": {Memory: 10 << 30, PIDs: []uint32{100}}}

	e.now = e.now.Add(time.Second)
	old.Tick(ctxFor(t))
	surge.Tick(ctxFor(t))
	if old.Lent()[uuid].Open || surge.Lent()[uuid].Open {
		t.Fatal("opened before the idle period")
	}
	before := republished["old"]
	// The surge instance's sample opens the GPU.
	e.now = e.now.Add(time.Minute)
	surge.Tick(ctxFor(t))
	if !surge.Lent()[uuid].Open {
		t.Fatalf("surge instance after the idle period: %+v, want open", surge.States()[uuid])
	}
	// The old instance's next sample sees the opened GPU and republishes.
	e.now = e.now.Add(time.Second)
	old.Tick(ctxFor(t))
	if !old.Lent()[uuid].Open {
		t.Fatalf("old instance: %+v, want open (read from the shared state)", old.States()[uuid])
	}
	if republished["old"] == before {
		t.Error("the old instance did not republish after the other instance opened the GPU: the two publish different taints")
	}
}
