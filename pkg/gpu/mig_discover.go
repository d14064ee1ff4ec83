package gpu

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MIG discovery: what a GPU in MIG mode is partitioned into. Read with
// nvmlDeviceGetGpuInstanceProfileInfo (every NVML_GPU_INSTANCE_PROFILE_*
// index), nvmlDeviceGetGpuInstancePossiblePlacements_v2,
// nvmlDeviceGetGpuInstances and nvmlGpuInstanceGetInfo, the compute instances
// of each GPU instance (nvmlGpuInstanceGetComputeInstanceProfileInfo for
// every NVML_COMPUTE_INSTANCE_PROFILE_* index, nvmlGpuInstanceGetComputeInstances,
// nvmlComputeInstanceGetInfo) and the MIG device handles
// (nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMigDeviceHandleByIndex) for
// their UUID, memory, SM count and processes. nvmlComputeInstanceInfo_t's
// device is the parent GPU, not the MIG device (nvml.h), so the MIG device of
// a compute instance is found by its GPU and compute instance IDs.

// migMinorsSource is an NVML that also knows the mig-minors content of its
// node: the mock nodes. The real driver writes it to MIGMinorsPath.
type migMinorsSource interface {
	MIGMinors() []byte
}

// migMinorsLoader reads the capability minors once per discovery, and only
// when a GPU in MIG mode needs them.
type migMinorsLoader struct {
	load   func() (MIGMinors, error)
	minors MIGMinors
	err    error
	done   bool
}

func newMIGMinorsLoader(lib nvml.Interface, opts DiscoverOptions) *migMinorsLoader {
	l := &migMinorsLoader{}
	switch src, ok := lib.(migMinorsSource); {
	case opts.MIGMinors != nil:
		l.load = func() (MIGMinors, error) { return ParseMIGMinors(bytes.NewReader(opts.MIGMinors)) }
	case ok:
		l.load = func() (MIGMinors, error) { return ParseMIGMinors(bytes.NewReader(src.MIGMinors())) }
	default:
		l.load = func() (MIGMinors, error) { return ReadMIGMinors(opts.MIGMinorsPath) }
	}
	return l
}

func (l *migMinorsLoader) get() MIGMinors {
	if !l.done {
		l.minors, l.err = l.load()
		l.done = true
	}
	return l.minors
}

// migProfileFacts is a profile as NVML described it, kept for the queries
// that take the profile info back.
type migProfileFacts struct {
	info    nvml.GpuInstanceProfileInfo
	profile MIGProfile
}

// migDeviceFacts is what a MIG device handle tells about one compute
// instance.
type migDeviceFacts struct {
	uuid            string
	memoryBytes     uint64
	multiprocessors int
	processes       int
}

// describeMIG fills g.MIG's profiles, slices and instances for a GPU in MIG
// mode. NVML failures do not fail the GPU: what could be read is kept, and
// the failures are joined into g.MIGError (see ReasonMIGUnknown).
func describeMIG(dev nvml.Device, g *GPU, sym symbols, minors *migMinorsLoader) {
	var errs []error
	profiles := readMIGProfiles(dev, g.MemoryTotalBytes, sym, &errs)
	m := g.MIG
	m.Profiles = make([]MIGProfile, 0, len(profiles))
	for _, p := range profiles {
		m.Profiles = append(m.Profiles, p.profile)
	}
	m.MemorySlices, m.ComputeSlices = migSlices(m.Profiles)

	devices := readMIGDevices(dev, &errs)
	caps := minors.get()
	for _, p := range profiles {
		gis, ret := dev.GetGpuInstances(&p.info)
		if ret != nvml.SUCCESS {
			errs = append(errs, nvmlError(fmt.Sprintf("nvmlDeviceGetGpuInstances(profile %d)", p.profile.ID), ret))
			continue
		}
		for _, gi := range gis {
			info, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				errs = append(errs, nvmlError(fmt.Sprintf("nvmlGpuInstanceGetInfo(profile %d)", p.profile.ID), ret))
				continue
			}
			inst := MIGInstance{
				ID: int(info.Id), ProfileID: int(info.ProfileId), ProfileName: p.profile.Name,
				Placement:   MIGPlacement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)},
				AccessMinor: caps.GPUInstance(g.Minor, int(info.Id)),
			}
			inst.ComputeInstances = readComputeInstances(gi, g.Minor, inst.ID, devices, caps, &errs)
			m.Instances = append(m.Instances, inst)
		}
	}
	slices.SortFunc(m.Instances, func(a, b MIGInstance) int { return cmp.Compare(a.ID, b.ID) })
	if len(errs) > 0 {
		g.MIGError = strings.ReplaceAll(errors.Join(errs...).Error(), "\n", "; ")
	}
}

