package gpu

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Test knobs of MockNode: injected NVML events, lost GPUs and per-process
// accounting (GPUs that fail discovery are in mock_discovery.go). They exist so that health handling and metrics can be tested
// without GPUs; nothing on a real node uses them.

// mockSupportedEvents are the event types every mock GPU can deliver.
const mockSupportedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError

// mockState is the mutable part of a MockNode, behind one mutex.
type mockState struct {
	mu    sync.Mutex
	sets  map[*mock.EventSet]*mockEventSet
	lost  map[int]bool
	procs map[int][]nvml.ProcessInfo
	// failures are the GPUs that fail discovery (see FailDiscovery).
	failures map[int]mockFailure
	// activity is the utilization and pod of processes, by GPU and PID
	// (see SetProcessActivity).
	activity map[int]map[uint32]mockActivity
	// conditions are the compute mode and fabric knobs (see
	// SetComputeMode).
	conditions mockConditions
	// mig is each GPU's MIG state (see mock_mig.go).
	mig map[int]*mockMIGGPU
}

// mockEventSet is what NVML keeps for one nvmlEventSet: which GPUs deliver
// which event types into it, and the events not yet waited for.
type mockEventSet struct {
	registered map[int]uint64 // device index → event type mask
	queue      chan mockDelivery
	freed      bool
}

type mockDelivery struct {
	data nvml.EventData
	ret  nvml.Return
}

// mockEventQueue is how many undelivered events an event set holds; further
// ones are dropped (and InjectEvent says so), as NVML drops on overflow.
const mockEventQueue = 256

func (n *MockNode) installEvents() {
	n.state = &mockState{sets: map[*mock.EventSet]*mockEventSet{}, lost: map[int]bool{}, procs: map[int][]nvml.ProcessInfo{},
		activity: map[int]map[uint32]mockActivity{}}
	n.installActivity()
	m := n.Interface
	m.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		set := &mock.EventSet{}
		s := &mockEventSet{registered: map[int]uint64{}, queue: make(chan mockDelivery, mockEventQueue)}
		set.WaitFunc = func(timeoutms uint32) (nvml.EventData, nvml.Return) { return n.wait(s, timeoutms) }
		set.FreeFunc = func() nvml.Return { return n.free(set) }
		n.state.mu.Lock()
		n.state.sets[set] = s
		n.state.mu.Unlock()
		return set, nvml.SUCCESS
	}
	m.EventSetWaitFunc = func(set nvml.EventSet, timeoutms uint32) (nvml.EventData, nvml.Return) {
		return set.Wait(timeoutms)
	}
	m.EventSetFreeFunc = func(set nvml.EventSet) nvml.Return { return set.Free() }
	for i, d := range n.Devices {
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			if n.isLost(i) {
				return 0, nvml.ERROR_GPU_IS_LOST
			}
			return mockSupportedEvents, nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
			return n.register(i, types, set)
		}
		memoryInfo := d.GetMemoryInfoFunc
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			if n.isLost(i) {
				return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
			}
			mem, ret := memoryInfo()
			for _, p := range n.processes(i) {
				mem.Used += p.UsedGpuMemory
			}
			mem.Free = mem.Total - min(mem.Used, mem.Total)
			return mem, ret
		}
		d.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			return n.processUtilization(i, uint64(time.Now().UnixMicro()))
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			if n.isLost(i) {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
			return n.processes(i), nvml.SUCCESS
		}
	}
}

