package gpu

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
)

// Process activity of MockNode: compute processes with an SM utilization and
// the pod each belongs to, so that lending (which maps NVML's processes to
// the pods of the claims holding a GPU) can be tested without GPUs.

// mockActivity is one mock compute process's utilization and pod.
type mockActivity struct {
	sm  uint32
	pod types.UID
}

// SetProcessActivity makes process pid of pod a compute process on GPU i
// using memory bytes and computing at sm percent: GetComputeRunningProcesses
// lists it, GetProcessUtilization samples it (sm > 0) and PodOfProcess maps
// it to pod. remove takes it off the GPU.
func (n *MockNode) SetProcessActivity(i int, pid uint32, pod types.UID, sm uint32, memory uint64, remove bool) error {
	if i < 0 || i >= len(n.Devices) {
		return fmt.Errorf("mock node %s: no GPU with index %d (it has %d)", n.Profile, i, len(n.Devices))
	}
	if sm > 100 {
		return fmt.Errorf("SM utilization %d%%: at most 100", sm)
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	procs := slices.DeleteFunc(n.state.procs[i], func(p nvml.ProcessInfo) bool { return p.Pid == pid })
	if n.state.activity[i] == nil {
		n.state.activity[i] = map[uint32]mockActivity{}
	}
	delete(n.state.activity[i], pid)
	if !remove {
		procs = append(procs, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: memory})
		n.state.activity[i][pid] = mockActivity{sm: sm, pod: pod}
	}
	n.state.procs[i] = procs
	return nil
}

// installActivity makes the mock devices answer the MPS process list (no MPS
// clients on a mock node).
func (n *MockNode) installActivity() {
	for i, d := range n.Devices {
		d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			if n.isLost(i) {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
			return nil, nvml.SUCCESS
		}
	}
}

// PodOfProcess is the pod of a process set by SetProcessActivity.
func (n *MockNode) PodOfProcess(pid uint32) (types.UID, bool) {
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	for _, procs := range n.state.activity {
		if a, ok := procs[pid]; ok && a.pod != "" {
			return a.pod, true
		}
	}
	return "", false
}

// processUtilization is GetProcessUtilization of GPU i: a sample, stamped
// now, of every process computing on it. Without one it answers what
// go-nvml's GetProcessUtilization (v0.13.0-1 to v0.13.4-1) returns over a
// real driver then: an empty list and ERROR_INSUFFICIENT_SIZE, because it
// sizes its buffer with a first call that answers INSUFFICIENT_SIZE and a
// count of 0 and returns that answer as is. (The driver may also answer
// ERROR_NOT_FOUND, which go-nvml passes on; the lending sampler's tests
// cover both.)
func (n *MockNode) processUtilization(i int, now uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	if n.isLost(i) {
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	var out []nvml.ProcessUtilizationSample
	for pid, a := range n.state.activity[i] {
		if a.sm > 0 {
			out = append(out, nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: now, SmUtil: a.sm})
		}
	}
	if len(out) == 0 {
		return []nvml.ProcessUtilizationSample{}, nvml.ERROR_INSUFFICIENT_SIZE
	}
	slices.SortFunc(out, func(a, b nvml.ProcessUtilizationSample) int { return int(a.Pid) - int(b.Pid) })
	return out, nvml.SUCCESS
}
