package lending

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/metrics"
)

// Activity is what one pod's processes do on a GPU.
type Activity struct {
	// SM is the highest SM utilization (percent) of the pod's processes
	// since the previous sample.
	SM uint32
	// Memory is the GPU memory the pod's processes use, in bytes.
	Memory int64
	// PIDs are the pod's compute processes on the GPU.
	PIDs []uint32
}

// Sample is one look at a GPU's processes.
type Sample struct {
	// Observed is false when NVML could not list the GPU's processes.
	Observed bool
	// Pods is the activity by pod UID; processes of no pod (or whose pod
	// is unknown) are under "".
	Pods map[types.UID]Activity
	// FreeMemory is the GPU's free memory (nvmlDeviceGetMemoryInfo); 0 when
	// unknown.
	FreeMemory int64
	// Utilization is what nvmlDeviceGetProcessUtilization answered
	// (ERROR_UNKNOWN when go-nvml panicked; see processUtilization).
	Utilization nvml.Return
	// UtilizationUnknown is true when that answer gave no per-process
	// utilization (anything but SUCCESS, or NOT_FOUND and
	// INSUFFICIENT_SIZE without samples, which mean no process computed):
	// every process then counts as computing at 100 % SM, so that a GPU
	// whose processes cannot be told idle is never lent.
	UtilizationUnknown bool
}

// Sampler reads the GPUs' compute processes and their SM utilization from
// NVML (nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetProcessUtilization)
// and maps each process to its pod. It is not safe for concurrent use.
type Sampler struct {
	Lib nvml.Interface
	// PodOf maps a process (a PID of the PID namespace NVML reports) to its
	// pod: on a node the pod UID in /proc/<pid>/cgroup, on a mock node the
	// mock's PodOfProcess.
	PodOf func(pid uint32) (types.UID, bool)
	// Threshold is the SM utilization (percent) at or above which a process
	// computes; a process that exited before it could be mapped to a pod
	// counts only when it computed at least this much.
	Threshold uint32

	lastSeen map[string]uint64
	// pods remembers the pod of every process seen running, so that one
	// that exits before its utilization is read is still attributed.
	pods  map[uint32]types.UID
	byGPU map[string][]uint32
}

// Sample looks at the GPU with this UUID: its compute processes (MPS clients
// included, nvmlDeviceGetMPSComputeRunningProcesses), their SM utilization
// since the previous sample, and the GPU's free memory.
func (s *Sampler) Sample(uuid string) Sample {
	dev, ret := s.Lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return Sample{}
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return Sample{}
	}
	if mps, ret := dev.GetMPSComputeRunningProcesses(); ret == nvml.SUCCESS {
		for _, p := range mps {
			if !slices.ContainsFunc(procs, func(q nvml.ProcessInfo) bool { return q.Pid == p.Pid }) {
				procs = append(procs, p)
			}
		}
	}
	out := Sample{Observed: true, Pods: map[types.UID]Activity{}}
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		out.FreeMemory = int64(min(mem.Free, 1<<62))
	}
	if s.pods == nil {
		s.pods = map[uint32]types.UID{}
	}
	seen := map[uint32]types.UID{}
	for _, p := range procs {
		pod, ok := s.PodOf(p.Pid)
		if !ok {
			pod = s.pods[p.Pid]
		}
		seen[p.Pid] = pod
		a := out.Pods[pod]
		a.PIDs = append(a.PIDs, p.Pid)
		if p.UsedGpuMemory != ^uint64(0) { // NVML_VALUE_NOT_AVAILABLE
			a.Memory += int64(min(p.UsedGpuMemory, 1<<62))
		}
		out.Pods[pod] = a
	}
	if s.lastSeen == nil {
		s.lastSeen = map[string]uint64{}
	}
	samples, ret := processUtilization(dev, s.lastSeen[uuid])
	out.Utilization = ret
	switch {
	case ret == nvml.SUCCESS:
	case ret == nvml.ERROR_NOT_FOUND, ret == nvml.ERROR_INSUFFICIENT_SIZE && len(samples) == 0:
		// No process computed since lastSeen. go-nvml (v0.13.0-1 through
		// v0.13.4-1) sizes its buffer with a first call, which answers
		// INSUFFICIENT_SIZE and a count of 0 when there are no samples,
		// and returns that answer with an empty list; the driver may also
		// answer NOT_FOUND.
		samples = nil
	default:
		// Without per-process utilization, a process cannot be told idle:
		// every one counts as computing, so owners are never idle and the
		// GPU is never lent.
		out.UtilizationUnknown = true
		for pod, a := range out.Pods {
			a.SM = 100
			out.Pods[pod] = a
		}
	}
	for _, smp := range samples {
		s.lastSeen[uuid] = max(s.lastSeen[uuid], smp.TimeStamp)
		pod, running := seen[smp.Pid]
		if !running {
			// It computed since the last sample and has exited: its pod
			// is the one it had when seen running, if it was; an unknown
			// one counts only if it computed.
			var known bool
			if pod, known = s.pods[smp.Pid]; !known {
				if pod, known = s.PodOf(smp.Pid); !known && smp.SmUtil < max(s.Threshold, 1) {
					continue
				}
			}
		}
		a := out.Pods[pod]
		a.SM = max(a.SM, smp.SmUtil)
		if running && !slices.Contains(a.PIDs, smp.Pid) {
			a.PIDs = append(a.PIDs, smp.Pid)
		}
		out.Pods[pod] = a
	}
	for pod, a := range out.Pods {
		slices.Sort(a.PIDs)
		out.Pods[pod] = a
	}
	// Remember the pods of the processes running now; forget the others.
	s.forget(uuid, seen)
	return out
}

