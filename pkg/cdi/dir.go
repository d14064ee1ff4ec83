package cdi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Dir is the CDI root into which the plugin writes its transient specs. It is
// safe for concurrent use; calls for different claims proceed in parallel.
// Calls for the same claim must not overlap (the plugin serializes per claim).
type Dir struct {
	root string
	// cache is the CDI library's registry, used only for its validated,
	// atomic WriteSpec and RemoveSpec. Auto-refresh is off: nothing here
	// reads devices back, so watching the directory would be wasted work.
	cache *cdiapi.Cache
}

// NewDir returns the CDI root at root, creating it (0755) if it is missing.
func NewDir(root string) (*Dir, error) {
	if root == "" {
		return nil, errors.New("cdi: empty root directory")
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("cdi: create root %s: %w", root, err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(root), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("cdi: open root %s: %w", root, err)
	}
	return &Dir{root: root, cache: cache}, nil
}

// Root is the directory the specs are written to.
func (d *Dir) Root() string { return d.root }

// Path is the file that holds the spec of the claim.
func (d *Dir) Path(claimUID types.UID) string {
	return d.root + string(os.PathSeparator) + specFileName(claimUID) + ".json"
}

// Write validates and writes the spec of one claim, replacing any earlier
// spec of the same claim, and returns the qualified CDI device ID of each
// device in the order given. record, when not empty, is kept in the spec's
// [RecordAnnotation]. On error nothing new is on disk (an earlier spec of the
// claim, if any, is untouched).
func (d *Dir) Write(claimUID types.UID, devices []Device, record []byte) ([]string, error) {
	spec, err := Build(claimUID, devices, record)
	if err != nil {
		return nil, err
	}
	if err := d.cache.WriteSpec(spec, specFileName(claimUID)+".json"); err != nil {
		return nil, fmt.Errorf("cdi: write spec %s: %w", d.Path(claimUID), err)
	}
	ids := make([]string, len(devices))
	for i, dev := range devices {
		ids[i] = QualifiedName(claimUID, dev.Name)
	}
	return ids, nil
}

// Current reports whether the claim's spec on disk is exactly what Write
// would write for devices and record. A missing or unreadable spec is not
// current; only an error other than a missing file is returned.
func (d *Dir) Current(claimUID types.UID, devices []Device, record []byte) (bool, error) {
	want, err := Build(claimUID, devices, record)
	if err != nil {
		return false, err
	}
	got, err := d.read(claimUID)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, nil //nolint:nilerr // an unreadable spec is rewritten, not reported
	}
	a, err := json.Marshal(want)
	if err != nil {
		return false, err
	}
	b, err := json.Marshal(got)
	if err != nil {
		return false, err
	}
	return bytes.Equal(a, b), nil
}

// Record returns the [RecordAnnotation] of the claim's spec: nil (no error)
// if the spec has none; an error wrapping fs.ErrNotExist if there is no spec.
func (d *Dir) Record(claimUID types.UID) ([]byte, error) {
	spec, err := d.read(claimUID)
	if err != nil {
		return nil, err
	}
	if r, ok := spec.Annotations[RecordAnnotation]; ok {
		return []byte(r), nil
	}
	return nil, nil
}

func (d *Dir) read(claimUID types.UID) (*cdispec.Spec, error) {
	data, err := os.ReadFile(d.Path(claimUID))
	if err != nil {
		return nil, fmt.Errorf("cdi: read spec: %w", err)
	}
	spec := &cdispec.Spec{}
	if err := json.Unmarshal(data, spec); err != nil {
		return nil, fmt.Errorf("cdi: read spec %s: %w", d.Path(claimUID), err)
	}
	return spec, nil
}

// Remove deletes the spec of the claim. A claim without a spec is not an error.
func (d *Dir) Remove(claimUID types.UID) error {
	if err := d.cache.RemoveSpec(specFileName(claimUID) + ".json"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cdi: remove spec %s: %w", d.Path(claimUID), err)
	}
	return nil
}

// List returns the UIDs of all claims with a spec in the root, sorted.
func (d *Dir) List() ([]types.UID, error) {
	entries, err := os.ReadDir(d.root)
	if err != nil {
		return nil, fmt.Errorf("cdi: list %s: %w", d.root, err)
	}
	var uids []types.UID
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		if uid, ok := claimUIDFromFile(e.Name()); ok {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	return uids, nil
}
