package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/accounting"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/model"
)

// PrepareResourceClaims implements kubeletplugin.DRAPlugin; see the package
// documentation for the contract. Every problem with a claim is reported for
// the claim it belongs to; the only overall error is a checkpoint that cannot
// be re-read (the kubelet retries the whole call).
func (p *Plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	if err := p.refresh(ctx); err != nil {
		// Preparing on a stale view could hand out a GPU another instance
		// just gave away; the kubelet retries.
		return nil, fmt.Errorf("prepare: %w", err)
	}
	for _, claim := range claims {
		start := time.Now()
		devices, err := p.prepareClaim(ctx, claim)
		var conflict *grantConflict
		if errors.As(err, &conflict) {
			released, kept := p.releaseStale(ctx, conflict.holders)
			if released > 0 {
				// A claim in the way was gone, and its pods too (force-deleted
				// before the kubelet unprepared it): try once more without it.
				devices, err = p.prepareClaim(ctx, claim)
			}
			if len(kept) > 0 && errors.As(err, &conflict) {
				err = fmt.Errorf("%w; %s", err, strings.Join(kept, "; "))
			}
		}
		p.opts.Metrics.ObservePrepare(time.Since(start), err)
		if err != nil {
			err = fmt.Errorf("claim %s/%s (uid %s): %w", claim.Namespace, claim.Name, claim.UID, err)
			klog.FromContext(ctx).Error(err, "Prepare failed", "claim", klog.KObj(claim))
			if errors.As(err, &conflict) && conflict.oversubscribed {
				p.claimEvent(claim, corev1.EventTypeWarning, "GPUOversubscribed", conflict.Error())
			}
			p.claimEvent(claim, corev1.EventTypeWarning, "PrepareFailed", err.Error())
			p.writeFailure(ctx, claim, err)
			result[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	p.warnMIGVisibility(claims, result)
	return result, nil
}

func (p *Plugin) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	unlock := p.lockClaim(claim.UID)
	defer unlock()
	logger := klog.FromContext(ctx)

	if prev, ok := p.opts.Store.Get(claim.UID); ok {
		if prev.State == checkpoint.PrepareCompleted {
			if err := p.ensureSpec(ctx, prev); err != nil {
				return nil, err
			}
			p.rememberClaim(claim)
			return resultDevices(prev), nil
		}
		// A prepare that failed half way and could not be rolled back
		// then, or one from before a crash: start over.
		if err := p.rollback(ctx, prev); err != nil {
			return nil, fmt.Errorf("roll back earlier unfinished prepare: %w", err)
		}
	}

	pl, err := p.planClaim(claim)
	if err != nil {
		return nil, err
	}
	if len(pl.devices) == 0 {
		return []kubeletplugin.Device{}, nil
	}
	// The edits of a dynamic MIG device need its instance, which exists
	// only once it is created below: check what can be checked now.
	createMIG := hasUncreatedMIG(pl)
	var specDevices []specDevice
	if createMIG {
		err = p.checkMIGEdits(pl)
	} else {
		specDevices, err = p.containerEdits(claim.UID, pl)
	}
	if err != nil {
		return nil, err
	}

	if createMIG {
		// Just before the intent is recorded: a placement that an instance
		// covers is refused, so that the intent never names an instance
		// this claim did not make.
		if err := p.checkMIGFree(claim.UID, pl); err != nil {
			return nil, err
		}
	}
	record, put, err := p.admitAndStart(claim, pl)
	if err != nil {
		if put {
			// A write that reached the disk but not durably (ErrNotDurable)
			// left the entry in the store: take it out again with
			// everything else.
			if rbErr := p.rollback(ctx, record); rbErr != nil {
				logger.Error(rbErr, "Rolling back failed prepare failed", "claim", klog.KObj(claim))
			}
		}
		return nil, err
	}

	if createMIG {
		// Intent recorded (PrepareStarted with GPU, profile, placement):
		// create, record the IDs, then compute the edits.
		if err = p.createMIG(ctx, &record, pl); err == nil {
			specDevices, err = p.containerEdits(claim.UID, pl)
		}
	}
	if err == nil {
		err = p.applyEffects(ctx, &record, pl, specDevices)
	}
	if err == nil {
		if err = p.opts.Store.Put(record); err != nil {
			err = fmt.Errorf("record prepare completion in checkpoint: %w", err)
		}
	}
	if err != nil {
		if rbErr := p.rollback(ctx, record); rbErr != nil {
			// The PrepareStarted entry stays; the next prepare or start retries.
			logger.Error(rbErr, "Rolling back failed prepare failed", "claim", klog.KObj(claim))
		}
		return nil, err
	}

	p.rememberClaim(claim)
	p.writeStatus(ctx, claim, pl, specDevices)
	p.lendingChanged()
	logger.V(2).Info("Prepared claim", "claim", klog.KObj(claim), "uid", claim.UID, "devices", len(pl.devices))
	return resultDevices(record), nil
}

// admitAndStart admits the claim's borrowers and owners
// (admitBorrowers, admitOwners), reserves its grants and records it
// PrepareStarted in the checkpoint, all under the plugin's admission lock:
// an owner that does not lend and a borrower of the same GPU then each see
// the other's record (or prepare first), never neither. The lock is taken
// inside the claim's lock and held only for these in-memory checks and the
// one checkpoint write; the slow work (CDI specs, MPS daemons) runs after.
// put reports that the checkpoint write was tried: on an error the caller
// rolls record back.
func (p *Plugin) admitAndStart(claim *resourceapi.ResourceClaim, pl *plan) (record checkpoint.Claim, put bool, err error) {
	p.admission.Lock()
	defer p.admission.Unlock()
	if err := p.admitBorrowers(claim, pl); err != nil {
		return record, false, err
	}
	if err := p.admitOwners(claim, pl); err != nil {
		return record, false, err
	}
	if err := p.admitMIG(claim, pl); err != nil {
		return record, false, err
	}
	if p.admitted != nil {
		p.admitted(claim.UID)
	}
	record = checkpoint.Claim{
		UID:       claim.UID,
		Namespace: claim.Namespace,
		Name:      claim.Name,
		State:     checkpoint.PrepareStarted,
		Devices:   checkpointDevices(pl),
		Pods:      reservingPods(claim),
		Config:    pl.config,
	}
	if err := p.grants.reserve(claim.UID, record.String(), grantRequests(record), p.memoryOf); err != nil {
		return record, false, err
	}
	if err := p.opts.Store.Put(record); err != nil {
		return record, true, fmt.Errorf("record prepare start in checkpoint: %w", err)
	}
	return record, false, nil
}

// reservingPods returns the UIDs of the pods the claim is reserved for, if
// it was generated for a pod (its controller is a Pod, as for a claim from a
// ResourceClaimTemplate), else nil: the kubelet prepares a claim once per
// node, so pods that start on a shared claim after this prepare are never
// seen here, and a stale claim whose pods are not all known is not
// released (releaseStale).
func reservingPods(claim *resourceapi.ResourceClaim) []types.UID {
	owner := metav1.GetControllerOf(claim)
	if owner == nil || owner.APIVersion != "v1" || owner.Kind != "Pod" {
		return nil
	}
	var pods []types.UID
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" && !slices.Contains(pods, r.UID) {
			pods = append(pods, r.UID)
		}
	}
	return pods
}

