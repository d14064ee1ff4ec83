// Package mig creates, finds and destroys the MIG instances of a node's GPUs
// through NVML, for the kubelet plugin's dynamic MIG (docs/mig.md).
//
// What callers may assume:
//
//   - An instance is found by its GPU and placement (and profile), never by
//     its IDs alone: the driver reuses GPU-instance IDs, and an ID read
//     before a restart may name another instance after it.
//   - Create never takes over an instance it did not make: an instance
//     that overlaps the placement is an error wrapping ErrOccupied, naming
//     it, unless it is exactly the instance the caller made before (the
//     profile at the placement, with a compute instance of the MIG UUID the
//     caller recorded, and no process on any of its compute instances),
//     which is returned as it is (Existed). A GPU instance without compute
//     instances is nobody's proven: it is refused too. Nothing is destroyed
//     to make room.
//   - Destroy removes the compute instances, then the GPU instance, and
//     refuses while a process runs on one of them. A placement without an
//     instance is already destroyed. Given the MIG UUID the caller recorded,
//     it destroys only the instance that has it (ErrChanged otherwise: the
//     driver reuses IDs and placements, never UUIDs).
//   - Every call reads the GPU's MIG state from NVML first; nothing is
//     cached but the capability minors, which the driver fixes at load.
//
// NVML calls (nvml.h): nvmlDeviceGetHandleByUUID,
// nvmlDeviceGetGpuInstanceProfileInfo,
// nvmlDeviceCreateGpuInstanceWithPlacement, nvmlDeviceGetGpuInstanceById,
// nvmlGpuInstanceGetComputeInstanceProfileInfo,
// nvmlGpuInstanceCreateComputeInstance,
// nvmlGpuInstanceGetComputeInstanceById, nvmlComputeInstanceDestroy,
// nvmlGpuInstanceDestroy, and gpu.ReadMIG's reads. Creating and destroying
// instances needs CAP_SYS_ADMIN or the mig-config capability (NVIDIA MIG
// user guide, "Device Nodes and Capabilities").
package mig

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// Instance is one MIG device: a GPU instance at a placement and the
// compute instance that takes all of it.
type Instance struct {
	// GPU and Minor are the parent GPU's UUID and device minor.
	GPU   string
	Minor int
	// ProfileID and Profile are the GPU-instance profile ("3g.40gb").
	ProfileID int
	Profile   string
	// Placement is where the GPU instance sits.
	Placement gpu.MIGPlacement
	// GPUInstance and ComputeInstance are the instances' IDs now.
	GPUInstance     int
	ComputeInstance int
	// UUID is the MIG device's "MIG-…" UUID.
	UUID string
	// MemoryBytes is the MIG device's memory.
	MemoryBytes uint64
	// GPUInstanceMinor and ComputeInstanceMinor are the minors of their
	// /dev/nvidia-caps/nvidia-cap<N> nodes; -1 when unknown.
	GPUInstanceMinor     int
	ComputeInstanceMinor int
}

// NVML manages MIG instances over an initialised nvml.Interface: the
// driver's library, or a gpu.MockNode. The zero value with Lib set is ready;
// it is safe for concurrent use.
type NVML struct {
	Lib nvml.Interface
	// MIGMinorsPath is the driver's mig-minors file; empty means
	// gpu.MIGMinorsPath. A Lib with a MIGMinors() []byte method (a mock
	// node) gives the content itself.
	MIGMinorsPath string

	once      sync.Once
	minors    gpu.MIGMinors
	minorsErr error
}

// minorsSource is an NVML that knows its node's mig-minors content (a mock
// node).
type minorsSource interface{ MIGMinors() []byte }

// Minors are the node's capability minors, read once; the error says why
// some or all are unknown.
func (n *NVML) Minors() (gpu.MIGMinors, error) {
	n.once.Do(func() {
		if src, ok := n.Lib.(minorsSource); ok {
			n.minors, n.minorsErr = gpu.ParseMIGMinors(bytes.NewReader(src.MIGMinors()))
			return
		}
		n.minors, n.minorsErr = gpu.ReadMIGMinors(n.MIGMinorsPath)
	})
	return n.minors, n.minorsErr
}

// Read returns the GPU's MIG state now (gpu.ReadMIG).
func (n *NVML) Read(uuid string) (gpu.GPU, error) {
	if n.Lib == nil {
		return gpu.GPU{}, errors.New("mig: no NVML")
	}
	minors, _ := n.Minors()
	return gpu.ReadMIG(n.Lib, uuid, minors)
}

