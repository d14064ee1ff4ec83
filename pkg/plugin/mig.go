package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/mig"
	"github.com/tessera-dev/tessera/pkg/model"
)

// MIG devices (docs/mig.md). A MIG device is exclusive, like a whole GPU:
// one claim holds it, and a container that references it gets that compute
// instance and nothing else of its GPU.
//
//   - Static MIG (gpu-N-mig-<GI>-<CI>): the instance is an admin's. Prepare
//     reads it from NVML (not from the last discovery) and fails if it is
//     gone; unprepare leaves it.
//   - Dynamic MIG (gpu-N-mig-<profile>-<start>): prepare records the intent
//     (GPU, profile, placement) in the checkpoint as PrepareStarted before
//     it creates the GPU instance at exactly the allocated placement and its
//     full compute instance, then records the IDs and the MIG UUID (still
//     PrepareStarted) before it writes the CDI spec. Unprepare and rollback
//     destroy the compute instance, then the GPU instance. The instance is
//     found by placement and profile, never by its IDs alone.
//   - At start, instances of checkpointed claims are adopted, and on
//     dynamic-MIG GPUs instances no record holds are destroyed when no
//     process runs on them, or kept and reported when one does (the model
//     publishes their slices as taken).
//
// Isolation on a MIG device is the hardware's. MPS inside one MIG device is
// allowed when the claim's or class's config asks for it (one daemon per MIG
// device and trust domain, CUDA_VISIBLE_DEVICES=MIG-<uuid>); HAMiCore and
// DriverMemory are refused. MIG devices are never lent.

// MIGInstances creates, reads and destroys MIG instances; *mig.NVML is the
// real one (over a mock node in tests and mock mode).
type MIGInstances interface {
	// Read returns the GPU's MIG state now.
	Read(uuid string) (gpu.GPU, error)
	// Create makes (or finds) the instance of the profile at the
	// placement with its full compute instance.
	Create(uuid string, profileID int, pl gpu.MIGPlacement) (mig.Created, error)
	// Destroy destroys the instance of the profile at the placement;
	// false when there is none. It refuses (mig.ErrInUse) while a process
	// runs on it.
	Destroy(uuid string, profileID int, pl gpu.MIGPlacement) (bool, error)
	// DestroyInstance destroys an instance Read listed.
	DestroyInstance(g gpu.GPU, in gpu.MIGInstance) error
}

var _ MIGInstances = (*mig.NVML)(nil)

// DynamicMIG names the GPUs published with dynamic MIG (--dynamic-mig):
// every GPU, or those named by NVML index or UUID. A named GPU that is not
// in MIG mode is published as usual and reported. The zero value names
// none: every MIG-mode GPU is static.
type DynamicMIG struct {
	All   bool
	Names []string
}

// ParseDynamicMIG reads --dynamic-mig: "all", or NVML indexes and GPU UUIDs
// ("0", "GPU-…").
func ParseDynamicMIG(values []string) (DynamicMIG, error) {
	var d DynamicMIG
	for _, v := range values {
		v = strings.TrimSpace(v)
		switch {
		case v == "":
		case strings.EqualFold(v, "all"):
			d.All = true
		case strings.HasPrefix(v, "GPU-"):
			d.Names = append(d.Names, v)
		default:
			if i, err := strconv.Atoi(v); err != nil || i < 0 || strconv.Itoa(i) != v {
				return DynamicMIG{}, fmt.Errorf("%q: want \"all\", an NVML index or a GPU UUID (GPU-…)", v)
			}
			d.Names = append(d.Names, v)
		}
	}
	if d.All && len(d.Names) > 0 {
		return DynamicMIG{}, fmt.Errorf("\"all\" and GPU names together: give one or the other")
	}
	return d, nil
}

// Named reports whether g is named (whatever its MIG mode).
func (d DynamicMIG) Named(g gpu.GPU) bool {
	return d.All || slices.Contains(d.Names, g.UUID) || slices.Contains(d.Names, strconv.Itoa(g.Index))
}

