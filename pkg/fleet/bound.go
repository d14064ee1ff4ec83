package fleet

import (
	"cmp"
	"context"
	"slices"
)

// request is a job's share request in the units the GPU counts: bytes and
// percent of the cores, as ShareRequest forms it for Tessera's claims.
type request struct{ mem, cores int64 }

func requestOf(j *Job) request {
	m, c := ShareRequest(Demand{j.Memory, j.Cores})
	return request{m.Value(), c.Value()}
}

func (a request) le(b request) bool { return a.mem <= b.mem && a.cores <= b.cores }

// --- fluid -------------------------------------------------------------------------

// fluidPlacer starts a job iff the fleet's total free memory and cores cover its
// share request: no GPU boundaries.
type fluidPlacer struct{ mem, cores int64 }

func newFluidPlacer(gpus int) *fluidPlacer {
	return &fluidPlacer{mem: int64(gpus) * gpuMemory.Value(), cores: int64(gpus) * 100}
}

func (p *fluidPlacer) place(_ context.Context, j *Job) (placement, bool, error) {
	r := requestOf(j)
	if r.mem > p.mem || r.cores > p.cores {
		return placement{}, false, nil
	}
	p.mem -= r.mem
	p.cores -= r.cores
	return placement{gpu: -1, use: gpuUse{memory: r.mem, cores: r.cores}}, true, nil
}

func (p *fluidPlacer) release(pl placement) {
	p.mem += pl.use.memory
	p.cores += pl.use.cores
}

// --- GPU-boundary bound: optimal repacking at every event --------------------------

// boundPlacer starts a job iff the share requests of the running jobs plus its
// own can be packed into the fleet's GPUs (two-dimensional vector bin packing:
// memory and cores per GPU), with every running job free to move to another
// GPU at that instant. It keeps one packing of the running jobs; a job that does
// not fit into it triggers, in order:
//
//  1. the fluid test (total memory and cores);
//  2. a failure known since the last completion for a request no larger;
//  3. Martello and Toth's L2 lower bound on the GPUs needed, per dimension: if
//     either exceeds the fleet, no packing exists;
//  4. first-fit decreasing repacking of everything (two orders): a packing found
//     is kept;
//  5. an exact depth-first search over GPUs with a node budget.
//
// When the search runs out of budget the job is started without a known
// packing (counted in undecided): that can only start jobs earlier, so the
// bound stays an upper bound.
type boundPlacer struct {
	gpus      int
	items     map[int]request // running jobs
	memSum    int64
	coreSum   int64
	valid     bool        // bins/assign hold a packing of items
	bins      []request   // load per GPU
	assign    map[int]int // job -> GPU
	refused   []request   // failures since the last completion
	undecided int
	budget    int
}

func newBoundPlacer(gpus int) *boundPlacer {
	return &boundPlacer{gpus: gpus, items: map[int]request{}, valid: true, bins: make([]request, gpus), assign: map[int]int{}, budget: 3000}
}

var capGPU = request{0, 100}

func init() { capGPU.mem = gpuMemory.Value() }

func (p *boundPlacer) place(_ context.Context, j *Job) (placement, bool, error) {
	r := requestOf(j)
	ok := p.fits(j.ID, r)
	if !ok {
		return placement{}, false, nil
	}
	p.items[j.ID] = r
	p.memSum += r.mem
	p.coreSum += r.cores
	return placement{gpu: -1, job: j.ID, use: gpuUse{memory: r.mem, cores: r.cores}}, true, nil
}

func (p *boundPlacer) release(pl placement) {
	id := pl.job
	r := p.items[id]
	delete(p.items, id)
	p.memSum -= r.mem
	p.coreSum -= r.cores
	if g, ok := p.assign[id]; ok && p.valid {
		p.bins[g].mem -= r.mem
		p.bins[g].cores -= r.cores
	}
	delete(p.assign, id)
	p.refused = p.refused[:0]
}

