package cdi

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
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

// DeviceID returns "nvidia.com/gpu=<uuid>" or, failing that,
// "nvidia.com/gpu=<index>" when a spec in the directories defines that
// device, and ok=false otherwise. Broken spec files of other vendors do not
// matter; the error is only for unreadable directories.
func (t *ToolkitSpecs) DeviceID(uuid string, index int) (id string, ok bool, err error) {
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
	for _, name := range []string{uuid, strconv.Itoa(index)} {
		if id := ToolkitDeviceID(name); t.cache.GetDevice(id) != nil {
			return id, true, nil
		}
	}
	return "", false, nil
}

// StaticToolkit is a fake of [ToolkitSpecs] for tests: the set of GPU UUIDs
// for which a toolkit device exists.
type StaticToolkit map[string]bool

// DeviceID implements the same lookup as [ToolkitSpecs.DeviceID], by UUID.
func (s StaticToolkit) DeviceID(uuid string, _ int) (string, bool, error) {
	if !s[uuid] {
		return "", false, nil
	}
	return ToolkitDeviceID(uuid), true, nil
}
