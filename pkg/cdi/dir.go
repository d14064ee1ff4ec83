package cdi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
// device in the order given. record, when not empty, is written first to a
// file beside the spec (see [Dir.Record]). On error no new spec is on disk (an
// earlier spec of the claim, if any, is untouched).
func (d *Dir) Write(claimUID types.UID, devices []Device, record []byte) ([]string, error) {
	spec, err := Build(claimUID, devices)
	if err != nil {
		return nil, err
	}
	if len(record) > 0 {
		if err := writeAtomic(d.recordPath(claimUID), record); err != nil {
			return nil, fmt.Errorf("cdi: write claim record: %w", err)
		}
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

// Current reports whether the claim's spec and record on disk are exactly
// what Write would write for devices and record. A missing or unreadable spec
// is not current; only errors other than that are returned.
func (d *Dir) Current(claimUID types.UID, devices []Device, record []byte) (bool, error) {
	want, err := Build(claimUID, devices)
	if err != nil {
		return false, err
	}
	got, err := d.read(claimUID)
	if err != nil {
		return false, nil //nolint:nilerr // a missing or unreadable spec is rewritten, not reported
	}
	a, err := json.Marshal(want)
	if err != nil {
		return false, err
	}
	b, err := json.Marshal(got)
	if err != nil {
		return false, err
	}
	if !bytes.Equal(a, b) {
		return false, nil
	}
	if len(record) == 0 {
		return true, nil
	}
	onDisk, err := os.ReadFile(d.recordPath(claimUID))
	return err == nil && bytes.Equal(onDisk, record), nil
}

// Record returns the record written beside the claim's spec: nil (no error)
// if the spec has none; an error wrapping fs.ErrNotExist if there is no spec.
func (d *Dir) Record(claimUID types.UID) ([]byte, error) {
	if _, err := os.Stat(d.Path(claimUID)); err != nil {
		return nil, fmt.Errorf("cdi: spec of claim %s: %w", claimUID, err)
	}
	data, err := os.ReadFile(d.recordPath(claimUID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cdi: read claim record: %w", err)
	}
	return data, nil
}

func (d *Dir) recordPath(claimUID types.UID) string {
	return d.root + string(os.PathSeparator) + specFileName(claimUID) + recordExt
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

// writeAtomic replaces path with data: a temporary file in the same
// directory, synced, renamed over path.
func writeAtomic(path string, data []byte) error {
	dir, base := filepath.Split(path)
	f, err := os.CreateTemp(dir, "."+base+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o600)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// Remove deletes the spec of the claim and then its record. A claim without
// a spec is not an error.
func (d *Dir) Remove(claimUID types.UID) error {
	if err := d.cache.RemoveSpec(specFileName(claimUID) + ".json"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cdi: remove spec %s: %w", d.Path(claimUID), err)
	}
	if err := os.Remove(d.recordPath(claimUID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cdi: remove claim record: %w", err)
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