// specDevice is one planned device with its CDI edits and the toolkit
// device the runtime gets before it.
type specDevice struct {
	cdi     cdi.Device
	toolkit string
	// applied is what the isolation backend got and added, for the
	// device's attestation (status.go).
	applied applied
}

// containerEdits computes the edits of every planned device without side
// effects, looking up the toolkit's device of each GPU.
func (p *Plugin) containerEdits(claimUID types.UID, pl *plan) ([]specDevice, error) {
	return p.editsFor(claimUID, pl.devices, pl.isolation, func(d plannedDevice) (string, error) {
		if p.opts.Mock || d.mig != nil {
			// MIG devices: the toolkit's spec has no device for them
			// (migEdits takes its common edits instead).
			return "", nil
		}
		var id string
		var ok bool
		if p.opts.Toolkit != nil {
			var err error
			if id, ok, err = p.opts.Toolkit.DeviceID(d.gpu.UUID, d.gpu.Index, d.gpu.Minor); err != nil {
				return "", deviceError(d.device, "look up NVIDIA container toolkit device: %v", err)
			}
		}
		if !ok {
			if !p.opts.LegacyRuntime {
				// Fail closed: device nodes without the driver's
				// libraries make a container in which CUDA fails.
				return "", deviceError(d.device, "%v", p.noToolkitDevice(d.gpu.UUID, d.gpu.Index))
			}
			return "", nil
		}
		return id, nil
	})
}