// readMIGProfiles queries every NVML_GPU_INSTANCE_PROFILE_* index; an index
// the GPU or driver does not have (NOT_SUPPORTED, INVALID_ARGUMENT) is no
// profile. The result is in ascending profile ID order.
func readMIGProfiles(dev nvml.Device, totalBytes uint64, sym symbols, errs *[]error) []migProfileFacts {
	var out []migProfileFacts
	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		switch {
		case absent(ret):
			continue
		case ret != nvml.SUCCESS:
			*errs = append(*errs, nvmlError(fmt.Sprintf("nvmlDeviceGetGpuInstanceProfileInfo(%d)", index), ret))
			continue
		}
		if slices.ContainsFunc(out, func(p migProfileFacts) bool { return p.info.Id == info.Id }) {
			continue // one profile under two indexes: listed once
		}
		p := MIGProfile{
			Index: index, ID: int(info.Id), Name: migProfileName(index, info, totalBytes),
			ComputeSlices: int(info.SliceCount), MemoryBytes: info.MemorySizeMB << 20,
			Multiprocessors: int(info.MultiprocessorCount), CopyEngines: int(info.CopyEngineCount),
			Decoders: int(info.DecoderCount), Encoders: int(info.EncoderCount), JPEGs: int(info.JpegCount), OFAs: int(info.OfaCount),
			MaxInstances: int(info.InstanceCount),
		}
		if sym.profileInfoV {
			// The driver's own name where it has one (R525 and later);
			// the derived one otherwise.
			if v2, ret := dev.GetGpuInstanceProfileInfoV(index).V2(); ret == nvml.SUCCESS {
				if name := strings.TrimPrefix(cString(v2.Name[:]), "MIG "); name != "" {
					p.Name = name
				}
			}
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			*errs = append(*errs, nvmlError(fmt.Sprintf("nvmlDeviceGetGpuInstancePossiblePlacements_v2(profile %d)", info.Id), ret))
		}
		for _, pl := range placements {
			p.Placements = append(p.Placements, MIGPlacement{Start: int(pl.Start), Size: int(pl.Size)})
		}
		slices.SortFunc(p.Placements, func(a, b MIGPlacement) int { return cmp.Compare(a.Start, b.Start) })
		if len(p.Placements) > 0 {
			p.MemorySlices = p.Placements[0].Size
		}
		out = append(out, migProfileFacts{info: info, profile: p})
	}
	slices.SortFunc(out, func(a, b migProfileFacts) int { return cmp.Compare(a.profile.ID, b.profile.ID) })
	return out
}

// migSlices is the GPU's memory and compute slice counts: those of its
// full-GPU profile (the one with the most compute slices). A GPU whose
// full profile has no placement counts the memory slices its placements
// reach.
func migSlices(profiles []MIGProfile) (memory, compute int) {
	for _, p := range profiles {
		if p.ComputeSlices > compute || p.ComputeSlices == compute && p.MemorySlices > memory {
			compute, memory = p.ComputeSlices, p.MemorySlices
		}
	}
	if memory == 0 {
		for _, p := range profiles {
			for _, pl := range p.Placements {
				memory = max(memory, pl.Start+pl.Size)
			}
		}
	}
	return memory, compute
}

