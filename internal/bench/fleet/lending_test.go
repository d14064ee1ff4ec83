package fleet

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/pkg/lending"
)

// tinyLending is 8 GPUs over 12 hours: a few hundred loans and reclaims.
func tinyLending() LendingWorkload {
	w := DefaultLendingWorkload(7)
	w.GPUs, w.Horizon = 8, 12*time.Hour
	return w
}

func runTiny(t *testing.T, w LendingWorkload, opt LendingOptions) (LendingResult, []LendingOwner, []Borrower) {
	t.Helper()
	if err := w.Validate(opt.Policy); err != nil {
		t.Fatal(err)
	}
	owners, borrowers := w.Generate()
	opt.Trace = true
	r, err := RunLending(owners, borrowers, w.Horizon, w.GPUMemory, opt)
	if err != nil {
		t.Fatal(err)
	}
	return r, owners, borrowers
}

// phaseAt is the GPU's phase at t from its phase changes: the last change
// at or before t.
func phaseAt(changes []PhaseChange, t float64) lending.Phase {
	p := lending.NotHeld
	for _, c := range changes {
		if c.T > t {
			break
		}
		p = c.Phase
	}
	return p
}

// lendingViolations checks a run's trace against what the real system
// guarantees, without the simulator's own bookkeeping: every borrower is
// allocated a GPU that lending.Step left Lent; it is gone within the grace
// and the eviction latency after the GPU stops being Lent; it never shares
// the GPU with its busy owner for longer than ReclaimBound after the owner
// turned busy; a GPU has one borrower at a time; borrowers are placed
// earliest arrival first; work is conserved.
func lendingViolations(w LendingWorkload, opt LendingOptions, owners []LendingOwner, borrowers []Borrower, r LendingResult) []string {
	const eps = 1e-6
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	tr := r.Trace
	horizon := w.Horizon.Seconds()
	evictAfter := (opt.Grace + opt.EvictionLatency).Seconds()
	bound := opt.ReclaimBound().Seconds()

	byGPU := make([][]Stay, len(owners))
	byBorrower := make(map[int][]Stay)
	for _, s := range tr.Stays {
		byGPU[s.GPU] = append(byGPU[s.GPU], s)
		byBorrower[s.Borrower] = append(byBorrower[s.Borrower], s)
		if p := phaseAt(tr.Phases[s.GPU], s.From); p != lending.Lent {
			bad("borrower %d allocated gpu %d at %.1f in phase %s", s.Borrower, s.GPU, s.From, p)
		}
		for _, c := range tr.Phases[s.GPU] {
			if c.T > s.From && c.Phase != lending.Lent {
				if s.To > c.T+evictAfter+eps {
					bad("borrower %d on gpu %d until %.1f, %.1f s after the GPU left Lent (%s) at %.1f", s.Borrower, s.GPU, s.To, s.To-c.T, c.Phase, c.T)
				}
				break
			}
		}
		for _, iv := range owners[s.GPU].Busy {
			if iv[0] < s.To && s.From < iv[1] && min(iv[1], s.To)-iv[0] > bound+eps {
				bad("borrower %d shares gpu %d with its busy owner %.1f s after the owner turned busy at %.1f (bound %.1f s)", s.Borrower, s.GPU, min(iv[1], s.To)-iv[0], iv[0], bound)
			}
		}
		if s.Progress > s.To-s.From+eps || s.Progress < -eps || s.Lost < 0 || s.Lost > s.Progress+eps {
			bad("borrower %d stay %.1f–%.1f: progress %.1f, lost %.1f", s.Borrower, s.From, s.To, s.Progress, s.Lost)
		}
		if s.Evicted && opt.Grace < opt.CheckpointWrite && s.Lost >= opt.CheckpointEvery.Seconds() {
			bad("borrower %d lost %.1f s, more than a checkpoint interval", s.Borrower, s.Lost)
		}
		if s.Evicted && opt.Grace >= opt.CheckpointWrite && s.Lost > eps {
			bad("borrower %d lost %.1f s although its grace let it save", s.Borrower, s.Lost)
		}
	}
	for g, stays := range byGPU {
		for i := 1; i < len(stays); i++ {
			if stays[i].From < stays[i-1].To-eps {
				bad("gpu %d has borrowers %d and %d at once", g, stays[i-1].Borrower, stays[i].Borrower)
			}
		}
	}

	// Earliest request first: when a borrower is placed, no borrower that
	// arrived before it may be waiting.
	type span struct{ from, to float64 }
	waiting := make(map[int][]span)
	for _, b := range borrowers {
		from := b.Arrival
		for _, s := range byBorrower[b.ID] {
			waiting[b.ID] = append(waiting[b.ID], span{from, s.From})
			from = math.Inf(1)
			if s.Evicted {
				from = s.To
			}
		}
		if !math.IsInf(from, 1) && from < horizon {
			waiting[b.ID] = append(waiting[b.ID], span{from, math.Inf(1)})
		}
	}
	for _, s := range tr.Stays {
		x := borrowers[s.Borrower]
		for _, y := range borrowers {
			if y.Arrival > x.Arrival || y.Arrival == x.Arrival && y.ID >= x.ID {
				break
			}
			for _, sp := range waiting[y.ID] {
				if sp.from <= s.From && s.From < sp.to {
					bad("borrower %d (arrived %.1f) placed at %.1f while borrower %d (arrived %.1f) waited", x.ID, x.Arrival, s.From, y.ID, y.Arrival)
				}
			}
		}
	}

	// Conservation: what the stays did, less what evictions threw away, is
	// the useful work; useful and remaining work add up to the total.
	var useful, lost, total float64
	completed := 0
	for _, b := range borrowers {
		if b.Arrival >= horizon {
			continue
		}
		total += b.Work
		var kept float64
		for _, s := range byBorrower[b.ID] {
			kept += s.Progress - s.Lost
			lost += s.Lost
		}
		if kept > b.Work+eps {
			bad("borrower %d kept %.1f s of %.1f s of work", b.ID, kept, b.Work)
		}
		if math.Abs(kept-b.Work) < eps {
			completed++
		}
		useful += kept
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-6*max(1, math.Abs(a), math.Abs(b)) }
	if !near(useful/3600, r.BorrowerGPUHours) || !near(lost/3600, r.LostGPUHours) || !near(total/3600, r.TotalWork) ||
		!near(r.BorrowerGPUHours+r.RemainingWork, r.TotalWork) || completed != r.Completed {
		bad("work: trace useful %.3f h, lost %.3f h, total %.3f h, completed %d; result useful %.3f h, lost %.3f h, remaining %.3f h, total %.3f h, completed %d",
			useful/3600, lost/3600, total/3600, completed, r.BorrowerGPUHours, r.LostGPUHours, r.RemainingWork, r.TotalWork, r.Completed)
	}
	return out
}