// noToolkitDevice is the reason a GPU without a device in the NVIDIA
// container toolkit's CDI spec cannot be prepared on this node.
func (p *Plugin) noToolkitDevice(uuid string, index int) error {
	return fmt.Errorf("GPU %s (index %d) has no device in the NVIDIA container toolkit's CDI spec (nvidia.com/gpu=%s or =%d, looked in %s); "+
		"without it the container would get the GPU's device nodes but not the driver's libraries. "+
		"Generate the spec on the node (nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml), "+
		"or start the plugin with --legacy-nvidia-runtime if the node's runtime is the NVIDIA runtime in legacy mode",
		uuid, index, uuid, index, strings.Join(p.opts.ToolkitSpecDirs, ", "))
}

// editsFor computes the CDI devices of a claim: each device carries its own
// GPU's visibility and limits ([isolation.DeviceEdits]), share devices also
// the claim's backend edits ([isolation.BackendEdits]), and on real nodes
// without a toolkit device (toolkitOf returns "") the GPU's device nodes.
func (p *Plugin) editsFor(claimUID types.UID, devs []plannedDevice, iso configapi.Isolation, toolkitOf func(plannedDevice) (string, error)) ([]specDevice, error) {
	in := isolation.Claim{Isolation: iso}
	var shareDevice string
	// migUUIDs are the MIG devices of a claim made of MIG devices only:
	// CUDA_VISIBLE_DEVICES names them (the same value on each device).
	var migUUIDs []string
	for _, d := range devs {
		if d.mig == nil || d.adminAccess {
			migUUIDs = nil
			break
		}
		migUUIDs = append(migUUIDs, isolationMIG(d).UUIDs()...)
	}
	for _, d := range devs {
		g := isolationGPU(d)
		if g.Shared && shareDevice == "" {
			shareDevice = d.device
		}
		// Two shares of one GPU in one claim (two requests) are one GPU to
		// the backend, with the sum of their limits.
		i := slices.IndexFunc(in.GPUs, func(x isolation.GPU) bool { return x.UUID == g.UUID })
		if i < 0 {
			in.GPUs = append(in.GPUs, g)
			continue
		}
		if in.GPUs[i].Shared && g.Shared {
			in.GPUs[i].MemoryLimit += g.MemoryLimit
			in.GPUs[i].CoresLimit = min(in.GPUs[i].CoresLimit+g.CoresLimit, configapi.MaxCores)
		}
	}
	if shareDevice == "" {
		shareDevice = devs[0].device
	}
	switch iso {
	case configapi.IsolationMPS:
		if p.opts.MPS == nil {
			return nil, deviceError(shareDevice, "isolation MPS is not available on this node (no MPS root configured)")
		}
		// The daemon's paths are known before it runs; it is acquired later.
		in.MPS = p.opts.MPS.Daemon(mpsGPU(devs[0]), devs[0].mpsDomain)
	case configapi.IsolationHAMiCore:
		if err := p.opts.HAMiCore.Check(); err != nil {
			return nil, deviceError(shareDevice, "%v", err)
		}
		in.HAMiCore = p.opts.HAMiCore
		in.HAMiCoreClaimDir = p.opts.HAMiCore.ClaimDir(claimUID)
	case configapi.IsolationDriverMemory:
		if err := p.opts.DriverMemory.Check(); err != nil {
			return nil, deviceError(shareDevice, "%v", err)
		}
		in.DriverMemory = p.opts.DriverMemory
	}
	backend, err := isolation.BackendEdits(in)
	if err != nil {
		return nil, deviceError(shareDevice, "%v", err)
	}

	out := make([]specDevice, 0, len(devs))
	for _, d := range devs {
		toolkitID, err := toolkitOf(d)
		if err != nil {
			return nil, err
		}
		g := isolationGPU(d)
		if d.mig != nil {
			edits, err := p.migEdits(d, migUUIDs)
			if err != nil {
				return nil, err
			}
			if g.Shared {
				// MPS inside the MIG device: the backend's
				// CUDA_VISIBLE_DEVICES names it.
				edits.Env = append(edits.Env, backend.Env...)
				edits.Mounts = append(edits.Mounts, slices.Clone(backend.Mounts)...)
				edits.Hooks = append(edits.Hooks, slices.Clone(backend.Hooks)...)
			}
			out = append(out, specDevice{cdi: cdi.Device{Name: cdi.DeviceName(d.device, d.shareID), Edits: edits}, applied: appliedTo(in, g, backend)})
			continue
		}
		legacy := !p.opts.Mock && toolkitID == ""
		edits, err := isolation.DeviceEdits(g, legacy)
		if err != nil {
			return nil, deviceError(d.device, "%v", err)
		}
		if g.Shared {
			edits.Env = append(edits.Env, backend.Env...)
			edits.Mounts = append(edits.Mounts, slices.Clone(backend.Mounts)...)
			edits.Hooks = append(edits.Hooks, slices.Clone(backend.Hooks)...)
		}
		if legacy {
			nodes, err := p.opts.DevNodes.Nodes(d.gpu.Minor)
			if err != nil {
				return nil, deviceError(d.device, "%v", err)
			}
			edits.DeviceNodes = nodes
		}
		out = append(out, specDevice{cdi: cdi.Device{Name: cdi.DeviceName(d.device, d.shareID), Edits: edits}, toolkit: toolkitID,
			applied: appliedTo(in, g, backend)})
	}
	return out, nil
}

