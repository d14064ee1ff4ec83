package doctor

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tessera-dev/tessera/pkg/toolkitconfig"
)

const (
	envvarSetting  = toolkitconfig.EnvvarSetting
	mountsSetting  = toolkitconfig.MountsSetting
	toolkitFixBase = "Set in %s: " + envvarSetting + " = false and " + mountsSetting + " = true " +
		"(nvidia-ctk config --config-file=%s --in-place --set " + envvarSetting + "=false --set " + mountsSetting + "=true; " +
		"with the GPU Operator, the toolkit's environment ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false and ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS=true). " +
		"The runtime reads the file for each container it starts; nothing restarts. docs/security.md, \"The NVIDIA_VISIBLE_DEVICES escape\"."
)

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
	// The chart mounts neither file, but the host's /proc: its init's
	// root is the host's /.
	file, err := toolkitconfig.Find(toolkitconfig.Places(c.ToolkitConfig, c.HostRoot, c.HostProc))
	if errors.Is(err, toolkitconfig.ErrNotFound) {
		res := Result{Check: check, Status: Warn,
			Message: fmt.Sprintf("cannot be checked: %v (the plugin's pod does not mount the toolkit's config, or the toolkit is not installed)", err),
			Fix: "On the node, if containerd runs the NVIDIA runtime: " + fmt.Sprintf(toolkitFixBase, "/etc/nvidia-container-runtime/config.toml", "/etc/nvidia-container-runtime/config.toml") +
				" Give the file to this check with --toolkit-config."}
		if c.LegacyRuntime {
			res.Message += "; with --legacy-nvidia-runtime its " + mountsSetting + " must be true, or containers of GPUs without a toolkit CDI device start without the driver's libraries"
		}
		return res
	}
	path, hostPath, req := file.Read, file.Host, file.Requests
	if err != nil {
		return Result{Check: check, Status: Warn, Message: err.Error(),
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
