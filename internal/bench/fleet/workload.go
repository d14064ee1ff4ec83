package fleet

import (
	"math"
	"math/rand/v2"
)

// Job is one inference job of the stream.
type Job struct {
	ID int
	// Arrival is when the job is submitted, in simulated seconds.
	Arrival float64
	// Memory and Cores are the fractions of one GPU the job needs, in (0, 1].
	Memory, Cores float64
	// Demand is max(Memory, Cores): the share of a GPU the job blocks in the
	// models that do not split memory from compute (fixed partitions, fluid).
	Demand float64
	// Runtime is how long the job runs once started, in simulated seconds. It does
	// not depend on what shares the GPU (the paper's inference jobs are served at
	// their requested rate).
	Runtime float64
	// GPUs > 0 asks for that many whole GPUs on one node (Memory, Cores and
	// Demand are then 1); 0 asks for one share of Memory and Cores.
	GPUs int `json:",omitempty"`
	// NVLink asks for all of a multi-GPU job's GPUs in one NVLink domain
	// (a matchAttribute constraint on nvlinkDomain).
	NVLink bool `json:",omitempty"`
	// Models restricts the job to these GPU models (catalogue names, see
	// Models); empty: any.
	Models []string `json:",omitempty"`
	// CPUOnly jobs ask for no GPU at all (openb's num_gpu 0); they take only
	// node CPU and memory.
	CPUOnly bool `json:",omitempty"`
	// MilliCPU and MemoryMiB are the pod's CPU and memory requests (0: none),
	// which the node must have room for.
	MilliCPU  int64 `json:",omitempty"`
	MemoryMiB int64 `json:",omitempty"`
}

// gpuCount is how many GPUs the job's claim holds (0 for a CPU-only job).
func (j *Job) gpuCount() int {
	switch {
	case j.CPUOnly:
		return 0
	case j.GPUs > 0:
		return j.GPUs
	}
	return 1
}

// gpuRequest is how much GPU the job asks for, in GPUs: its share of one,
// or its whole GPUs.
func (j *Job) gpuRequest() float64 {
	switch {
	case j.CPUOnly:
		return 0
	case j.GPUs > 0:
		return float64(j.GPUs)
	}
	return j.Demand
}

func newJob(id int, arrival float64, d Demand, runtime float64) Job {
	return Job{ID: id, Arrival: arrival, Memory: d.Memory, Cores: d.Cores, Demand: d.Max(), Runtime: runtime}
}

// Workload describes a job stream as in KubeShare §5.3: Poisson arrivals,
// exponential run times, demands drawn from Dist.
type Workload struct {
	Seed int64
	// Jobs is the number of jobs in the stream.
	Jobs int
	// Dist draws the demands; nil is Normal(MeanDemand, SDDemand) clipped to
	// [MinDemand, 1], the paper's.
	Dist Distribution
	// MeanDemand is the mean of Demand.Max under Dist (set by Bench for the
	// report; computed from Dist when zero). With Dist nil it is the normal's mean.
	MeanDemand, SDDemand float64
	// MeanRuntime is the mean of the exponential run time, in seconds.
	MeanRuntime float64
	// GPUs is the fleet size the arrival rate is scaled to.
	GPUs int
	// Load is the offered load relative to the fluid capacity of the fleet:
	// arrival rate = Load × GPUs / (MeanDemand × MeanRuntime). Above 1 every model
	// saturates, which is where the throughput of the models differs.
	Load float64
	// Trace, when set, is the stream itself (ReadTrace); Generate returns it and
	// the fields above other than Dist's name do not apply.
	Trace []Job
}

// MinDemand is the smallest demand a job has after clipping: one percent of the cores.
const MinDemand = 0.01

// Distribution returns Dist, or the paper's normal when Dist is nil.
func (w Workload) Distribution() Distribution {
	if w.Dist != nil {
		return w.Dist
	}
	return Normal{w.MeanDemand, w.SDDemand}
}

// Mean is MeanDemand, or the distribution's mean when MeanDemand is zero.
func (w Workload) Mean() float64 {
	if w.MeanDemand > 0 {
		return w.MeanDemand
	}
	return MeanDemand(w.Distribution())
}

// ArrivalRate is the Poisson arrival rate in jobs per second.
func (w Workload) ArrivalRate() float64 {
	return w.Load * float64(w.GPUs) / (w.Mean() * w.MeanRuntime)
}

// Generate draws the stream. The same Workload always yields the same jobs; the
// stream does not depend on the model it is replayed against.
func (w Workload) Generate() []Job {
	if w.Trace != nil {
		return append([]Job(nil), w.Trace...)
	}
	rng := rand.New(rand.NewPCG(uint64(w.Seed), math.Float64bits(w.Mean())))
	rate := w.ArrivalRate()
	dist := w.Distribution()
	jobs := make([]Job, w.Jobs)
	t := 0.0
	for i := range jobs {
		t += rng.ExpFloat64() / rate
		d := dist.Sample(rng)
		jobs[i] = newJob(i, t, d, rng.ExpFloat64()*w.MeanRuntime)
	}
	return jobs
}
