package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
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
//   - Static MIG (gpu-N-mig-<GI>; gpu-N-mig-<GI>-<CI> from releases that
//     published one device per compute instance): the GPU instance is an
//     admin's, and the claim gets it whole, with all its compute instances.
//     Prepare reads it from NVML (not from the last discovery), fails if it
//     is gone or is not the instance the plugin published under that name
//     (profile, placement, MIG UUIDs); unprepare leaves it.
//   - Dynamic MIG (gpu-N-mig-<profile>-<start>): prepare reads NVML and
//     refuses a placement any instance covers, then records the intent
//     (GPU, profile, placement) in the checkpoint as PrepareStarted, creates
//     the GPU instance at exactly the allocated placement and its full
//     compute instance (never taking over one that is there: mig.Create),
//     then records the IDs and the MIG UUID (still PrepareStarted) before it
//     writes the CDI spec. Unprepare and rollback destroy the compute
//     instance, then the GPU instance, found by placement and profile and,
//     once recorded, its MIG UUID: an instance at the placement without it
//     is not the claim's, is left, and the record is dropped.
//   - At start, instances of checkpointed claims are adopted. Nothing else
//     is destroyed: an instance no record names is foreign (an admin's, or
//     another tool's), kept, reported once, and on a dynamic-MIG GPU its
//     slices are published as taken. A crash between a create and the
//     record of its IDs leaves the intent record, whose rollback destroys
//     the instance.
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
	// Create makes the instance of the profile at the placement with its
	// full compute instance; own is the MIG UUID recorded for it before
	// ("" if none). Any other instance over the placement is refused
	// (mig.ErrOccupied).
	Create(uuid string, profileID int, pl gpu.MIGPlacement, own string) (mig.Created, error)
	// Destroy destroys the instance of the profile at the placement;
	// false when there is none. Given the recorded MIG UUID it destroys
	// only the instance that has it (mig.ErrChanged). It refuses
	// (mig.ErrInUse) while a process runs on it.
	Destroy(uuid string, profileID int, pl gpu.MIGPlacement, migUUID string) (bool, error)
}

var _ MIGInstances = (*mig.NVML)(nil)

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
	// The kernel drops signals a container's init process (PID 1, the
	// plugin in its pod) sends itself, SIGKILL included: exit at once
	// instead, running nothing more, as a kill would.
	time.Sleep(100 * time.Millisecond)
	os.Exit(137)
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

