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
	// Demand is the fraction of one GPU (memory and compute alike) the job needs, in (0, 1].
	Demand float64
	// Runtime is how long the job runs once started, in simulated seconds. It does
	// not depend on what shares the GPU (the paper's inference jobs are served at
	// their requested rate).
	Runtime float64
}

// Workload describes a job stream as in KubeShare §5.3.
type Workload struct {
	Seed int64
	// Jobs is the number of jobs in the stream.
	Jobs int
	// MeanDemand and SDDemand parametrise the normal GPU demand, clipped to [MinDemand, 1].
	MeanDemand, SDDemand float64
	// MeanRuntime is the mean of the exponential run time, in seconds.
	MeanRuntime float64
	// GPUs is the fleet size the arrival rate is scaled to.
	GPUs int
	// Load is the offered load relative to the fluid capacity of the fleet:
	// arrival rate = Load × GPUs / (MeanDemand × MeanRuntime). Above 1 every model
	// saturates, which is where the throughput of the models differs.
	Load float64
}

// MinDemand is the smallest demand a job has after clipping: one percent of the cores.
const MinDemand = 0.01

// ArrivalRate is the Poisson arrival rate in jobs per second.
func (w Workload) ArrivalRate() float64 {
	return w.Load * float64(w.GPUs) / (w.MeanDemand * w.MeanRuntime)
}

// Generate draws the stream. The same Workload always yields the same jobs; the
// stream does not depend on the model it is replayed against.
func (w Workload) Generate() []Job {
	rng := rand.New(rand.NewPCG(uint64(w.Seed), math.Float64bits(w.MeanDemand)))
	rate := w.ArrivalRate()
	jobs := make([]Job, w.Jobs)
	t := 0.0
	for i := range jobs {
		t += rng.ExpFloat64() / rate
		d := w.MeanDemand + w.SDDemand*rng.NormFloat64()
		d = min(max(d, MinDemand), 1)
		jobs[i] = Job{ID: i, Arrival: t, Demand: d, Runtime: rng.ExpFloat64() * w.MeanRuntime}
	}
	return jobs
}
