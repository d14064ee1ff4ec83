package fleet

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// request is a job's share request in the units the GPU counts: bytes and
// percent of the cores, as ShareRequest forms it for Tessera's claims.
type request struct{ mem, cores int64 }

func (a request) le(b request) bool { return a.mem <= b.mem && a.cores <= b.cores }

// requestOn is what job j's claim asks of one GPU of model m (a whole GPU
// per GPU for a multi-GPU job).
func requestOn(j *Job, m GPUModel) request {
	if j.GPUs > 0 {
		return request{m.MemoryBytes(), 100}
	}
	mem, cores, err := shareRequest(Demand{j.Memory, j.Cores}, m)
	if err != nil {
		panic(err) // checked for every job by checkJobs before the run
	}
	return request{mem.Value(), cores.Value()}
}

// checkJobs refuses a stream the fleet cannot run: a job whose share cannot
// be formed, whose allowed models the fleet lacks, or that asks for more
// GPUs than any allowed node has.
func checkJobs(f Fleet, jobs []Job) error {
	models := f.GPUModels()
	for i := range jobs {
		j := &jobs[i]
		if j.CPUOnly {
			continue
		}
		if j.GPUs == 0 && !(j.Memory > 0 && j.Memory <= 1 && j.Cores > 0 && j.Cores <= 1) {
			return fmt.Errorf("job %d: memory %.4f and cores %.4f must be fractions in (0, 1]", j.ID, j.Memory, j.Cores)
		}
		most := 0
		for _, s := range f.Nodes {
			if allowed(j.Models, s.Model) {
				most = max(most, s.GPUs)
			}
		}
		if most == 0 {
			return fmt.Errorf("job %d: no GPU of models %v in the fleet (%s)", j.ID, j.Models, f)
		}
		if j.gpuCount() > most {
			return fmt.Errorf("job %d: %d GPUs, but the largest node of its models has %d", j.ID, j.gpuCount(), most)
		}
		if j.GPUs == 0 {
			for _, m := range models {
				if allowed(j.Models, m) {
					if _, _, err := shareRequest(Demand{j.Memory, j.Cores}, m); err != nil {
						return fmt.Errorf("job %d on %s: %w", j.ID, m.Name, err)
					}
				}
			}
		}
	}
	return nil
}

// homogeneous is the fleet's one GPU model for the reference models, which
// place on no GPU and so know only one GPU size.
func homogeneous(f Fleet, what Kind) (GPUModel, error) {
	m, ok := f.Homogeneous()
	if !ok {
		return GPUModel{}, fmt.Errorf("%s: the reference needs a fleet of one GPU model, not %s", what, f)
	}
	return m, nil
}

// items is what job j puts into the reference models' packing: its share,
// or a whole GPU per GPU it asks for; nothing for a CPU-only job.
func items(j *Job, m GPUModel) []request {
	if j.CPUOnly {
		return nil
	}
	r := requestOn(j, m)
	out := make([]request, j.gpuCount())
	for i := range out {
		out[i] = r
	}
	return out
}

// --- fluid -------------------------------------------------------------------------

// fluidPlacer starts a job iff the fleet's total free memory and cores cover its
// share request: no GPU boundaries. It ignores node resources and pod counts.
type fluidPlacer struct {
	model      GPUModel
	mem, cores int64
}

func newFluidPlacer(f Fleet, jobs []Job) (*fluidPlacer, error) {
	m, err := homogeneous(f, Fluid)
	if err != nil {
		return nil, err
	}
	gpus := int64(f.GPUs())
	return &fluidPlacer{model: m, mem: gpus * m.MemoryBytes(), cores: gpus * 100}, checkJobs(f, jobs)
}

func (p *fluidPlacer) place(_ context.Context, j *Job) (placement, bool, error) {
	var sum request
	if n := int64(j.gpuCount()); n > 0 {
		r := requestOn(j, p.model)
		sum = request{n * r.mem, n * r.cores}
	}
	if sum.mem > p.mem || sum.cores > p.cores {
		return placement{}, false, nil
	}
	p.mem -= sum.mem
	p.cores -= sum.cores
	return placement{job: j.ID, charged: gpuUse{memory: sum.mem, cores: sum.cores}}, true, nil
}

func (p *fluidPlacer) release(pl placement, _ *Job) {
	p.mem += pl.charged.memory
	p.cores += pl.charged.cores
}