// planStaticMIG fills in the existing GPU instance of a static MIG device,
// read from NVML now, with all its compute instances. Device names are GPU
// instance IDs, which the driver reuses: the instance must still be the one
// the plugin published under the name (its last inventory: profile,
// placement and MIG UUIDs), not one an admin made since with the same ID.
// A name of the older form gpu-N-mig-<GI>-<CI> (allocated before an
// upgrade) gets the same GPU instance, provided it still has that compute
// instance.
func (p *Plugin) planStaticMIG(d *plannedDevice, name model.MIGDeviceName) error {
	g := d.gpu
	published, wasPublished := migInstanceByID(g.MIG, name.GPUInstance)
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
	gi, ok := migInstanceByID(g.MIG, name.GPUInstance)
	switch {
	case !ok:
		return deviceError(d.device, "GPU %s has no GPU instance %d now (destroyed since it was published?)", g.UUID, name.GPUInstance)
	case len(gi.ComputeInstances) == 0:
		return deviceError(d.device, "GPU %s: GPU instance %d has no compute instance now (destroyed since it was published?)", g.UUID, gi.ID)
	case name.ComputeInstance >= 0 && !slices.ContainsFunc(gi.ComputeInstances, func(ci gpu.MIGComputeInstance) bool { return ci.ID == name.ComputeInstance }):
		return deviceError(d.device, "GPU %s has no compute instance %d in GPU instance %d now (destroyed since it was published?)", g.UUID, name.ComputeInstance, gi.ID)
	case !wasPublished:
		return deviceError(d.device, "GPU %s: GPU instance %d (%s at memory slices %d-%d) is not one this plugin published: it was made after the inventory the claim was allocated from; refusing to hand out an instance the scheduler did not see",
			g.UUID, gi.ID, gi.ProfileName, gi.Placement.Start, gi.Placement.Start+gi.Placement.Size-1)
	}
	if why := migInstanceChanged(published, gi); why != "" {
		return deviceError(d.device, "GPU %s: GPU instance %d is not the instance published under this name (%s): it was destroyed and another made with its ID since; the plugin republishes, and the claim needs a new allocation", g.UUID, gi.ID, why)
	}
	for _, ci := range gi.ComputeInstances {
		if ci.UUID == "" {
			return deviceError(d.device, "compute instance %d of GPU instance %d has no MIG device UUID (%s)", ci.ID, gi.ID, g.MIGError)
		}
	}
	if d.isolation == configapi.IsolationMPS && len(gi.ComputeInstances) > 1 {
		return deviceError(d.device, "request %q: isolation MPS on GPU instance %d, which has %d compute instances: an MPS daemon serves one MIG device; ask for a GPU instance with one compute instance (attribute computeInstances == 1)", d.request, gi.ID, len(gi.ComputeInstances))
	}
	first := gi.ComputeInstances[0]
	memory := first.MemoryBytes
	if p, ok := g.MIG.Profile(gi.ProfileID); ok && memory == 0 {
		memory = p.MemoryBytes
	}
	d.mig = &checkpoint.MIGDevice{
		Profile: gi.ProfileName, ProfileID: gi.ProfileID, Start: gi.Placement.Start, Size: gi.Placement.Size,
		UUID: first.UUID, GPUInstance: gi.ID, ComputeInstance: first.ID,
		GPUInstanceMinor: max(gi.AccessMinor, 0), ComputeInstanceMinor: max(first.AccessMinor, 0), MemoryBytes: int64(min(memory, uint64(1<<63-1))),
	}
	for _, ci := range gi.ComputeInstances[1:] {
		d.mig.OtherComputeInstances = append(d.mig.OtherComputeInstances, checkpoint.MIGComputeInstance{ID: ci.ID, UUID: ci.UUID, Minor: max(ci.AccessMinor, 0)})
	}
	return nil
}

// migInstanceByID is GPU instance id of m.
func migInstanceByID(m *gpu.MIG, id int) (gpu.MIGInstance, bool) {
	if m == nil {
		return gpu.MIGInstance{}, false
	}
	i := slices.IndexFunc(m.Instances, func(in gpu.MIGInstance) bool { return in.ID == id })
	if i < 0 {
		return gpu.MIGInstance{}, false
	}
	return m.Instances[i], true
}