func (p *boundPlacer) fits(id int, r request) bool {
	G := int64(p.gpus)
	if p.memSum+r.mem > G*capGPU.mem || p.coreSum+r.cores > G*capGPU.cores {
		return false
	}
	if p.valid {
		best := -1
		for g, b := range p.bins {
			if b.mem+r.mem > capGPU.mem || b.cores+r.cores > capGPU.cores {
				continue
			}
			if best < 0 || slack(b) < slack(p.bins[best]) {
				best = g
			}
		}
		if best >= 0 {
			p.bins[best].mem += r.mem
			p.bins[best].cores += r.cores
			p.assign[id] = best
			return true
		}
	}
	for _, f := range p.refused {
		if f.le(r) {
			return false
		}
	}
	ids := make([]int, 0, len(p.items)+1)
	for k := range p.items {
		ids = append(ids, k)
	}
	slices.Sort(ids)
	ids = append(ids, id)
	sizes := make([]request, len(ids))
	for i, k := range ids {
		if k == id {
			sizes[i] = r
		} else {
			sizes[i] = p.items[k]
		}
	}
	mems, cores := make([]int64, len(sizes)), make([]int64, len(sizes))
	for i, s := range sizes {
		mems[i], cores[i] = s.mem, s.cores
	}
	if l2(mems, capGPU.mem) > p.gpus || l2(cores, capGPU.cores) > p.gpus ||
		dffBound(mems, capGPU.mem) > p.gpus || dffBound(cores, capGPU.cores) > p.gpus {
		p.refused = append(p.refused, r)
		return false
	}
	for _, key := range []func(request) float64{maxFrac, sumFrac} {
		if bins, assign, ok := firstFitDecreasing(sizes, p.gpus, key); ok {
			p.adopt(ids, bins, assign)
			return true
		}
	}
	bins, assign, res := exactPack(sizes, p.gpus, p.budget)
	switch res {
	case packFound:
		p.adopt(ids, bins, assign)
		return true
	case packImpossible:
		p.refused = append(p.refused, r)
		return false
	}
	p.undecided++
	p.valid = false
	clear(p.assign)
	return true
}

func (p *boundPlacer) adopt(ids []int, bins []request, assign []int) {
	p.valid = true
	copy(p.bins, bins)
	clear(p.assign)
	for i, id := range ids {
		p.assign[id] = assign[i]
	}
}

func slack(b request) float64 {
	return min(float64(capGPU.mem-b.mem)/float64(capGPU.mem), float64(capGPU.cores-b.cores)/float64(capGPU.cores))
}

func maxFrac(r request) float64 {
	return max(float64(r.mem)/float64(capGPU.mem), float64(r.cores)/float64(capGPU.cores))
}

func sumFrac(r request) float64 {
	return float64(r.mem)/float64(capGPU.mem) + float64(r.cores)/float64(capGPU.cores)
}

// decreasing is the indexes of sizes by decreasing key, ties in their order.
func decreasing(sizes []request, key func(request) float64) []int {
	order := make([]int, len(sizes))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(key(sizes[b]), key(sizes[a])) })
	return order
}

// firstFitDecreasing packs sizes in decreasing key order, each into the fullest
// GPU it fits (best fit).
func firstFitDecreasing(sizes []request, gpus int, key func(request) float64) ([]request, []int, bool) {
	order := decreasing(sizes, key)
	bins := make([]request, gpus)
	assign := make([]int, len(sizes))
	for _, i := range order {
		s := sizes[i]
		best := -1
		for g, b := range bins {
			if b.mem+s.mem > capGPU.mem || b.cores+s.cores > capGPU.cores {
				continue
			}
			if best < 0 || slack(b) < slack(bins[best]) {
				best = g
			}
		}
		if best < 0 {
			return nil, nil, false
		}
		bins[best].mem += s.mem
		bins[best].cores += s.cores
		assign[i] = best
	}
	return bins, assign, true
}

// l2 is Martello and Toth's L2 lower bound on the number of bins of capacity c
// that hold items of the given sizes (1990): for every α in [0, c/2], the items
// larger than c−α need a bin each, so do those in (c/2, c−α], and the items in
// [α, c/2] can use only what those leave.
func l2(sizes []int64, c int64) int {
	s := slices.Clone(sizes)
	slices.Sort(s)
	n := len(s)
	prefix := make([]int64, n+1)
	for i, x := range s {
		prefix[i+1] = prefix[i] + x
	}
	// idx(v): first index with s[i] > v.
	upper := func(v int64) int {
		i, _ := slices.BinarySearchFunc(s, v, func(e, t int64) int {
			if e <= t {
				return -1
			}
			return 1
		})
		return i
	}
	lower := func(v int64) int { // first index with s[i] >= v
		i, _ := slices.BinarySearch(s, v)
		return i
	}
	half := upper(c / 2) // items with 2x > c start here
	best := 0
	alphas := []int64{0}
	for _, x := range s {
		if 2*x <= c && (len(alphas) == 0 || alphas[len(alphas)-1] != x) {
			alphas = append(alphas, x)
		}
	}
	for _, a := range alphas {
		j1 := upper(c - a) // items > c−a: [j1, n)
		n1 := n - j1
		n2 := j1 - half // items in (c/2, c−a]
		if n2 < 0 {
			n2 = 0
		}
		sum2 := prefix[j1] - prefix[min(half, j1)]
		lo := lower(a)
		sum3 := prefix[half] - prefix[min(lo, half)]
		free := int64(n2)*c - sum2
		extra := int64(0)
		if sum3 > free {
			extra = (sum3 - free + c - 1) / c
		}
		best = max(best, n1+n2+int(extra))
	}
	return best
}

// dffMaxK is the largest k of the dual feasible functions tried.
const dffMaxK = 20

