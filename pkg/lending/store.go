package lending

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/google/renameio/v2"
)

// StateFile is the name of the lending state file in the kubelet plugin's
// data directory, beside the checkpoint.
const StateFile = "lending.json"

const stateVersion = 1

// Snapshot is what the state file keeps: every GPU's state by UUID and the
// node's boot.
type Snapshot struct {
	Version int `json:"version"`
	// BootID is the node's boot the states belong to: after a reboot no
	// claim is prepared, so nothing is lent and nothing is reclaimed.
	BootID string           `json:"bootID"`
	GPUs   map[string]State `json:"gpus"`
}

// Store is the state file. Save replaces it atomically (a temporary file,
// fsync, rename).
type Store struct {
	Path string
}

// Load returns the states of this boot; a missing file, or one of another
// boot, holds none. A file that cannot be read or parsed is an error, and
// the caller goes on without it: every GPU then starts NotHeld, which takes
// back whatever was lent (the safe direction: owners first).
func (s Store) Load(bootID string) (map[string]State, error) {
	data, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]State{}, nil
	}
	if err != nil {
		return map[string]State{}, fmt.Errorf("lending state %s: %w", s.Path, err)
	}
	var f Snapshot
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return map[string]State{}, fmt.Errorf("lending state %s: corrupt: %w", s.Path, err)
	}
	if f.Version != stateVersion {
		return map[string]State{}, fmt.Errorf("lending state %s: format version %d, want %d", s.Path, f.Version, stateVersion)
	}
	if f.BootID != bootID || f.GPUs == nil {
		return map[string]State{}, nil
	}
	return f.GPUs, nil
}

// Save replaces the file with the states.
func (s Store) Save(bootID string, states map[string]State) error {
	f := Snapshot{Version: stateVersion, BootID: bootID, GPUs: map[string]State{}}
	for uuid, st := range states {
		st.Since, st.IdleSince = st.Since.UTC().Truncate(time.Millisecond), st.IdleSince.UTC().Truncate(time.Millisecond)
		f.GPUs[uuid] = st
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("lending state %s: %w", s.Path, err)
	}
	if err := renameio.WriteFile(s.Path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("lending state %s: %w", s.Path, err)
	}
	return nil
}
