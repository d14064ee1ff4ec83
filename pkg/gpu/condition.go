package gpu

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ComputeMode is a GPU's compute mode (nvmlDeviceGetComputeMode), named as
// it is published in the computeMode device attribute.
type ComputeMode string

// Compute modes. NVIDIA's names (nvidia-smi -c) are DEFAULT,
// EXCLUSIVE_PROCESS, PROHIBITED and the deprecated EXCLUSIVE_THREAD.
const (
	// ComputeModeDefault: any number of processes may hold a context on the
	// GPU. Whole GPUs and shares that are not MPS need it.
	ComputeModeDefault ComputeMode = "Default"
	// ComputeModeExclusiveProcess: one process (an MPS server counts as one)
	// may hold a context at a time.
	ComputeModeExclusiveProcess ComputeMode = "ExclusiveProcess"
	// ComputeModeProhibited: no process may create a context.
	ComputeModeProhibited ComputeMode = "Prohibited"
	// ComputeModeExclusiveThread is deprecated by NVIDIA; no current driver
	// accepts it, but NVML still defines it.
	ComputeModeExclusiveThread ComputeMode = "ExclusiveThread"
	// ComputeModeAny is not a mode: as an expected mode (ComputeModePolicy)
	// it accepts every mode.
	ComputeModeAny ComputeMode = "Any"
)

// computeModeName maps NVML's enum to ComputeMode; a value go-nvml does not
// know is "Unknown(<n>)", which no policy expects.
func computeModeName(m nvml.ComputeMode) ComputeMode {
	switch m {
	case nvml.COMPUTEMODE_DEFAULT:
		return ComputeModeDefault
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return ComputeModeExclusiveProcess
	case nvml.COMPUTEMODE_PROHIBITED:
		return ComputeModeProhibited
	case nvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return ComputeModeExclusiveThread
	default:
		return ComputeMode(fmt.Sprintf("Unknown(%d)", m))
	}
}

// ParseComputeMode reads an expected compute mode: Default,
// ExclusiveProcess, Prohibited or Any, in any case, or nvidia-smi's
// spellings (DEFAULT, EXCLUSIVE_PROCESS, PROHIBITED, 0, 3, 2).
func ParseComputeMode(s string) (ComputeMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "default", "0":
		return ComputeModeDefault, nil
	case "exclusiveprocess", "exclusive_process", "3":
		return ComputeModeExclusiveProcess, nil
	case "prohibited", "2":
		return ComputeModeProhibited, nil
	case "any":
		return ComputeModeAny, nil
	}
	return "", fmt.Errorf("compute mode %q: want Default, ExclusiveProcess, Prohibited or Any", s)
}

// nvidiaSMIName is the mode's name for nvidia-smi -c.
func (m ComputeMode) nvidiaSMIName() string {
	switch m {
	case ComputeModeExclusiveProcess:
		return "EXCLUSIVE_PROCESS"
	case ComputeModeProhibited:
		return "PROHIBITED"
	default:
		return "DEFAULT"
	}
}

// FabricState is a GPU's registration with the NVLink fabric (Fabric
// Manager on NVSwitch systems), from nvmlDeviceGetGpuFabricInfo.
type FabricState string

const (
	// FabricNone: the GPU takes no part in an NVLink fabric (NVML answers
	// ERROR_NOT_SUPPORTED or GPU_FABRIC_STATE_NOT_SUPPORTED, or the driver
	// has no such call): GPUs without NVSwitch.
	FabricNone FabricState = ""
	// FabricNotStarted: registration has not started (Fabric Manager is
	// not running).
	FabricNotStarted FabricState = "NotStarted"
	// FabricInProgress: registration is under way.
	FabricInProgress FabricState = "InProgress"
	// FabricCompleted: registered; CUDA can use the GPU.
	FabricCompleted FabricState = "Completed"
	// FabricFailed: registration completed with an error (GPU.FabricError).
	FabricFailed FabricState = "Failed"
)

// ComputeModePolicy says which compute mode Tessera expects of each GPU. The
// zero value expects Default of every GPU, which whole GPUs and every share
// but MPS need.
type ComputeModePolicy struct {
	// Default is the mode expected of a GPU PerGPU says nothing about; ""
	// means ComputeModeDefault, ComputeModeAny accepts every mode.
	Default ComputeMode
	// PerGPU, when set, gives the mode expected of the GPUs it returns ok
	// for (for example GPUs dedicated to MPS, expected in
	// ExclusiveProcess); it must be a pure function of the GPU.
	PerGPU func(g GPU) (ComputeMode, bool)
}

