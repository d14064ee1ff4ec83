package scale

import (
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

// Publisher is what the fake nodes publish: the ResourceSlices of one node,
// all of one DRA driver.
type Publisher struct {
	// Name says in a few words what each node publishes.
	Name string
	// Driver is the driver of every slice.
	Driver string
	// Slices returns the slices of the node (generateName, no owner).
	Slices func(node string) ([]resourceapi.ResourceSlice, error)
}

// benchDrivers are the drivers whose slices a fake node may carry; publishing
// one removes the others' from the node.
var benchDrivers = []string{model.DriverName, NVIDIADriverName}

// TesseraPublisher publishes NodeSlices of the profile: what Tessera's plugin
// publishes with --mock-profile.
func TesseraPublisher(profile string) Publisher {
	return Publisher{
		Name:   "Tessera, mock profile " + profile,
		Driver: model.DriverName,
		Slices: func(node string) ([]resourceapi.ResourceSlice, error) { return NodeSlices(node, profile) },
	}
}

// DynamicMIGPublisher publishes what Tessera's plugin publishes for the
// profile when every GPU in MIG mode is named in --dynamic-mig: each valid
// placement of each profile a device, and per GPU a counter set of memory
// slices, compute slices and engines (model.WithDynamicMIG).
func DynamicMIGPublisher(profile string) Publisher { return DynamicMIGPublisherTaken(profile, 0) }

// DynamicMIGPublisherTaken is DynamicMIGPublisher after Tessera's claims
// have taken the GPUs with minor below taken whole, each with one GPU
// instance of its full-GPU profile made at prepare: what the plugin
// republishes then (model.WithMIGHeld), where such a GPU keeps only that
// placement.
func DynamicMIGPublisherTaken(profile string, taken int) Publisher {
	name := "Tessera with dynamic MIG on every MIG-mode GPU, mock profile " + profile
	if taken > 0 {
		name += fmt.Sprintf(", GPUs 0-%d each held by one full-GPU instance", taken-1)
	}
	return Publisher{
		Name:   name,
		Driver: model.DriverName,
		Slices: func(node string) ([]resourceapi.ResourceSlice, error) {
			gpus, err := mockGPUs(profile)
			if err != nil {
				return nil, err
			}
			var uuids []string
			held := map[string][]model.MIGHold{}
			for i, g := range gpus {
				if !g.MIGEnabled {
					continue
				}
				uuids = append(uuids, g.UUID)
				if g.Minor >= taken {
					continue
				}
				full, ok := fullMIGProfile(g.MIG)
				if !ok || len(full.Placements) == 0 {
					return nil, fmt.Errorf("mock profile %s: GPU %d has no full-GPU MIG profile to take it with", profile, g.Minor)
				}
				pl := full.Placements[0]
				gpus[i].MIG.Instances = []gpu.MIGInstance{{ID: 1, ProfileID: full.ID, ProfileName: full.Name, Placement: pl, AccessMinor: -1}}
				held[g.UUID] = []model.MIGHold{{ProfileID: full.ID, Placement: pl}}
			}
			if len(uuids) == 0 {
				return nil, fmt.Errorf("mock profile %s: no GPU in MIG mode to publish with dynamic MIG", profile)
			}
			res, err := model.Resources(node, gpus, model.WithDriverMemoryLimits(false), model.WithDynamicMIG(uuids...), model.WithMIGHeld(held))
			if err != nil {
				return nil, fmt.Errorf("node %s: %w", node, err)
			}
			return model.ResourceSlices(node, res)
		},
	}
}

// fullMIGProfile is the profile of m that takes every compute and memory
// slice.
func fullMIGProfile(m *gpu.MIG) (gpu.MIGProfile, bool) {
	for _, p := range m.Profiles {
		if p.ComputeSlices == m.ComputeSlices && p.MemorySlices == m.MemorySlices {
			return p, true
		}
	}
	return gpu.MIGProfile{}, false
}

// NVIDIA's DRA driver for GPUs (github.com/NVIDIA/k8s-dra-driver-gpu), read at
// commit 2240711 of its main branch: cmd/gpu-kubelet-plugin/deviceinfo.go
// (GpuInfo.Attributes, GetDevice, CanonicalName), partitions.go
// (fullGpuCapacity), driver.go (publishResources without the DynamicMIG
// gate: one slice per node holding every device) and
// deployments/helm/.../deviceclass-gpu.yaml.
const (
	// NVIDIADriverName is its driver name.
	NVIDIADriverName = "gpu.nvidia.com"
	// NVIDIAClassName is its DeviceClass for whole GPUs.
	NVIDIAClassName = "gpu.nvidia.com"
)

// NVIDIAPublisher publishes, for each GPU of the profile's mock node, the
// device NVIDIA's DRA driver publishes for a full GPU with MIG and dynamic
// MIG off: named gpu-<minor>, attributes type "gpu", uuid, productName,
// brand, architecture, cudaComputeCapability, driverVersion and
// cudaDriverVersion (versions as semver), the standard
// resource.kubernetes.io/pciBusID and pcieRoot, and capacity memory (the
// NVML total), all in one slice of the node's pool. Figures come from the
// same mock discovery as Tessera's slices.
func NVIDIAPublisher(profile string) Publisher {
	return Publisher{
		Name:   "NVIDIA's DRA driver (gpu.nvidia.com, MIG and dynamic MIG off), mock profile " + profile,
		Driver: NVIDIADriverName,
		Slices: func(node string) ([]resourceapi.ResourceSlice, error) {
			gpus, err := mockGPUs(profile)
			if err != nil {
				return nil, err
			}
			devices := make([]resourceapi.Device, 0, len(gpus))
			for _, g := range gpus {
				if g.MIGEnabled {
					return nil, fmt.Errorf("mock profile %s: GPU %d is in MIG mode, which NVIDIA's driver publishes as MIG devices, not modelled here", profile, g.Minor)
				}
				devices = append(devices, nvidiaDevice(g))
			}
			return []resourceapi.ResourceSlice{{
				ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-" + NVIDIADriverName + "-"},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:   NVIDIADriverName,
					NodeName: ptr.To(node),
					Pool:     resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
					Devices:  devices,
				},
			}}, nil
		},
	}
}