func (n *MockNode) register(i int, types uint64, set nvml.EventSet) nvml.Return {
	if n.isLost(i) {
		return nvml.ERROR_GPU_IS_LOST
	}
	if types&^mockSupportedEvents != 0 {
		return nvml.ERROR_NOT_SUPPORTED
	}
	ms, ok := set.(*mock.EventSet)
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	s := n.state.sets[ms]
	if !ok || s == nil || s.freed {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s.registered[i] |= types
	return nvml.SUCCESS
}

func (n *MockNode) wait(s *mockEventSet, timeoutms uint32) (nvml.EventData, nvml.Return) {
	t := time.NewTimer(time.Duration(timeoutms) * time.Millisecond)
	defer t.Stop()
	select {
	case d := <-s.queue:
		return d.data, d.ret
	case <-t.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

func (n *MockNode) free(set *mock.EventSet) nvml.Return {
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	s, ok := n.state.sets[set]
	if !ok || s.freed {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s.freed = true
	delete(n.state.sets, set)
	return nvml.SUCCESS
}

func (n *MockNode) isLost(i int) bool {
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	return n.state.lost[i]
}

func (n *MockNode) processes(i int) []nvml.ProcessInfo {
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	return slices.Clone(n.state.procs[i])
}

// deliver puts an event into every live event set in which GPU i registered
// for the event type, and returns how many sets got it.
func (n *MockNode) deliver(i int, eventType uint64, d mockDelivery) (int, error) {
	if i < 0 || i >= len(n.Devices) {
		return 0, fmt.Errorf("mock node %s: no GPU with index %d (it has %d)", n.Profile, i, len(n.Devices))
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	delivered := 0
	for _, s := range n.state.sets {
		if s.registered[i]&eventType == 0 {
			continue
		}
		select {
		case s.queue <- d:
			delivered++
		default:
			return delivered, fmt.Errorf("mock node %s: event queue full, event for GPU %d dropped", n.Profile, i)
		}
	}
	return delivered, nil
}

// InjectEvent makes NVML report an event of eventType (an nvml.EventType*
// constant) with data (the XID code for EventTypeXidCriticalError) on GPU i,
// as the driver would: every event set in which the GPU registered for that
// type receives it. It returns how many sets received it; 0 means nobody is
// watching that GPU for that type. The event is not attributed to a MIG
// instance (GpuInstanceId and ComputeInstanceId 0xFFFFFFFF, as nvml.h
// specifies); InjectMIGEvent makes one that is.
func (n *MockNode) InjectEvent(i int, eventType, data uint64) (int, error) {
	if i < 0 || i >= len(n.Devices) {
		return n.deliver(i, eventType, mockDelivery{})
	}
	return n.deliver(i, eventType, mockDelivery{
		data: nvml.EventData{Device: n.Devices[i], EventType: eventType, EventData: data, GpuInstanceId: noInstanceID, ComputeInstanceId: noInstanceID},
		ret:  nvml.SUCCESS,
	})
}

// InjectXID is InjectEvent for a critical XID error.
func (n *MockNode) InjectXID(i int, xid uint64) (int, error) {
	return n.InjectEvent(i, nvml.EventTypeXidCriticalError, xid)
}

// SetLost makes GPU i fall off the bus (lost=true) or come back. While lost,
// its GetMemoryInfo, GetComputeRunningProcesses, GetSupportedEventTypes and
// RegisterEvents return ERROR_GPU_IS_LOST, and when it gets lost every event
// set it registered in returns ERROR_GPU_IS_LOST from its next Wait, as the
// real library does.
func (n *MockNode) SetLost(i int, lost bool) error {
	if i < 0 || i >= len(n.Devices) {
		return fmt.Errorf("mock node %s: no GPU with index %d (it has %d)", n.Profile, i, len(n.Devices))
	}
	n.state.mu.Lock()
	was := n.state.lost[i]
	if lost {
		n.state.lost[i] = true
	} else {
		delete(n.state.lost, i)
	}
	n.state.mu.Unlock()
	if lost && !was {
		_, err := n.deliver(i, ^uint64(0), mockDelivery{ret: nvml.ERROR_GPU_IS_LOST})
		return err
	}
	return nil
}

// SetProcesses sets what GetComputeRunningProcesses reports for GPU i (the
// GPU's used memory follows: GetMemoryInfo's Used is their sum).
func (n *MockNode) SetProcesses(i int, procs []nvml.ProcessInfo) error {
	if i < 0 || i >= len(n.Devices) {
		return fmt.Errorf("mock node %s: no GPU with index %d (it has %d)", n.Profile, i, len(n.Devices))
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	n.state.procs[i] = slices.Clone(procs)
	return nil
}