// isolationGPU is the device as the isolation backend sees it. A MIG device
// is its MIG UUID; under MPS it is a "share" of all the instance's memory
// and 100% of its SMs, so that the backend runs a daemon for it.
func isolationGPU(d plannedDevice) isolation.GPU {
	if d.mig != nil {
		g := isolation.GPU{UUID: d.mig.UUID, Minor: d.gpu.Minor}
		if d.isolation == configapi.IsolationMPS && !d.adminAccess {
			g.Shared, g.MemoryLimit, g.CoresLimit = true, d.mig.MemoryBytes, configapi.MaxCores
		}
		return g
	}
	return isolation.GPU{UUID: d.gpu.UUID, Minor: d.gpu.Minor, Shared: d.shared && !d.adminAccess, Preemptible: d.lent,
		MemoryLimit: d.memoryLimit, CoresLimit: d.coresLimit}
}

// mpsGPU is what an MPS daemon of the device serves: the GPU, or the MIG
// device.
func mpsGPU(d plannedDevice) string {
	if d.mig != nil {
		return d.mig.UUID
	}
	return d.gpu.UUID
}

// applyEffects acquires the MPS daemon (if any) and writes the CDI spec, with
// record (as it will be once complete) beside the spec; it
// fills in record's CDI device IDs and marks it PrepareCompleted. On error it
// may have done part of the work; the caller rolls back.
func (p *Plugin) applyEffects(ctx context.Context, record *checkpoint.Claim, pl *plan, devs []specDevice) error {
	if pl.isolation == configapi.IsolationMPS {
		// Its clients' limits are the daemon's defaults too, which their
		// own environment cannot lift.
		d := pl.devices[0]
		var limits isolation.MPSLimits
		if g := isolationGPU(d); g.Shared {
			var err error
			if limits, err = isolation.MPSClientLimits(g, p.opts.MPS.Daemon(mpsGPU(d), d.mpsDomain)); err != nil {
				return deviceError(d.device, "%v", err)
			}
		}
		if _, err := p.opts.MPS.AcquireLimited(ctx, mpsGPU(d), d.mpsDomain, record.UID, limits); err != nil {
			return deviceError(d.device, "%v", err)
		}
	}
	if pl.isolation == configapi.IsolationHAMiCore {
		// The claim's own HAMi-core shared region, mounted by its spec.
		if err := p.opts.HAMiCore.CreateClaimDir(record.UID); err != nil {
			return deviceError(pl.devices[0].device, "%v", err)
		}
	}
	cdiDevices := make([]cdi.Device, len(devs))
	for i, d := range devs {
		cdiDevices[i] = d.cdi
		// The toolkit's device first: it brings the GPU's device nodes and
		// the driver's libraries; ours adds visibility and limits.
		var ids []string
		if d.toolkit != "" {
			ids = append(ids, d.toolkit)
		}
		ids = append(ids, cdi.QualifiedName(record.UID, d.cdi.Name))
		record.Devices[i].CDIDeviceIDs = ids
	}
	record.State = checkpoint.PrepareCompleted
	raw, err := json.Marshal(record)
	if err != nil {
		return fmt.Errorf("encode claim record: %w", err)
	}
	written, err := p.opts.Specs.Write(record.UID, cdiDevices, raw)
	if err != nil {
		return err
	}
	for i, id := range written {
		if i >= len(record.Devices) || !slices.Contains(record.Devices[i].CDIDeviceIDs, id) {
			return fmt.Errorf("CDI spec writer returned device ID %q, which is not the one recorded", id)
		}
	}
	return nil
}