// Created is what Create did.
type Created struct {
	Instance
	// Existed is true when the instance was there already: the one the
	// caller made before, recognised by its MIG UUID (a retry).
	Existed bool
	// Driver is the time spent in the driver's create calls
	// (nvmlDeviceCreateGpuInstanceWithPlacement and
	// nvmlGpuInstanceCreateComputeInstance); zero when nothing was made.
	Driver time.Duration
}

// ErrOccupied is wrapped by Create's error when an instance the caller did
// not make (as far as its recorded MIG UUID tells) covers some of the
// placement's memory slices: an admin's, another claim's, one left behind.
var ErrOccupied = errors.New("MIG placement occupied")

// ErrChanged is wrapped by Destroy's error when the instance at the
// placement is not the MIG device the caller recorded: it was destroyed and
// another made there since (by an admin, or another claim). Nothing is
// destroyed.
var ErrChanged = errors.New("MIG instance is not the recorded one")

// Describe names GPU instance in of GPU g for messages: its ID, profile,
// memory slices, compute instances with their MIG UUIDs and processes.
func Describe(g gpu.GPU, in gpu.MIGInstance) string {
	s := fmt.Sprintf("GPU %s (index %d): GPU instance %d (%s at memory slices %d-%d", g.UUID, g.Index, in.ID, in.ProfileName, in.Placement.Start, in.Placement.Start+in.Placement.Size-1)
	if len(in.ComputeInstances) == 0 {
		return s + ", no compute instance)"
	}
	for _, ci := range in.ComputeInstances {
		s += fmt.Sprintf("; compute instance %d %s", ci.ID, ci.UUID)
		switch {
		case ci.Processes > 0:
			s += fmt.Sprintf(" with %d processes", ci.Processes)
		case ci.Processes < 0:
			s += " with processes unknown"
		}
	}
	return s + ")"
}

// Occupant is the first instance of g (as Read returned it) that covers a
// memory slice of pl; ok is false when pl is free.
func Occupant(g gpu.GPU, pl gpu.MIGPlacement) (in gpu.MIGInstance, ok bool) {
	if !g.MIGEnabled || g.MIG == nil {
		return gpu.MIGInstance{}, false
	}
	for _, in := range g.MIG.Instances {
		if in.Placement.Overlaps(pl) {
			return in, true
		}
	}
	return gpu.MIGInstance{}, false
}

// busy reports whether a process runs on a compute instance of in, or
// cannot be ruled out (processes unknown).
func busy(in gpu.MIGInstance) bool {
	return slices.ContainsFunc(in.ComputeInstances, func(ci gpu.MIGComputeInstance) bool { return ci.Processes != 0 })
}

// computeInstance is the compute instance of in with this MIG UUID.
func computeInstance(in gpu.MIGInstance, migUUID string) (gpu.MIGComputeInstance, bool) {
	if migUUID == "" {
		return gpu.MIGComputeInstance{}, false
	}
	i := slices.IndexFunc(in.ComputeInstances, func(ci gpu.MIGComputeInstance) bool { return ci.UUID == migUUID })
	if i < 0 {
		return gpu.MIGComputeInstance{}, false
	}
	return in.ComputeInstances[i], true
}

