package cdi

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// ToolkitKind is the CDI kind of the NVIDIA container toolkit's generated spec
// ("nvidia-ctk cdi generate"), whose devices are named by GPU UUID
// (--device-name-strategy=uuid) or by NVML index (the default).
const ToolkitKind = "nvidia.com/gpu"

// ToolkitDeviceID is the CDI device ID of the GPU with this UUID in the
// toolkit's spec: "nvidia.com/gpu=<uuid>".
func ToolkitDeviceID(uuid string) string {
	vendor, class := parser.ParseQualifier(ToolkitKind)
	return parser.QualifiedName(vendor, class, uuid)
}

// ToolkitSpecs finds the NVIDIA container toolkit's CDI devices in the node's
// CDI spec directories (as mounted into the plugin). It rescans on every call,
// so a toolkit spec generated after the plugin started is found; the scan
// reads a handful of small files and runs only on nodes with real GPUs.
type ToolkitSpecs struct {
	mu    sync.Mutex
	cache *cdiapi.Cache
}

// NewToolkitSpecs looks for the toolkit's spec in dirs. Missing directories
// are not an error: a node without the toolkit simply has no such devices.
func NewToolkitSpecs(dirs ...string) (*ToolkitSpecs, error) {
	if len(dirs) == 0 {
		return nil, errors.New("cdi: no toolkit spec directories")
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dirs...), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("cdi: toolkit spec dirs %v: %w", dirs, err)
	}
	return &ToolkitSpecs{cache: cache}, nil
}

// ErrStaleIndexDevice is the error of [ToolkitSpecs.DeviceID] when the
// spec's device named by the GPU's NVML index holds another GPU's device
// node: NVML numbers GPUs by PCI order at driver load, so after a GPU left
// the bus or the node's GPUs changed, a spec generated before names the
// index of one GPU for the device node of another.
var ErrStaleIndexDevice = errors.New("the toolkit's CDI spec is older than the node's GPUs")

// DeviceID returns "nvidia.com/gpu=<uuid>" or, failing that,
// "nvidia.com/gpu=<index>" when a spec in the directories defines that
// device, and ok=false otherwise. A device named by index must give the
// GPU's own device node (/dev/nvidia<minor>), or DeviceID returns an error
// wrapping [ErrStaleIndexDevice]: handing out that device would give the
// container another GPU. Broken spec files of other vendors do not matter;
// the other errors are for unreadable directories.
func (t *ToolkitSpecs) DeviceID(uuid string, index, minor int) (id string, ok bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Refresh returns the errors of every broken spec file in the dirs;
	// only our lookup matters, so they are not fatal here.
	_ = t.cache.Refresh()
	for dir, err := range t.cache.GetSpecDirErrors() {
		if !errors.Is(err, os.ErrNotExist) {
			return "", false, fmt.Errorf("cdi: toolkit spec dir %s: %w", dir, err)
		}
	}
	if id := ToolkitDeviceID(uuid); t.cache.GetDevice(id) != nil {
		return id, true, nil
	}
	id = ToolkitDeviceID(strconv.Itoa(index))
	dev := t.cache.GetDevice(id)
	if dev == nil {
		return "", false, nil
	}
	want := "/dev/nvidia" + strconv.Itoa(minor)
	var nodes []string
	for _, n := range dev.ContainerEdits.DeviceNodes {
		if n.Path == want {
			return id, true, nil
		}
		nodes = append(nodes, n.Path)
	}
	return "", false, fmt.Errorf("cdi: %w: its device %s (GPU index %d) has device nodes %v, not %s of GPU %s; "+
		"generate the spec again (nvidia-ctk cdi generate), by UUID (--device-name-strategy=uuid) so that renumbering cannot matter",
		ErrStaleIndexDevice, id, index, nodes, want, uuid)
}