// Resolve returns the UUIDs of the GPUs published with dynamic MIG (named
// and in MIG mode), the named GPUs not in MIG mode, and the names that are
// no GPU of gpus.
func (d DynamicMIG) Resolve(gpus []gpu.GPU) (dynamic []string, notMIG []gpu.GPU, unknown []string) {
	for _, g := range gpus {
		switch {
		case !d.Named(g):
		case g.MIGEnabled:
			dynamic = append(dynamic, g.UUID)
		default:
			notMIG = append(notMIG, g)
		}
	}
	for _, n := range d.Names {
		if !slices.ContainsFunc(gpus, func(g gpu.GPU) bool { return g.UUID == n || strconv.Itoa(g.Index) == n }) {
			unknown = append(unknown, n)
		}
	}
	return dynamic, notMIG, unknown
}

// dynamicMIG reports whether g is published with dynamic MIG.
func (p *Plugin) dynamicMIG(g gpu.GPU) bool { return g.MIGEnabled && p.opts.DynamicMIG.Named(g) }

// FailpointMIGAfterCreate is the failpoint (environment variable
// TESSERA_FAILPOINT) at which the plugin kills itself with SIGKILL: right
// after it created a dynamic MIG instance, before it records the IDs. The
// intent is recorded; the next start finds the instance by placement and
// destroys it. For the end-to-end test of a crash; never set in production.
const FailpointMIGAfterCreate = "mig-after-create"

// FailpointEnv is the environment variable that arms a failpoint.
const FailpointEnv = "TESSERA_FAILPOINT"

// FailpointOnceEnv, when set, names a file that makes the failpoint fire
// once: only while the file does not exist, which it creates before the
// kill. A plugin restarted with the same environment (the kubelet restarts
// the container of the killed process) then runs on.
const FailpointOnceEnv = "TESSERA_FAILPOINT_ONCE"