// forget keeps, for the GPU just sampled, the pods of its running processes.
// Processes are per GPU in NVML but PIDs are node-wide, so the map keeps
// every GPU's processes: it is rebuilt per GPU from what runs.
func (s *Sampler) forget(uuid string, running map[uint32]types.UID) {
	if s.byGPU == nil {
		s.byGPU = map[string][]uint32{}
	}
	for _, pid := range s.byGPU[uuid] {
		delete(s.pods, pid)
	}
	s.byGPU[uuid] = s.byGPU[uuid][:0]
	for pid, pod := range running {
		if pod != "" {
			s.pods[pid] = pod
			s.byGPU[uuid] = append(s.byGPU[uuid], pid)
		}
	}
}

// Observe turns a sample into the Observation of a GPU with memory bytes:
// the processes of borrowerPods are the borrowers' (their memory is summed),
// those of neutral pods (the MPS daemons' servers) nobody's, and every other
// process is the owners' — a process of an unknown pod counts as the
// owners', so that it can only end a loan, never start one. Busy means an
// owner process computed at or above threshold percent.
func Observe(s Sample, memory int64, owners []Owner, borrowers []types.UID, neutral, borrowerPods map[types.UID]bool, threshold uint32) Observation {
	o := Observation{Owners: owners, Borrowers: borrowers, Observed: s.Observed, Memory: memory, FreeMemory: s.FreeMemory}
	for pod, a := range s.Pods {
		if pod != "" && borrowerPods[pod] {
			o.BorrowerMemory += a.Memory
			continue
		}
		if pod != "" && neutral[pod] {
			continue
		}
		o.OwnerMemory += a.Memory
		o.OwnerProcesses = append(o.OwnerProcesses, a.PIDs...)
		if a.SM >= max(threshold, 1) {
			o.Busy = true
		}
	}
	slices.Sort(o.OwnerProcesses)
	return o
}

// ProcPods maps a process to its pod through <procRoot>/<pid>/cgroup (the
// kubelet's cgroup naming; see metrics.PodUIDFromCgroup). NVML reports PIDs
// of the host's PID namespace, so on a node procRoot is the host's /proc.
func ProcPods(procRoot string) func(pid uint32) (types.UID, bool) {
	return func(pid uint32) (types.UID, bool) {
		data, err := os.ReadFile(filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
		if err != nil {
			return "", false
		}
		return metrics.PodUIDFromCgroup(string(data))
	}
}

// processUtilization is dev.GetProcessUtilization without its panic: go-nvml
// (v0.13.0-1 through v0.13.4-1) sizes its buffer with a first call and
// slices the second call's answer to the count NVML then reports, which is
// out of range when a process started in between (INSUFFICIENT_SIZE with a
// larger count). That answer is "not observed", as any other error is.
func processUtilization(dev nvml.Device, since uint64) (samples []nvml.ProcessUtilizationSample, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			samples, ret = nil, nvml.ERROR_UNKNOWN
		}
	}()
	return dev.GetProcessUtilization(since)
}