// StaticToolkit is a fake of [ToolkitSpecs] for tests: the set of GPU UUIDs
// for which a toolkit device exists.
type StaticToolkit map[string]bool

// DeviceID implements the same lookup as [ToolkitSpecs.DeviceID], by UUID.
func (s StaticToolkit) DeviceID(uuid string, _, _ int) (string, bool, error) {
	if !s[uuid] {
		return "", false, nil
	}
	return ToolkitDeviceID(uuid), true, nil
}

// CommonEdits returns the container edits of the toolkit's spec itself (not
// of a device): the driver's libraries, the hooks that make them usable and
// the control device nodes, which the runtime applies with any device of the
// spec. A MIG device that did not exist when the spec was generated has no
// device in it, and the toolkit gives a GPU in MIG mode no device of its own
// (nvidia-ctk cdi generate skips it), so Tessera copies these into such a
// device's edits. ok is false when no spec of kind nvidia.com/gpu is found;
// of several, the one of the highest-priority directory (the last in the
// directory list) is taken, as the CDI library resolves its devices.
func (t *ToolkitSpecs) CommonEdits() (edits cdispec.ContainerEdits, ok bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_ = t.cache.Refresh()
	for dir, err := range t.cache.GetSpecDirErrors() {
		if !errors.Is(err, os.ErrNotExist) {
			return cdispec.ContainerEdits{}, false, fmt.Errorf("cdi: toolkit spec dir %s: %w", dir, err)
		}
	}
	vendor, class := parser.ParseQualifier(ToolkitKind)
	var best *cdiapi.Spec
	for _, s := range t.cache.GetVendorSpecs(vendor) {
		if s.GetClass() != class || len(t.cache.GetSpecErrors(s)) > 0 {
			continue
		}
		if best == nil || s.GetPriority() > best.GetPriority() {
			best = s
		}
	}
	if best == nil {
		return cdispec.ContainerEdits{}, false, nil
	}
	return cloneEdits(best.ContainerEdits), true, nil
}

// CommonEdits of the fake: a toolkit spec exists when any GPU has a device,
// and its common edits mount libcuda.
func (s StaticToolkit) CommonEdits() (cdispec.ContainerEdits, bool, error) {
	if len(s) == 0 {
		return cdispec.ContainerEdits{}, false, nil
	}
	return cdispec.ContainerEdits{
		Env: []string{"NVIDIA_VISIBLE_DEVICES=void"},
		Mounts: []*cdispec.Mount{{HostPath: StaticToolkitLibrary, ContainerPath: StaticToolkitLibrary,
			Options: []string{"ro", "nosuid", "nodev", "bind"}}},
	}, true, nil
}

// StaticToolkitLibrary is the library StaticToolkit's common edits mount.
const StaticToolkitLibrary = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"

// cloneEdits deep-copies edits, so that callers may change what they get.
func cloneEdits(e cdispec.ContainerEdits) cdispec.ContainerEdits {
	out := cdispec.ContainerEdits{Env: slices.Clone(e.Env), AdditionalGIDs: slices.Clone(e.AdditionalGIDs)}
	for _, d := range e.DeviceNodes {
		if d != nil {
			c := *d
			out.DeviceNodes = append(out.DeviceNodes, &c)
		}
	}
	for _, m := range e.Mounts {
		if m != nil {
			c := *m
			c.Options = slices.Clone(m.Options)
			out.Mounts = append(out.Mounts, &c)
		}
	}
	for _, h := range e.Hooks {
		if h != nil {
			c := *h
			c.Args, c.Env = slices.Clone(h.Args), slices.Clone(h.Env)
			out.Hooks = append(out.Hooks, &c)
		}
	}
	for _, n := range e.NetDevices {
		if n != nil {
			c := *n
			out.NetDevices = append(out.NetDevices, &c)
		}
	}
	if e.IntelRdt != nil {
		c := *e.IntelRdt
		out.IntelRdt = &c
	}
	return out
}