// ensureSpec makes sure the CDI spec of the prepared claim c is on disk as
// its record says (a cleared /var/run/cdi, a spec edited or truncated by
// someone else), rewriting it from the record if not: the kubelet has the
// recorded IDs, and they must resolve. It replays the record; it does not
// re-plan, so a changed node default or toolkit cannot change a prepared
// claim's spec.
func (p *Plugin) ensureSpec(ctx context.Context, c checkpoint.Claim) error {
	raw, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode claim record: %w", err)
	}
	devs, err := p.specFromRecord(c)
	if err != nil {
		return fmt.Errorf("rebuild the CDI spec of a prepared claim from its record: %w", err)
	}
	devices := make([]cdi.Device, len(devs))
	for i, d := range devs {
		devices[i] = d.cdi
	}
	if slices.ContainsFunc(c.Devices, func(d checkpoint.Device) bool { return d.Isolation == string(configapi.IsolationHAMiCore) }) {
		// The spec mounts the claim's shared-region directory, which lives
		// on a tmpfs: make it again if it is gone (idempotent).
		if err := p.opts.HAMiCore.CreateClaimDir(c.UID); err != nil {
			return fmt.Errorf("the HAMi-core directory of a prepared claim: %w", err)
		}
	}
	if ok, err := p.opts.Specs.Current(c.UID, devices, raw); err != nil || ok {
		return err
	}
	if _, err := p.opts.Specs.Write(c.UID, devices, raw); err != nil {
		return fmt.Errorf("write the missing CDI spec of a prepared claim again: %w", err)
	}
	klog.FromContext(ctx).Info("Rewrote the CDI spec of a prepared claim from its record: it was missing or differed", "claim", c.String())
	p.event(corev1.EventTypeWarning, "CDISpecRewritten", fmt.Sprintf("claim %s: its CDI spec was missing or changed and was written again", c))
	return nil
}

