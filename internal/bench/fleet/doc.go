// Package fleet simulates a fleet of GPU nodes (hgx-h100 by default; any mix
// of the GPU models in Models) under several ways of handing out GPUs, on the
// workload of the KubeShare paper (HPDC '20, §5.3) or a trace, and measures
// what kube-scheduler's DRA allocator costs per node for each. It backs
// `make bench`, `make bench-full` and `make bench-fill` through
// cmd/tessera-bench. Everything it reports is simulation; docs/fleet-sim.md
// says what is modelled and proves the bounds.
//
// The models compared on the same job stream (Run, AllKinds):
//
//   - (a) Whole: one device per GPU, one job per GPU (today's Kubernetes).
//   - (b) Partition: fixed partitions of 1/8, 1/4, 1/2 and 1/1 GPU published as
//     partitionable devices over per-GPU counter sets (this package's own slices).
//   - (c) Tessera: the driver's real model (pkg/model over each node's GPUs,
//     the hgx-h100 mock of pkg/gpu for the default fleet), each job a share
//     of gpu-N-shared with memory and cores ∝ demand, or whole gpu-N devices.
//   - (c') TesseraBestFit: the same requests packed best-fit by an oracle, to show
//     what the allocator's first-fit costs.
//   - (d) Migrating: a reference policy that repacks every running job at
//     every event; it moves running jobs and is not a bound.
//   - (e) Fluid: a reference policy without GPU boundaries.
//
// and two bounds that hold for every schedule of the stream, whatever its
// queue and placement (ServedBound, RunningBound). Fill runs the fill
// experiment of "Beware of Fragmentation" (USENIX ATC '23), on the openb
// trace (ReadOpenBNodes, ReadOpenBPods) or a synthetic one.
//
// What the caller may assume:
//
//   - Run is pure apart from CPU: a discrete-event simulation on a simulated clock;
//     the same Workload and Options give the same Result (wall-clock timing appears
//     only in MeasureCost and Bench's informative durations). Fill likewise.
//   - Every placement for (a), (b), (c) is a real structured.Allocator call with the
//     feature set kube-scheduler 1.37 enables (model.SchedulerFeatures) against the node's
//     current AllocatedState, which is updated from the results the way the
//     scheduler does. The allocator is rebuilt after every change of a node's state
//     because it caches the counters left in each pool.
//   - Queueing and node choice are kube-scheduler 1.37's (see QueueKube and
//     ChoiceScore); FIFO and first-node choice remain as options.
//
// The node side (prepare/unprepare latency, plugin memory, ResourceSlice writes)
// is measured by internal/bench/node; Report carries its results so that one report
// holds both halves.
//
// # Lending
//
// RunLending models lending idle GPUs to preemptible borrowers (LendingBench sweeps it;
// `make bench-lending`, results/fleet-lending.md): owners that hold a GPU
// whole all horizon long and are busy part of the time in bursts, and a
// queue of preemptible batch borrowers that checkpoint. What the caller may
// assume:
//
//   - Every lend and reclaim decision is pkg/lending's Step, called for every
//     GPU at every sample interval of the simulated clock with what the plugin
//     would observe (the owner busy at any time since the previous sample, its
//     memory and processes, the borrowers on the GPU).
//   - A borrower is allocated only a GPU that Step left Lent, the earliest
//     arrival first (kube-scheduler's queue order for equal priorities; an
//     evicted borrower keeps its arrival); one borrower per GPU (it asks for
//     all the lent cores).
//   - Entering Reclaiming is the NoExecute taint: the borrower is gone after
//     its grace (tolerationSeconds) plus the eviction latency, an input. A
//     grace of at least CheckpointWrite saves its work at the taint; a shorter
//     one keeps its last periodic checkpoint.
//   - The owner's extra wait is the time it is busy while a borrower is still
//     on its GPU; memory pressure and slowdown while they share are not
//     modelled.
//   - The same workload and options give the same result; Trace records the
//     phases and the borrowers' stays so tests can check the rules without the
//     simulator's own bookkeeping.
package fleet
