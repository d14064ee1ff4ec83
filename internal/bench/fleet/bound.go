package fleet

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Bound is an upper bound on a measure of a schedule (Result.ServedPerHour
// for ServedBound, Result.MeanRunning for RunningBound) that holds for every
// schedule of one stream on one fleet, whatever its queue and placement:
// online or offline, with or without migration or preemption. The only
// thing it assumes of a schedule is that at every instant the share
// requests of the running jobs fit on the fleet's GPUs (each GPU's shares
// within its memory and cores, a whole GPU alone), and that a job runs only
// after its arrival and for its run time at most. docs/fleet-sim.md has the
// argument; in short:
//
//   - Let λ_{m,c} be the time-average, over the window, of the number of
//     GPUs of model m whose running requests form the multiset c, and x_j
//     the time job j runs inside the window over the window's length. Then
//     Σ_c λ_{m,c} ≤ G_m (the GPUs of model m), x_j ≤ ū_j (its run time, or
//     what of it fits between its arrival and the window's end), and for
//     every request type k: Σ_{j of type k} q_j x_j = Σ_{m,c} c_k λ_{m,c}
//     (q_j: the GPUs a job holds). ServedPerHour is Σ_j x_j · 3600/R_j,
//     MeanRunning Σ_j x_j: Σ_j x_j v_j with v_j the one or the other.
//   - So the measure is at most the optimum of the configuration LP over
//     these variables, and by weak duality at most
//     B(w) = Σ_m G_m φ_m(w) + Σ_j ū_j (v_j − q_j w_k)⁺ for every
//     w ≥ 0, where φ_m(w) = max_c Σ_k c_k w_k over the multisets that fit on
//     one GPU of model m.
//   - The configurations are relaxed (a superset is taken, which only raises
//     B): cores exactly (integer percent, 100 per GPU) and memory rounded
//     down to 1/memUnits of the GPU; node resources, pod counts, a node's
//     boundary for multi-GPU jobs and NVLink are ignored.
//
// Column generation over the LP with each type's jobs merged into a few
// segments finds a good w; B(w) is then evaluated exactly (every job, the
// knapsack φ_m solved exactly over the relaxed configurations), so the
// bound holds however well the LP was solved. The served bound is the
// clairvoyant optimum's: a schedule that knew run times could serve short
// jobs first. The running bound does not reward that: with run times
// exponential and independent of everything else (the KubeShare stream), a
// scheduler that learns a run time only when the job ends completes in
// expectation 3600/(mean run time) jobs per hour per job running.
type Bound struct {
	// Value is the bound.
	Value float64
	// Master is the column-generation master's value (jobs merged into
	// segments): how close the dual solution came; not itself a bound.
	Master float64
	// Types, Configs and Rounds describe the LP: request types, per-GPU
	// configurations generated, column-generation rounds.
	Types, Configs, Rounds int
}

// memUnits is the grid the bound rounds a share's memory down to, per GPU.
const memUnits = 200

// boundSegments is how many segments each type's jobs are merged into in
// the master LP (only the dual solution depends on it).
const boundSegments = 16

type boundJob struct {
	typ     int
	q       float64 // GPUs held
	v       float64 // 3600 / run time: jobs per hour per unit of x
	ubar    float64 // largest x
	perSlot float64 // v / q
}

type boundType struct {
	cores int
	mem   []int // memory units per fleet model; -1 where not allowed
}

// ServedBound bounds Result.ServedPerHour of jobs on fleet f for the window [w0, w1].
func ServedBound(f Fleet, jobs []Job, w0, w1 float64) (Bound, error) {
	return configurationBound(f, jobs, w0, w1, true)
}

// RunningBound bounds Result.MeanRunning (jobs running, time-averaged over
// the window [w0, w1]) of jobs on fleet f.
func RunningBound(f Fleet, jobs []Job, w0, w1 float64) (Bound, error) {
	return configurationBound(f, jobs, w0, w1, false)
}

// configurationBound is B(w) for the measure Σ_j x_j v_j (v_j = 3600/R_j
// when served, else 1), minimised over the dual solutions column generation
// visits.
func configurationBound(f Fleet, jobs []Job, w0, w1 float64, served bool) (Bound, error) {
	W := w1 - w0
	if !(W > 0) {
		return Bound{}, fmt.Errorf("bound: empty window [%g, %g]", w0, w1)
	}
	models := f.GPUModels()
	G := make([]float64, len(models))
	for _, s := range f.Nodes {
		for mi, m := range models {
			if s.Model.Name == m.Name {
				G[mi] += float64(s.GPUs)
			}
		}
	}
	var constant float64
	var bjobs []boundJob
	var types []boundType
	typeIndex := map[string]int{}
	for i := range jobs {
		j := &jobs[i]
		if j.Runtime <= 0 {
			// Served at once: it counts one job served if it can start in
			// the window, and never runs.
			if j.Arrival <= w1 && served {
				constant += 3600 / W
			}
			continue
		}
		u := min(j.Runtime, w1-max(j.Arrival, w0))
		if u <= 0 {
			continue
		}
		bj := boundJob{q: float64(j.gpuCount()), v: 1, ubar: u / W}
		if served {
			bj.v = 3600 / j.Runtime
		}
		if j.CPUOnly {
			constant += bj.ubar * bj.v
			continue
		}
		t := boundType{cores: 100, mem: make([]int, len(models))}
		any := false
		for mi, m := range models {
			if !allowed(j.Models, m) {
				t.mem[mi] = -1
				continue
			}
			any = true
			r := requestOn(j, m)
			t.cores = int(r.cores)
			t.mem[mi] = int(r.mem * memUnits / m.MemoryBytes())
		}
		if !any {
			continue // no schedule runs it
		}
		key := strconv.Itoa(t.cores) + ":" + fmt.Sprint(t.mem)
		k, ok := typeIndex[key]
		if !ok {
			k = len(types)
			typeIndex[key] = k
			types = append(types, t)
		}
		bj.typ, bj.perSlot = k, bj.v/bj.q
		bjobs = append(bjobs, bj)
	}
	if len(types) == 0 {
		return Bound{Value: constant, Master: constant}, nil
	}

	// The master: rows 0..K-1 the types (Σ slots served − Σ c_k λ ≤ 0,
	// perturbed by a hair against degeneracy), rows K..K+M-1 the models.
	K, M := len(types), len(models)
	rhs := make([]float64, K+M)
	for k := range K {
		rhs[k] = 1e-9 * float64(1+k%7)
	}
	for mi := range M {
		rhs[K+mi] = G[mi]
	}
	p := newLP(rhs)
	byType := make([][]int, K)
	for i, bj := range bjobs {
		byType[bj.typ] = append(byType[bj.typ], i)
	}
	for k, idx := range byType {
		slices.SortFunc(idx, func(a, b int) int {
			return cmpFloat(bjobs[b].perSlot, bjobs[a].perSlot)
		})
		var total float64
		for _, i := range idx {
			total += bjobs[i].q * bjobs[i].ubar
		}
		var slots, value float64
		for n, i := range idx {
			bj := bjobs[i]
			slots += bj.q * bj.ubar
			value += bj.q * bj.ubar * bj.perSlot
			if n == len(idx)-1 || slots >= total/boundSegments {
				if slots > 0 {
					p.addColumn([]int{k}, []float64{1}, value/slots, slots)
				}
				slots, value = 0, 0
			}
		}
	}
	seen := map[string]bool{}
	configs := 0
	addConfig := func(mi int, counts []int) bool {
		var rows []int
		var vals []float64
		var key strings.Builder
		fmt.Fprintf(&key, "%d:", mi)
		for k, c := range counts {
			if c > 0 {
				rows, vals = append(rows, k), append(vals, -float64(c))
				fmt.Fprintf(&key, "%d=%d,", k, c)
			}
		}
		if len(rows) == 0 || seen[key.String()] {
			return false
		}
		seen[key.String()] = true
		p.addColumn(append(rows, K+mi), append(vals, 1), 0, math.Inf(1))
		configs++
		return true
	}
	// Seed: every type alone, as many as fit on one GPU of each model.
	for mi := range M {
		for k, t := range types {
			if t.mem[mi] < 0 {
				continue
			}
			n := 100 / t.cores
			if t.mem[mi] > 0 {
				n = min(n, memUnits/t.mem[mi])
			}
			if n > 0 {
				counts := make([]int, K)
				counts[k] = n
				addConfig(mi, counts)
			}
		}
	}

	eval := func(w []float64, phi []float64) float64 {
		b := constant
		for mi := range M {
			b += G[mi] * phi[mi]
		}
		for _, bj := range bjobs {
			if d := bj.v - bj.q*w[bj.typ]; d > 0 {
				b += bj.ubar * d
			}
		}
		return b
	}
	best := math.Inf(1)
	// w = 0 is always dual feasible: the bound that serves every job fully.
	best = min(best, eval(make([]float64, K), make([]float64, M)))
	rounds := 0
	const maxRounds = 1000
	for ; rounds < maxRounds; rounds++ {
		if err := p.solve(50000); err != nil {
			return Bound{}, fmt.Errorf("bound: round %d: %w", rounds, err)
		}
		pi := p.duals()
		w := make([]float64, K)
		for k := range K {
			w[k] = max(0, pi[k])
		}
		phi := make([]float64, M)
		cols := make([][]int, M)
		for mi := range M {
			phi[mi], cols[mi] = knapsack(types, mi, w)
		}
		best = min(best, eval(w, phi))
		added := false
		for mi := range M {
			if phi[mi] > max(0, pi[K+mi])+1e-9*max(1, phi[mi]) && addConfig(mi, cols[mi]) {
				added = true
			}
		}
		if !added {
			break
		}
	}
	if math.IsInf(best, 1) || math.IsNaN(best) {
		return Bound{}, errors.New("bound: no finite dual value")
	}
	return Bound{Value: best, Master: p.objective() + constant, Types: K, Configs: configs, Rounds: rounds}, nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// knapsack is φ_m(w): the most Σ c_k w_k a multiset of types fitting on one
// GPU of model mi can have (cores within 100, memory units within
// memUnits; unbounded copies), and the multiset.
func knapsack(types []boundType, mi int, w []float64) (float64, []int) {
	const C, U = 100, memUnits
	type item struct {
		k, c, u int
		w       float64
	}
	var its []item
	for k, t := range types {
		if t.mem[mi] >= 0 && w[k] > 0 {
			its = append(its, item{k, t.cores, t.mem[mi], w[k]})
		}
	}
	stride := U + 1
	dp := make([]float64, (C+1)*stride)
	choice := make([]int32, (C+1)*stride)
	for c := 0; c <= C; c++ {
		for u := 0; u <= U; u++ {
			i := c*stride + u
			best, ch := 0.0, int32(-1)
			if c > 0 {
				best, ch = dp[i-stride], -2
			}
			if u > 0 && dp[i-1] > best {
				best, ch = dp[i-1], -3
			}
			for n, it := range its {
				if it.c <= c && it.u <= u {
					if v := dp[(c-it.c)*stride+(u-it.u)] + it.w; v > best {
						best, ch = v, int32(n)
					}
				}
			}
			dp[i], choice[i] = best, ch
		}
	}
	counts := make([]int, len(types))
	for c, u := C, U; ; {
		ch := choice[c*stride+u]
		switch ch {
		case -1:
			return dp[C*stride+U], counts
		case -2:
			c--
		case -3:
			u--
		default:
			it := its[ch]
			counts[it.k]++
			c, u = c-it.c, u-it.u
		}
	}
}