// migInstanceChanged says how GPU instance now differs from the one
// published with its ID ("" when it does not): profile, placement, or the
// MIG UUIDs of its compute instances (fresh for every instance created).
func migInstanceChanged(published, now gpu.MIGInstance) string {
	if published.ProfileID != now.ProfileID || published.Placement != now.Placement {
		return fmt.Sprintf("published as %s at memory slices %d-%d, now %s at %d-%d", published.ProfileName, published.Placement.Start, published.Placement.Start+published.Placement.Size-1,
			now.ProfileName, now.Placement.Start, now.Placement.Start+now.Placement.Size-1)
	}
	var was, is []string
	for _, ci := range published.ComputeInstances {
		was = append(was, ci.UUID)
	}
	for _, ci := range now.ComputeInstances {
		is = append(is, ci.UUID)
	}
	if !slices.Equal(was, is) {
		return fmt.Sprintf("published with MIG devices %v, now %v", was, is)
	}
	return ""
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

// migOverlap reports whether two MIG devices of one GPU collide: when their
// placements share a memory slice. Two static devices of one GPU instance
// (its compute instances, as records of releases that published one device
// per compute instance name them) collide: they share its memory, L2 cache
// and engines, so they are one tenant's or none's.
func migOverlap(a, b *checkpoint.MIGDevice) bool {
	return migPlacement(a).Overlaps(migPlacement(b))
}

// checkMIGFree reads NVML for every dynamic MIG device of the plan whose
// instance is not made yet and refuses one whose placement an instance
// covers, naming it: the intent recorded next would otherwise name an
// instance the claim did not make (mig.Create refuses it again, in case one
// appears between this read and the create). A placement another recorded
// claim holds is left to admitMIG, which names that claim.
func (p *Plugin) checkMIGFree(claim types.UID, pl *plan) error {
	for _, d := range pl.devices {
		if d.mig == nil || !d.mig.Dynamic || d.mig.Created() {
			continue
		}
		if _, held := p.migHolder(claim, checkpoint.Device{UUID: d.gpu.UUID, MIG: d.mig}); held {
			continue
		}
		g, err := p.opts.MIG.Read(d.gpu.UUID)
		if err != nil {
			return deviceError(d.device, "read the GPU's MIG instances: %v", err)
		}
		if in, ok := mig.Occupant(g, migPlacement(d.mig)); ok {
			return deviceError(d.device, "%s at memory slices %d-%d is taken by %s, which no claim of this plugin made; nothing is created over it (the slices are published as taken once the plugin republishes)",
				d.mig.Profile, d.mig.Start, d.mig.Start+d.mig.Size-1, mig.Describe(g, in))
		}
	}
	return nil
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
		c, err := p.opts.MIG.Create(d.gpu.UUID, d.mig.ProfileID, migPlacement(d.mig), d.mig.UUID)
		if errors.Is(err, mig.ErrOccupied) {
			// The instance there is not this claim's: the rollback that
			// follows must not destroy it. A record that is not Dynamic
			// names an instance Tessera did not make, which stays.
			m := *d.mig
			m.Dynamic = false
			record.Devices[i].MIG = &m
			if perr := p.opts.Store.Put(*record); perr != nil {
				klog.FromContext(ctx).Error(perr, "Recording that the placement is taken failed; the rollback leaves the instance there", "device", d.device)
			}
		}
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
// unprepare): each found by GPU, placement and profile and, once its IDs
// are recorded, by its MIG UUID. An instance at the placement without the
// recorded UUID (destroyed and another made there since) is not this
// claim's: it is left, reported (MIGInstanceChanged) and the record goes.
// An instance that another claim's record holds is not this claim's and is
// left; one with processes is refused (the error wraps mig.ErrInUse, and
// the claim stays recorded for a retry).
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
		destroyed, err := p.opts.MIG.Destroy(d.UUID, d.MIG.ProfileID, migPlacement(d.MIG), d.MIG.UUID)
		if errors.Is(err, mig.ErrChanged) {
			msg := fmt.Sprintf("claim %s: device %s: its MIG instance is gone and another is at its placement; that one is not the claim's and was not destroyed: %v", c, d.Device, err)
			klog.FromContext(ctx).Info("Not destroying a MIG instance the claim's record does not name", "claim", c.String(), "device", d.Device, "err", err)
			p.event(corev1.EventTypeWarning, "MIGInstanceChanged", msg)
			continue
		}
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

// MIGHeld are the GPU instances (profile and placement) the checkpoint's
// claims hold or are about to create, static and dynamic, by GPU UUID: the
// model's model.WithMIGHeld, so that a held dynamic instance's slices are
// not published as taken by a foreign instance, and a held static one is
// not tainted as in use outside Tessera.
func (p *Plugin) MIGHeld() map[string][]model.MIGHold {
	var out map[string][]model.MIGHold
	for _, c := range p.opts.Store.List() {
		for _, d := range c.Devices {
			if d.MIG == nil || d.AdminAccess {
				continue
			}
			if out == nil {
				out = map[string][]model.MIGHold{}
			}
			if h := (model.MIGHold{ProfileID: d.MIG.ProfileID, Placement: migPlacement(d.MIG)}); !slices.Contains(out[d.UUID], h) {
				out[d.UUID] = append(out[d.UUID], h)
			}
		}
	}
	for uuid := range out {
		slices.SortFunc(out[uuid], func(a, b model.MIGHold) int {
			return cmp.Or(a.Placement.Start-b.Placement.Start, a.ProfileID-b.ProfileID)
		})
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
// (matched by placement and profile, and by MIG UUID once recorded), a
// record whose instance is gone or changed is reported, and every other
// instance is foreign: kept, and reported once. It destroys nothing: the
// instances Tessera may destroy are those a record names, and the
// rollbacks before it (of records left PrepareStarted) did that. Deleting
// an instance no record names would take an admin's layout the first time
// a GPU is named in --dynamic-mig, or another tool's instance.
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
	gpus := p.gpusByMinor()
	for _, g := range gpus {
		if !g.MIGEnabled && len(byGPU[g.UUID]) == 0 {
			continue
		}
		now, err := p.opts.MIG.Read(g.UUID)
		if err != nil {
			logger.Error(err, "Reading MIG instances at start failed; they are neither adopted nor reported", "gpu", g.UUID)
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
			in := instances[i]
			ciOK := slices.ContainsFunc(in.ComputeInstances, func(ci gpu.MIGComputeInstance) bool { return ci.UUID == h.dev.MIG.UUID })
			if h.dev.MIG.Created() && !ciOK {
				// Not adopted: the instance there is another's, foreign
				// below (its slices stay taken, nothing is destroyed).
				msg := fmt.Sprintf("claim %s: device %s: the MIG instance at memory slice %d of GPU %s is no longer MIG device %s (GPU instance %d now); its containers have lost their MIG device", h.claim, h.dev.Device, in.Placement.Start, g.UUID, h.dev.MIG.UUID, in.ID)
				logger.Error(nil, "MIG instance of a prepared claim changed", "claim", h.claim, "device", h.dev.Device)
				p.event(corev1.EventTypeWarning, "MIGInstanceChanged", msg)
				continue
			}
			adopted[i] = true
			logger.V(2).Info("Adopted MIG instance of a checkpointed claim", "claim", h.claim, "device", h.dev.Device, "gpuInstance", in.ID)
		}
		if !p.dynamicMIG(now) {
			continue // a static GPU publishes every instance; an admin's instances are its devices
		}
		for i, in := range instances {
			if !adopted[i] {
				p.foreignMIG(ctx, now, in)
			}
		}
	}
}

// firstMIGReport records that the MIG report named key was made, and says
// whether this is the first time.
func (p *Plugin) firstMIGReport(key string) bool {
	p.migReportedMu.Lock()
	defer p.migReportedMu.Unlock()
	if p.migReported == nil {
		p.migReported = map[string]bool{}
	}
	seen := p.migReported[key]
	p.migReported[key] = true
	return !seen
}

// foreignMIG reports, once per instance, an instance of a dynamic-MIG GPU
// that no record holds: it is kept (an admin's, another tool's, or one a
// release without MIG support left), and its slices are published as taken
// until it is gone.
func (p *Plugin) foreignMIG(ctx context.Context, g gpu.GPU, in gpu.MIGInstance) {
	key := g.UUID + "/" + strconv.Itoa(in.ID) + "/" + strconv.Itoa(in.ProfileID) + "/" + strconv.Itoa(in.Placement.Start)
	for _, ci := range in.ComputeInstances {
		key += "/" + ci.UUID
	}
	if !p.firstMIGReport(key) {
		return
	}
	msg := mig.Describe(g, in) + " is held by no claim of this plugin: it is kept, and its memory slices are published as taken until it is gone (an admin's or another tool's instance on a GPU named in --dynamic-mig; " +
		"destroy it with nvidia-smi mig -i " + strconv.Itoa(g.Index) + " -dci -gi " + strconv.Itoa(in.ID) + " and -dgi -gi " + strconv.Itoa(in.ID) + " once its work is done, to give its slices to claims)"
	klog.FromContext(ctx).Info("Foreign MIG instance kept", "gpu", g.UUID, "gpuInstance", in.ID, "profile", in.ProfileName, "start", in.Placement.Start)
	p.event(corev1.EventTypeWarning, "MIGInstanceForeign", msg)
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
	m := isolationMIG(d)
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

// MIG devices and CUDA's enumeration (NVIDIA MIG user guide, "CUDA Device
// Enumeration"): a CUDA process enumerates a single MIG device, whatever a
// container is given, and enumerates no GPU that is not in MIG mode while
// a MIG device is visible to it. A claim made of MIG devices only sets
// CUDA_VISIBLE_DEVICES to its MIG UUIDs; a container that also references
// a claim with whole GPUs or shares therefore has those hidden from CUDA,
// and one that references two such claims gets one claim's list.
// warnMIGVisibility tells the claim's owner when a pod's prepared claims
// mix like that (the plugin cannot see which container references which
// claim, only the pods a claim is reserved for).

// migVisibility is how a prepared claim's devices show to CUDA.
type migVisibility int

const (
	visibleNone migVisibility = iota // no devices
	// visibleMIGOnly: MIG devices only, none with admin access; the claim
	// sets CUDA_VISIBLE_DEVICES (editsFor).
	visibleMIGOnly
	// visibleGPUs: whole GPUs, shares, or admin access; the claim sets no
	// CUDA_VISIBLE_DEVICES, and another claim's would hide its devices.
	visibleGPUs
)

func visibilityOf(c checkpoint.Claim) migVisibility {
	if len(c.Devices) == 0 {
		return visibleNone
	}
	for _, d := range c.Devices {
		if d.MIG == nil || d.AdminAccess {
			return visibleGPUs
		}
	}
	return visibleMIGOnly
}

// warnMIGVisibility emits a Warning event MIGVisibleDevices on each claim
// of this prepare call that shares a pod with another prepared claim when
// one of them is made of MIG devices only and the other has devices too,
// once per pod and claim.
func (p *Plugin) warnMIGVisibility(claims []*resourceapi.ResourceClaim, result map[types.UID]kubeletplugin.PrepareResult) {
	if p.opts.Events == nil {
		return
	}
	// The pods of every prepared claim this plugin remembers.
	p.facts.mu.Lock()
	byPod := map[types.UID][]types.UID{}
	podName := map[types.UID]string{}
	for uid, f := range p.facts.claims {
		for _, ref := range f.pods {
			byPod[ref.UID] = append(byPod[ref.UID], uid)
			podName[ref.UID] = ref.Namespace + "/" + ref.Name
		}
	}
	p.facts.mu.Unlock()
	for _, claim := range claims {
		if r, ok := result[claim.UID]; !ok || r.Err != nil {
			continue
		}
		for _, ref := range factsOf(claim).pods {
			var migOnly, gpus []string
			for _, uid := range byPod[ref.UID] {
				c, ok := p.opts.Store.Get(uid)
				if !ok || c.State != checkpoint.PrepareCompleted {
					continue
				}
				switch visibilityOf(c) {
				case visibleMIGOnly:
					migOnly = append(migOnly, c.String())
				case visibleGPUs:
					gpus = append(gpus, c.String())
				}
			}
			slices.Sort(migOnly)
			slices.Sort(gpus)
			var msg string
			switch {
			case len(migOnly) > 0 && len(gpus) > 0:
				msg = fmt.Sprintf("pod %s references claims of MIG devices only (%s) and claims with whole GPUs or shares (%s): a container that references both sees only the MIG devices "+
					"(the MIG claim sets CUDA_VISIBLE_DEVICES to its MIG UUIDs, and CUDA enumerates no GPU outside MIG mode while a MIG device is visible); give them to separate containers",
					podName[ref.UID], strings.Join(migOnly, ", "), strings.Join(gpus, ", "))
			case len(migOnly) > 1:
				msg = fmt.Sprintf("pod %s references several claims of MIG devices only (%s): a container that references more than one gets one claim's CUDA_VISIBLE_DEVICES, and a CUDA process uses one MIG device in any case; "+
					"run one process per MIG device with CUDA_VISIBLE_DEVICES set from its TESSERA_MIG_… variable", podName[ref.UID], strings.Join(migOnly, ", "))
			default:
				continue
			}
			key := string(ref.UID) + "/" + string(claim.UID)
			if p.firstMIGReport(key) {
				p.claimEvent(claim, corev1.EventTypeWarning, "MIGVisibleDevices", msg)
			}
		}
	}
}

// isolationMIG is MIG device d (created) as the isolation package sees it.
func isolationMIG(d plannedDevice) isolation.MIGDevice {
	m := isolation.MIGDevice{
		UUID: d.mig.UUID, ParentUUID: d.gpu.UUID, Minor: d.gpu.Minor, GPUInstance: d.mig.GPUInstance, ComputeInstance: d.mig.ComputeInstance,
		Profile: d.mig.Profile, GPUInstanceMinor: d.mig.GPUInstanceMinor, ComputeInstanceMinor: d.mig.ComputeInstanceMinor,
	}
	for _, ci := range d.mig.OtherComputeInstances {
		m.Others = append(m.Others, isolation.MIGComputeInstance{ID: ci.ID, UUID: ci.UUID, Minor: ci.Minor})
	}
	return m
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