func TestLendingInvariants(t *testing.T) {
	for _, grace := range []time.Duration{0, 30 * time.Second} {
		for _, idle := range []time.Duration{time.Minute, 15 * time.Minute} {
			t.Run(fmt.Sprintf("idle %s grace %s", idle, grace), func(t *testing.T) {
				w, opt := tinyLending(), DefaultLendingOptions(idle, grace)
				r, owners, borrowers := runTiny(t, w, opt)
				if len(r.Trace.Stays) < 20 || r.Reclaims < 20 || r.Evictions < 20 {
					t.Fatalf("too little happened to check anything: %d stays, %d reclaims, %d evictions", len(r.Trace.Stays), r.Reclaims, r.Evictions)
				}
				for _, v := range lendingViolations(w, opt, owners, borrowers, r) {
					t.Error(v)
				}
				ticks := int64(w.Horizon/opt.Sample) + 1
				if r.Steps != int64(w.GPUs)*ticks {
					t.Errorf("lending.Step called %d times, want every GPU every sample: %d", r.Steps, int64(w.GPUs)*ticks)
				}
				if r.ReclaimP99 > opt.ReclaimBound().Seconds() || r.ReclaimP50 < (opt.Grace+opt.EvictionLatency).Seconds() {
					t.Errorf("reclaim p50 %.1f s, p99 %.1f s: want within [grace + eviction, sample + grace + eviction] = [%s, %s]",
						r.ReclaimP50, r.ReclaimP99, opt.Grace+opt.EvictionLatency, opt.ReclaimBound())
				}
				if grace == 0 && r.LostGPUHours == 0 {
					t.Errorf("borrowers evicted without a grace lost nothing (%d evictions)", r.Evictions)
				}
				if r.BorrowerGPUHours > r.LentGPUHours+float64(w.GPUs)*opt.Sample.Hours() || r.BorrowerGPUHours <= 0 {
					t.Errorf("borrowers did %.2f GPU-h in %.2f lent GPU-h", r.BorrowerGPUHours, r.LentGPUHours)
				}
			})
		}
	}
}

