package gpu

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Test knobs of MockNode for MIG: what an admin (nvidia-smi -mig, a GPU
// reset, nvidia-smi mig -cgi) or a workload (processes on a MIG device) does
// to a GPU. Each change is written to the MIG state file, if the node has
// one. Nothing on a real node uses them.

// migGPU is GPU i's MIG state, or an error for an index out of range or a
// product without MIG. Call it without the lock.
func (n *MockNode) migGPU(i int) (*mockMIGGPU, error) {
	if err := n.checkIndex(i); err != nil {
		return nil, err
	}
	s := n.state.mig[i]
	if s.table == nil {
		return nil, fmt.Errorf("mock node %s: GPU %d does not support MIG", n.Profile, i)
	}
	return s, nil
}

// commitKnob commits a knob's change as commit does; a failed state-file
// write is its error. Call it with the lock held.
func (n *MockNode) commitKnob(undo func()) error {
	if n.commit(undo) != nvml.SUCCESS {
		return fmt.Errorf("mock node %s: writing MIG state file %s: %w", n.Profile, n.migFile, n.migWriteErr)
	}
	return nil
}

// SetMIG turns GPU i's MIG mode on or off, as nvidia-smi -mig followed by a
// GPU reset would: current and pending mode both become enabled. Changing
// the mode destroys the GPU's instances, as the reset does. It fails for a
// product without MIG.
func (n *MockNode) SetMIG(i int, enabled bool) error {
	return n.withMIGGPU(i, func(s *mockMIGGPU) error { return n.setMode(s, enabled, enabled) })
}

// withMIGGPU runs f on GPU i's MIG state with the lock held.
func (n *MockNode) withMIGGPU(i int, f func(s *mockMIGGPU) error) error {
	s, err := n.migGPU(i)
	if err != nil {
		return err
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	return f(s)
}

// setMode sets s's current and pending MIG mode and commits the change; a
// change of the current mode destroys the GPU's instances. Call it with the
// lock held.
func (n *MockNode) setMode(s *mockMIGGPU, current, pending bool) error {
	old := *s
	changed := old.current != current
	s.current, s.pending = current, pending
	if changed {
		s.instances = nil
	}
	if err := n.commitKnob(func() { *s = old }); err != nil {
		return err
	}
	if changed {
		markGone(old.instances)
	}
	return nil
}

// SetMIGPending sets GPU i's pending MIG mode only, as nvidia-smi -i <i>
// -mig <0|1> does while the GPU is in use: the current mode and the
// instances stay until ResetGPU.
func (n *MockNode) SetMIGPending(i int, enabled bool) error {
	return n.withMIGGPU(i, func(s *mockMIGGPU) error { return n.setMode(s, s.current, enabled) })
}

// ResetGPU resets GPU i (nvidia-smi -r): its pending MIG mode becomes the
// current one, and a mode change destroys its instances. Like the driver it
// refuses while a process runs on the GPU or on one of its MIG devices.
func (n *MockNode) ResetGPU(i int) error {
	s, err := n.migGPU(i)
	if err != nil {
		return err
	}
	if len(n.processes(i)) > 0 {
		return fmt.Errorf("mock node %s: GPU %d is in use by %d processes: reset refused", n.Profile, i, len(n.processes(i)))
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	for _, ci := range s.computeInstances() {
		if len(ci.procs) > 0 {
			return fmt.Errorf("mock node %s: GPU %d: MIG device %d/%d is in use by %d processes: reset refused", n.Profile, i, ci.gi.id, ci.id, len(ci.procs))
		}
	}
	return n.setMode(s, s.pending, s.pending)
}

// markGone invalidates the handles of destroyed instances.
func markGone(gis []*mockGI) {
	for _, gi := range gis {
		gi.gone = true
		for _, ci := range gi.cis {
			ci.gone = true
		}
	}
}

// CreateMIGInstance creates a GPU instance of profile (its name, "3g.40gb")
// at memory slice start on GPU i, with one compute instance of its size, as
// nvidia-smi mig -cgi <profile> -C with a placement would (an admin's
// instance), and returns their IDs. start -1 lets the driver place it. The
// driver's rules apply (see mock_mig.go); a refusal names its NVML return.
func (n *MockNode) CreateMIGInstance(i int, profile string, start int) (gi, ci int, err error) {
	h, prof, err := n.createMIGGPUInstance(i, profile, start)
	if err != nil {
		return 0, 0, err
	}
	ciInfo, ret := h.GetComputeInstanceProfileInfo(mockCIProfileIndex[prof.slices], nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return 0, 0, fmt.Errorf("mock node %s: GPU %d: compute instance profile of %s: %w", n.Profile, i, profile, ret)
	}
	c, ret := h.CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		return 0, 0, fmt.Errorf("mock node %s: GPU %d: compute instance of %s: %w", n.Profile, i, profile, ret)
	}
	giInfo, _ := h.GetInfo()
	cInfo, _ := c.GetInfo()
	return int(giInfo.Id), int(cInfo.Id), nil
}

// CreateMIGGPUInstance creates a GPU instance of profile at memory slice
// start on GPU i (-1: the driver places it) without a compute instance, as
// nvidia-smi mig -cgi <profile> without -C would, and returns its ID; add
// compute instances with CreateMIGComputeInstance.
func (n *MockNode) CreateMIGGPUInstance(i int, profile string, start int) (int, error) {
	h, _, err := n.createMIGGPUInstance(i, profile, start)
	if err != nil {
		return 0, err
	}
	info, _ := h.GetInfo()
	return int(info.Id), nil
}

func (n *MockNode) createMIGGPUInstance(i int, profile string, start int) (nvml.GpuInstance, *mockMIGProfile, error) {
	s, err := n.migGPU(i)
	if err != nil {
		return nil, nil, err
	}
	prof, ok := s.table.byName(profile)
	if !ok {
		return nil, nil, fmt.Errorf("mock node %s: GPU %d has no MIG profile %q", n.Profile, i, profile)
	}
	info := prof.info()
	var h nvml.GpuInstance
	var ret nvml.Return
	if start < 0 {
		h, ret = n.Devices[i].CreateGpuInstance(&info)
	} else {
		h, ret = n.Devices[i].CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: prof.size})
	}
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("mock node %s: GPU %d: creating %s at %d: %w", n.Profile, i, profile, start, ret)
	}
	return h, prof, nil
}