// Create makes a GPU instance of the profile at exactly the placement on
// the GPU, and a compute instance that takes all of it, and returns the
// MIG device. own is the MIG UUID the caller recorded for this placement
// before ("" if none): an instance with it is the caller's own, returned as
// it is; any other instance over the placement is refused (ErrOccupied).
// On an error after the GPU instance was made it destroys what it made.
func (n *NVML) Create(uuid string, profileID int, pl gpu.MIGPlacement, own string) (Created, error) {
	g, err := n.Read(uuid)
	if err != nil {
		return Created{}, err
	}
	if !g.MIGEnabled || g.MIG == nil {
		return Created{}, fmt.Errorf("GPU %s is not in MIG mode", uuid)
	}
	prof, ok := g.MIG.Profile(profileID)
	if !ok {
		return Created{}, fmt.Errorf("GPU %s has no MIG profile with ID %d", uuid, profileID)
	}
	if pl.Size != prof.MemorySlices || !containsPlacement(prof.Placements, pl) {
		return Created{}, fmt.Errorf("GPU %s: %s cannot be placed at memory slices %d-%d (its placements: %v)", uuid, prof.Name, pl.Start, pl.Start+pl.Size-1, prof.Placements)
	}
	for _, in := range g.MIG.Instances {
		if !in.Placement.Overlaps(pl) {
			continue
		}
		ci, mine := computeInstance(in, own)
		switch {
		case !mine || in.Placement != pl || in.ProfileID != profileID:
			return Created{}, fmt.Errorf("%s at memory slices %d-%d: taken by %s, which this claim did not make: %w", prof.Name, pl.Start, pl.Start+pl.Size-1, Describe(g, in), ErrOccupied)
		case busy(in):
			return Created{}, fmt.Errorf("%s at memory slices %d-%d: %s was made for this claim but processes run on it before it was handed out: %w", prof.Name, pl.Start, pl.Start+pl.Size-1, Describe(g, in), ErrInUse)
		}
		return n.found(g, in, ci, Created{Existed: true})
	}
	dev, ret := n.Lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return Created{}, nvmlError(uuid, "nvmlDeviceGetHandleByUUID", ret)
	}
	var out Created
	info, ret := dev.GetGpuInstanceProfileInfo(prof.Index)
	if ret != nvml.SUCCESS {
		return Created{}, nvmlError(uuid, fmt.Sprintf("nvmlDeviceGetGpuInstanceProfileInfo(%d)", prof.Index), ret)
	}
	start := time.Now()
	gih, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
	out.Driver += time.Since(start)
	if ret != nvml.SUCCESS {
		return Created{}, nvmlError(uuid, fmt.Sprintf("nvmlDeviceCreateGpuInstanceWithPlacement(%s at %d)", prof.Name, pl.Start), ret)
	}
	var cih nvml.ComputeInstance
	undo := func(err error) (Created, error) {
		if cih != nil {
			if ret := cih.Destroy(); ret != nvml.SUCCESS {
				return Created{}, errors.Join(err, nvmlError(uuid, "nvmlComputeInstanceDestroy (undoing the create)", ret))
			}
		}
		if ret := gih.Destroy(); ret != nvml.SUCCESS {
			err = errors.Join(err, nvmlError(uuid, "nvmlGpuInstanceDestroy (undoing the create)", ret))
		}
		return Created{}, err
	}
	ciInfo, err := fullComputeProfile(gih, info.SliceCount)
	if err != nil {
		return undo(fmt.Errorf("GPU %s: %s: %w", uuid, prof.Name, err))
	}
	start = time.Now()
	cih, ret = gih.CreateComputeInstance(&ciInfo)
	out.Driver += time.Since(start)
	if ret != nvml.SUCCESS {
		cih = nil
		return undo(nvmlError(uuid, fmt.Sprintf("nvmlGpuInstanceCreateComputeInstance(%s)", prof.Name), ret))
	}
	g, err = n.Read(uuid)
	if err != nil {
		return undo(err)
	}
	for _, in := range g.MIG.Instances {
		if in.Placement == pl && in.ProfileID == profileID && len(in.ComputeInstances) > 0 {
			c, err := n.found(g, in, in.ComputeInstances[0], out)
			if err != nil {
				return undo(err)
			}
			return c, nil
		}
	}
	return undo(fmt.Errorf("GPU %s: the %s instance just made at %d is not listed by NVML", uuid, prof.Name, pl.Start))
}

// found is the Created of compute instance ci of GPU instance in of g.
func (n *NVML) found(g gpu.GPU, in gpu.MIGInstance, ci gpu.MIGComputeInstance, out Created) (Created, error) {
	if ci.UUID == "" {
		return Created{}, fmt.Errorf("GPU %s: GPU instance %d compute instance %d: no MIG device UUID (%s)", g.UUID, in.ID, ci.ID, g.MIGError)
	}
	memory := ci.MemoryBytes
	if memory == 0 {
		if p, ok := g.MIG.Profile(in.ProfileID); ok {
			memory = p.MemoryBytes
		}
	}
	out.Instance = Instance{
		GPU: g.UUID, Minor: g.Minor, ProfileID: in.ProfileID, Profile: in.ProfileName, Placement: in.Placement,
		GPUInstance: in.ID, ComputeInstance: ci.ID, UUID: ci.UUID, MemoryBytes: memory,
		GPUInstanceMinor: in.AccessMinor, ComputeInstanceMinor: ci.AccessMinor,
	}
	return out, nil
}