// --- migrating reference: repacking at every event ---------------------------------

// migratingPlacer starts a job iff the share requests of the running jobs plus
// its own can be packed into the fleet's GPUs (two-dimensional vector bin
// packing: memory and cores per GPU), with every running job free to move to
// another GPU at that instant. A multi-GPU job is that many whole-GPU items
// (which need not share a node); node resources are ignored. It keeps one
// packing of the running jobs; a job that does not fit into it triggers, in
// order:
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
// packing (counted in undecided). It is a policy that moves running jobs, not
// a bound: under kube-scheduler's queue starting a job earlier can delay
// others, so no policy's result is ordered against it (ServedBound and
// RunningBound are bounds).
type migratingPlacer struct {
	model     GPUModel
	cap       request
	gpus      int
	items     map[int][]request // running jobs
	memSum    int64
	coreSum   int64
	valid     bool          // bins/assign hold a packing of items
	bins      []request     // load per GPU
	assign    map[int][]int // job -> GPU of each item
	refused   []request     // failures since the last completion (single items)
	undecided int
	budget    int
}

func newMigratingPlacer(f Fleet, jobs []Job) (*migratingPlacer, error) {
	m, err := homogeneous(f, Migrating)
	if err != nil {
		return nil, err
	}
	gpus := f.GPUs()
	return &migratingPlacer{model: m, cap: request{m.MemoryBytes(), 100}, gpus: gpus, items: map[int][]request{}, valid: true,
		bins: make([]request, gpus), assign: map[int][]int{}, budget: 3000}, checkJobs(f, jobs)
}

func (p *migratingPlacer) place(_ context.Context, j *Job) (placement, bool, error) {
	its := items(j, p.model)
	if len(its) > 0 && !p.fits(j.ID, its) {
		return placement{}, false, nil
	}
	p.items[j.ID] = its
	var sum request
	for _, r := range its {
		p.memSum += r.mem
		p.coreSum += r.cores
		sum.mem += r.mem
		sum.cores += r.cores
	}
	return placement{job: j.ID, charged: gpuUse{memory: sum.mem, cores: sum.cores}}, true, nil
}

func (p *migratingPlacer) release(pl placement, _ *Job) {
	id := pl.job
	its := p.items[id]
	delete(p.items, id)
	for k, r := range its {
		p.memSum -= r.mem
		p.coreSum -= r.cores
		if g, ok := p.assign[id]; ok && p.valid {
			p.bins[g[k]].mem -= r.mem
			p.bins[g[k]].cores -= r.cores
		}
	}
	delete(p.assign, id)
	p.refused = p.refused[:0]
}

func (p *migratingPlacer) fits(id int, its []request) bool {
	G := int64(p.gpus)
	var add request
	for _, r := range its {
		add.mem += r.mem
		add.cores += r.cores
	}
	if p.memSum+add.mem > G*p.cap.mem || p.coreSum+add.cores > G*p.cap.cores {
		return false
	}
	if p.valid {
		// Best fit of each item into the current packing, undone if one fails.
		placed := make([]int, 0, len(its))
		for _, r := range its {
			best := -1
			for g, b := range p.bins {
				if b.mem+r.mem > p.cap.mem || b.cores+r.cores > p.cap.cores {
					continue
				}
				if best < 0 || p.slack(b) < p.slack(p.bins[best]) {
					best = g
				}
			}
			if best < 0 {
				break
			}
			p.bins[best].mem += r.mem
			p.bins[best].cores += r.cores
			placed = append(placed, best)
		}
		if len(placed) == len(its) {
			p.assign[id] = placed
			return true
		}
		for k, g := range placed {
			p.bins[g].mem -= its[k].mem
			p.bins[g].cores -= its[k].cores
		}
	}
	if len(its) == 1 {
		for _, f := range p.refused {
			if f.le(its[0]) {
				return false
			}
		}
	}
	ids := make([]int, 0, len(p.items)+1)
	for k := range p.items {
		ids = append(ids, k)
	}
	slices.Sort(ids)
	var sizes []request
	var owner []int
	for _, k := range ids {
		for _, r := range p.items[k] {
			sizes, owner = append(sizes, r), append(owner, k)
		}
	}
	for _, r := range its {
		sizes, owner = append(sizes, r), append(owner, id)
	}
	mems, cores := make([]int64, len(sizes)), make([]int64, len(sizes))
	for i, s := range sizes {
		mems[i], cores[i] = s.mem, s.cores
	}
	refuse := func() bool {
		if len(its) == 1 {
			p.refused = append(p.refused, its[0])
		}
		return false
	}
	if l2(mems, p.cap.mem) > p.gpus || l2(cores, p.cap.cores) > p.gpus ||
		dffBound(mems, p.cap.mem) > p.gpus || dffBound(cores, p.cap.cores) > p.gpus {
		return refuse()
	}
	for _, key := range []func(request) float64{p.maxFrac, p.sumFrac} {
		if bins, assign, ok := firstFitDecreasing(sizes, p.gpus, p.cap, key); ok {
			p.adopt(owner, bins, assign)
			return true
		}
	}
	bins, assign, res := exactPack(sizes, p.gpus, p.cap, p.budget)
	switch res {
	case packFound:
		p.adopt(owner, bins, assign)
		return true
	case packImpossible:
		return refuse()
	}
	p.undecided++
	p.valid = false
	clear(p.assign)
	return true
}

