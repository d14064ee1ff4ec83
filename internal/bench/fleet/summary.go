package fleet

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// ClaimSpec is the spec of the ResourceClaim job j creates under model kind
// (Whole, Partition or Tessera) on the KubeShare fleet (hgx-h100 nodes):
// what the simulation hands the allocator, for replaying the stream on a
// real cluster.
func ClaimSpec(kind Kind, j *Job) (resourceapi.ResourceClaimSpec, error) {
	m, err := newDeviceModel(kind, HGXFleet(1))
	if err != nil {
		return resourceapi.ResourceClaimSpec{}, err
	}
	c, err := m.claim(j)
	if err != nil {
		return resourceapi.ResourceClaimSpec{}, err
	}
	return c.Spec, nil
}

// Published returns what the simulation publishes for model kind (Whole,
// Partition or Tessera): the ResourceSlices of node, without names (the API
// server generates them from GenerateName), and the DeviceClasses its claims
// ([ClaimSpec]) name. A replay on a real cluster publishes them to compare
// the model with the real scheduler.
func Published(kind Kind, node string) ([]*resourceapi.ResourceSlice, []*resourceapi.DeviceClass, error) {
	m, err := newDeviceModel(kind, HGXFleet(1))
	if err != nil {
		return nil, nil, err
	}
	slices, err := m.slices(node, HGXFleet(1).Nodes[0])
	if err != nil {
		return nil, nil, err
	}
	for _, s := range slices {
		s.Name = ""
	}
	return slices, m.classes(), nil
}

// Summarize measures a run from the start time of every job (simulated seconds;
// a job completes Runtime after its start): completions per hour in the window
// Run uses and the waits. It is how a replay on a real cluster is measured the
// same way as a simulation.
func Summarize(kind Kind, jobs []Job, starts []float64) (Result, error) {
	r := Result{Kind: kind, Jobs: len(jobs), Starts: starts}
	if len(jobs) == 0 {
		return r, nil
	}
	if len(starts) != len(jobs) {
		return r, fmt.Errorf("%d start times for %d jobs", len(starts), len(jobs))
	}
	r.WindowStart, r.WindowEnd = jobs[len(jobs)/10].Arrival, jobs[len(jobs)-1].Arrival
	waits := make([]float64, len(jobs))
	var done int
	for i, j := range jobs {
		if starts[i] < j.Arrival {
			return r, fmt.Errorf("job %d starts at %.1fs, before its arrival %.1fs", i, starts[i], j.Arrival)
		}
		waits[i] = starts[i] - j.Arrival
		r.WaitMean += waits[i] / float64(len(jobs))
		end := starts[i] + j.Runtime
		if end >= r.WindowStart && end <= r.WindowEnd {
			done++
		}
		r.Makespan = max(r.Makespan, end)
	}
	if w := r.WindowEnd - r.WindowStart; w > 0 {
		r.JobsPerHour = float64(done) / w * 3600
	}
	r.ServedPerHour, r.MeanRunning = served(jobs, starts, r.WindowStart, r.WindowEnd)
	slices.Sort(waits)
	r.WaitP50, r.WaitP95, r.WaitP99 = percentile(waits, 0.50), percentile(waits, 0.95), percentile(waits, 0.99)
	return r, nil
}