// readMIGDevices reads every MIG device handle of dev, by GPU and compute
// instance ID.
func readMIGDevices(dev nvml.Device, errs *[]error) map[[2]int]migDeviceFacts {
	out := map[[2]int]migDeviceFacts{}
	count, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		*errs = append(*errs, nvmlError("nvmlDeviceGetMaxMigDeviceCount", ret))
		return out
	}
	for i := range count {
		mig, ret := dev.GetMigDeviceHandleByIndex(i)
		switch {
		case ret == nvml.ERROR_NOT_FOUND:
			continue
		case ret != nvml.SUCCESS:
			*errs = append(*errs, nvmlError(fmt.Sprintf("nvmlDeviceGetMigDeviceHandleByIndex(%d)", i), ret))
			continue
		}
		fail := func(call string, ret nvml.Return) {
			*errs = append(*errs, nvmlError(fmt.Sprintf("MIG device %d: %s", i, call), ret))
		}
		gi, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			fail("nvmlDeviceGetGpuInstanceId", ret)
			continue
		}
		ci, ret := mig.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			fail("nvmlDeviceGetComputeInstanceId", ret)
			continue
		}
		f := migDeviceFacts{processes: -1}
		if f.uuid, ret = mig.GetUUID(); ret != nvml.SUCCESS {
			fail("nvmlDeviceGetUUID", ret)
		}
		if mem, ret := mig.GetMemoryInfo(); ret == nvml.SUCCESS {
			f.memoryBytes = mem.Total
		} else {
			fail("nvmlDeviceGetMemoryInfo", ret)
		}
		if attrs, ret := mig.GetAttributes(); ret == nvml.SUCCESS {
			f.multiprocessors = int(attrs.MultiprocessorCount)
		} else {
			fail("nvmlDeviceGetAttributes", ret)
		}
		if procs, ret := mig.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
			f.processes = len(procs)
		} else {
			fail("nvmlDeviceGetComputeRunningProcesses", ret)
		}
		out[[2]int{gi, ci}] = f
	}
	return out
}

// readComputeInstances lists GPU instance giID's compute instances, with the
// facts of their MIG devices, in ascending ID order.
func readComputeInstances(gi nvml.GpuInstance, gpuMinor, giID int, devices map[[2]int]migDeviceFacts, caps MIGMinors, errs *[]error) []MIGComputeInstance {
	var out []MIGComputeInstance
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		switch {
		case absent(ret):
			continue
		case ret != nvml.SUCCESS:
			*errs = append(*errs, nvmlError(fmt.Sprintf("GPU instance %d: nvmlGpuInstanceGetComputeInstanceProfileInfo(%d)", giID, index), ret))
			continue
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != nvml.SUCCESS {
			*errs = append(*errs, nvmlError(fmt.Sprintf("GPU instance %d: nvmlGpuInstanceGetComputeInstances(profile %d)", giID, info.Id), ret))
			continue
		}
		for _, ci := range cis {
			cinfo, ret := ci.GetInfo()
			if ret != nvml.SUCCESS {
				*errs = append(*errs, nvmlError(fmt.Sprintf("GPU instance %d: nvmlComputeInstanceGetInfo", giID), ret))
				continue
			}
			id := int(cinfo.Id)
			c := MIGComputeInstance{ID: id, AccessMinor: caps.ComputeInstance(gpuMinor, giID, id), Processes: -1}
			if f, ok := devices[[2]int{giID, id}]; ok {
				c.UUID, c.MemoryBytes, c.Multiprocessors, c.Processes = f.uuid, f.memoryBytes, f.multiprocessors, f.processes
			} else {
				*errs = append(*errs, fmt.Errorf("GPU instance %d compute instance %d: no MIG device handle has it (nvmlDeviceGetMigDeviceHandleByIndex)", giID, id))
			}
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b MIGComputeInstance) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// migProfileName is the name nvidia-smi gives a GPU-instance profile:
// "<compute slices>g.<memory>gb" with a suffix for the profile variants
// (+me: one of each media engine; +me.all: all of them; -me: none; +gfx:
// graphics), as NVIDIA's go-nvlib derives it (pkg/nvlib/device,
// mig_profile.go) for drivers whose NVML has no name. The memory is the
// profile's share of the GPU rounded up to eighths, times the GPU's memory
// in whole GiB, rounded: 9984 MiB of an 81559 MiB H100 is "10gb".
func migProfileName(index int, info nvml.GpuInstanceProfileInfo, totalBytes uint64) string {
	suffix := ""
	switch index {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		suffix = "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		suffix = "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		suffix = "-me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		suffix = "+gfx"
	}
	return fmt.Sprintf("%dg.%dgb%s", info.SliceCount, migMemoryGB(info.MemorySizeMB, totalBytes), suffix)
}

// migMemoryGB is the "<memory>gb" of a profile name (see migProfileName).
func migMemoryGB(profileMiB, totalBytes uint64) uint64 {
	if totalBytes == 0 {
		return (profileMiB + 1023) / 1024
	}
	const gib = 1 << 30
	eighths := math.Ceil(float64(profileMiB<<20) / float64(totalBytes) * 8)
	totalGiB := float64((totalBytes + gib - 1) / gib)
	return uint64(math.Round(eighths / 8 * totalGiB))
}

// cString is a NUL-terminated C string of a fixed-size NVML array.
func cString(b []uint8) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return strings.TrimSpace(string(b))
}