// nvidiaDevice is one full GPU as NVIDIA's driver publishes it.
func nvidiaDevice(g gpu.GPU) resourceapi.Device {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(s)} }
	ver := func(s string) resourceapi.DeviceAttribute {
		return resourceapi.DeviceAttribute{VersionValue: ptr.To(semver(s))}
	}
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"type":                            str("gpu"),
		"uuid":                            str(g.UUID),
		"productName":                     str(g.ProductName),
		"brand":                           str("Nvidia"),
		"architecture":                    str(g.Architecture),
		"cudaComputeCapability":           ver(g.CUDAComputeCapability),
		"driverVersion":                   ver(g.DriverVersion),
		"cudaDriverVersion":               ver(g.CUDADriverVersion),
		"resource.kubernetes.io/pciBusID": str(g.PCIBusID),
	}
	if g.PCIeRoot != "" {
		attrs["resource.kubernetes.io/pcieRoot"] = str(g.PCIeRoot)
	}
	memory := g.MemoryTotalBytes // NVML's total, which NVIDIA's driver publishes
	if memory == 0 {
		memory = g.MemoryBytes
	}
	return resourceapi.Device{
		Name:       fmt.Sprintf("gpu-%d", g.Minor),
		Attributes: attrs,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: *resource.NewQuantity(int64(memory), resource.BinarySI)},
		},
	}
}

// semver is a dotted version ("9.0", "580.95.05", "13.0") as the NVIDIA
// driver's semver.MustParse(...).String() gives it: three parts, leading
// zeros dropped ("580.95.5").
func semver(v string) string {
	parts := strings.Split(v, ".")
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		if n, err := strconv.ParseUint(p, 10, 64); err == nil {
			parts[i] = strconv.FormatUint(n, 10)
		}
	}
	return strings.Join(parts, ".")
}

// NVIDIADeviceClass is its whole-GPU DeviceClass as its chart installs it on
// resource.k8s.io/v1, without its extendedResourceName nvidia.com/gpu (the
// benchmark's pods use claim templates only).
func NVIDIADeviceClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: NVIDIAClassName},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
		}}}},
	}
}