// dffBound is the largest of Fekete and Schepers' lower bounds (2001) on the
// bins of capacity c that hold items of the given sizes, for the dual feasible
// functions u⁽ᵏ⁾(x) = x if (k+1)x is an integer, else ⌊(k+1)x⌋/k, k = 1…dffMaxK:
// ⌈Σ u⁽ᵏ⁾(sᵢ/c)⌉. (k = 3 says, for example, that a GPU holds at most three
// items larger than a quarter.)
func dffBound(sizes []int64, c int64) int {
	best := 0
	for k := int64(1); k <= dffMaxK; k++ {
		// Σ u in units of 1/(k·c): x·k·c for the exact multiples, ⌊(k+1)x⌋·c otherwise.
		var num int64
		for _, s := range sizes {
			if (k+1)*s%c == 0 {
				num += s * k
			} else {
				num += ((k + 1) * s / c) * c
			}
		}
		den := k * c
		best = max(best, int((num+den-1)/den))
	}
	return best
}

type packResult int

const (
	packFound packResult = iota
	packImpossible
	packUnknown
)

// exactPack searches for a packing of sizes into gpus bins, largest first,
// trying each bin whose load differs from the bins tried before it (equal
// loads are interchangeable), within budget search nodes.
func exactPack(sizes []request, gpus int, budget int) ([]request, []int, packResult) {
	order := decreasing(sizes, maxFrac)
	bins := make([]request, gpus)
	assign := make([]int, len(sizes))
	// Suffix sums and minima of what is left to place from position k on.
	n := len(order)
	restSum, restMin := make([]request, n+1), make([]request, n+1)
	restMin[n] = capGPU
	for k := n - 1; k >= 0; k-- {
		s := sizes[order[k]]
		restSum[k] = request{restSum[k+1].mem + s.mem, restSum[k+1].cores + s.cores}
		restMin[k] = request{min(restMin[k+1].mem, s.mem), min(restMin[k+1].cores, s.cores)}
	}
	nodes := 0
	var dfs func(k int) packResult
	dfs = func(k int) packResult {
		if k == len(order) {
			return packFound
		}
		nodes++
		if nodes > budget {
			return packUnknown
		}
		// A GPU whose room is below the smallest item left is wasted: if what is
		// left exceeds the usable room, no packing completes this one.
		var usable request
		for _, b := range bins {
			free := request{capGPU.mem - b.mem, capGPU.cores - b.cores}
			if free.mem >= restMin[k].mem && free.cores >= restMin[k].cores {
				usable.mem += free.mem
				usable.cores += free.cores
			}
		}
		if restSum[k].mem > usable.mem || restSum[k].cores > usable.cores {
			return packImpossible
		}
		i := order[k]
		s := sizes[i]
		unknown := false
		seen := make([]request, 0, 8)
		for g := range bins {
			b := bins[g]
			if b.mem+s.mem > capGPU.mem || b.cores+s.cores > capGPU.cores || slices.Contains(seen, b) {
				continue
			}
			seen = append(seen, b)
			bins[g].mem += s.mem
			bins[g].cores += s.cores
			assign[i] = g
			switch dfs(k + 1) {
			case packFound:
				return packFound
			case packUnknown:
				unknown = true
			}
			bins[g].mem -= s.mem
			bins[g].cores -= s.cores
			if unknown {
				return packUnknown
			}
		}
		return packImpossible
	}
	res := dfs(0)
	if res == packFound {
		return bins, assign, res
	}
	return nil, nil, res
}

// --- packing oracle ----------------------------------------------------------------------

// oraclePlacer packs Tessera's share requests without the allocator: best-fit (the
// fullest GPU that still fits, fleet-wide) or first-fit (node order, GPU order, which
// is what the allocator does; tests compare the two).
type oraclePlacer struct {
	bestFit bool
	mem     []int64 // free bytes per GPU
	cores   []int64
}

func newOraclePlacer(gpus int, bestFit bool) *oraclePlacer {
	p := &oraclePlacer{bestFit: bestFit, mem: make([]int64, gpus), cores: make([]int64, gpus)}
	for g := range gpus {
		p.mem[g], p.cores[g] = gpuMemory.Value(), 100
	}
	return p
}

func (p *oraclePlacer) place(_ context.Context, j *Job) (placement, bool, error) {
	r := requestOf(j)
	best := -1
	for g := range p.mem {
		if p.mem[g] < r.mem || p.cores[g] < r.cores {
			continue
		}
		if !p.bestFit {
			best = g
			break
		}
		if best < 0 || p.mem[g] < p.mem[best] {
			best = g
		}
	}
	if best < 0 {
		return placement{}, false, nil
	}
	p.mem[best] -= r.mem
	p.cores[best] -= r.cores
	return placement{gpu: best, node: best / GPUsPerNode, use: gpuUse{memory: r.mem, cores: r.cores}}, true, nil
}

func (p *oraclePlacer) release(pl placement) {
	p.mem[pl.gpu] += pl.use.memory
	p.cores[pl.gpu] += pl.use.cores
}
