package gpu

import (
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// MIG on MockNode: the GPU-instance and compute-instance calls of NVML over
// the profile tables of mock_mig_tables.go, with the rules the driver
// enforces:
//
//   - A GPU instance is created only in MIG mode (else NOT_SUPPORTED), with
//     a profile the GPU has (else NOT_SUPPORTED) and, with a placement, only
//     at one of the profile's possible placements (else INVALID_ARGUMENT,
//     nvml.h: "placement ... invalid").
//   - It may not overlap the memory slices of an existing instance, exceed
//     the profile's instance count, or take more compute slices, decoders,
//     encoders, JPEG decoders, OFAs or copy engines than the full-GPU
//     profile has (so a second +me profile, which needs the GPU's only OFA,
//     is refused): INSUFFICIENT_RESOURCES, as nvmlDeviceCreateGpuInstance
//     documents and nvidia-smi shows ("Insufficient Resources") in the MIG
//     user guide.
//   - Without a placement (nvmlDeviceCreateGpuInstance) the mock picks the
//     free placement that leaves the most other placements creatable,
//     lowest start first. NVIDIA does not document the driver's choice; this
//     rule reproduces every create the MIG user guide and the public
//     transcripts quoted in mock_mig_tables.go show (seven 1g on an empty
//     GPU land at 6, 4, 5, 0, 1, 2, 3; a first 3g at 4) but one (an H100 NVL
//     transcript whose first 3g landed at 0): assumed.
//   - GPU instance IDs follow the placement, not the order of creation: 0
//     for the 8-slice placement, 1-2 for the 4-slice ones, 3-6 for 2-slice
//     ones, 7-14 for single slices, each range in ascending start order. So
//     an ID freed by a destroy is the one a new instance at that placement
//     gets. The guide's examples (a first 1g at slice 6 gets ID 13; 2:2 gets
//     4, 4:2 gets 5) and H100 transcripts (1g at slices 0-6 are IDs 7-13)
//     show this numbering; other transcripts show the two 4-slice IDs, and
//     the halves of the single-slice IDs, swapped on some GPUs, so callers
//     must match instances by placement, never by a formula.
//   - A GPU instance with compute instances, or a compute instance with
//     processes, is not destroyed: IN_USE (nvml.h, nvmlGpuInstanceDestroy
//     and nvmlComputeInstanceDestroy).
//   - Compute instance IDs are the lowest free (0, 1, ...), as nvidia-smi
//     mig -cci shows. Compute-instance profiles: the GPU instance's own size
//     and the smaller ones go-nvml's dgxa100 mock lists; a compute instance
//     smaller than its GPU instance gets that share of its SMs (assumed).
//   - Each compute instance is a MIG device (nvmlDeviceGetMigDeviceHandleByIndex,
//     in GPU-instance then compute-instance ID order) with the profile's
//     memory, the compute instance's SMs and a "MIG-…" UUID of its own: a
//     hash of the GPU's UUID and a serial number the GPU counts up for every
//     compute instance created (kept in the state file), so an instance
//     destroyed and re-created at the same place, with the same IDs, gets a
//     fresh UUID, as a real driver gives one per creation. Compute instances
//     of a state file written before serials get the UUID of that older
//     mock: a hash of the GPU's UUID and the two IDs.
//
// With MockOptions.MIGStateFile the modes and instances are kept in a JSON
// file, written atomically on every change and read by the next MockNode,
// so that instances outlive the process as they outlive a kubelet plugin.

// MockOptions tune NewMockNodeWith. The zero value is NewMockNode.
type MockOptions struct {
	// MIGStateFile, when set, keeps the node's MIG modes, GPU and compute
	// instances and MIG-device processes in this JSON file: a node whose
	// file exists starts from it instead of its profile's initial state,
	// and every change is written to it atomically (a temporary file in the
	// same directory, renamed over it).
	MIGStateFile string
}

// mockMIGGPU is the MIG state of one mock GPU.
type mockMIGGPU struct {
	table     *mockMIGTable // nil: the product has no MIG
	current   bool
	pending   bool
	instances []*mockGI // ascending ID
	// serial is the serial number of the latest compute instance created
	// on the GPU (0: none yet); each new one gets the next.
	serial uint64
}

// nextSerial is the serial number of a compute instance created now. Call
// it with the lock held.
func (s *mockMIGGPU) nextSerial() uint64 {
	s.serial++
	return s.serial
}

// mockGI is one GPU instance.
type mockGI struct {
	id      int
	profile *mockMIGProfile
	start   uint32
	cis     []*mockCI // ascending ID
	handle  *mock.GpuInstance
	gone    bool
}

func (g *mockGI) placement() MIGPlacement {
	return MIGPlacement{Start: int(g.start), Size: int(g.profile.size)}
}

// mockCI is one compute instance and its MIG device.
type mockCI struct {
	id     int
	gi     *mockGI
	slices uint32 // compute slices
	start  uint32
	// serial numbers the compute instance among all its GPU has had
	// (mockMIGUUID); 0 for one read from a state file without serials.
	serial uint64
	procs  []nvml.ProcessInfo
	handle *mock.ComputeInstance
	device *mock.Device
	gone   bool
}

// mockCIProfileIndex maps a compute instance's slice count to its
// NVML_COMPUTE_INSTANCE_PROFILE_* (which is also its profile ID, as
// nvidia-smi mig -lcip lists them).
var mockCIProfileIndex = map[uint32]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

// mockCISlices are the compute-instance sizes a GPU instance of g compute
// slices offers (go-nvml's dgxa100 mock).
func mockCISlices(g uint32) []uint32 {
	switch g {
	case 1:
		return []uint32{1}
	case 2:
		return []uint32{1, 2}
	case 3:
		return []uint32{1, 2, 3}
	case 4:
		return []uint32{1, 2, 4}
	case 7:
		return []uint32{1, 2, 3, 4, 7}
	}
	return []uint32{g}
}

func mockCISlicesOfIndex(gi *mockGI, index int) (uint32, bool) {
	for _, c := range mockCISlices(gi.profile.slices) {
		if mockCIProfileIndex[c] == index {
			return c, true
		}
	}
	return 0, false
}

// sms is the SM count of a compute instance of c slices in gi.
func (gi *mockGI) sms(c uint32) uint32 {
	if c >= gi.profile.slices {
		return gi.profile.sms
	}
	return gi.profile.sms * c / gi.profile.slices
}

func (gi *mockGI) ciProfileInfo(c uint32) nvml.ComputeInstanceProfileInfo {
	p := gi.profile
	return nvml.ComputeInstanceProfileInfo{
		Id: uint32(mockCIProfileIndex[c]), SliceCount: c, InstanceCount: p.slices / c, MultiprocessorCount: gi.sms(c),
		SharedCopyEngineCount: p.ce, SharedDecoderCount: p.dec, SharedEncoderCount: p.enc, SharedJpegCount: p.jpeg, SharedOfaCount: p.ofa,
	}
}

// installMIG gives every device the MIG calls. Call it after installEvents
// (which makes the state) and before installConditions and
// installDiscoveryFailures (which wrap some of them).
func (n *MockNode) installMIG(p mockProfile) {
	n.state.mig = map[int]*mockMIGGPU{}
	for i, d := range n.Devices {
		s := &mockMIGGPU{table: p.migTable()}
		n.state.mig[i] = s
		d.GetMigModeFunc = func() (int, int, nvml.Return) {
			n.state.mu.Lock()
			defer n.state.mu.Unlock()
			if s.table == nil {
				return 0, 0, nvml.ERROR_NOT_SUPPORTED
			}
			return migModeValue(s.current), migModeValue(s.pending), nvml.SUCCESS
		}
		d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
		d.GetGpuInstanceProfileInfoFunc = func(index int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
			switch {
			case n.isLost(i):
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_GPU_IS_LOST
			case s.table == nil:
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
			case index < 0 || index >= nvml.GPU_INSTANCE_PROFILE_COUNT:
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			prof, ok := s.table.byIndex(index)
			if !ok {
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return prof.info(), nvml.SUCCESS
		}
		d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
			prof, ret := n.migProfile(i, s, info, false)
			if ret != nvml.SUCCESS {
				return nil, ret
			}
			return prof.placements(), nvml.SUCCESS
		}
		d.GetGpuInstanceRemainingCapacityFunc = func(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
			prof, ret := n.migProfile(i, s, info, true)
			if ret != nvml.SUCCESS {
				return 0, ret
			}
			n.state.mu.Lock()
			defer n.state.mu.Unlock()
			free := 0
			for _, start := range prof.starts {
				if s.fits(prof, start) {
					free++
				}
			}
			return min(free, int(prof.max)-s.count(prof)), nvml.SUCCESS
		}
		d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
			prof, ret := n.migProfile(i, s, info, true)
			if ret != nvml.SUCCESS {
				return nil, ret
			}
			n.state.mu.Lock()
			defer n.state.mu.Unlock()
			return handlesOf(s.instances, func(gi *mockGI) bool { return gi.profile == prof },
				func(gi *mockGI) nvml.GpuInstance { return n.giHandle(i, s, gi) }), nvml.SUCCESS
		}
		d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
			if ret := n.migReady(i, s); ret != nvml.SUCCESS {
				return nil, ret
			}
			n.state.mu.Lock()
			defer n.state.mu.Unlock()
			for _, gi := range s.instances {
				if gi.id == id {
					return n.giHandle(i, s, gi), nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		}
		d.CreateGpuInstanceFunc = func(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
			return n.createGI(i, s, info, nil)
		}
		d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
			if pl == nil {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return n.createGI(i, s, info, pl)
		}
		d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
			if s.table == nil {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return int(s.table.full().slices), nvml.SUCCESS
		}
		d.GetMigDeviceHandleByIndexFunc = func(index int) (nvml.Device, nvml.Return) {
			if ret := n.migReady(i, s); ret != nvml.SUCCESS {
				return nil, ret
			}
			if index < 0 || index >= int(s.table.full().slices) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			n.state.mu.Lock()
			defer n.state.mu.Unlock()
			cis := s.computeInstances()
			if index >= len(cis) {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return n.migDevice(i, cis[index]), nvml.SUCCESS
		}
	}
}

func migModeValue(enabled bool) int {
	if enabled {
		return nvml.DEVICE_MIG_ENABLE
	}
	return nvml.DEVICE_MIG_DISABLE
}

// migEnabled is GPU i's current MIG mode as its GetMigMode answers it (a
// test may have replaced that call). Call it without the state lock.
func (n *MockNode) migEnabled(i int) bool {
	current, _, ret := n.Devices[i].GetMigMode()
	return ret == nvml.SUCCESS && current == nvml.DEVICE_MIG_ENABLE
}

// migReady answers the calls that need MIG mode: GPU_IS_LOST, NOT_SUPPORTED
// (no MIG, or not in MIG mode), or SUCCESS.
func (n *MockNode) migReady(i int, s *mockMIGGPU) nvml.Return {
	switch {
	case n.isLost(i):
		return nvml.ERROR_GPU_IS_LOST
	case s.table == nil || !n.migEnabled(i):
		return nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.SUCCESS
}

// migProfile is the profile of info.Id, if MIG calls may be made (in MIG
// mode when needMode).
func (n *MockNode) migProfile(i int, s *mockMIGGPU, info *nvml.GpuInstanceProfileInfo, needMode bool) (*mockMIGProfile, nvml.Return) {
	switch {
	case n.isLost(i):
		return nil, nvml.ERROR_GPU_IS_LOST
	case s.table == nil:
		return nil, nvml.ERROR_NOT_SUPPORTED
	case info == nil:
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if needMode {
		if ret := n.migReady(i, s); ret != nvml.SUCCESS {
			return nil, ret
		}
	}
	prof, ok := s.table.byID(info.Id)
	if !ok {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	return prof, nvml.SUCCESS
}

// count is how many instances of prof exist.
func (s *mockMIGGPU) count(prof *mockMIGProfile) int {
	n := 0
	for _, gi := range s.instances {
		if gi.profile == prof {
			n++
		}
	}
	return n
}

// overlaps reports whether an instance of prof at start would share a
// memory slice with an existing one.
func (s *mockMIGGPU) overlaps(prof *mockMIGProfile, start uint32) bool {
	p := MIGPlacement{Start: int(start), Size: int(prof.size)}
	return slices.ContainsFunc(s.instances, func(gi *mockGI) bool { return gi.placement().Overlaps(p) })
}

// fits reports whether an instance of prof can be created at start: no
// overlap, and the instance count, compute slices and engines of the GPU
// not exceeded.
func (s *mockMIGGPU) fits(prof *mockMIGProfile, start uint32) bool {
	if s.overlaps(prof, start) || s.count(prof) >= int(prof.max) {
		return false
	}
	full := s.table.full()
	sum := *prof
	for _, gi := range s.instances {
		p := gi.profile
		sum.slices += p.slices
		sum.ce += p.ce
		sum.dec += p.dec
		sum.enc += p.enc
		sum.jpeg += p.jpeg
		sum.ofa += p.ofa
	}
	return sum.slices <= full.slices && sum.ce <= full.ce && sum.dec <= full.dec && sum.enc <= full.enc &&
		sum.jpeg <= full.jpeg && sum.ofa <= full.ofa
}

// pickStart is the placement nvmlDeviceCreateGpuInstance takes for prof:
// the fitting start that leaves the most placements of all profiles free,
// lowest start on a tie; false when none fits.
func (s *mockMIGGPU) pickStart(prof *mockMIGProfile) (uint32, bool) {
	best, bestBlocked, found := uint32(0), 0, false
	for _, start := range prof.starts {
		if !s.fits(prof, start) {
			continue
		}
		cand := MIGPlacement{Start: int(start), Size: int(prof.size)}
		blocked := 0
		for _, other := range s.table.profiles {
			for _, st := range other.starts {
				if !s.overlaps(&other, st) && cand.Overlaps(MIGPlacement{Start: int(st), Size: int(other.size)}) {
					blocked++
				}
			}
		}
		if !found || blocked < bestBlocked {
			best, bestBlocked, found = start, blocked, true
		}
	}
	return best, found
}

// giID is the ID of a new instance of prof at start (see the numbering
// above); the lowest free ID where the placement is not a power-of-two block.
func (s *mockMIGGPU) giID(prof *mockMIGProfile, start uint32) int {
	n, size := s.table.memorySlices, prof.size
	pow2 := func(v uint32) bool { return v > 0 && v&(v-1) == 0 }
	used := func(id int) bool {
		return slices.ContainsFunc(s.instances, func(gi *mockGI) bool { return gi.id == id })
	}
	if pow2(n) && pow2(size) && size <= n && start%size == 0 {
		if id := int(n/size-1) + int(start/size); !used(id) {
			return id
		}
	}
	id := 0
	for used(id) {
		id++
	}
	return id
}

// computeInstances are the GPU's compute instances in MIG device order.
func (s *mockMIGGPU) computeInstances() []*mockCI {
	var out []*mockCI
	for _, gi := range s.instances {
		out = append(out, gi.cis...)
	}
	return out
}

func (n *MockNode) createGI(i int, s *mockMIGGPU, info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	prof, ret := n.migProfile(i, s, info, true)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	gi, ret := s.create(prof, pl)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	if ret := n.commit(func() { s.remove(gi) }); ret != nvml.SUCCESS {
		return nil, ret
	}
	return n.giHandle(i, s, gi), nvml.SUCCESS
}

// create adds an instance of prof at pl (nil: the driver's choice).
func (s *mockMIGGPU) create(prof *mockMIGProfile, pl *nvml.GpuInstancePlacement) (*mockGI, nvml.Return) {
	var start uint32
	if pl != nil {
		if pl.Size != prof.size || !slices.Contains(prof.starts, pl.Start) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if !s.fits(prof, pl.Start) {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		start = pl.Start
	} else {
		var ok bool
		if start, ok = s.pickStart(prof); !ok {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}
	gi := &mockGI{id: s.giID(prof, start), profile: prof, start: start}
	s.instances = insertByID(s.instances, gi)
	return gi, nvml.SUCCESS
}

func (s *mockMIGGPU) remove(gi *mockGI) {
	s.instances = without(s.instances, gi)
}

// insert puts a removed instance back (undoing a destroy).
func (s *mockMIGGPU) insert(gi *mockGI) {
	s.instances = insertByID(s.instances, gi)
}

func (gi *mockGI) ident() int { return gi.id }
func (ci *mockCI) ident() int { return ci.id }

// insertByID adds x to list, kept in ascending ID order (GPU instances of a
// GPU, compute instances of a GPU instance).
func insertByID[T interface{ ident() int }](list []T, x T) []T {
	list = append(list, x)
	slices.SortFunc(list, func(a, b T) int { return cmp.Compare(a.ident(), b.ident()) })
	return list
}

// handlesOf is the handles of the instances of list that match, in list's
// order; nil if none does.
func handlesOf[E, H any](list []E, match func(E) bool, handle func(E) H) []H {
	var out []H
	for _, e := range list {
		if match(e) {
			out = append(out, handle(e))
		}
	}
	return out
}

// without is list less x.
func without[T comparable](list []T, x T) []T {
	return slices.DeleteFunc(list, func(y T) bool { return y == x })
}

// giHandle is gi's nvml.GpuInstance, made once. Call it with the lock held.
func (n *MockNode) giHandle(i int, s *mockMIGGPU, gi *mockGI) *mock.GpuInstance {
	if gi.handle != nil {
		return gi.handle
	}
	h := &mock.GpuInstance{}
	gi.handle = h
	// alive answers INVALID_ARGUMENT once the instance is destroyed (its
	// handle is then invalid, nvml.h). Call it with the lock held.
	alive := func() nvml.Return {
		if gi.gone {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.SUCCESS
	}
	h.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
		n.state.mu.Lock()
		defer n.state.mu.Unlock()
		if ret := alive(); ret != nvml.SUCCESS {
			return nvml.GpuInstanceInfo{}, ret
		}
		return nvml.GpuInstanceInfo{Device: n.Devices[i], Id: uint32(gi.id), ProfileId: gi.profile.id,
			Placement: nvml.GpuInstancePlacement{Start: gi.start, Size: gi.profile.size}}, nvml.SUCCESS
	}
	h.DestroyFunc = func() nvml.Return {
		n.state.mu.Lock()
		defer n.state.mu.Unlock()
		if ret := alive(); ret != nvml.SUCCESS {
			return ret
		}
		if len(gi.cis) > 0 {
			return nvml.ERROR_IN_USE
		}
		s.remove(gi)
		if ret := n.commit(func() { s.insert(gi) }); ret != nvml.SUCCESS {
			return ret
		}
		gi.gone = true
		return nvml.SUCCESS
	}
	h.GetComputeInstanceProfileInfoFunc = func(index, engine int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		n.state.mu.Lock()
		defer n.state.mu.Unlock()
		if ret := alive(); ret != nvml.SUCCESS {
			return nvml.ComputeInstanceProfileInfo{}, ret
		}
		if index < 0 || index >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT || engine != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		c, ok := mockCISlicesOfIndex(gi, index)
		if !ok {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return gi.ciProfileInfo(c), nvml.SUCCESS
	}
	ciSlices := func(info *nvml.ComputeInstanceProfileInfo) (uint32, nvml.Return) {
		if ret := alive(); ret != nvml.SUCCESS {
			return 0, ret
		}
		if info == nil {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		c, ok := mockCISlicesOfIndex(gi, int(info.Id))
		if !ok {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return c, nvml.SUCCESS
	}
	h.GetComputeInstancesFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
		n.state.mu.Lock()
		defer n.state.mu.Unlock()
		c, ret := ciSlices(info)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return handlesOf(gi.cis, func(ci *mockCI) bool { return ci.slices == c },
			func(ci *mockCI) nvml.ComputeInstance { return n.ciHandle(i, s, ci) }), nvml.SUCCESS
	}
	h.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		n.state.mu.Lock()
		defer n.state.mu.Unlock()
		if ret := alive(); ret != nvml.SUCCESS {
			return nil, ret
		}
		for _, ci := range gi.cis {
			if ci.id == id {
				return n.ciHandle(i, s, ci), nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	h.GetComputeInstanceRemainingCapacityFunc = func(info *nvml.ComputeInstanceProfileInfo) (int, nvml.Return) {
		n.state.mu.Lock()
		defer n.state.mu.Unlock()
		c, ret := ciSlices(info)
		if ret != nvml.SUCCESS {
			return 0, ret
		}
		free := 0
		for start := uint32(0); start+c <= gi.profile.slices; start += c {
			if gi.ciFree(start, c) {
				free++
			}
		}
		return free, nvml.SUCCESS
	}
	h.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		n.state.mu.Lock()
		defer n.state.mu.Unlock()
		c, ret := ciSlices(info)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		ci, ret := gi.createCI(c)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		ci.serial = s.nextSerial()
		if ret := n.commit(func() { gi.removeCI(ci) }); ret != nvml.SUCCESS {
			return nil, ret
		}
		return n.ciHandle(i, s, ci), nvml.SUCCESS
	}
	return h
}

// ciFree reports whether compute slices start..start+c-1 of gi are free.
func (gi *mockGI) ciFree(start, c uint32) bool {
	for _, ci := range gi.cis {
		if start < ci.start+ci.slices && ci.start < start+c {
			return false
		}
	}
	return true
}

// createCI adds a compute instance of c slices at the first free aligned
// start, with the lowest free ID.
func (gi *mockGI) createCI(c uint32) (*mockCI, nvml.Return) {
	for start := uint32(0); start+c <= gi.profile.slices; start += c {
		if !gi.ciFree(start, c) {
			continue
		}
		id := 0
		for slices.ContainsFunc(gi.cis, func(ci *mockCI) bool { return ci.id == id }) {
			id++
		}
		ci := &mockCI{id: id, gi: gi, slices: c, start: start}
		gi.cis = insertByID(gi.cis, ci)
		return ci, nvml.SUCCESS
	}
	return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
}

func (gi *mockGI) removeCI(ci *mockCI) {
	gi.cis = without(gi.cis, ci)
}

func (gi *mockGI) insertCI(ci *mockCI) {
	gi.cis = insertByID(gi.cis, ci)
}

// ciHandle is ci's nvml.ComputeInstance, made once. Call it with the lock
// held.
func (n *MockNode) ciHandle(i int, s *mockMIGGPU, ci *mockCI) *mock.ComputeInstance {
	if ci.handle != nil {
		return ci.handle
	}
	h := &mock.ComputeInstance{}
	ci.handle = h
	h.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) {
		n.state.mu.Lock()
		defer n.state.mu.Unlock()
		if ci.gone {
			return nvml.ComputeInstanceInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.ComputeInstanceInfo{Device: n.Devices[i], GpuInstance: n.giHandle(i, s, ci.gi), Id: uint32(ci.id),
			ProfileId: uint32(mockCIProfileIndex[ci.slices]), Placement: nvml.ComputeInstancePlacement{Start: ci.start, Size: ci.slices}}, nvml.SUCCESS
	}
	h.DestroyFunc = func() nvml.Return {
		n.state.mu.Lock()
		defer n.state.mu.Unlock()
		if ci.gone {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if len(ci.procs) > 0 {
			return nvml.ERROR_IN_USE
		}
		ci.gi.removeCI(ci)
		if ret := n.commit(func() { ci.gi.insertCI(ci) }); ret != nvml.SUCCESS {
			return ret
		}
		ci.gone = true
		return nvml.SUCCESS
	}
	return h
}

// mockMIGUUID is the UUID of the MIG device of ci on the GPU with this
// UUID: from its serial number, unique among all compute instances the GPU
// has had, or (serial 0, a state file without serials) from its IDs.
func mockMIGUUID(parent string, ci *mockCI) string {
	var sum [sha256.Size]byte
	if ci.serial > 0 {
		sum = sha256.Sum256(fmt.Appendf(nil, "tessera-mock-mig/%s/serial/%d", parent, ci.serial))
	} else {
		sum = sha256.Sum256(fmt.Appendf(nil, "tessera-mock-mig/%s/%d/%d", parent, ci.gi.id, ci.id))
	}
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x50
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("MIG-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// migDevice is ci's MIG device handle, made once. Call it with the lock
// held.
func (n *MockNode) migDevice(i int, ci *mockCI) *mock.Device {
	if ci.device != nil {
		return ci.device
	}
	parent := n.Devices[i]
	parentUUID := mockUUID(n.Profile, i)
	product := n.product
	d := &mock.Device{}
	ci.device = d
	// read runs f on the live compute instance, or answers
	// INVALID_ARGUMENT (a MIG device handle of a destroyed instance is
	// invalid, nvml.h) or GPU_IS_LOST.
	read := func(f func()) nvml.Return {
		if n.isLost(i) {
			return nvml.ERROR_GPU_IS_LOST
		}
		n.state.mu.Lock()
		defer n.state.mu.Unlock()
		if ci.gone || ci.gi.gone {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		f()
		return nvml.SUCCESS
	}
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS }
	d.GetMinorNumberFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d.GetUUIDFunc = func() (string, nvml.Return) {
		var uuid string
		ret := read(func() { uuid = mockMIGUUID(parentUUID, ci) })
		return uuid, ret
	}
	d.GetNameFunc = func() (string, nvml.Return) {
		var name string
		ret := read(func() {
			name = product + " MIG " + ci.gi.profile.name
			if ci.slices < ci.gi.profile.slices {
				name = fmt.Sprintf("%s MIG %dc.%s", product, ci.slices, ci.gi.profile.name)
			}
		})
		return name, ret
	}
	d.GetGpuInstanceIdFunc = func() (int, nvml.Return) {
		var id int
		ret := read(func() { id = ci.gi.id })
		return id, ret
	}
	d.GetComputeInstanceIdFunc = func() (int, nvml.Return) {
		var id int
		ret := read(func() { id = ci.id })
		return id, ret
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		var m nvml.Memory
		ret := read(func() {
			m.Total = ci.gi.profile.memMiB << 20
			for _, p := range ci.gi.allProcs() {
				m.Used += p.UsedGpuMemory
			}
			m.Used = min(m.Used, m.Total)
			m.Free = m.Total - m.Used
		})
		return m, ret
	}
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		m, ret := d.GetMemoryInfo()
		return nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: m.Total, Free: m.Free, Used: m.Used}, ret
	}
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		var a nvml.DeviceAttributes
		ret := read(func() {
			p := ci.gi.profile
			a = nvml.DeviceAttributes{MultiprocessorCount: ci.gi.sms(ci.slices), SharedCopyEngineCount: p.ce, SharedDecoderCount: p.dec,
				SharedEncoderCount: p.enc, SharedJpegCount: p.jpeg, SharedOfaCount: p.ofa, GpuInstanceSliceCount: p.slices,
				ComputeInstanceSliceCount: ci.slices, MemorySizeMB: p.memMiB}
		})
		return a, ret
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		var procs []nvml.ProcessInfo
		ret := read(func() { procs = slices.Clone(ci.procs) })
		return procs, ret
	}
	return d
}

// allProcs are the processes of all of gi's compute instances (they share
// its memory).
func (gi *mockGI) allProcs() []nvml.ProcessInfo {
	var out []nvml.ProcessInfo
	for _, ci := range gi.cis {
		out = append(out, ci.procs...)
	}
	return out
}

// commit writes the MIG state file after a change, and undoes the change
// if that fails (ERROR_UNKNOWN). Call it with the lock held.
func (n *MockNode) commit(undo func()) nvml.Return {
	if err := n.writeMIGState(); err != nil {
		undo()
		n.migWriteErr = err
		return nvml.ERROR_UNKNOWN
	}
	return nvml.SUCCESS
}

// MIGStateError is the error of the latest failed write of the MIG state
// file (an NVML call that changed MIG state answered ERROR_UNKNOWN and
// changed nothing); nil if none failed.
func (n *MockNode) MIGStateError() error {
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	return n.migWriteErr
}

// The MIG state file.
type mockMIGFile struct {
	Version int `json:"version"`
	// Profile is the mock node profile the state belongs to: another
	// profile's GPUs are other GPUs.
	Profile string                    `json:"profile"`
	GPUs    map[string]mockMIGFileGPU `json:"gpus"`
}

type mockMIGFileGPU struct {
	Current bool `json:"current"`
	Pending bool `json:"pending"`
	// Serial is the serial number of the latest compute instance created
	// on the GPU (files written before serials have none).
	Serial    uint64          `json:"serial,omitempty"`
	Instances []mockMIGFileGI `json:"instances,omitempty"`
}

type mockMIGFileGI struct {
	ID               int             `json:"id"`
	ProfileID        uint32          `json:"profileID"`
	Start            uint32          `json:"start"`
	ComputeInstances []mockMIGFileCI `json:"computeInstances,omitempty"`
}

type mockMIGFileCI struct {
	ID     int    `json:"id"`
	Slices uint32 `json:"slices"`
	Start  uint32 `json:"start"`
	// Serial gives the MIG device its UUID (mockMIGUUID); 0 in files
	// written before serials.
	Serial    uint64               `json:"serial,omitempty"`
	Processes []mockMIGFileProcess `json:"processes,omitempty"`
}

type mockMIGFileProcess struct {
	PID    uint32 `json:"pid"`
	Memory uint64 `json:"memory,omitempty"`
}

const mockMIGFileVersion = 1

// writeMIGState writes the state file, if there is one. Call it with the
// lock held.
func (n *MockNode) writeMIGState() error {
	if n.migFile == "" {
		return nil
	}
	f := mockMIGFile{Version: mockMIGFileVersion, Profile: n.Profile, GPUs: map[string]mockMIGFileGPU{}}
	for i, s := range n.state.mig {
		if s.table == nil {
			continue
		}
		g := mockMIGFileGPU{Current: s.current, Pending: s.pending, Serial: s.serial}
		for _, gi := range s.instances {
			fg := mockMIGFileGI{ID: gi.id, ProfileID: gi.profile.id, Start: gi.start}
			for _, ci := range gi.cis {
				fc := mockMIGFileCI{ID: ci.id, Slices: ci.slices, Start: ci.start, Serial: ci.serial}
				for _, p := range ci.procs {
					fc.Processes = append(fc.Processes, mockMIGFileProcess{PID: p.Pid, Memory: p.UsedGpuMemory})
				}
				fg.ComputeInstances = append(fg.ComputeInstances, fc)
			}
			g.Instances = append(g.Instances, fg)
		}
		f.GPUs[strconv.Itoa(i)] = g
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(n.migFile, append(b, '\n'))
}

// writeFileAtomic replaces path with data: a reader sees the old or the new
// content, never a part, even if the process is killed.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// loadMIGState replaces the node's MIG state with the file's, checking it
// against the profile tables; false when the file does not exist.
func (n *MockNode) loadMIGState() (bool, error) {
	b, err := os.ReadFile(n.migFile)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var f mockMIGFile
	if err := json.Unmarshal(b, &f); err != nil {
		return false, fmt.Errorf("%s: %w", n.migFile, err)
	}
	if f.Version != mockMIGFileVersion {
		return false, fmt.Errorf("%s: version %d, want %d", n.migFile, f.Version, mockMIGFileVersion)
	}
	if f.Profile != n.Profile {
		return false, fmt.Errorf("%s: the MIG state of mock profile %q, not of %s: give each profile a state file of its own", n.migFile, f.Profile, n.Profile)
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	for key, g := range f.GPUs {
		i, err := strconv.Atoi(key)
		s := n.state.mig[i]
		if err != nil || s == nil || s.table == nil {
			return false, fmt.Errorf("%s: GPU %q: no MIG GPU with that index on mock node %s", n.migFile, key, n.Profile)
		}
		s.current, s.pending, s.instances, s.serial = g.Current, g.Pending, nil, g.Serial
		for _, fg := range g.Instances {
			prof, ok := s.table.byID(fg.ProfileID)
			if !ok {
				return false, fmt.Errorf("%s: GPU %d: no profile %d", n.migFile, i, fg.ProfileID)
			}
			gi, ret := s.create(prof, &nvml.GpuInstancePlacement{Start: fg.Start, Size: prof.size})
			if ret != nvml.SUCCESS {
				return false, fmt.Errorf("%s: GPU %d: GPU instance %s at %d: %v", n.migFile, i, prof.name, fg.Start, ret)
			}
			if gi.id != fg.ID {
				return false, fmt.Errorf("%s: GPU %d: GPU instance %s at %d has ID %d, the mock gives it %d", n.migFile, i, prof.name, fg.Start, fg.ID, gi.id)
			}
			for _, fc := range fg.ComputeInstances {
				if _, ok := mockCIProfileIndex[fc.Slices]; !ok || !slices.Contains(mockCISlices(prof.slices), fc.Slices) ||
					fc.Start%fc.Slices != 0 || fc.Start+fc.Slices > prof.slices || !gi.ciFree(fc.Start, fc.Slices) ||
					slices.ContainsFunc(gi.cis, func(ci *mockCI) bool { return ci.id == fc.ID }) {
					return false, fmt.Errorf("%s: GPU %d: GPU instance %d: compute instance %d (%d slices at %d) is not valid", n.migFile, i, gi.id, fc.ID, fc.Slices, fc.Start)
				}
				if fc.Serial > 0 && slices.ContainsFunc(s.computeInstances(), func(ci *mockCI) bool { return ci.serial == fc.Serial }) {
					return false, fmt.Errorf("%s: GPU %d: GPU instance %d: compute instance %d: serial %d is another compute instance's", n.migFile, i, gi.id, fc.ID, fc.Serial)
				}
				ci := &mockCI{id: fc.ID, gi: gi, slices: fc.Slices, start: fc.Start, serial: fc.Serial}
				s.serial = max(s.serial, fc.Serial)
				for _, p := range fc.Processes {
					ci.procs = append(ci.procs, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.Memory, GpuInstanceId: uint32(gi.id), ComputeInstanceId: uint32(fc.ID)})
				}
				gi.insertCI(ci)
			}
		}
	}
	return true, nil
}

// mockStaticInstance is a GPU instance (with one compute instance of its
// size) a node profile starts with.
type mockStaticInstance struct {
	profile string
	start   uint32
}

// initMIG puts the node in its profile's initial MIG state, then takes the
// state file's if there is one (writing the initial state when there is
// not).
func (n *MockNode) initMIG(p mockProfile, opts MockOptions) error {
	n.state.mu.Lock()
	for _, i := range p.migOn {
		s := n.state.mig[i]
		s.current, s.pending = true, true
		for _, st := range p.migInstances[i] {
			prof, ok := s.table.byName(st.profile)
			if !ok {
				n.state.mu.Unlock()
				return fmt.Errorf("mock profile %s: GPU %d: no MIG profile %q", n.Profile, i, st.profile)
			}
			gi, ret := s.create(prof, &nvml.GpuInstancePlacement{Start: st.start, Size: prof.size})
			if ret != nvml.SUCCESS {
				n.state.mu.Unlock()
				return fmt.Errorf("mock profile %s: GPU %d: %s at %d: %v", n.Profile, i, st.profile, st.start, ret)
			}
			ci, ret := gi.createCI(prof.slices)
			if ret != nvml.SUCCESS {
				n.state.mu.Unlock()
				return fmt.Errorf("mock profile %s: GPU %d: compute instance of %s: %v", n.Profile, i, st.profile, ret)
			}
			ci.serial = s.nextSerial()
		}
	}
	n.state.mu.Unlock()
	n.migFile = opts.MIGStateFile
	if n.migFile == "" {
		return nil
	}
	loaded, err := n.loadMIGState()
	if err != nil || loaded {
		return err
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	return n.writeMIGState()
}

// mockMIGMinors is the driver's mig-minors content, made once.
var mockMIGMinors = sync.OnceValue(driverMIGMinors)

// MIGMinors is the content of the node's /proc/driver/nvidia-caps/mig-minors:
// the driver's fixed numbering (see ParseMIGMinors), which lists every
// possible capability of GPU minors 0-31, so it holds the minors of every
// instance the node has or will have. Discovery reads it from here on a mock
// node.
func (n *MockNode) MIGMinors() []byte { return mockMIGMinors() }