// Expected is the mode expected of g.
func (p ComputeModePolicy) Expected(g GPU) ComputeMode {
	if p.PerGPU != nil {
		if m, ok := p.PerGPU(g); ok && m != "" {
			return m
		}
	}
	if p.Default == "" {
		return ComputeModeDefault
	}
	return p.Default
}

// ConditionReason names what is wrong with a discovered GPU. Each is also the
// reason of the Node event about it and the value of its taint, if any.
type ConditionReason string

const (
	// ReasonMIGEnabled: the GPU is in MIG mode, so it is published as MIG
	// devices only, never whole or in shares (whole or shared devices would
	// double-book the instances' memory and compute). Information, no
	// taint.
	ReasonMIGEnabled ConditionReason = "MIGEnabled"
	// ReasonMIGModePending: the GPU's pending MIG mode differs from its
	// current one (an admin changed it while the GPU was in use); it is
	// published in its current mode, tainted, until a GPU reset makes the
	// two agree.
	ReasonMIGModePending ConditionReason = "MIGModePending"
	// ReasonMIGUnknown: NVML failed on MIG queries of a GPU in MIG mode
	// (GPU.MIGError); it is published with what was read, tainted.
	ReasonMIGUnknown ConditionReason = "MIGUnknown"
	// ReasonNVLinkUnknown: NVML failed on the GPU's NVLink or fabric
	// queries; it is published in an NVLink domain of its own.
	ReasonNVLinkUnknown ConditionReason = "NVLinkUnknown"
	// ReasonFabricNotReady: the GPU has not (successfully) registered with
	// the NVLink fabric, so CUDA cannot use it; it is published tainted.
	ReasonFabricNotReady ConditionReason = "FabricNotReady"
	// ReasonComputeMode: the GPU is not in the compute mode Tessera expects
	// of it; it is published tainted.
	ReasonComputeMode ConditionReason = "ComputeMode"
)

// Condition is something discovery found wrong with a GPU it described: not
// a failure of discovery (see Failure), but a fact an admin must hear about
// and that decides whether the GPU is published and whether new work may go
// to it.
type Condition struct {
	// UUID, Index and Minor name the GPU.
	UUID  string
	Index int
	Minor int
	// Reason says what is wrong.
	Reason ConditionReason
	// Message says it for an admin: what was found, what Tessera does about
	// it and how to fix it.
	Message string
	// Published is false when the GPU is not published at all.
	Published bool
	// Taint, when not empty, is the value of the taint its published
	// devices carry (the kubelet plugin's key gpu.tessera.dev/unhealthy,
	// effect NoSchedule): no new claim is allocated on the GPU, the pods
	// already using it stay.
	Taint string
}

