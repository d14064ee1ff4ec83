// Package toolkitconfig reads what the NVIDIA container toolkit's
// config.toml says about the ways an unprivileged container may ask the
// NVIDIA container runtime for GPUs without a claim: the doctor's
// toolkit-envvar check and the plugin's publication read it the same way.
package toolkitconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/BurntSushi/toml"
)

// Paths are where the toolkit's config.toml is, relative to the host's /:
// where the toolkit's own packages put it, and where the GPU Operator's
// toolkit container does (its runtime wrappers point
// NVIDIA_CTK_CONFIG_FILE_PATH there).
var Paths = []string{
	"etc/nvidia-container-runtime/config.toml",
	"usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
}

// The toolkit's settings for how a container asks its runtime for GPUs, and
// their defaults when the file does not set them.
const (
	EnvvarSetting = "accept-nvidia-visible-devices-envvar-when-unprivileged"
	MountsSetting = "accept-nvidia-visible-devices-as-volume-mounts"
	envvarDefault = true
	mountsDefault = false
)

// DeviceRequests is what a config.toml says about the ways an unprivileged
// container may ask the NVIDIA runtime for GPUs; unset settings have the
// toolkit's defaults.
type DeviceRequests struct {
	// Envvar is accept-nvidia-visible-devices-envvar-when-unprivileged:
	// NVIDIA_VISIBLE_DEVICES from the container's own environment is
	// honoured. EnvvarSet says whether the file sets it.
	Envvar, EnvvarSet bool
	// Mounts is accept-nvidia-visible-devices-as-volume-mounts: /dev/null
	// mounted at /var/run/nvidia-container-devices/<id> asks for GPU <id>.
	Mounts, MountsSet bool
}

// Parse reads the two top-level settings of a toolkit config.toml.
func Parse(data []byte) (DeviceRequests, error) {
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return DeviceRequests{}, fmt.Errorf("not a TOML file: %w", err)
	}
	out := DeviceRequests{Envvar: envvarDefault, Mounts: mountsDefault}
	for key, dst := range map[string]*bool{EnvvarSetting: &out.Envvar, MountsSetting: &out.Mounts} {
		v, ok := raw[key]
		if !ok {
			continue
		}
		b, ok := v.(bool)
		if !ok {
			return out, fmt.Errorf("%s = %v: want true or false", key, v)
		}
		*dst = b
		if key == EnvvarSetting {
			out.EnvvarSet = true
		} else {
			out.MountsSet = true
		}
	}
	return out, nil
}

// Place is one place a config.toml may be: the path to read here and the
// path an admin finds it at on the node.
type Place struct{ Read, Host string }

// Places are the places to look for the config, in order: explicit alone
// when it is set; otherwise every path of Paths under hostRoot (empty: /)
// and then under hostProc's 1/root (the host's / through its init, when the
// host's /proc is mounted but not its /; empty hostProc: not).
func Places(explicit, hostRoot, hostProc string) []Place {
	if explicit != "" {
		return []Place{{explicit, explicit}}
	}
	if hostRoot == "" {
		hostRoot = "/"
	}
	var places []Place
	for _, p := range Paths {
		places = append(places, Place{filepath.Join(hostRoot, p), "/" + p})
	}
	if hostProc != "" {
		for _, p := range Paths {
			places = append(places, Place{filepath.Join(hostProc, "1/root", p), "/" + p})
		}
	}
	return places
}

// File is a config.toml that was found and read.
type File struct {
	Place
	Requests DeviceRequests
}

// ErrNotFound is Find's error when no place has a config: the node has no
// NVIDIA container runtime configured (or the file is not visible here).
var ErrNotFound = errors.New("no NVIDIA container toolkit config.toml")

// Find reads the first config that exists of places. A place that does not
// exist is skipped; one that exists but cannot be read, or does not parse,
// is an error naming it (the runtime reads the same file). When none exists
// the error wraps ErrNotFound and says where it looked.
func Find(places []Place) (File, error) {
	var missing []error
	for _, p := range places {
		data, err := os.ReadFile(p.Read)
		if errors.Is(err, fs.ErrNotExist) {
			missing = append(missing, err)
			continue
		}
		if err != nil {
			return File{Place: p}, err
		}
		req, err := Parse(data)
		if err != nil {
			return File{Place: p}, fmt.Errorf("%s: %w", p.Read, err)
		}
		return File{Place: p, Requests: req}, nil
	}
	return File{}, fmt.Errorf("%w: %w", ErrNotFound, errors.Join(missing...))
}