// envFailpoint kills the process at the failpoint TESSERA_FAILPOINT names.
func envFailpoint(ctx context.Context, name string) {
	if os.Getenv(FailpointEnv) != name {
		return
	}
	if once := os.Getenv(FailpointOnceEnv); once != "" {
		f, err := os.OpenFile(once, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return // fired before (or cannot tell: do not kill)
		}
		_ = f.Sync()
		_ = f.Close()
	}
	klog.FromContext(ctx).Info("FAILPOINT: killing the plugin with SIGKILL", "failpoint", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not delivered synchronously
}

// planMIG checks one MIG device result and fills in its MIG device: for a
// static device the instance as NVML has it now, for a dynamic one the
// instance to create. cfg is the request's merged config and source who
// chose its isolation.
func (p *Plugin) planMIG(claim *resourceapi.ResourceClaim, d *plannedDevice, name model.MIGDeviceName, cfg *configapi.GpuConfig, source isolationSource) error {
	g := d.gpu
	if !g.MIGEnabled || g.MIG == nil {
		return deviceError(d.device, "GPU %s (index %d) is not in MIG mode now: its MIG devices are gone (was MIG disabled since the claim was allocated?)", g.UUID, g.Index)
	}
	// MIG devices are never lent: a GPU in MIG mode publishes no lending
	// device, and an owner's consent would promise what cannot happen.
	if cfg.LendsWhenIdle() && !d.adminAccess {
		return deviceError(d.device, "request %q: lending.lendWhenIdle is refused on a MIG device: MIG devices are never lent; remove it from the MIG request's config", d.request)
	}
	// MIG is the isolation: only MPS may run inside a MIG device, and
	// only when a config asks for it (the node's default is for shares).
	// Admin access observes the device and gets no backend.
	if source != isolationFromNode && !d.adminAccess {
		switch iso := cfg.Sharing.Isolation; iso {
		case configapi.IsolationMPS:
			d.isolation, d.mpsDomain = iso, claim.Namespace
		case configapi.IsolationAdvisory, "":
		default:
			return deviceError(d.device, "request %q: isolation %s (%s) is refused on a MIG device: the MIG instance is the isolation (its own memory, cache and SMs in hardware); %s", d.request, iso, sourceName(source), migIsolationHint(iso))
		}
	}
	if name.Static {
		return p.planStaticMIG(d, name)
	}
	return p.planDynamicMIG(d, name)
}

func sourceName(s isolationSource) string {
	if s == isolationFromClaim {
		return "set by the claim's config"
	}
	return "set by the device class's config"
}

func migIsolationHint(iso configapi.Isolation) string {
	switch iso {
	case configapi.IsolationHAMiCore:
		return "HAMi-core's limits would only cut the instance's own memory and SMs further; ask for a smaller profile instead"
	case configapi.IsolationDriverMemory:
		return "the driver limits memory per GPU, not per MIG device; ask for a smaller profile instead"
	}
	return "remove sharing.isolation from the MIG request's config"
}

// planStaticMIG fills in the existing compute instance of a static MIG
// device, read from NVML now.
func (p *Plugin) planStaticMIG(d *plannedDevice, name model.MIGDeviceName) error {
	g := d.gpu
	if p.opts.MIG != nil {
		now, err := p.opts.MIG.Read(g.UUID)
		if err != nil {
			return deviceError(d.device, "read the GPU's MIG instances: %v", err)
		}
		if !now.MIGEnabled || now.MIG == nil {
			return deviceError(d.device, "GPU %s (index %d) is not in MIG mode now: its MIG devices are gone", g.UUID, g.Index)
		}
		g.MIG = now.MIG
	}
	gi, ci, ok := g.MIG.ComputeInstance(name.GPUInstance, name.ComputeInstance)
	if !ok {
		return deviceError(d.device, "GPU %s has no compute instance %d in GPU instance %d now (destroyed since it was published?)", g.UUID, name.ComputeInstance, name.GPUInstance)
	}
	if ci.UUID == "" {
		return deviceError(d.device, "compute instance %d of GPU instance %d has no MIG device UUID (%s)", ci.ID, gi.ID, g.MIGError)
	}
	memory := ci.MemoryBytes
	if p, ok := g.MIG.Profile(gi.ProfileID); ok && memory == 0 {
		memory = p.MemoryBytes
	}
	d.mig = &checkpoint.MIGDevice{
		Profile: gi.ProfileName, ProfileID: gi.ProfileID, Start: gi.Placement.Start, Size: gi.Placement.Size,
		UUID: ci.UUID, GPUInstance: gi.ID, ComputeInstance: ci.ID,
		GPUInstanceMinor: max(gi.AccessMinor, 0), ComputeInstanceMinor: max(ci.AccessMinor, 0), MemoryBytes: int64(min(memory, uint64(1<<63-1))),
	}
	return nil
}

// planDynamicMIG fills in the instance a dynamic MIG device is to get.
func (p *Plugin) planDynamicMIG(d *plannedDevice, name model.MIGDeviceName) error {
	g := d.gpu
	switch {
	case !p.dynamicMIG(g):
		return deviceError(d.device, "GPU %s (index %d) is not published with dynamic MIG on node %s now (--dynamic-mig): no instance is created for a placement", g.UUID, g.Index, p.opts.NodeName)
	case p.opts.MIG == nil:
		return deviceError(d.device, "this plugin cannot create MIG instances (no NVML)")
	case d.adminAccess:
		return deviceError(d.device, "admin access to a dynamic MIG placement: there is no instance to observe (admin access gets static MIG devices and whole GPUs)")
	}
	for _, prof := range g.MIG.Profiles {
		if model.MIGProfileSlug(prof.Name) != name.ProfileSlug {
			continue
		}
		for _, pl := range prof.Placements {
			if pl.Start != name.Start {
				continue
			}
			d.mig = &checkpoint.MIGDevice{
				Dynamic: true, Profile: prof.Name, ProfileID: prof.ID, Start: pl.Start, Size: pl.Size,
				MemoryBytes: int64(min(prof.MemoryBytes, uint64(1<<63-1))),
			}
			return nil
		}
		return deviceError(d.device, "GPU %s: profile %s has no placement at memory slice %d", g.UUID, prof.Name, name.Start)
	}
	return deviceError(d.device, "GPU %s has no MIG profile %q", g.UUID, name.ProfileSlug)
}

// migPlacement is the placement of a MIG device record.
func migPlacement(m *checkpoint.MIGDevice) gpu.MIGPlacement {
	return gpu.MIGPlacement{Start: m.Start, Size: m.Size}
}

// hasUncreatedMIG reports whether the plan has a dynamic MIG device whose
// instance is not made yet.
func hasUncreatedMIG(pl *plan) bool {
	return slices.ContainsFunc(pl.devices, func(d plannedDevice) bool { return d.mig != nil && d.mig.Dynamic && !d.mig.Created() })
}

// admitMIG refuses a claim whose MIG devices another checkpointed claim
// holds: the same static instance, or a dynamic placement overlapping
// another's on the same GPU. The scheduler never allocates such a pair;
// this is the last line of defence, like the double-grant index.
func (p *Plugin) admitMIG(claim *resourceapi.ResourceClaim, pl *plan) error {
	for _, d := range pl.devices {
		if d.mig == nil || d.adminAccess {
			continue
		}
		for _, c := range p.opts.Store.List() {
			if c.UID == claim.UID {
				continue
			}
			for _, cd := range c.Devices {
				if cd.MIG == nil || cd.AdminAccess || cd.UUID != d.gpu.UUID || !migOverlap(cd.MIG, d.mig) {
					continue
				}
				return &grantConflict{
					msg: fmt.Sprintf("device %s: %s %s at memory slices %d-%d of GPU %s is already prepared for claim %s (device %s); refusing to also give it to claim %s/%s (uid %s)",
						d.device, migKind(d.mig), d.mig.Profile, d.mig.Start, d.mig.Start+d.mig.Size-1, d.gpu.UUID, c, cd.Device, claim.Namespace, claim.Name, claim.UID),
					holders: []types.UID{c.UID},
				}
			}
		}
	}
	return nil
}

func migKind(m *checkpoint.MIGDevice) string {
	if m.Dynamic {
		return "the dynamic MIG instance"
	}
	return "the MIG instance"
}

// migOverlap reports whether two MIG devices of one GPU collide: static ones
// when they are the same compute instance, otherwise when their placements
// share a memory slice.
func migOverlap(a, b *checkpoint.MIGDevice) bool {
	if !a.Dynamic && !b.Dynamic {
		return a.GPUInstance == b.GPUInstance && a.ComputeInstance == b.ComputeInstance && a.Start == b.Start
	}
	return migPlacement(a).Overlaps(migPlacement(b))
}

// createMIG creates the instances of the claim's dynamic MIG devices, whose
// intent record is in the checkpoint, and records their IDs (still
// PrepareStarted). On error the caller rolls back, which destroys what was
// made.
func (p *Plugin) createMIG(ctx context.Context, record *checkpoint.Claim, pl *plan) error {
	created := false
	for i := range pl.devices {
		d := &pl.devices[i]
		if d.mig == nil || !d.mig.Dynamic || d.mig.Created() {
			continue
		}
		c, err := p.opts.MIG.Create(d.gpu.UUID, d.mig.ProfileID, migPlacement(d.mig))
		if err != nil {
			return deviceError(d.device, "create the MIG instance: %v", err)
		}
		p.failpoint(ctx, FailpointMIGAfterCreate)
		klog.FromContext(ctx).V(2).Info("Created MIG instance", "gpu", d.gpu.UUID, "profile", c.Profile, "start", c.Placement.Start,
			"gpuInstance", c.GPUInstance, "computeInstance", c.ComputeInstance, "uuid", c.UUID, "existed", c.Existed, "driver", c.Driver)
		d.mig.UUID, d.mig.GPUInstance, d.mig.ComputeInstance = c.UUID, c.GPUInstance, c.ComputeInstance
		d.mig.GPUInstanceMinor, d.mig.ComputeInstanceMinor = max(c.GPUInstanceMinor, 0), max(c.ComputeInstanceMinor, 0)
		if c.MemoryBytes > 0 {
			d.mig.MemoryBytes = int64(min(c.MemoryBytes, uint64(1<<63-1)))
		}
		m := *d.mig
		record.Devices[i].MIG = &m
		created = true
	}
	if !created {
		return nil
	}
	if err := p.opts.Store.Put(*record); err != nil {
		return fmt.Errorf("record the MIG instances in the checkpoint: %w", err)
	}
	p.migChanged()
	return nil
}

// destroyMIG destroys the dynamic MIG instances of claim c (rollback and
// unprepare): each found by GPU, placement and profile, whether or not its
// IDs were recorded. An instance that another claim's record holds is not
// this claim's and is left; one with processes is refused (the error wraps
// mig.ErrInUse, and the claim stays recorded for a retry).
func (p *Plugin) destroyMIG(ctx context.Context, c checkpoint.Claim) error {
	var errs []error
	changed := false
	for _, d := range c.Devices {
		if d.MIG == nil || !d.MIG.Dynamic {
			continue
		}
		if holder, ok := p.migHolder(c.UID, d); ok {
			klog.FromContext(ctx).Info("Not destroying a MIG instance another claim holds", "claim", c.String(), "device", d.Device, "holder", holder)
			continue
		}
		if p.opts.MIG == nil {
			errs = append(errs, deviceError(d.Device, "cannot destroy its MIG instance: this plugin has no NVML"))
			continue
		}
		destroyed, err := p.opts.MIG.Destroy(d.UUID, d.MIG.ProfileID, migPlacement(d.MIG))
		if err != nil {
			errs = append(errs, fmt.Errorf("device %s: destroy the MIG instance: %w", d.Device, err))
			continue
		}
		if destroyed {
			changed = true
			klog.FromContext(ctx).V(2).Info("Destroyed MIG instance", "claim", c.String(), "gpu", d.UUID, "profile", d.MIG.Profile, "start", d.MIG.Start)
		}
	}
	if changed {
		p.migChanged()
	}
	return errors.Join(errs...)
}

// migHolder is another claim of the checkpoint whose MIG device collides
// with d (of claim uid).
func (p *Plugin) migHolder(uid types.UID, d checkpoint.Device) (string, bool) {
	for _, c := range p.opts.Store.List() {
		if c.UID == uid {
			continue
		}
		for _, cd := range c.Devices {
			if cd.MIG != nil && !cd.AdminAccess && cd.UUID == d.UUID && migOverlap(cd.MIG, d.MIG) {
				return c.String(), true
			}
		}
	}
	return "", false
}

// MIGHeld are the placements of the dynamic MIG instances the checkpoint's
// claims hold (or are about to create), by GPU UUID: the model's
// model.WithMIGHeld, so that their slices are not published as taken by a
// foreign instance.
func (p *Plugin) MIGHeld() map[string][]gpu.MIGPlacement {
	var out map[string][]gpu.MIGPlacement
	for _, c := range p.opts.Store.List() {
		for _, d := range c.Devices {
			if d.MIG == nil || !d.MIG.Dynamic || d.AdminAccess {
				continue
			}
			if out == nil {
				out = map[string][]gpu.MIGPlacement{}
			}
			if pl := migPlacement(d.MIG); !slices.Contains(out[d.UUID], pl) {
				out[d.UUID] = append(out[d.UUID], pl)
			}
		}
	}
	for uuid := range out {
		slices.SortFunc(out[uuid], func(a, b gpu.MIGPlacement) int { return a.Start - b.Start })
	}
	return out
}

// OnMIGChange sets what runs after the plugin created or destroyed a MIG
// instance (the inventory's Trigger: republish with the new instances).
func (p *Plugin) OnMIGChange(f func()) {
	p.migChangeMu.Lock()
	defer p.migChangeMu.Unlock()
	p.migChange = f
}

func (p *Plugin) migChanged() {
	p.migChangeMu.Lock()
	f := p.migChange
	p.migChangeMu.Unlock()
	if f != nil {
		f()
	}
}

// reconcileMIG brings the MIG instances in line with the checkpoint at
// start (see the top of this file): instances held by records are adopted
// (matched by placement and profile), a record whose instance is gone is
// reported, and on dynamic-MIG GPUs an instance no record holds is
// destroyed when no process runs on it, else kept (its slices stay out of
// use: the model publishes them as taken) and reported.
func (p *Plugin) reconcileMIG(ctx context.Context) {
	if p.opts.MIG == nil {
		return
	}
	logger := klog.FromContext(ctx)
	type held struct {
		claim string
		dev   checkpoint.Device
	}
	byGPU := map[string][]held{}
	for _, c := range p.opts.Store.List() {
		for _, d := range c.Devices {
			if d.MIG != nil && !d.AdminAccess {
				byGPU[d.UUID] = append(byGPU[d.UUID], held{claim: c.String(), dev: d})
			}
		}
	}
	p.gpusMu.RLock()
	gpus := make([]gpu.GPU, 0, len(p.gpus))
	for _, g := range p.gpus {
		gpus = append(gpus, g)
	}
	p.gpusMu.RUnlock()
	slices.SortFunc(gpus, func(a, b gpu.GPU) int { return a.Minor - b.Minor })
	for _, g := range gpus {
		if !g.MIGEnabled && len(byGPU[g.UUID]) == 0 {
			continue
		}
		now, err := p.opts.MIG.Read(g.UUID)
		if err != nil {
			logger.Error(err, "Reading MIG instances at start failed; they are neither adopted nor cleaned up", "gpu", g.UUID)
			p.event(corev1.EventTypeWarning, "MIGReconcileFailed", fmt.Sprintf("GPU %s: %v", g.UUID, err))
			continue
		}
		var instances []gpu.MIGInstance
		if now.MIGEnabled && now.MIG != nil {
			instances = now.MIG.Instances
		}
		adopted := make([]bool, len(instances))
		for _, h := range byGPU[g.UUID] {
			i := slices.IndexFunc(instances, func(in gpu.MIGInstance) bool {
				return in.Placement == migPlacement(h.dev.MIG) && in.ProfileID == h.dev.MIG.ProfileID
			})
			if i < 0 {
				if h.dev.MIG.Dynamic && !h.dev.MIG.Created() {
					continue // an intent whose rollback failed: nothing was made
				}
				msg := fmt.Sprintf("claim %s: device %s: its MIG instance (%s at memory slice %d of GPU %s) is gone; its containers have lost their MIG device", h.claim, h.dev.Device, h.dev.MIG.Profile, h.dev.MIG.Start, g.UUID)
				logger.Error(nil, "MIG instance of a prepared claim is gone", "claim", h.claim, "device", h.dev.Device)
				p.event(corev1.EventTypeWarning, "MIGInstanceMissing", msg)
				continue
			}
			adopted[i] = true
			in := instances[i]
			ciOK := slices.ContainsFunc(in.ComputeInstances, func(ci gpu.MIGComputeInstance) bool { return ci.UUID == h.dev.MIG.UUID })
			if h.dev.MIG.Created() && !ciOK {
				msg := fmt.Sprintf("claim %s: device %s: the MIG instance at memory slice %d of GPU %s is no longer MIG device %s (GPU instance %d now); its containers have lost their MIG device", h.claim, h.dev.Device, in.Placement.Start, g.UUID, h.dev.MIG.UUID, in.ID)
				logger.Error(nil, "MIG instance of a prepared claim changed", "claim", h.claim, "device", h.dev.Device)
				p.event(corev1.EventTypeWarning, "MIGInstanceChanged", msg)
				continue
			}
			logger.V(2).Info("Adopted MIG instance of a checkpointed claim", "claim", h.claim, "device", h.dev.Device, "gpuInstance", in.ID)
		}
		if !p.dynamicMIG(now) {
			continue
		}
		for i, in := range instances {
			if adopted[i] {
				continue
			}
			p.foreignMIG(ctx, now, in)
		}
	}
}

// foreignMIG handles an instance of a dynamic-MIG GPU that no record
// holds: destroyed when idle, kept and reported when a process runs on it
// (or when that cannot be read).
func (p *Plugin) foreignMIG(ctx context.Context, g gpu.GPU, in gpu.MIGInstance) {
	logger := klog.FromContext(ctx)
	procs, unknown := 0, false
	for _, ci := range in.ComputeInstances {
		if ci.Processes < 0 {
			unknown = true
		}
		procs += max(ci.Processes, 0)
	}
	where := fmt.Sprintf("GPU %s (index %d): MIG GPU instance %d (%s at memory slices %d-%d)", g.UUID, g.Index, in.ID, in.ProfileName, in.Placement.Start, in.Placement.Start+in.Placement.Size-1)
	if procs > 0 || unknown {
		state := fmt.Sprintf("%d processes run on it", procs)
		if unknown {
			state = "its processes cannot be read"
		}
		msg := where + " is held by no claim and " + state + ": it is kept, and its slices are published as taken until it is gone (an admin's instance on a dynamic-MIG GPU; destroy it with nvidia-smi mig -i " +
			strconv.Itoa(g.Index) + " -dci -gi " + strconv.Itoa(in.ID) + " and -dgi -gi " + strconv.Itoa(in.ID) + " once its work is done)"
		logger.Info("Foreign MIG instance with processes kept", "gpu", g.UUID, "gpuInstance", in.ID, "profile", in.ProfileName, "start", in.Placement.Start, "processes", procs, "unknown", unknown)
		p.event(corev1.EventTypeWarning, "MIGInstanceForeign", msg)
		return
	}
	if err := p.opts.MIG.DestroyInstance(g, in); err != nil {
		logger.Error(err, "Destroying an orphaned MIG instance failed", "gpu", g.UUID, "gpuInstance", in.ID)
		p.event(corev1.EventTypeWarning, "MIGOrphanNotDestroyed", fmt.Sprintf("%s is held by no claim, runs no process, and could not be destroyed: %v", where, err))
		return
	}
	msg := where + " was held by no claim and ran no process: destroyed (left by a prepare that did not finish, or by a release without MIG)"
	logger.Info("Destroyed orphaned MIG instance", "gpu", g.UUID, "gpuInstance", in.ID, "profile", in.ProfileName, "start", in.Placement.Start)
	p.event(corev1.EventTypeNormal, "MIGOrphanDestroyed", msg)
	p.migChanged()
}

// migEdits are the CDI edits of MIG device d (created): its environment
// (isolation.MIGDeviceEdits), CUDA_VISIBLE_DEVICES when the claim is made
// of MIG devices only (visible), and on real nodes its device nodes (the
// parent's /dev/nvidia<minor>, nvidiactl, nvidia-uvm and the two capability
// nodes, made on the host if missing) and the driver's libraries: the
// toolkit spec's common edits, or on a legacy-mode NVIDIA runtime the
// device-list mount. Mock nodes get the environment only (no node is made
// on the host).
func (p *Plugin) migEdits(d plannedDevice, visible []string) (cdispec.ContainerEdits, error) {
	m := isolation.MIGDevice{
		UUID: d.mig.UUID, ParentUUID: d.gpu.UUID, Minor: d.gpu.Minor, GPUInstance: d.mig.GPUInstance, ComputeInstance: d.mig.ComputeInstance,
		Profile: d.mig.Profile, GPUInstanceMinor: d.mig.GPUInstanceMinor, ComputeInstanceMinor: d.mig.ComputeInstanceMinor,
	}
	var common cdispec.ContainerEdits
	legacy := false
	if !p.opts.Mock {
		var err error
		if common, legacy, err = p.migLibraries(d); err != nil {
			return cdispec.ContainerEdits{}, err
		}
	}
	edits, err := isolation.MIGDeviceEdits(m, legacy)
	if err != nil {
		return cdispec.ContainerEdits{}, deviceError(d.device, "%v", err)
	}
	if len(visible) > 0 && d.isolation != configapi.IsolationMPS {
		edits.Env = append(edits.Env, isolation.MIGVisibleDevices(visible))
	}
	if p.opts.Mock {
		return edits, nil
	}
	nodes, err := p.opts.DevNodes.Nodes(d.gpu.Minor)
	if err != nil {
		return cdispec.ContainerEdits{}, deviceError(d.device, "%v", err)
	}
	caps, err := p.opts.DevNodes.CapabilityNodes(isolation.MIGCapabilities(m))
	if err != nil {
		return cdispec.ContainerEdits{}, deviceError(d.device, "%v", err)
	}
	// The toolkit's edits first, so that ours win where both set one.
	out := common
	out.Env = append(out.Env, edits.Env...)
	out.Mounts = append(out.Mounts, edits.Mounts...)
	out.DeviceNodes = append(append(out.DeviceNodes, nodes...), caps...)
	return out, nil
}

// migLibraries is where a MIG device's driver libraries come from on a
// real node: the toolkit spec's common edits, else (legacy true) the
// legacy-mode NVIDIA runtime. Neither fails closed, as for whole GPUs.
func (p *Plugin) migLibraries(d plannedDevice) (common cdispec.ContainerEdits, legacy bool, err error) {
	ok := false
	if p.opts.Toolkit != nil {
		if common, ok, err = p.opts.Toolkit.CommonEdits(); err != nil {
			return cdispec.ContainerEdits{}, false, deviceError(d.device, "read the NVIDIA container toolkit's CDI spec: %v", err)
		}
	}
	switch {
	case ok:
		return common, false, nil
	case p.opts.LegacyRuntime:
		return cdispec.ContainerEdits{}, true, nil
	}
	return cdispec.ContainerEdits{}, false, deviceError(d.device, "no NVIDIA container toolkit CDI spec (looked in %s) to take the driver's libraries from; "+
		"without it the container would get the MIG device's nodes but not the driver's libraries. "+
		"Generate the spec on the node (nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml), "+
		"or start the plugin with --legacy-nvidia-runtime if the node's runtime is the NVIDIA runtime in legacy mode",
		strings.Join(p.opts.ToolkitSpecDirs, ", "))
}

// checkMIGEdits checks, before any instance is created, what the edits of
// the plan's MIG devices will need on a real node: the driver's libraries
// and the parent's device nodes. The capability nodes can only be looked
// for once the instance exists.
func (p *Plugin) checkMIGEdits(pl *plan) error {
	for _, d := range pl.devices {
		if d.mig == nil || p.opts.Mock {
			continue
		}
		if _, _, err := p.migLibraries(d); err != nil {
			return err
		}
		if _, err := p.opts.DevNodes.Nodes(d.gpu.Minor); err != nil {
			return deviceError(d.device, "%v", err)
		}
	}
	if pl.isolation == configapi.IsolationMPS {
		if p.opts.MPS == nil {
			return deviceError(pl.devices[0].device, "isolation MPS is not available on this node (no MPS root configured)")
		}
		if len(pl.devices) != 1 {
			return deviceError(pl.devices[0].device, "isolation MPS: the claim has %d devices; an MPS claim must be exactly one share or MIG device (its limits are per process, for the one device CUDA uses)", len(pl.devices))
		}
	}
	return nil
}