// CreateMIGComputeInstance adds a compute instance of slices compute slices
// to GPU instance gi of GPU i, as nvidia-smi mig -cci <profile> -gi <gi>
// would (an admin splitting a GPU instance: 1c.3g.40gb), and returns its ID.
// The driver's rules apply (see mock_mig.go).
func (n *MockNode) CreateMIGComputeInstance(i, gi, slices int) (int, error) {
	if _, err := n.migGPU(i); err != nil {
		return 0, err
	}
	h, ret := n.Devices[i].GetGpuInstanceById(gi)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("mock node %s: GPU %d: GPU instance %d: %w", n.Profile, i, gi, ret)
	}
	index, ok := mockCIProfileIndex[uint32(max(slices, 0))]
	if !ok {
		return 0, fmt.Errorf("mock node %s: no compute-instance profile of %d slices", n.Profile, slices)
	}
	info, ret := h.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("mock node %s: GPU %d: GPU instance %d: compute instance profile of %d slices: %w", n.Profile, i, gi, slices, ret)
	}
	c, ret := h.CreateComputeInstance(&info)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("mock node %s: GPU %d: GPU instance %d: compute instance of %d slices: %w", n.Profile, i, gi, slices, ret)
	}
	cInfo, _ := c.GetInfo()
	return int(cInfo.Id), nil
}

// DestroyMIGInstance destroys GPU instance gi of GPU i and its compute
// instances, as nvidia-smi mig -dci then -dgi would; refused (IN_USE) while
// one of them has processes.
func (n *MockNode) DestroyMIGInstance(i, gi int) error {
	if _, err := n.migGPU(i); err != nil {
		return err
	}
	h, ret := n.Devices[i].GetGpuInstanceById(gi)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("mock node %s: GPU %d: GPU instance %d: %w", n.Profile, i, gi, ret)
	}
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := h.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, _ := h.GetComputeInstances(&info)
		for _, c := range cis {
			if ret := c.Destroy(); ret != nvml.SUCCESS {
				return fmt.Errorf("mock node %s: GPU %d: GPU instance %d: destroying a compute instance: %w", n.Profile, i, gi, ret)
			}
		}
	}
	if ret := h.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("mock node %s: GPU %d: destroying GPU instance %d: %w", n.Profile, i, gi, ret)
	}
	return nil
}

// SetMIGProcesses sets the compute processes of the MIG device of compute
// instance ci in GPU instance gi on GPU i: its
// nvmlDeviceGetComputeRunningProcesses lists them (with their instance
// IDs), its used memory is their sum, and destroying the instance is
// refused while there are any. nil removes them.
func (n *MockNode) SetMIGProcesses(i, gi, ci int, procs []nvml.ProcessInfo) error {
	return n.withMIGGPU(i, func(s *mockMIGGPU) error {
		for _, c := range s.computeInstances() {
			if c.gi.id != gi || c.id != ci {
				continue
			}
			old := c.procs
			c.procs = nil
			for _, p := range procs {
				p.GpuInstanceId, p.ComputeInstanceId = uint32(gi), uint32(ci)
				c.procs = append(c.procs, p)
			}
			return n.commitKnob(func() { c.procs = old })
		}
		return fmt.Errorf("mock node %s: GPU %d has no compute instance %d in GPU instance %d", n.Profile, i, ci, gi)
	})
}

// InjectMIGEvent is InjectEvent for an event the driver attributes to GPU
// instance gi and compute instance ci (ci -1: to the GPU instance only) of
// GPU i: the event data carries their IDs, as nvmlEventData_t does for XIDs
// on MIG devices. The GPU must be in MIG mode and have that instance.
func (n *MockNode) InjectMIGEvent(i, gi, ci int, eventType, data uint64) (int, error) {
	s, err := n.migGPU(i)
	if err != nil {
		return 0, err
	}
	n.state.mu.Lock()
	found := slices.ContainsFunc(s.instances, func(g *mockGI) bool {
		return g.id == gi && (ci < 0 || slices.ContainsFunc(g.cis, func(c *mockCI) bool { return c.id == ci }))
	})
	n.state.mu.Unlock()
	if !found {
		return 0, fmt.Errorf("mock node %s: GPU %d has no GPU instance %d with compute instance %d", n.Profile, i, gi, ci)
	}
	ciID := noInstanceID
	if ci >= 0 {
		ciID = uint32(ci)
	}
	return n.deliver(i, eventType, mockDelivery{
		data: nvml.EventData{Device: n.Devices[i], EventType: eventType, EventData: data, GpuInstanceId: uint32(gi), ComputeInstanceId: ciID},
		ret:  nvml.SUCCESS,
	})
}

// InjectMIGXID is InjectMIGEvent for a critical XID error.
func (n *MockNode) InjectMIGXID(i, gi, ci int, xid uint64) (int, error) {
	return n.InjectMIGEvent(i, gi, ci, nvml.EventTypeXidCriticalError, xid)
}
