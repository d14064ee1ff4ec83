package publish

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/toolkitconfig"
)

// UnclaimedAccessTaintKey is the device taint of every GPU of a node whose
// NVIDIA container runtime hands GPUs to pods that hold no claim for them.
// Its values say why: UnclaimedAccessEnvvar, UnclaimedAccessUnknown.
const UnclaimedAccessTaintKey = model.DriverName + "/unclaimed-access"

// Values of UnclaimedAccessTaintKey.
const (
	// UnclaimedAccessEnvvar: the toolkit's config accepts
	// NVIDIA_VISIBLE_DEVICES from unprivileged containers (its default),
	// so a pod without a claim that sets NVIDIA_VISIBLE_DEVICES=all gets
	// every GPU of the node.
	UnclaimedAccessEnvvar = "VisibleDevicesEnvvar"
	// UnclaimedAccessUnknown: the toolkit's config exists but cannot be
	// read or parsed here, so whether it accepts the variable is unknown.
	UnclaimedAccessUnknown = "ToolkitConfigUnreadable"
)

// UnclaimedAccess decides, from the NVIDIA container toolkit's config.toml
// (read the way the doctor's toolkit-envvar check reads it), whether pods
// without a claim can reach the node's GPUs through the NVIDIA runtime, and
// taints every GPU NoSchedule while they can: nothing is allocated on a GPU
// that any pod of the node can open. The config is read again at each
// Taints, so that a fixed config lifts the taint at the next publication.
//
//   - No config anywhere (a node whose containers get GPUs through CDI
//     only, without the NVIDIA runtime): not open, no taint.
//   - accept-nvidia-visible-devices-envvar-when-unprivileged true or unset
//     (the toolkit's default): open, UnclaimedAccessEnvvar.
//   - A config that exists but cannot be read or parsed:
//     UnclaimedAccessUnknown (the runtime reads the same file).
//   - Allow (the admin accepts the risk): no taint, but a Warning event
//     and a log line say the GPUs are open.
//
// Each verdict is logged and, when Events is set, recorded as a Node event
// once per change: Warning GPUsReachableWithoutClaim (tainted), Warning
// GPUsReachableWithoutClaimAllowed (open, allowed) and Normal
// GPUsReachableOnlyWithClaim (no longer open).
type UnclaimedAccess struct {
	// Places are where the toolkit's config is looked for
	// (toolkitconfig.Places).
	Places []toolkitconfig.Place
	// Allow is --allow-visible-devices-envvar.
	Allow bool
	// Events, when set, gets the Node events above.
	Events EventRecorder

	mu       sync.Mutex
	reported string
}

// Fix is what an admin does about an open node; the message of every event.
const unclaimedAccessFix = "Set " + toolkitconfig.EnvvarSetting + " = false and " + toolkitconfig.MountsSetting + " = true in the toolkit's config.toml " +
	"(nvidia-ctk config --config-file=<file> --in-place --set " + toolkitconfig.EnvvarSetting + "=false --set " + toolkitconfig.MountsSetting + "=true; " +
	"with the GPU Operator, the toolkit's environment ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false and ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS=true); " +
	"the taint goes at the next publication. To accept the risk instead: --allow-visible-devices-envvar (kubeletPlugin.allowVisibleDevicesEnvvar=true)."

// Taints returns the taints every GPU of the node gets: none, or one
// UnclaimedAccessTaintKey NoSchedule taint.
func (u *UnclaimedAccess) Taints(ctx context.Context) []resourceapi.DeviceTaint {
	file, err := toolkitconfig.Find(u.Places)
	var value, msg string
	switch {
	case errors.Is(err, toolkitconfig.ErrNotFound):
	case err != nil:
		value = UnclaimedAccessUnknown
		msg = fmt.Sprintf("The NVIDIA container toolkit's config cannot be read (%v): whether the NVIDIA runtime gives pods without a claim every GPU through NVIDIA_VISIBLE_DEVICES is unknown.", err)
	case file.Requests.Envvar:
		value = UnclaimedAccessEnvvar
		how := "true"
		if !file.Requests.EnvvarSet {
			how = "not set (the toolkit's default is true)"
		}
		msg = fmt.Sprintf("%s: %s is %s: a pod without a claim that sets NVIDIA_VISIBLE_DEVICES=all (every CUDA base image does) gets every GPU of the node, other tenants' included.",
			file.Host, toolkitconfig.EnvvarSetting, how)
	}
	var taints []resourceapi.DeviceTaint
	reason, eventType := "GPUsReachableOnlyWithClaim", corev1.EventTypeNormal
	switch {
	case value != "" && u.Allow:
		reason, eventType = "GPUsReachableWithoutClaimAllowed", corev1.EventTypeWarning
		msg += " --allow-visible-devices-envvar accepts this: the GPUs are published untainted. " + unclaimedAccessFix
	case value != "":
		reason, eventType = "GPUsReachableWithoutClaim", corev1.EventTypeWarning
		msg += " Every GPU is published tainted " + UnclaimedAccessTaintKey + "=" + value + ":NoSchedule. " + unclaimedAccessFix
		taints = []resourceapi.DeviceTaint{{Key: UnclaimedAccessTaintKey, Value: value, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	default:
		msg = "The NVIDIA container runtime gives GPUs only to the containers of claims (no toolkit config, or it refuses NVIDIA_VISIBLE_DEVICES from unprivileged containers)."
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	// A node that was never open says nothing about it.
	if key := reason + msg; key != u.reported && (u.reported != "" || value != "") {
		logger := klog.FromContext(ctx)
		if value != "" {
			logger.Info("GPUs reachable without a claim", "reason", value, "allowed", u.Allow, "message", msg)
		} else {
			logger.Info(msg)
		}
		if u.Events != nil {
			u.Events.Event(eventType, reason, msg)
		}
		u.reported = key
	}
	return taints
}
