package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// CheckToolkit reports, at start, the GPUs of a real node that have no
// device in the NVIDIA container toolkit's CDI spec: unless the node runs the
// NVIDIA runtime in legacy mode (Options.LegacyRuntime), their claims fail to
// prepare, because a container with the GPU's device nodes but without the
// driver's libraries cannot run CUDA. It logs the reason and records a
// Warning event NoToolkitCDISpec on the Node naming the command that
// generates the spec and the directories searched. It changes nothing.
func (p *Plugin) CheckToolkit(ctx context.Context) {
	if p.opts.Mock || p.opts.LegacyRuntime {
		return
	}
	p.gpusMu.RLock()
	minors := make([]int, 0, len(p.gpus))
	for m := range p.gpus {
		minors = append(minors, m)
	}
	p.gpusMu.RUnlock()
	slices.Sort(minors)

	var missing []string
	var errs []error
	for _, m := range minors {
		g, _ := p.gpuByMinor(m)
		ok, err := p.inToolkitSpec(g)
		switch {
		case err != nil:
			errs = append(errs, err)
		case ok: // in the spec: nothing to report
		case g.MIGEnabled:
			missing = append(missing, fmt.Sprintf("%s (index %d, in MIG mode: no toolkit spec at all)", g.UUID, g.Index))
		default:
			missing = append(missing, fmt.Sprintf("%s (index %d)", g.UUID, g.Index))
		}
	}
	if len(missing) == 0 && len(errs) == 0 {
		return
	}
	err := errors.Join(errs...)
	msg := fmt.Sprintf("GPUs without a device in the NVIDIA container toolkit's CDI spec (looked in %s): %s. "+
		"Their claims fail to prepare: a container would get the device nodes but not the driver's libraries. "+
		"Generate the spec on the node (nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml), "+
		"or start the plugin with --legacy-nvidia-runtime if the node's runtime is the NVIDIA runtime in legacy mode",
		strings.Join(p.opts.ToolkitSpecDirs, ", "), strings.Join(missing, ", "))
	if err != nil {
		msg += fmt.Sprintf(" (reading the spec directories: %v)", err)
	}
	klog.FromContext(ctx).Error(nil, msg)
	p.event(corev1.EventTypeWarning, "NoToolkitCDISpec", msg)
}

// inToolkitSpec reports whether the toolkit's CDI spec has what the
// containers of g need: g's device, or for a GPU in MIG mode the spec's
// common edits (the toolkit gives a GPU in MIG mode no device of its own,
// nor instances made after the spec: its MIG devices take the common edits,
// so the spec must exist). Without a toolkit it reports false.
func (p *Plugin) inToolkitSpec(g gpu.GPU) (bool, error) {
	switch {
	case p.opts.Toolkit == nil:
		return false, nil
	case g.MIGEnabled:
		_, ok, err := p.opts.Toolkit.CommonEdits()
		return ok, err
	default:
		_, ok, err := p.opts.Toolkit.DeviceID(g.UUID, g.Index, g.Minor)
		return ok, err
	}
}