// TestLendingViolationsCatchBrokenModels shows that the checks fail on
// traces of a model that breaks the rules.
func TestLendingViolationsCatchBrokenModels(t *testing.T) {
	w, opt := tinyLending(), DefaultLendingOptions(5*time.Minute, 10*time.Second)
	good, owners, borrowers := runTiny(t, w, opt)
	tamper := []struct {
		name, want string
		f          func(r *LendingResult)
	}{
		{"a borrower placed before the GPU is lent", "in phase", func(r *LendingResult) {
			s := &r.Trace.Stays[0]
			s.From = r.Trace.Phases[s.GPU][0].T
		}},
		{"a borrower outstays the reclaim", "after the GPU left Lent", func(r *LendingResult) {
			for i, s := range r.Trace.Stays {
				if s.Evicted {
					r.Trace.Stays[i].To += 60
					return
				}
			}
		}},
		{"queue order", "waited", func(r *LendingResult) {
			// The last first placement goes to the borrower that arrived last.
			last := slices.MaxFunc(borrowers, func(a, b Borrower) int { return int(a.Arrival - b.Arrival) })
			r.Trace.Stays = append(r.Trace.Stays, Stay{Borrower: last.ID, GPU: 0, From: last.Arrival, To: last.Arrival})
		}},
		{"work counted twice", "work:", func(r *LendingResult) { r.BorrowerGPUHours += 1 }},
	}
	for _, tc := range tamper {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tr := *good.Trace
			tr.Stays = slices.Clone(tr.Stays)
			r.Trace = &tr
			tc.f(&r)
			v := lendingViolations(w, opt, owners, borrowers, r)
			if !slices.ContainsFunc(v, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("violations %q: none mentions %q", v, tc.want)
			}
		})
	}
}

func TestLendingFollowsStep(t *testing.T) {
	w := tinyLending()
	// An idle period longer than the horizon: lending.Step never lends, so
	// nothing may be borrowed.
	r, _, _ := runTiny(t, w, DefaultLendingOptions(w.Horizon+time.Hour, 0))
	if r.Loans != 0 || len(r.Trace.Stays) != 0 || r.BorrowerGPUHours != 0 || r.OwnerWaitHours != 0 {
		t.Errorf("no loans expected: %d loans, %d stays, %.2f borrower GPU-h, %.2f h owner wait", r.Loans, len(r.Trace.Stays), r.BorrowerGPUHours, r.OwnerWaitHours)
	}
	// A longer grace keeps owners waiting longer and saves the borrowers'
	// work.
	short, _, _ := runTiny(t, w, DefaultLendingOptions(5*time.Minute, 0))
	long, _, _ := runTiny(t, w, DefaultLendingOptions(5*time.Minute, time.Minute))
	if !(long.OwnerWaitShare > short.OwnerWaitShare) || !(long.LostGPUHours < short.LostGPUHours) {
		t.Errorf("grace 0: wait %.4f, lost %.2f h; grace 1m: wait %.4f, lost %.2f h", short.OwnerWaitShare, short.LostGPUHours, long.OwnerWaitShare, long.LostGPUHours)
	}
}