// ensureSpecs runs ensureSpec for every prepared claim (at start: the kubelet
// does not prepare a claim again that it has prepared, so a lost spec would
// otherwise break its containers' restarts).
func (p *Plugin) ensureSpecs(ctx context.Context) {
	for _, c := range p.opts.Store.List() {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		if err := p.ensureSpec(ctx, c); err != nil {
			klog.FromContext(ctx).Error(err, "Checking the CDI spec of a prepared claim failed", "claim", c.String())
		}
	}
}

// specFromRecord computes the CDI devices of a prepared claim from its
// checkpoint record: the devices in their recorded order, with their recorded
// limits and isolation, and the toolkit's device where one was recorded.
func (p *Plugin) specFromRecord(c checkpoint.Claim) ([]specDevice, error) {
	devs := make([]plannedDevice, len(c.Devices))
	toolkit := map[int]string{}
	var iso configapi.Isolation
	for i, d := range c.Devices {
		g, _ := p.gpuByMinor(d.Minor)
		if g.UUID != d.UUID {
			g = gpu.GPU{UUID: d.UUID, Minor: d.Minor}
		}
		if d.MIG != nil {
			if !d.MIG.Created() {
				return nil, deviceError(d.Device, "the record has no MIG instance")
			}
			m := *d.MIG
			devs[i] = plannedDevice{request: d.Request, pool: d.Pool, device: d.Device, adminAccess: d.AdminAccess, gpu: g,
				isolation: configapi.Isolation(d.Isolation), mpsDomain: d.MPSDomain, mig: &m}
			if d.Isolation != "" && !d.AdminAccess && iso == "" {
				iso = configapi.Isolation(d.Isolation)
			}
			continue
		}
		_, kind, err := model.ParseDevice(d.Device)
		if err != nil {
			return nil, deviceError(d.Device, "%v", err)
		}
		shared := kind != model.KindWhole
		devs[i] = plannedDevice{
			request: d.Request, pool: d.Pool, device: d.Device, shareID: types.UID(d.ShareID),
			adminAccess: d.AdminAccess, gpu: g, shared: shared, lent: kind == model.KindLent, lend: d.Lend,
			isolation: configapi.Isolation(d.Isolation), memoryLimit: d.MemoryLimit, coresLimit: d.CoresLimit,
			mpsDomain: d.MPSDomain,
		}
		if shared && !d.AdminAccess && iso == "" {
			iso = configapi.Isolation(d.Isolation)
		}
		if len(d.CDIDeviceIDs) > 1 {
			toolkit[i] = d.CDIDeviceIDs[0]
		}
	}
	if len(devs) == 0 {
		return nil, errors.New("the record has no devices")
	}
	return p.editsFor(c.UID, devs, iso, func(d plannedDevice) (string, error) {
		return toolkit[slices.IndexFunc(devs, func(x plannedDevice) bool { return x.device == d.device && x.shareID == d.shareID })], nil
	})
}

// rollback undoes every effect of a (possibly partial) prepare recorded in c:
// MPS holds, the CDI spec, the checkpoint entry and the grants. Each step is
// idempotent, so rolling back twice, or something that never happened, is
// fine. The checkpoint entry is deleted last, and only if everything else
// succeeded, so that a failed rollback is retried from it.
func (p *Plugin) rollback(ctx context.Context, c checkpoint.Claim) error {
	var errs []error
	for _, key := range mpsDaemons(c) {
		if p.opts.MPS == nil {
			continue
		}
		if err := p.opts.MPS.Release(ctx, key.GPU, key.Domain, c.UID); err != nil {
			errs = append(errs, err)
		}
	}
	if err := p.opts.Specs.Remove(c.UID); err != nil {
		errs = append(errs, err)
	}
	// After the spec: a spec never names a directory that is gone.
	if err := p.opts.HAMiCore.RemoveClaimDir(c.UID); err != nil {
		errs = append(errs, err)
	}
	// After the spec too: the compute instance, then the GPU instance.
	if err := p.destroyMIG(ctx, c); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		// ErrNotDurable: the entry is gone from memory and disk, only a
		// power loss could bring it back; the rollback is done.
		if err := p.opts.Store.Delete(c.UID); err != nil && !errors.Is(err, checkpoint.ErrNotDurable) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	p.grants.release(c.UID)
	return nil
}

