package lending

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

const gib = int64(1) << 30

var t0 = time.Date(2026, 11, 23, 8, 0, 0, 0, time.UTC)

func policy() Policy {
	return Policy{IdlePeriod: 5 * time.Minute, MemorySlack: 256 << 20, MinLend: gib, Reserve: gib}
}

func lender() []Owner { return []Owner{{Claim: "owner", Lend: true}} }

// full is an idle owner that holds nearly all of the GPU's memory.
func full() Observation {
	o := idle()
	o.OwnerMemory = 79 * gib
	return o
}

func idle() Observation {
	return Observation{Owners: lender(), Observed: true, OwnerMemory: 10 * gib, OwnerProcesses: []uint32{100}, Memory: 80 * gib}
}

// run feeds the observations one minute apart and returns every state.
func run(t *testing.T, s State, obs ...Observation) []State {
	t.Helper()
	var out []State
	for i, o := range obs {
		s = Step(policy(), s, o, t0.Add(time.Duration(i)*time.Minute))
		out = append(out, s)
	}
	return out
}

func phases(states []State) []Phase {
	var out []Phase
	for _, s := range states {
		out = append(out, s.Phase)
	}
	return out
}

func with(o Observation, f func(*Observation)) Observation { f(&o); return o }

func TestStep(t *testing.T) {
	borrowed := func(o *Observation) { o.Borrowers = []types.UID{"borrower"} }
	busyOwner := func(o *Observation) { o.Busy = true }
	lent := run(t, State{}, idle(), idle(), idle(), idle(), idle(), idle())
	tests := []struct {
		name string
		from State
		obs  []Observation
		want []Phase
	}{
		{"idle owner lends after the idle period", State{}, []Observation{idle(), idle(), idle(), idle(), idle(), idle()},
			[]Phase{WaitingForIdle, WaitingForIdle, WaitingForIdle, WaitingForIdle, WaitingForIdle, Lent}},
		{"no owner", State{}, []Observation{{Observed: true, Memory: 80 * gib}}, []Phase{NotHeld}},
		{"an owner that does not lend", State{}, []Observation{with(idle(), func(o *Observation) {
			o.Owners = append(o.Owners, Owner{Claim: "other"})
		})}, []Phase{OwnerDoesNotLend}},
		{"activity restarts the idle period", State{}, []Observation{idle(), idle(), idle(), with(idle(), busyOwner), idle(), idle(), idle(), idle(), idle(), idle()},
			[]Phase{WaitingForIdle, WaitingForIdle, WaitingForIdle, OwnerBusy, WaitingForIdle, WaitingForIdle, WaitingForIdle, WaitingForIdle, WaitingForIdle, Lent}},
		{"busy owner with a borrower reclaims until the borrower is gone", lent[5],
			[]Observation{with(idle(), borrowed), with(with(idle(), borrowed), busyOwner), with(idle(), borrowed), idle(), idle()},
			[]Phase{Lent, Reclaiming, Reclaiming, WaitingForIdle, WaitingForIdle}},
		{"busy owner without borrowers closes the GPU", lent[5], []Observation{with(idle(), busyOwner)}, []Phase{OwnerBusy}},
		{"a new owner process is activity", lent[5], []Observation{with(with(idle(), borrowed), func(o *Observation) {
			o.OwnerProcesses = []uint32{100, 101}
		})}, []Phase{Reclaiming}},
		{"owner memory growth beyond the slack is activity", lent[5], []Observation{
			with(with(idle(), borrowed), func(o *Observation) { o.OwnerMemory += 200 << 20 }),
			with(with(idle(), borrowed), func(o *Observation) { o.OwnerMemory += 300 << 20 }),
		}, []Phase{Lent, Reclaiming}},
		{"an owner releasing the GPU ends the loan", lent[5], []Observation{{Observed: true, Memory: 80 * gib, Borrowers: []types.UID{"b"}}, {Observed: true, Memory: 80 * gib}},
			[]Phase{Reclaiming, NotHeld}},
		{"an unobservable GPU is taken back", lent[5], []Observation{with(idle(), func(o *Observation) { o.Observed = false; borrowed(o) })}, []Phase{Reclaiming}},
		{"a borrower on a GPU that is not lent is reclaimed", State{}, []Observation{with(idle(), borrowed)}, []Phase{Reclaiming}},
		{"owners using all memory lend nothing", State{}, []Observation{
			full(), full(), full(), full(), full(), full(), idle(),
		}, []Phase{WaitingForIdle, WaitingForIdle, WaitingForIdle, WaitingForIdle, WaitingForIdle, NoSpareMemory, Lent}},
		{"an owner loading memory while waiting is busy", State{}, []Observation{
			idle(), idle(), with(idle(), func(o *Observation) { o.OwnerMemory += 20 * gib }), idle(),
		}, []Phase{WaitingForIdle, WaitingForIdle, OwnerBusy, WaitingForIdle}},
		{"a new owner process while waiting is busy", State{}, []Observation{
			idle(), with(idle(), func(o *Observation) { o.OwnerProcesses = []uint32{100, 102} }),
		}, []Phase{WaitingForIdle, OwnerBusy}},
		{"an owner joining a lent GPU takes it back", lent[5], []Observation{with(with(idle(), borrowed), func(o *Observation) {
			o.Owners = append(o.Owners, Owner{Claim: "second", Lend: true})
		})}, []Phase{Reclaiming}},
		{"an owner under MPS never lends", State{}, []Observation{
			with(idle(), func(o *Observation) { o.Owners[0].MPS = true }),
			with(with(idle(), borrowed), func(o *Observation) { o.Owners[0].MPS = true }),
		}, []Phase{OwnerUsesMPS, Reclaiming}},
		{"borrowers over what was lent are reclaimed", lent[5], []Observation{
			with(with(idle(), borrowed), func(o *Observation) { o.BorrowerMemory = 69 * gib }),
			with(with(idle(), borrowed), func(o *Observation) { o.BorrowerMemory = 70 * gib }),
		}, []Phase{Lent, Reclaiming}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := phases(run(t, tt.from, tt.obs...))
			if len(got) != len(tt.want) {
				t.Fatalf("phases %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("phases %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestLentState(t *testing.T) {
	states := run(t, State{}, idle(), idle(), idle(), idle(), idle(), idle())
	s := states[5]
	if !s.Open() || s.Lendable != 69*gib || s.OwnerMemory != 10*gib {
		t.Fatalf("lent state %+v: want open, 69 GiB lendable (80 - 10 used - 1 reserve), owner memory 10 GiB", s)
	}
	if !s.Since.Equal(t0.Add(5 * time.Minute)) {
		t.Errorf("since %s, want the time of lending", s.Since)
	}
	reclaim := Step(policy(), s, with(idle(), func(o *Observation) { o.Busy = true; o.Borrowers = []types.UID{"b"} }), t0.Add(time.Hour))
	if reclaim.Reason != ReasonOwnerBusy || reclaim.Lendable != s.Lendable || reclaim.Open() {
		t.Errorf("reclaim %+v: want reason %s, lendable kept, closed", reclaim, ReasonOwnerBusy)
	}
	// The driver's free memory caps what is lent.
	capped := run(t, State{}, idle(), idle(), idle(), idle(), idle(), with(idle(), func(o *Observation) { o.FreeMemory = 30 * gib }))[5]
	if capped.Lendable != 29*gib {
		t.Errorf("lendable %d with 30 GiB free, want 29 GiB (free less the reserve)", capped.Lendable)
	}
	if reclaim.TaintValue() != string(Reclaiming) || (State{}).TaintValue() != string(NotHeld) {
		t.Errorf("taint values %q, %q", reclaim.TaintValue(), State{}.TaintValue())
	}
}

func TestPolicyValidate(t *testing.T) {
	if err := DefaultPolicy().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Policy{{}, {IdlePeriod: time.Second, Reserve: -1}} {
		if p.Validate() == nil {
			t.Errorf("policy %+v: no error", p)
		}
	}
}

func TestStore(t *testing.T) {
	dir := t.TempDir()
	s := Store{Path: filepath.Join(dir, StateFile)}
	if got, err := s.Load("boot-1"); err != nil || len(got) != 0 {
		t.Fatalf("missing file: %v, %v", got, err)
	}
	lent := run(t, State{}, idle(), idle(), idle(), idle(), idle(), idle())[5]
	if err := s.Save("boot-1", map[string]State{"GPU-1": lent}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load("boot-1")
	if err != nil || got["GPU-1"].Phase != Lent || !got["GPU-1"].Since.Equal(lent.Since) || got["GPU-1"].Lendable != lent.Lendable {
		t.Fatalf("reloaded %+v, %v; want %+v", got, err, lent)
	}
	if got, err := s.Load("boot-2"); err != nil || len(got) != 0 {
		t.Errorf("after a reboot: %v, %v; want nothing", got, err)
	}
	if err := os.WriteFile(s.Path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Load("boot-1"); err == nil || len(got) != 0 {
		t.Errorf("corrupt file: %v, %v; want an error and nothing", got, err)
	}
}

// Shares' owners leave the GPU's memory less what their shares are
// entitled to, not less what they use now; a whole GPU's owner lends what
// it does not use.
func TestLendableIsWhatOwnersAreNotEntitledTo(t *testing.T) {
	for _, tc := range []struct {
		name   string
		owners []Owner
		want   int64
	}{
		{"one share of 20Gi using 2Gi", []Owner{{Claim: "a", Lend: true, Memory: 20 * gib}}, 80*gib - 20*gib - gib},
		{"two shares of 20Gi and 30Gi", []Owner{{Claim: "a", Lend: true, Memory: 20 * gib}, {Claim: "b", Lend: true, Memory: 30 * gib}}, 80*gib - 50*gib - gib},
		{"a whole GPU using 2Gi", []Owner{{Claim: "a", Lend: true, Whole: true}}, 80*gib - 2*gib - gib},
		{"a share using more than its 1Gi (unenforced)", []Owner{{Claim: "a", Lend: true, Memory: gib}}, 80*gib - 2*gib - gib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Observation{Owners: tc.owners, Observed: true, OwnerMemory: 2 * gib, Memory: 80 * gib}
			states := run(t, State{}, o, o, o, o, o, o, o)
			last := states[len(states)-1]
			if last.Phase != Lent || last.Lendable != tc.want {
				t.Fatalf("%s, lendable %d MiB; want Lent, %d MiB", last.Phase, last.Lendable>>20, tc.want>>20)
			}
		})
	}
	// Shares entitled to all but the reserve leave nothing worth lending.
	o := Observation{Owners: []Owner{{Claim: "a", Lend: true, Memory: 78*gib + gib/2}}, Observed: true, OwnerMemory: gib, Memory: 80 * gib}
	if got := run(t, State{}, o, o, o, o, o, o, o); got[len(got)-1].Phase != NoSpareMemory {
		t.Fatalf("phases %v, want NoSpareMemory at the end", phases(got))
	}
}

// A claim that does not lend, refused at prepare while borrowers remain,
// takes the GPU back at once and keeps it closed after they are gone.
func TestOwnerWaitingTakesTheGPUBack(t *testing.T) {
	lent := run(t, State{}, idle(), idle(), idle(), idle(), idle(), idle())
	if last := lent[len(lent)-1]; last.Phase != Lent {
		t.Fatalf("setup: %s, want Lent", last.Phase)
	}
	from := lent[len(lent)-1]
	waiting := with(idle(), func(o *Observation) { o.OwnerWaiting = true; o.Borrowers = []types.UID{"borrower"} })
	got := Step(policy(), from, waiting, t0.Add(time.Hour))
	if got.Phase != Reclaiming || got.Reason != ReasonOwnerDoesNotLend {
		t.Fatalf("%s (%s), want Reclaiming (%s)", got.Phase, got.Reason, ReasonOwnerDoesNotLend)
	}
	gone := with(idle(), func(o *Observation) { o.OwnerWaiting = true })
	if got = Step(policy(), got, gone, t0.Add(time.Hour+time.Minute)); got.Phase != OwnerDoesNotLend {
		t.Fatalf("borrowers gone: %s, want %s until the waiting claim is prepared", got.Phase, OwnerDoesNotLend)
	}
	// The GPU without owners (the last owner left) and a waiting claim.
	noOwners := with(waiting, func(o *Observation) { o.Owners = nil })
	if got = Step(policy(), from, noOwners, t0.Add(time.Hour)); got.Phase != Reclaiming || got.Reason != ReasonOwnerDoesNotLend {
		t.Fatalf("no owners, one waiting: %s (%s), want Reclaiming (%s)", got.Phase, got.Reason, ReasonOwnerDoesNotLend)
	}
}