func TestLendingDeterministic(t *testing.T) {
	cfg := DefaultLendingBench(3, 3*time.Second)
	cfg.Workload.GPUs, cfg.Workload.Horizon = 8, 6*time.Hour
	cfg.IdlePeriods, cfg.Graces = []time.Duration{time.Minute, 5 * time.Minute}, []time.Duration{0, 30 * time.Second}
	a, err := LendingBench(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Parallel = 1
	b, err := LendingBench(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.Wall, b.Wall = 0, 0
	if !reflect.DeepEqual(a, b) {
		t.Errorf("two runs of the same configuration differ:\n%+v\n%+v", a.Results, b.Results)
	}
	md := a.Markdown()
	for _, want := range []string{"| 1m0s | 30s |", "| 5m0s | 0s |", "Both targets met:"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	js, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back LendingReport
	if err := json.Unmarshal(js, &back); err != nil || !reflect.DeepEqual(back.Results, a.Results) {
		t.Errorf("JSON round trip: %v", err)
	}
}

func TestLendingWorkloadGenerate(t *testing.T) {
	w := DefaultLendingWorkload(1)
	owners, borrowers := w.Generate()
	horizon := w.Horizon.Seconds()
	var busy float64
	for g, o := range owners {
		for i, iv := range o.Busy {
			if iv[0] >= iv[1] || iv[1] > horizon || i > 0 && iv[0] <= o.Busy[i-1][1] {
				t.Fatalf("owner %d busy interval %d %v: not sorted, disjoint and in the horizon", g, i, iv)
			}
			busy += iv[1] - iv[0]
		}
		if o.Memory < w.OwnerMemory[0] || o.Memory > w.OwnerMemory[1] {
			t.Errorf("owner %d memory %d outside %v", g, o.Memory, w.OwnerMemory)
		}
	}
	// 64 owners over 3 days busy 20–40 %: the mean must be near 30 %.
	if f := busy / (horizon * float64(w.GPUs)); f < 0.25 || f > 0.35 {
		t.Errorf("owners busy %.3f of the time, want about 0.30", f)
	}
	for i, b := range borrowers {
		if b.Work < w.Work[0].Seconds() || b.Work > w.Work[1].Seconds() || b.Memory < w.BorrowerMemory[0] || b.Memory > w.BorrowerMemory[1] ||
			i > 0 && b.Arrival < borrowers[i-1].Arrival {
			t.Fatalf("borrower %+v outside the workload", b)
		}
	}
}

func TestLendingValidate(t *testing.T) {
	p := lending.DefaultPolicy()
	tests := []struct {
		field string
		f     func(*LendingWorkload)
	}{
		{"GPUs", func(w *LendingWorkload) { w.GPUs = 0 }},
		{"BusyFraction", func(w *LendingWorkload) { w.BusyFraction = [2]float64{0.4, 0.2} }},
		{"BurstMean", func(w *LendingWorkload) { w.BurstMean[0] = 0 }},
		{"BorrowerLoad", func(w *LendingWorkload) { w.BorrowerLoad = math.NaN() }},
		{"BorrowerMemory", func(w *LendingWorkload) { w.BorrowerMemory[1] = 70 << 30 }},
	}
	for _, tc := range tests {
		w := DefaultLendingWorkload(1)
		tc.f(&w)
		if err := w.Validate(p); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: error %v does not name the field", tc.field, err)
		}
	}
	opt := DefaultLendingOptions(time.Minute, 0)
	opt.Sample = 0
	if _, err := RunLending(nil, nil, time.Hour, 80<<30, opt); err == nil || !strings.Contains(err.Error(), "Sample") {
		t.Errorf("zero sample interval: error %v", err)
	}
}
