package cdi

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	// Vendor is the CDI vendor of Tessera's transient specs.
	Vendor = "k8s.gpu.tessera.dev"
	// Class is the CDI class of Tessera's transient specs: one spec per claim.
	Class = "claim"
	// Kind is the CDI kind ("vendor/class") of Tessera's transient specs.
	Kind = Vendor + "/" + Class
	// DefaultRoot is where transient specs go by default (a tmpfs, which
	// is right: nothing prepared survives a reboot).
	DefaultRoot = cdiapi.DefaultDynamicDir
	// recordExt is the extension of the file beside each spec that holds the
	// plugin's record of the claim (its checkpoint entry), so that the
	// checkpoint can be rebuilt from the CDI root if it is ever lost. CDI
	// reads only .json and .yaml files, and a spec annotation would raise the
	// spec to CDI 0.6.0, which older runtimes refuse.
	recordExt = ".tessera-record"
)

// Device is one CDI device of a claim's spec: the edits the runtime applies to
// a container that references it.
type Device struct {
	// Name is unique within the claim (see [DeviceName]); the CDI device name
	// is "<claim uid>-<Name>".
	Name string
	// Edits are the container edits of this device. They must not be empty
	// (the CDI library rejects a device without edits).
	Edits cdispec.ContainerEdits
}

// DeviceName is the name of a claim's CDI device for the DRA device named
// device (gpu-3, gpu-3-shared) and, for shares, its share ID. It is unique
// within the claim because the allocator never hands one device, or one
// share, to a claim twice.
func DeviceName(device string, shareID types.UID) string {
	if shareID == "" {
		return device
	}
	return device + "-" + string(shareID)
}

// QualifiedName returns the CDI device ID "k8s.gpu.tessera.dev/claim=<uid>-<name>"
// that the kubelet passes to the runtime.
func QualifiedName(claimUID types.UID, name string) string {
	return parser.QualifiedName(Vendor, Class, cdiDeviceName(claimUID, name))
}

func cdiDeviceName(claimUID types.UID, name string) string {
	return string(claimUID) + "-" + name
}

// specFileName is the base name (without extension) of a claim's spec.
func specFileName(claimUID types.UID) string {
	return cdiapi.GenerateTransientSpecName(Vendor, Class, string(claimUID))
}

// claimUIDFromFile is the inverse of specFileName+".json"; ok is false for any
// file this package did not write.
func claimUIDFromFile(base string) (types.UID, bool) {
	rest, ok := strings.CutPrefix(base, Vendor+"-"+Class+"_")
	if !ok {
		return "", false
	}
	uid, ok := strings.CutSuffix(rest, ".json")
	if !ok || uid == "" || strings.ContainsAny(uid, "/_") {
		return "", false
	}
	return types.UID(uid), true
}

// Build returns the raw CDI spec of one claim. It does not validate:
// [Dir.Write] validates with the CDI library before writing.
func Build(claimUID types.UID, devices []Device) (*cdispec.Spec, error) {
	if claimUID == "" {
		return nil, fmt.Errorf("cdi spec: empty claim uid")
	}
	if len(devices) == 0 {
		return nil, fmt.Errorf("cdi spec for claim %s: no devices", claimUID)
	}
	spec := &cdispec.Spec{
		Kind:    Kind,
		Devices: make([]cdispec.Device, 0, len(devices)),
	}
	for _, d := range devices {
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           cdiDeviceName(claimUID, d.Name),
			ContainerEdits: d.Edits,
		})
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("cdi spec for claim %s: %w", claimUID, err)
	}
	spec.Version = version
	return spec, nil
}
