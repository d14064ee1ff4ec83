// Package mig creates, finds and destroys the MIG instances of a node's GPUs
// through NVML, for the kubelet plugin's dynamic MIG (docs/mig.md).
//
// What callers may assume:
//
//   - An instance is found by its GPU and placement (and profile), never by
//     its IDs alone: the driver reuses GPU-instance IDs, and an ID read
//     before a restart may name another instance after it.
//   - Create is idempotent: a GPU instance of the profile at exactly the
//     placement is taken as it is (a retry after a failure or a crash finds
//     the instance it made), its full compute instance is made if it lacks
//     one. An instance of another profile, or one overlapping the
//     placement, is an error; nothing is destroyed to make room.
//   - Destroy removes the compute instances, then the GPU instance, and
//     refuses while a process runs on one of them. A placement without an
//     instance is already destroyed.
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
	// Existed is true when the GPU instance was there already (a retry).
	Existed bool
	// Driver is the time spent in the driver's create calls
	// (nvmlDeviceCreateGpuInstanceWithPlacement and
	// nvmlGpuInstanceCreateComputeInstance); zero when nothing was made.
	Driver time.Duration
}

// Create makes a GPU instance of the profile at exactly the placement on
// the GPU, and a compute instance that takes all of it, and returns the
// MIG device (see the package documentation for idempotency). On an error
// after the GPU instance was made it destroys what it made.
func (n *NVML) Create(uuid string, profileID int, pl gpu.MIGPlacement) (Created, error) {
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
	dev, ret := n.Lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return Created{}, nvmlError(uuid, "nvmlDeviceGetHandleByUUID", ret)
	}
	var out Created
	var gih nvml.GpuInstance
	for _, in := range g.MIG.Instances {
		switch {
		case in.Placement == pl && in.ProfileID == profileID:
			out.Existed = true
			if h, ret := dev.GetGpuInstanceById(in.ID); ret == nvml.SUCCESS {
				gih = h
			} else {
				return Created{}, nvmlError(uuid, fmt.Sprintf("nvmlDeviceGetGpuInstanceById(%d)", in.ID), ret)
			}
			if len(in.ComputeInstances) > 0 {
				return n.found(g, in, out)
			}
		case in.Placement.Overlaps(pl):
			return Created{}, fmt.Errorf("GPU %s: memory slices %d-%d are taken by GPU instance %d (%s at %d-%d)", uuid, pl.Start, pl.Start+pl.Size-1,
				in.ID, in.ProfileName, in.Placement.Start, in.Placement.Start+in.Placement.Size-1)
		}
	}
	info, ret := dev.GetGpuInstanceProfileInfo(prof.Index)
	if ret != nvml.SUCCESS {
		return Created{}, nvmlError(uuid, fmt.Sprintf("nvmlDeviceGetGpuInstanceProfileInfo(%d)", prof.Index), ret)
	}
	if gih == nil {
		start := time.Now()
		h, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
		out.Driver += time.Since(start)
		if ret != nvml.SUCCESS {
			return Created{}, nvmlError(uuid, fmt.Sprintf("nvmlDeviceCreateGpuInstanceWithPlacement(%s at %d)", prof.Name, pl.Start), ret)
		}
		gih = h
	}
	undo := func(err error) (Created, error) {
		if out.Existed {
			return Created{}, err
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
	start := time.Now()
	_, ret = gih.CreateComputeInstance(&ciInfo)
	out.Driver += time.Since(start)
	if ret != nvml.SUCCESS {
		return undo(nvmlError(uuid, fmt.Sprintf("nvmlGpuInstanceCreateComputeInstance(%s)", prof.Name), ret))
	}
	g, err = n.Read(uuid)
	if err != nil {
		return undo(err)
	}
	for _, in := range g.MIG.Instances {
		if in.Placement == pl && in.ProfileID == profileID {
			c, err := n.found(g, in, out)
			if err != nil {
				return undo(err)
			}
			return c, nil
		}
	}
	return undo(fmt.Errorf("GPU %s: the %s instance just made at %d is not listed by NVML", uuid, prof.Name, pl.Start))
}

// found is the Created of GPU instance in of g, which has a compute
// instance; its first compute instance is the MIG device.
func (n *NVML) found(g gpu.GPU, in gpu.MIGInstance, out Created) (Created, error) {
	ci := in.ComputeInstances[0]
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
// An instance with processes is not touched: the error wraps ErrInUse.
func (n *NVML) Destroy(uuid string, profileID int, pl gpu.MIGPlacement) (destroyed bool, err error) {
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
		return true, n.destroy(g, in)
	}
	return false, nil
}

// DestroyInstance destroys GPU instance in of GPU g (as Read returned it)
// and its compute instances, unless a process runs on one of them.
func (n *NVML) DestroyInstance(g gpu.GPU, in gpu.MIGInstance) error { return n.destroy(g, in) }

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
