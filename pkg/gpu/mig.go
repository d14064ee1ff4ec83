package gpu

// MIG is what discovery knows about a GPU's Multi-Instance GPU state. A GPU
// without MIG support has none (GPU.MIG nil).
//
// A GPU in MIG mode is partitioned in hardware into GPU instances, each at a
// placement: a run of memory slices (a GPU has MemorySlices of them, 8 on
// A100/H100/H200). A GPU instance holds one or more compute instances; the
// unit a container gets is a compute instance, named by its "MIG-…" UUID.
//
// The current mode is GPU.MIGEnabled.
type MIG struct {
	// PendingEnabled is the mode after the next GPU reset (the pending one).
	// When it differs from Enabled an admin asked for a change that has not
	// happened yet.
	PendingEnabled bool `json:"pendingEnabled"`
	// MemorySlices is the number of memory slices placements are counted in
	// (the size of the full-GPU profile's placement); 0 when not in MIG mode.
	MemorySlices int `json:"memorySlices,omitempty"`
	// ComputeSlices is the number of compute slices (the full-GPU profile's
	// slice count, 7 on A100/H100/H200); 0 when not in MIG mode.
	ComputeSlices int `json:"computeSlices,omitempty"`
	// Profiles are the GPU-instance profiles the GPU supports, read only in
	// MIG mode, in ascending ID order.
	Profiles []MIGProfile `json:"profiles,omitempty"`
	// Instances are the GPU instances that exist, each with its compute
	// instances, in ascending GPU-instance ID order.
	Instances []MIGInstance `json:"instances,omitempty"`
}

// MIGProfile is one GPU-instance profile (nvmlGpuInstanceProfileInfo).
type MIGProfile struct {
	// Index is the NVML_GPU_INSTANCE_PROFILE_* constant the profile was
	// queried with (nvmlDeviceGetGpuInstanceProfileInfo's argument).
	Index int `json:"index"`
	// ID is the profile's ID (what nvidia-smi mig -lgip lists).
	ID int `json:"id"`
	// Name as nvidia-smi spells it, e.g. "3g.40gb", "1g.10gb+me".
	Name string `json:"name"`
	// ComputeSlices is the profile's compute slice count (the "3" of 3g).
	ComputeSlices int `json:"computeSlices"`
	// MemorySlices is the size of every placement of the profile.
	MemorySlices int `json:"memorySlices"`
	// MemoryBytes is the instance's framebuffer memory.
	MemoryBytes uint64 `json:"memoryBytes"`
	// Multiprocessors is the number of SMs the profile's full compute
	// instance gets.
	Multiprocessors int `json:"multiprocessors"`
	// Copy engines and media engines the profile takes.
	CopyEngines int `json:"copyEngines"`
	Decoders    int `json:"decoders"`
	Encoders    int `json:"encoders"`
	JPEGs       int `json:"jpegs"`
	OFAs        int `json:"ofas"`
	// MaxInstances is how many instances of the profile the GPU holds at most.
	MaxInstances int `json:"maxInstances"`
	// Placements are the profile's possible placements
	// (nvmlDeviceGetGpuInstancePossiblePlacements_v2), ascending start.
	Placements []MIGPlacement `json:"placements"`
}

// MIGPlacement is a run of memory slices: Start, Start+1, …, Start+Size-1.
type MIGPlacement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// Overlaps reports whether two placements share a memory slice.
func (p MIGPlacement) Overlaps(o MIGPlacement) bool {
	return p.Start < o.Start+o.Size && o.Start < p.Start+p.Size
}

// MIGInstance is one GPU instance and its compute instances.
type MIGInstance struct {
	// ID is the GPU instance ID (reused by the driver after a destroy).
	ID int `json:"id"`
	// ProfileID is the GPU-instance profile's ID; ProfileName its name.
	ProfileID   int    `json:"profileID"`
	ProfileName string `json:"profileName"`
	// Placement is where the instance sits.
	Placement MIGPlacement `json:"placement"`
	// AccessMinor is the minor of /dev/nvidia-caps/nvidia-cap<N> that gives
	// access to the GPU instance (/proc/driver/nvidia-caps/mig-minors,
	// "gpu<minor>/gi<ID>/access"); -1 when unknown.
	AccessMinor int `json:"accessMinor"`
	// ComputeInstances are the GPU instance's compute instances.
	ComputeInstances []MIGComputeInstance `json:"computeInstances,omitempty"`
}

// MIGComputeInstance is one compute instance: what a container is given.
type MIGComputeInstance struct {
	// ID is the compute instance ID within its GPU instance.
	ID int `json:"id"`
	// UUID is the MIG device's "MIG-…" UUID (CUDA_VISIBLE_DEVICES).
	UUID string `json:"uuid"`
	// MemoryBytes and Multiprocessors the MIG device has.
	MemoryBytes     uint64 `json:"memoryBytes"`
	Multiprocessors int    `json:"multiprocessors"`
	// AccessMinor is the minor of the capability node of the compute
	// instance ("gpu<minor>/gi<GI>/ci<ID>/access"); -1 when unknown.
	AccessMinor int `json:"accessMinor"`
	// Processes is the number of compute processes running on it; -1 when
	// unknown.
	Processes int `json:"processes"`
}

// MIGPendingChange reports whether the GPU's MIG mode will change at its
// next reset (an admin's change that has not taken effect).
func (g GPU) MIGPendingChange() bool { return g.MIG != nil && g.MIG.PendingEnabled != g.MIGEnabled }

// Profile is the profile with this ID.
func (m *MIG) Profile(id int) (MIGProfile, bool) {
	if m == nil {
		return MIGProfile{}, false
	}
	for _, p := range m.Profiles {
		if p.ID == id {
			return p, true
		}
	}
	return MIGProfile{}, false
}

// ComputeInstance is compute instance ci of GPU instance gi, with its GPU
// instance.
func (m *MIG) ComputeInstance(gi, ci int) (MIGInstance, MIGComputeInstance, bool) {
	if m == nil {
		return MIGInstance{}, MIGComputeInstance{}, false
	}
	for _, in := range m.Instances {
		if in.ID != gi {
			continue
		}
		for _, c := range in.ComputeInstances {
			if c.ID == ci {
				return in, c, true
			}
		}
	}
	return MIGInstance{}, MIGComputeInstance{}, false
}

// noInstanceID is the GPU or compute instance ID NVML event data carries
// when the event is not attributable to one (nvml.h, nvmlEventData_t).
const noInstanceID = ^uint32(0)

// EventMIGInstance says which MIG device an NVML event concerns, from the
// GPU and compute instance IDs the driver puts in the event data of an XID
// on a GPU in MIG mode: ok false when the event concerns the whole GPU
// (both IDs 0xFFFFFFFF), ci -1 when it concerns GPU instance gi and all its
// compute instances. A consumer marks only that GPU instance's devices (or
// that one compute instance's) unhealthy; see MIG.ComputeInstance.
func EventMIGInstance(gpuInstanceID, computeInstanceID uint32) (gi, ci int, ok bool) {
	if gpuInstanceID == noInstanceID {
		return 0, 0, false
	}
	if computeInstanceID == noInstanceID {
		return int(gpuInstanceID), -1, true
	}
	return int(gpuInstanceID), int(computeInstanceID), true
}
