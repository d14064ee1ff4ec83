package health

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
)

// StateFile is the name of the tracker's state file in the kubelet plugin's
// data directory (--plugin-data-dir), beside the checkpoint.
const StateFile = "health.json"

// stateVersion is the format of the state file.
const stateVersion = 1

// stateFile is the state file's content: the unhealthy GPUs by UUID, and
// the unhealthy MIG devices by "<GPU UUID>/mig-…" (statusKey; a plugin that
// predates MIG reads those as GPUs it does not have).
type stateFile struct {
	Version int                 `json:"version"`
	GPUs    map[string]gpuState `json:"gpus"`
}

// gpuState is what the state file keeps of one unhealthy GPU. RecoversAt is
// not kept: it is LastEvent plus the reading tracker's RecoveryPeriod.
type gpuState struct {
	Effect    resourceapi.DeviceTaintEffect `json:"effect"`
	Reason    string                        `json:"reason"`
	Since     time.Time                     `json:"since"`
	LastEvent time.Time                     `json:"lastEvent"`
	Events    int                           `json:"events,omitempty"`
	Lost      bool                          `json:"lost,omitempty"`
}

// Store is the file in which Trackers keep the unhealthy GPUs across
// restarts of the plugin, and share them between the two instances of a
// surge rolling update (see Tracker.Persist for the rules).
type Store struct {
	// Path of the state file; <Path>.lock is its lock file.
	Path string
}

// Load returns the statuses the file holds, by UUID; a missing file holds
// none. A file that cannot be read or parsed, is of another format version,
// or holds an entry without time of last fault or with an unknown effect is
// an error: the caller logs it and goes on without the file's content.
func (s Store) Load() (map[string]Status, error) {
	states, _, err := s.load()
	return states, err
}

func (s Store) load() (map[string]Status, []byte, error) {
	data, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("GPU health state %s: %w", s.Path, err)
	}
	var f stateFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, data, fmt.Errorf("GPU health state %s: corrupt: %w", s.Path, err)
	}
	if f.Version != stateVersion {
		return nil, data, fmt.Errorf("GPU health state %s: format version %d, want %d", s.Path, f.Version, stateVersion)
	}
	out := make(map[string]Status, len(f.GPUs))
	for key, g := range f.GPUs {
		uuid, scope, err := parseStatusKey(key)
		switch {
		case err != nil:
			return nil, data, fmt.Errorf("GPU health state %s: corrupt: %w", s.Path, err)
		case uuid == "":
			return nil, data, fmt.Errorf("GPU health state %s: corrupt: an entry without UUID", s.Path)
		case g.LastEvent.IsZero():
			return nil, data, fmt.Errorf("GPU health state %s: corrupt: GPU %s has no time of last fault", s.Path, uuid)
		case g.Effect != resourceapi.DeviceTaintEffectNoExecute && g.Effect != resourceapi.DeviceTaintEffectNoSchedule && g.Effect != resourceapi.DeviceTaintEffectNone:
			return nil, data, fmt.Errorf("GPU health state %s: corrupt: GPU %s has effect %q", s.Path, uuid, g.Effect)
		}
		out[key] = Status{UUID: uuid, MIG: scope, Effect: g.Effect, Reason: g.Reason, Since: g.Since, LastEvent: g.LastEvent, Events: g.Events, Lost: g.Lost}
	}
	return out, data, nil
}

// encode is the file content for the statuses (deterministic: encoding/json
// sorts map keys).
func encode(states map[string]Status) ([]byte, error) {
	f := stateFile{Version: stateVersion, GPUs: make(map[string]gpuState, len(states))}
	for uuid, s := range states {
		f.GPUs[uuid] = gpuState{Effect: s.Effect, Reason: s.Reason, Since: s.Since.UTC(), LastEvent: s.LastEvent.UTC(), Events: s.Events, Lost: s.Lost}
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// Save replaces the file with the statuses, atomically and durably: a
// temporary file in the same directory, fsync, rename, fsync of the
// directory. On an error before the rename the old file stays.
func (s Store) Save(states map[string]Status) error {
	data, err := encode(states)
	if err != nil {
		return fmt.Errorf("GPU health state %s: %w", s.Path, err)
	}
	return s.write(data)
}

func (s Store) write(data []byte) (err error) {
	dir := filepath.Dir(s.Path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(s.Path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("GPU health state %s: %w", s.Path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("GPU health state %s: write: %w", s.Path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("GPU health state %s: fsync: %w", s.Path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("GPU health state %s: close: %w", s.Path, err)
	}
	if err := os.Rename(tmp.Name(), s.Path); err != nil {
		return fmt.Errorf("GPU health state %s: rename: %w", s.Path, err)
	}
	if d, err := os.Open(dir); err == nil {
		// Some filesystems cannot fsync a directory; the rename is done.
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// lock takes the state file's lock (flock on <Path>.lock), which serialises
// the read-merge-write of the instances of a surge rolling update.
func (s Store) lock() (unlock func(), err error) {
	f, err := os.OpenFile(s.Path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("GPU health state lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("GPU health state lock %s: %w", f.Name(), err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}