// mpsDaemons are the MPS daemons the claim holds (or may hold): one per GPU
// of its MPS shares, of the domain its record names.
func mpsDaemons(c checkpoint.Claim) []isolation.DaemonKey {
	var out []isolation.DaemonKey
	for _, d := range c.Devices {
		key := isolation.DaemonKey{GPU: d.UUID, Domain: d.MPSDomain}
		if d.MIG != nil {
			if !d.MIG.Created() {
				continue // no instance, no daemon
			}
			key.GPU = d.MIG.UUID // MPS inside a MIG device
		}
		if d.Isolation == string(configapi.IsolationMPS) && !slices.Contains(out, key) {
			out = append(out, key)
		}
	}
	return out
}

func checkpointDevices(pl *plan) []checkpoint.Device {
	out := make([]checkpoint.Device, len(pl.devices))
	for i, d := range pl.devices {
		out[i] = checkpoint.Device{
			Request:        d.request,
			Pool:           d.pool,
			Device:         d.device,
			ShareID:        string(d.shareID),
			UUID:           d.gpu.UUID,
			Minor:          d.gpu.Minor,
			Isolation:      string(d.isolation),
			MemoryLimit:    d.memoryLimit,
			CoresLimit:     d.coresLimit,
			AdminAccess:    d.adminAccess,
			ConsumedMemory: d.consumedMemory,
			ConsumedCores:  d.consumedCores,
			Lend:           d.lend && !d.adminAccess,
			MPSDomain:      d.mpsDomain,
		}
		if d.mig != nil {
			m := *d.mig
			out[i].MIG = &m
		}
	}
	return out
}

// grantRequests are the holds a checkpointed claim has on its GPUs, by the
// accounting rule: a share holds what it consumed, admin access nothing.
func grantRequests(c checkpoint.Claim) []grantRequest {
	var reqs []grantRequest
	for _, cd := range c.Devices {
		d, ok := accounting.FromCheckpoint(cd)
		if !ok || d.AdminAccess {
			continue
		}
		reqs = append(reqs, grantRequest{minor: cd.Minor, shared: d.Shared, memory: d.Consumed.MemoryBytes, cores: d.Consumed.Cores})
	}
	return reqs
}

// memoryOf is the memory of a GPU in the inventory, for the capacity check:
// NVML's total when known, not the usable memory the node publishes. The
// scheduler already holds new allocations to the published figure; this
// check only stops double grants, and must still take claims the scheduler
// allocated against a larger figure published earlier (NVML's total before
// an upgrade, less reserved memory before a driver update), which would
// otherwise never start.
func (p *Plugin) memoryOf(minor int) (int64, bool) {
	g, ok := p.gpuByMinor(minor)
	if !ok {
		return 0, false
	}
	switch {
	case g.MemoryTotalBytes > g.MemoryBytes:
		return int64(g.MemoryTotalBytes), true
	case g.MemoryBytes > 0:
		return int64(g.MemoryBytes), true
	}
	return 0, false
}

// resultDevices is what the kubelet gets for a prepared claim, built from the
// checkpoint so that a repeated prepare answers exactly the same.
func resultDevices(c checkpoint.Claim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(c.Devices))
	for _, d := range c.Devices {
		dev := kubeletplugin.Device{
			Requests:     []string{d.Request},
			PoolName:     d.Pool,
			DeviceName:   d.Device,
			CDIDeviceIDs: slices.Clone(d.CDIDeviceIDs),
		}
		if d.ShareID != "" {
			id := types.UID(d.ShareID)
			dev.ShareID = &id
		}
		out = append(out, dev)
	}
	return out
}