func (p *migratingPlacer) adopt(owner []int, bins []request, assign []int) {
	p.valid = true
	copy(p.bins, bins)
	clear(p.assign)
	for i, id := range owner {
		p.assign[id] = append(p.assign[id], assign[i])
	}
}

func (p *migratingPlacer) slack(b request) float64 {
	return min(float64(p.cap.mem-b.mem)/float64(p.cap.mem), float64(p.cap.cores-b.cores)/float64(p.cap.cores))
}

func (p *migratingPlacer) maxFrac(r request) float64 {
	return max(float64(r.mem)/float64(p.cap.mem), float64(r.cores)/float64(p.cap.cores))
}

func (p *migratingPlacer) sumFrac(r request) float64 {
	return float64(r.mem)/float64(p.cap.mem) + float64(r.cores)/float64(p.cap.cores)
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
// GPU of capacity c it fits (best fit).
func firstFitDecreasing(sizes []request, gpus int, c request, key func(request) float64) ([]request, []int, bool) {
	slack := func(b request) float64 {
		return min(float64(c.mem-b.mem)/float64(c.mem), float64(c.cores-b.cores)/float64(c.cores))
	}
	order := decreasing(sizes, key)
	bins := make([]request, gpus)
	assign := make([]int, len(sizes))
	for _, i := range order {
		s := sizes[i]
		best := -1
		for g, b := range bins {
			if b.mem+s.mem > c.mem || b.cores+s.cores > c.cores {
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

// exactPack searches for a packing of sizes into gpus bins of capacity
// capGPU, largest first, trying each bin whose load differs from the bins
// tried before it (equal loads are interchangeable), within budget search nodes.
func exactPack(sizes []request, gpus int, capGPU request, budget int) ([]request, []int, packResult) {
	maxFrac := func(r request) float64 {
		return max(float64(r.mem)/float64(capGPU.mem), float64(r.cores)/float64(capGPU.cores))
	}
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

// oraclePlacer packs the share requests without the allocator, on the same
// nodes with the same node resources: best fit (the GPU left with the least
// free memory, as a fraction of its own, fleet-wide; a multi-GPU job on the
// node with the fewest free whole GPUs that still has enough) or first fit
// (node order, GPU order, which is what the allocator does for shares; tests
// compare the two).
type oraclePlacer struct {
	bestFit bool
	fleet   Fleet
	opt     Options
	maxPods int
	node    []int // node of each GPU
	model   []GPUModel
	mem     []int64 // free bytes per GPU
	cores   []int64
	base    []int // first GPU of each node
	load    []nodeLoad
}

func newOraclePlacer(f Fleet, opt Options, bestFit bool) *oraclePlacer {
	if opt.Scoring == (Scoring{}) {
		opt.Scoring = DefaultScoring
	}
	p := &oraclePlacer{bestFit: bestFit, fleet: f, opt: opt, maxPods: cmp.Or(opt.Scoring.MaxPods, defaultMaxPods)}
	for i, s := range f.Nodes {
		p.base = append(p.base, len(p.mem))
		p.load = append(p.load, nodeLoad{allocCPU: cmp.Or(s.MilliCPU, opt.Scoring.NodeMilliCPU), allocMem: cmp.Or(s.MemoryMiB<<20, opt.Scoring.NodeMemory)})
		for range s.GPUs {
			p.node = append(p.node, i)
			p.model = append(p.model, s.Model)
			p.mem = append(p.mem, s.Model.MemoryBytes())
			p.cores = append(p.cores, 100)
		}
	}
	return p
}

func (p *oraclePlacer) place(_ context.Context, j *Job) (placement, bool, error) {
	req := p.opt.Scoring.requestsOf(j)
	room := func(n int) bool { return p.load[n].room(req, p.maxPods) }
	if j.CPUOnly {
		for n := range p.fleet.Nodes {
			if room(n) {
				p.load[n].add(req, 1)
				return placement{node: n, job: j.ID}, true, nil
			}
		}
		return placement{}, false, nil
	}
	if j.GPUs > 0 {
		return p.placeWhole(j, room)
	}
	best := -1
	var bestFree float64
	// The request on each GPU model, formed once for this attempt.
	var models []GPUModel
	var reqs []request
	requestFor := func(m GPUModel) request {
		for k := range models {
			if models[k].Name == m.Name {
				return reqs[k]
			}
		}
		r := requestOn(j, m)
		models, reqs = append(models, m), append(reqs, r)
		return r
	}
	for g := range p.mem {
		m := p.model[g]
		if !room(p.node[g]) || !allowed(j.Models, m) {
			continue
		}
		r := requestFor(m)
		if p.mem[g] < r.mem || p.cores[g] < r.cores {
			continue
		}
		if !p.bestFit {
			best = g
			break
		}
		if free := float64(p.mem[g]-r.mem) / float64(m.MemoryBytes()); best < 0 || free < bestFree {
			best, bestFree = g, free
		}
	}
	if best < 0 {
		return placement{}, false, nil
	}
	r := requestFor(p.model[best])
	p.mem[best] -= r.mem
	p.cores[best] -= r.cores
	n := p.node[best]
	p.load[n].add(req, 1)
	return placement{node: n, job: j.ID, gpus: []int{best}, uses: []gpuUse{{memory: r.mem, cores: r.cores}}}, true, nil
}

// placeWhole puts a multi-GPU job on the allowed node with the fewest free
// whole GPUs that has enough (in one NVLink domain when it asks for one:
// all of an NVLink model's node, one GPU of a PCIe model's), its lowest free GPUs.
func (p *oraclePlacer) placeWhole(j *Job, room func(int) bool) (placement, bool, error) {
	bestNode, bestFree := -1, 0
	for n, s := range p.fleet.Nodes {
		if s.GPUs < j.GPUs || !allowed(j.Models, s.Model) || !room(n) || (j.NVLink && j.GPUs > 1 && !s.Model.NVLink) {
			continue
		}
		free := 0
		for g := p.base[n]; g < p.base[n]+s.GPUs; g++ {
			if p.mem[g] == s.Model.MemoryBytes() && p.cores[g] == 100 {
				free++
			}
		}
		if free < j.GPUs {
			continue
		}
		if !p.bestFit {
			bestNode = n
			break
		}
		if bestNode < 0 || free < bestFree {
			bestNode, bestFree = n, free
		}
	}
	if bestNode < 0 {
		return placement{}, false, nil
	}
	s := p.fleet.Nodes[bestNode]
	pl := placement{node: bestNode, job: j.ID}
	for g := p.base[bestNode]; g < p.base[bestNode]+s.GPUs && len(pl.gpus) < j.GPUs; g++ {
		if p.mem[g] == s.Model.MemoryBytes() && p.cores[g] == 100 {
			pl.gpus = append(pl.gpus, g)
			pl.uses = append(pl.uses, gpuUse{whole: true, memory: p.mem[g], cores: 100})
			p.mem[g], p.cores[g] = 0, 0
		}
	}
	p.load[bestNode].add(p.opt.Scoring.requestsOf(j), 1)
	return pl, true, nil
}

func (p *oraclePlacer) release(pl placement, j *Job) {
	for k, g := range pl.gpus {
		p.mem[g] += pl.uses[k].memory
		p.cores[g] += pl.uses[k].cores
	}
	p.load[pl.node].add(p.opt.Scoring.requestsOf(j), -1)
}