// Conditions returns what is wrong with each of gpus, in their order (one
// GPU may have several conditions); nil when nothing is. It is a pure
// function of its arguments, so the kubelet plugin, its metrics and
// `tessera doctor` agree on it:
//
//   - A GPU in MIG mode is published as MIG devices only
//     (ReasonMIGEnabled, no taint).
//   - A GPU whose pending MIG mode differs from its current one is tainted
//     ReasonMIGModePending until a reset makes them agree; it is published
//     in its current mode meanwhile.
//   - A GPU in MIG mode whose MIG queries failed is tainted
//     ReasonMIGUnknown: its instances may be more than discovery read.
//   - A GPU whose NVLink or fabric queries failed is published in an NVLink
//     domain of its own (ReasonNVLinkUnknown), without a taint: it computes,
//     only its peers are unknown.
//   - A GPU whose fabric registration has not completed, or completed with
//     an error, is tainted ReasonFabricNotReady: on NVSwitch systems CUDA
//     fails on it until Fabric Manager has registered it. A GPU without a
//     fabric (FabricNone) never is.
//   - A GPU whose compute mode is known and differs from the one modes
//     expects of it is tainted "ComputeMode<mode>" (ReasonComputeMode).
//     Discovery never changes a mode.
func Conditions(gpus []GPU, modes ComputeModePolicy) []Condition {
	var out []Condition
	for _, g := range gpus {
		add := func(reason ConditionReason, taint, format string, args ...any) {
			msg := fmt.Sprintf("GPU index %d (%s): ", g.Index, g.UUID) + fmt.Sprintf(format, args...)
			out = append(out, Condition{UUID: g.UUID, Index: g.Index, Minor: g.Minor, Reason: reason, Message: msg, Published: true, Taint: taint})
		}
		if g.MIGEnabled {
			add(ReasonMIGEnabled, "", "%s", migEnabledMessage(g))
		}
		if g.MIGPendingChange() {
			add(ReasonMIGModePending, string(ReasonMIGModePending), "%s", migPendingMessage(g))
		}
		if g.MIGEnabled && g.MIGError != "" {
			add(ReasonMIGUnknown, string(ReasonMIGUnknown), "NVML failed on its MIG queries (%s): its MIG devices are published as far as they were read, "+
				"tainted %s, so that no new claim lands on a GPU whose instances are not all known. Check nvidia-smi mig -i %d -lgi and nvidia-smi mig -i %d -lci; "+
				"the taint goes once discovery reads them.", g.MIGError, ReasonMIGUnknown, g.Index, g.Index)
		}
		if g.NVLinkError != "" {
			add(ReasonNVLinkUnknown, "", "its NVLink peers are unknown (%s): it is published in an NVLink domain of its own, "+
				"so claims that need NVLink between GPUs do not get it with another GPU. Check nvidia-smi nvlink -s -i %d.", g.NVLinkError, g.Index)
		}
		switch g.Fabric {
		case FabricNotStarted, FabricInProgress:
			add(ReasonFabricNotReady, string(ReasonFabricNotReady), "its NVLink fabric registration is %s, so CUDA cannot use it yet: published tainted %s. "+
				"Is the nvidia-fabricmanager service running (systemctl status nvidia-fabricmanager)? The taint goes once registration completes.", g.Fabric, ReasonFabricNotReady)
		case FabricFailed:
			add(ReasonFabricNotReady, string(ReasonFabricNotReady), "its NVLink fabric registration failed (%s), so CUDA cannot use it: published tainted %s. "+
				"Check the Fabric Manager's log (journalctl -u nvidia-fabricmanager); the taint goes once registration succeeds.", g.FabricError, ReasonFabricNotReady)
		}
		want := modes.Expected(g)
		if g.ComputeMode != "" && want != ComputeModeAny && g.ComputeMode != want {
			taint := string(ReasonComputeMode) + string(g.ComputeMode)
			if strings.HasPrefix(string(g.ComputeMode), "Unknown") {
				taint = string(ReasonComputeMode) + "Unknown"
			}
			add(ReasonComputeMode, taint, "compute mode is %s, Tessera expects %s: published tainted %s. "+
				"Tessera never changes a compute mode: set it back with nvidia-smi -i %d -c %s, or tell the kubelet plugin to expect it (--expected-compute-mode).",
				g.ComputeMode, want, taint, g.Index, want.nvidiaSMIName())
		}
	}
	return out
}

// migEnabledMessage says what a GPU in MIG mode is published as.
func migEnabledMessage(g GPU) string {
	instances, devices := 0, 0
	if g.MIG != nil {
		instances = len(g.MIG.Instances)
		for _, in := range g.MIG.Instances {
			devices += len(in.ComputeInstances)
		}
	}
	msg := fmt.Sprintf("MIG mode is enabled: the GPU is published as MIG devices only, never whole or in shares. "+
		"It has %d GPU instances with %d compute instances; with static MIG each compute instance is one device, "+
		"with dynamic MIG every free placement of every profile is one.", instances, devices)
	if devices == 0 {
		msg += fmt.Sprintf(" With static MIG it publishes nothing until an admin creates instances (nvidia-smi mig -i %d -cgi <profile> -C).", g.Index)
	}
	return msg + fmt.Sprintf(" To publish it whole and in shares again, disable MIG when it is idle: nvidia-smi -i %d -mig 0.", g.Index)
}

// migPendingMessage says what a GPU whose MIG mode change waits for a reset
// is published as meanwhile, and how to finish or cancel the change.
func migPendingMessage(g GPU) string {
	pending, now, after, cancel := "disable", "its MIG devices", "whole and in shares", 1
	if g.MIG.PendingEnabled {
		pending, now, after, cancel = "enable", "its whole and shared devices", "as MIG devices only", 0
	}
	return fmt.Sprintf("MIG mode is pending %s: the change takes effect at the next reset of the GPU. Until then the node publishes %s "+
		"tainted %s, so no new claim lands on the GPU; pods already using it keep running. "+
		"To finish: wait until no process uses the GPU (nvidia-smi -i %d --query-compute-apps=pid --format=csv; the taint keeps new pods away), "+
		"then reset it: nvidia-smi -r -i %d (stop services that hold it open, such as nvidia-persistenced or DCGM, first; "+
		"where the GPU cannot be reset, as in some VMs, reboot the node). After the reset it is published %s. "+
		"To cancel the change instead: nvidia-smi -i %d -mig %d.",
		pending, now, ReasonMIGModePending, g.Index, g.Index, after, g.Index, cancel)
}