// fullComputeProfile is the compute-instance profile of a GPU instance of
// slices compute slices that takes all of them (what nvidia-smi mig -cgi
// <profile> -C creates).
func fullComputeProfile(gih nvml.GpuInstance, slices uint32) (nvml.ComputeInstanceProfileInfo, error) {
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gih.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		if info.SliceCount == slices {
			return info, nil
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("no compute-instance profile of %d slices (nvmlGpuInstanceGetComputeInstanceProfileInfo)", slices)
}

// ErrInUse is wrapped by Destroy's error when a process runs on the
// instance.
var ErrInUse = errors.New("MIG instance in use")

// Destroy destroys the GPU instance of the profile at the placement on the
// GPU and its compute instances; destroyed is false when there was none.
// migUUID is the MIG UUID the caller recorded for it ("" while only the
// intent is recorded): an instance there without a compute instance of that
// UUID is not the caller's and is not touched (the error wraps ErrChanged).
// An instance with processes is not touched: the error wraps ErrInUse.
func (n *NVML) Destroy(uuid string, profileID int, pl gpu.MIGPlacement, migUUID string) (destroyed bool, err error) {
	g, err := n.Read(uuid)
	if err != nil {
		return false, err
	}
	if !g.MIGEnabled || g.MIG == nil {
		// Leaving MIG mode destroyed every instance.
		return false, nil
	}
	for _, in := range g.MIG.Instances {
		if in.Placement != pl || in.ProfileID != profileID {
			continue
		}
		if _, ok := computeInstance(in, migUUID); migUUID != "" && !ok {
			return false, fmt.Errorf("%s is not MIG device %s, which was recorded for it: %w", Describe(g, in), migUUID, ErrChanged)
		}
		return true, n.destroy(g, in)
	}
	return false, nil
}

func (n *NVML) destroy(g gpu.GPU, in gpu.MIGInstance) error {
	for _, ci := range in.ComputeInstances {
		if ci.Processes > 0 {
			return fmt.Errorf("GPU %s: GPU instance %d (%s at %d): compute instance %d has %d processes: %w", g.UUID, in.ID, in.ProfileName, in.Placement.Start, ci.ID, ci.Processes, ErrInUse)
		}
	}
	dev, ret := n.Lib.DeviceGetHandleByUUID(g.UUID)
	if ret != nvml.SUCCESS {
		return nvmlError(g.UUID, "nvmlDeviceGetHandleByUUID", ret)
	}
	gih, ret := dev.GetGpuInstanceById(in.ID)
	switch {
	case ret == nvml.ERROR_NOT_FOUND:
		return nil
	case ret != nvml.SUCCESS:
		return nvmlError(g.UUID, fmt.Sprintf("nvmlDeviceGetGpuInstanceById(%d)", in.ID), ret)
	}
	for _, ci := range in.ComputeInstances {
		cih, ret := gih.GetComputeInstanceById(ci.ID)
		switch {
		case ret == nvml.ERROR_NOT_FOUND:
			continue
		case ret != nvml.SUCCESS:
			return nvmlError(g.UUID, fmt.Sprintf("GPU instance %d: nvmlGpuInstanceGetComputeInstanceById(%d)", in.ID, ci.ID), ret)
		}
		if ret := cih.Destroy(); ret != nvml.SUCCESS {
			err := nvmlError(g.UUID, fmt.Sprintf("GPU instance %d: nvmlComputeInstanceDestroy(%d)", in.ID, ci.ID), ret)
			if ret == nvml.ERROR_IN_USE {
				err = fmt.Errorf("%w: %w", err, ErrInUse)
			}
			return err
		}
	}
	if ret := gih.Destroy(); ret != nvml.SUCCESS {
		err := nvmlError(g.UUID, fmt.Sprintf("nvmlGpuInstanceDestroy(%d)", in.ID), ret)
		if ret == nvml.ERROR_IN_USE {
			err = fmt.Errorf("%w: %w", err, ErrInUse)
		}
		return err
	}
	return nil
}

func containsPlacement(pls []gpu.MIGPlacement, pl gpu.MIGPlacement) bool {
	return slices.Contains(pls, pl)
}

func nvmlError(uuid, call string, ret nvml.Return) error {
	return fmt.Errorf("GPU %s: %s: %w", uuid, call, ret)
}
