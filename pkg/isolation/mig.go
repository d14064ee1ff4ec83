package isolation

import (
	"fmt"
	"strconv"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// MIGDevice is one allocated MIG device of a claim as its containers see
// it: a GPU instance of a GPU in MIG mode with its compute instance (and,
// for a GPU instance an admin split, its other compute instances: Others).
type MIGDevice struct {
	// UUID is the MIG device's "MIG-…" UUID.
	UUID string
	// ParentUUID and Minor are the GPU's UUID and device minor.
	ParentUUID string
	Minor      int
	// GPUInstance and ComputeInstance are the instance IDs.
	GPUInstance     int
	ComputeInstance int
	// Profile is the GPU-instance profile ("3g.40gb").
	Profile string
	// GPUInstanceMinor and ComputeInstanceMinor are the minors of the
	// capability nodes /dev/nvidia-caps/nvidia-cap<N> that give access to
	// the GPU and the compute instance (gpu.MIGMinors).
	GPUInstanceMinor     int
	ComputeInstanceMinor int
	// Others are the GPU instance's other compute instances, each a MIG
	// device of its own with its own UUID and capability node: the claim
	// gets the whole GPU instance (static MIG).
	Others []MIGComputeInstance
}

// MIGComputeInstance is one more compute instance of a MIG device's GPU
// instance: its ID, MIG UUID and capability minor.
type MIGComputeInstance struct {
	ID    int
	UUID  string
	Minor int
}

// computeInstances are all of m's compute instances, the first one first.
func (m MIGDevice) computeInstances() []MIGComputeInstance {
	return append([]MIGComputeInstance{{ID: m.ComputeInstance, UUID: m.UUID, Minor: m.ComputeInstanceMinor}}, m.Others...)
}

func (m MIGDevice) check() error {
	if m.GPUInstanceMinor <= 0 {
		return fmt.Errorf("MIG device %s: capability minor of GPU instance %d unknown (/proc/driver/nvidia-caps/mig-minors)", m.UUID, m.GPUInstance)
	}
	for _, ci := range m.computeInstances() {
		switch {
		case !strings.HasPrefix(ci.UUID, "MIG-"):
			return fmt.Errorf("MIG device %d/%d of GPU gpu-%d: UUID %q is not a MIG-… UUID", m.GPUInstance, ci.ID, m.Minor, ci.UUID)
		case ci.Minor <= 0:
			return fmt.Errorf("MIG device %s: capability minors unknown (GPU instance %d, compute instance %d; /proc/driver/nvidia-caps/mig-minors)", ci.UUID, m.GPUInstanceMinor, ci.Minor)
		}
	}
	return nil
}

// UUIDs are the MIG UUIDs of all of m's compute instances, the first one
// first.
func (m MIGDevice) UUIDs() []string {
	var out []string
	for _, ci := range m.computeInstances() {
		out = append(out, ci.UUID)
	}
	return out
}

// MIGVariable is the name of the variable that holds the UUID of the MIG
// device of compute instance ci of GPU instance gi on GPU minor, and the
// prefix of its other variables. It follows the static device name
// (gpu-<minor>-mig-<gi>-<ci>), so two MIG devices of one GPU in one
// container never share a variable.
func MIGVariable(minor, gi, ci int) string {
	return "TESSERA_MIG_" + strconv.Itoa(minor) + "_" + strconv.Itoa(gi) + "_" + strconv.Itoa(ci)
}

// MIGCapabilityPath is the container (and host) path of the capability
// node with this minor.
func MIGCapabilityPath(minor int) string {
	return "/dev/" + capsDir + "/nvidia-cap" + strconv.Itoa(minor)
}

// capsDir is the directory of the capability nodes under /dev.
const capsDir = "nvidia-caps"

// MIGDeviceEdits returns the environment of one MIG device (one CDI device).
// Like DeviceEdits, every variable is named after the device or has the
// same value on every device, so any set of devices merges into exactly
// their MIG devices:
//
//	NVIDIA_VISIBLE_DEVICES=void
//	CUDA_DEVICE_ORDER=PCI_BUS_ID
//	TESSERA_MIG_<minor>_<gi>_<ci>=MIG-<uuid>
//	TESSERA_MIG_<minor>_<gi>_<ci>_PROFILE=<profile>            3g.40gb
//	TESSERA_MIG_<minor>_<gi>_<ci>_CAPS=/dev/nvidia-caps/nvidia-cap<G>,/dev/nvidia-caps/nvidia-cap<C>
//
// and the three TESSERA_MIG_<minor>_<gi>_<ci> variables again for each of
// the GPU instance's other compute instances (Others).
//
// No TESSERA_GPU_<minor>: the container does not get the GPU, only the MIG
// device. What makes the MIG device, and no other, visible to CUDA are its
// device nodes (the parent's /dev/nvidia<minor> and the two capability
// nodes, which the plugin adds on real nodes: NVIDIA MIG user guide,
// "Device Nodes and Capabilities"). CUDA_VISIBLE_DEVICES is a list and
// would not compose; the plugin sets it only where a claim alone decides it
// (MIGVisibleDevices).
//
// With legacyRuntime the device also mounts /dev/null at
// /var/run/nvidia-container-devices/MIG-<uuid>: a legacy-mode NVIDIA runtime
// accepts MIG UUIDs in its device list and adds the driver's libraries.
func MIGDeviceEdits(m MIGDevice, legacyRuntime bool) (cdispec.ContainerEdits, error) {
	if err := m.check(); err != nil {
		return cdispec.ContainerEdits{}, err
	}
	var edits cdispec.ContainerEdits
	edits.Env = []string{"NVIDIA_VISIBLE_DEVICES=void", "CUDA_DEVICE_ORDER=PCI_BUS_ID"}
	for _, ci := range m.computeInstances() {
		if legacyRuntime {
			edits.Mounts = append(edits.Mounts, bindMount("/dev/null", LegacyDeviceMount(ci.UUID), "ro"))
		}
		prefix := MIGVariable(m.Minor, m.GPUInstance, ci.ID)
		edits.Env = append(edits.Env,
			prefix+"="+ci.UUID,
			prefix+"_PROFILE="+m.Profile,
			prefix+"_CAPS="+MIGCapabilityPath(m.GPUInstanceMinor)+","+MIGCapabilityPath(ci.Minor),
		)
	}
	return edits, nil
}

// MIGVisibleDevices is CUDA_VISIBLE_DEVICES naming these MIG devices, in
// this order: the plugin puts it on every device of a claim whose devices
// are all MIG devices (same value on each, so it composes within the
// claim). MPS on a MIG device needs it (the daemon and its clients name the
// MIG device); otherwise the device nodes already decide what CUDA sees.
func MIGVisibleDevices(uuids []string) string {
	return "CUDA_VISIBLE_DEVICES=" + strings.Join(uuids, ",")
}

// MIGCapability is one capability node a MIG device needs: its minor and
// the driver's /proc file for it, relative to
// /proc/driver/nvidia/capabilities ("gpu3/mig/gi1/access",
// "gpu3/mig/gi1/ci0/access").
type MIGCapability struct {
	Minor int
	Proc  string
}

// MIGCapabilities are the capability nodes of MIG device m: its GPU
// instance's and its compute instances' (the paths NVIDIA's container
// toolkit reads, internal/nvcaps).
func MIGCapabilities(m MIGDevice) []MIGCapability {
	gi := fmt.Sprintf("gpu%d/mig/gi%d", m.Minor, m.GPUInstance)
	out := []MIGCapability{{Minor: m.GPUInstanceMinor, Proc: gi + "/access"}}
	for _, ci := range m.computeInstances() {
		out = append(out, MIGCapability{Minor: ci.Minor, Proc: fmt.Sprintf("%s/ci%d/access", gi, ci.ID)})
	}
	return out
}
