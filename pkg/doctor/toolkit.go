package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
)

// The NVIDIA container toolkit's config.toml: where the toolkit's own
// packages put it, and where the GPU Operator's toolkit container does
// (its runtime wrappers point NVIDIA_CTK_CONFIG_FILE_PATH there).
var toolkitConfigPaths = []string{
	"etc/nvidia-container-runtime/config.toml",
	"usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
}

// The toolkit's settings for how a container asks its runtime for GPUs, and
// their defaults when the file does not set them.
const (
	envvarSetting  = "accept-nvidia-visible-devices-envvar-when-unprivileged"
	mountsSetting  = "accept-nvidia-visible-devices-as-volume-mounts"
	envvarDefault  = true
	mountsDefault  = false
	toolkitFixBase = "Set in %s: " + envvarSetting + " = false and " + mountsSetting + " = true " +
		"(nvidia-ctk config --config-file=%s --in-place --set " + envvarSetting + "=false --set " + mountsSetting + "=true; " +
		"with the GPU Operator, the toolkit's environment ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false and ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS=true). " +
		"The runtime reads the file for each container it starts; nothing restarts. docs/security.md, \"The NVIDIA_VISIBLE_DEVICES escape\"."
)

// ToolkitDeviceRequests is what the NVIDIA container toolkit's config.toml
// says about the ways an unprivileged container may ask the NVIDIA runtime
// for GPUs; unset settings have the toolkit's defaults.
type ToolkitDeviceRequests struct {
	// Envvar is accept-nvidia-visible-devices-envvar-when-unprivileged:
	// NVIDIA_VISIBLE_DEVICES from the container's own environment is
	// honoured. EnvvarSet says whether the file sets it.
	Envvar, EnvvarSet bool
	// Mounts is accept-nvidia-visible-devices-as-volume-mounts: /dev/null
	// mounted at /var/run/nvidia-container-devices/<id> asks for GPU <id>.
	Mounts, MountsSet bool
}

// ParseToolkitDeviceRequests reads the two top-level settings of a toolkit
// config.toml.
func ParseToolkitDeviceRequests(data []byte) (ToolkitDeviceRequests, error) {
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return ToolkitDeviceRequests{}, fmt.Errorf("not a TOML file: %w", err)
	}
	out := ToolkitDeviceRequests{Envvar: envvarDefault, Mounts: mountsDefault}
	for key, dst := range map[string]*bool{envvarSetting: &out.Envvar, mountsSetting: &out.Mounts} {
		v, ok := raw[key]
		if !ok {
			continue
		}
		b, ok := v.(bool)
		if !ok {
			return out, fmt.Errorf("%s = %v: want true or false", key, v)
		}
		*dst = b
		if key == envvarSetting {
			out.EnvvarSet = true
		} else {
			out.MountsSet = true
		}
	}
	return out, nil
}

// checkToolkitEnvvar reads the NVIDIA container toolkit's config for the
// NVIDIA_VISIBLE_DEVICES escape: while the NVIDIA runtime honours the
// variable from unprivileged containers (the toolkit's default), any pod
// that sets NVIDIA_VISIBLE_DEVICES=all gets every GPU of the node, whoever
// was allocated them. With --legacy-nvidia-runtime, Tessera asks the runtime
// for a GPU through a volume mount instead, which the config must accept.
func (c Config) checkToolkitEnvvar() Result {
	const check = "toolkit-envvar"
	if c.mock() {
		return c.skipMock(check, "mock GPUs reach containers through Tessera's CDI devices only; there is no NVIDIA runtime to check")
	}
	// Each place as read here and as an admin finds it on the node.
	type place struct{ read, host string }
	places := []place{{c.ToolkitConfig, c.ToolkitConfig}}
	if c.ToolkitConfig == "" {
		places = nil
		for _, p := range toolkitConfigPaths {
			places = append(places, place{c.hostPath(p), "/" + p})
		}
		// The chart mounts neither file, but the host's /proc: its
		// init's root is the host's /.
		if c.HostProc != "" {
			for _, p := range toolkitConfigPaths {
				places = append(places, place{filepath.Join(c.HostProc, "1/root", p), "/" + p})
			}
		}
	}
	var path, hostPath string
	var data []byte
	var errs []error
	for _, p := range places {
		d, err := os.ReadFile(p.read)
		if err == nil {
			path, hostPath, data = p.read, p.host, d
			break
		}
		errs = append(errs, err)
	}
	if path == "" {
		res := Result{Check: check, Status: Warn,
			Message: fmt.Sprintf("cannot be checked: %v (the plugin's pod does not mount the toolkit's config, or the toolkit is not installed)", errors.Join(errs...)),
			Fix: "On the node, if containerd runs the NVIDIA runtime: " + fmt.Sprintf(toolkitFixBase, "/etc/nvidia-container-runtime/config.toml", "/etc/nvidia-container-runtime/config.toml") +
				" Give the file to this check with --toolkit-config."}
		if c.LegacyRuntime {
			res.Message += "; with --legacy-nvidia-runtime its " + mountsSetting + " must be true, or containers of GPUs without a toolkit CDI device start without the driver's libraries"
		}
		return res
	}
	req, err := ParseToolkitDeviceRequests(data)
	if err != nil {
		return Result{Check: check, Status: Warn, Message: fmt.Sprintf("%s: %v", path, err),
			Fix: "The NVIDIA runtime reads the same file: correct it (nvidia-ctk config --config-file=" + hostPath + " shows what the toolkit makes of it)."}
	}
	fix := fmt.Sprintf(toolkitFixBase, hostPath, hostPath)
	var problems []string
	status := OK
	if req.Envvar {
		status = Warn
		how := "true"
		if !req.EnvvarSet {
			how = "not set (the toolkit's default is true)"
		}
		problems = append(problems, fmt.Sprintf("%s is %s: if containerd runs the NVIDIA runtime, a pod without a claim that sets NVIDIA_VISIBLE_DEVICES=all (every CUDA base image does) gets every GPU of the node, other tenants' whole GPUs included", envvarSetting, how))
	}
	if c.LegacyRuntime && !req.Mounts {
		status = Fail
		how := "false"
		if !req.MountsSet {
			how = "not set (the toolkit's default is false)"
		}
		problems = append(problems, fmt.Sprintf("%s is %s: --legacy-nvidia-runtime asks the NVIDIA runtime for a GPU through a volume mount, so containers of GPUs without a toolkit CDI device start without the driver's libraries", mountsSetting, how))
	}
	if len(problems) > 0 {
		return Result{Check: check, Status: status, Message: path + ": " + strings.Join(problems, "; "), Fix: fix}
	}
	msg := fmt.Sprintf("%s: %s = false: the NVIDIA runtime ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers", path, envvarSetting)
	if req.Mounts {
		msg += fmt.Sprintf("; %s = true", mountsSetting)
	}
	return Result{Check: check, Status: OK, Message: msg}
}
