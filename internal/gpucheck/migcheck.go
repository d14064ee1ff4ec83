package gpucheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-dev/tessera/internal/gpucheck/cuda"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/mig"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/plugin"
	"github.com/tessera-dev/tessera/pkg/publish"
)

// The MIG checks (docs/gpu-check.md, the checks "MIG: …"), run only on a GPU in
// MIG mode already: the check never turns MIG mode on or off and never
// resets a GPU (both need an idle GPU and are an admin's decision). On the
// first such GPU (by minor) with a free placement of its smallest profile
// without media extensions, a kubelet plugin of the check's own publishes
// the GPU with dynamic MIG and prepares one claim per placement (one, or
// two when two fit): prepare creates the GPU instance and its compute
// instance, unprepare destroys them — Tessera's own path (pkg/plugin's
// dynamic MIG over pkg/mig). In between, memory probes run in each claim's
// environment (the CDI spec's CUDA_VISIBLE_DEVICES=MIG-<uuid>, as the
// backends' probes do):
//
//   - create and destroy: the instance is there after prepare, at the
//     placement, with the profile, its MIG device is the one the spec
//     names, and it is gone after unprepare; every instance the check did
//     not create is as it was;
//   - memory: the process sees one device, the instance's, with the
//     profile's memory, and allocates most of it and no more;
//   - isolation: while the process in instance B holds all the memory it
//     could allocate, the process in A sees only A (not B's MIG UUID) and
//     allocates A's memory, no more.
//
// The check's plugin may destroy only the instances the check created: the
// plugin destroys only instances its claims' records name (pkg/mig checks
// the recorded MIG UUID), and on top of that its MIG runner (guardedMIG)
// refuses to destroy any MIG device it did not create itself.

// Names of the MIG checks.
const (
	migCreateCheckName    = "MIG: an instance created and destroyed through prepare and unprepare"
	migMemoryCheckName    = "MIG: a process in the instance sees the profile's memory"
	migIsolationCheckName = "MIG: a process in one instance cannot see or allocate another's"
)

// migNamespace is the namespace of the MIG checks' claims.
const migNamespace = "gpu-check-mig"

// migLowFraction: a process in an instance sees at least this part of the
// instance's memory as cuMemGetInfo's total, and allocates at least this
// part of that total (what its context and the driver keep is less).
// NVIDIA documents no figure; assumed.
const migLowFraction = 0.8

// migPlan is where the MIG checks create their instances.
type migPlan struct {
	gpu        gpu.GPU // as discovery describes it, with its MIG state read now
	profile    gpu.MIGProfile
	placements []gpu.MIGPlacement // one or two, highest start first
}

// planMIG picks, on the first GPU of gpus (MIG state read now) that is in
// MIG mode without a pending change and has a free placement, the smallest
// profile without media extensions ("+me") and up to two free placements
// of it. why says why there is none.
func planMIG(gpus []gpu.GPU) (migPlan, string) {
	var why []string
	var best migPlan
	for _, g := range gpus {
		switch {
		case !g.MIGEnabled:
			continue
		case g.MIGPendingChange():
			why = append(why, fmt.Sprintf("gpu-%d: MIG mode change pending (until the GPU is reset)", g.Minor))
			continue
		case g.MIG == nil || len(g.MIG.Profiles) == 0:
			why = append(why, fmt.Sprintf("gpu-%d: no MIG profiles read (%s)", g.Minor, g.MIGError))
			continue
		}
		profiles := slices.Clone(g.MIG.Profiles)
		slices.SortStableFunc(profiles, func(a, b gpu.MIGProfile) int {
			if a.MemorySlices != b.MemorySlices {
				return a.MemorySlices - b.MemorySlices
			}
			return a.ComputeSlices - b.ComputeSlices
		})
		for _, prof := range profiles {
			if strings.Contains(prof.Name, "+") {
				continue
			}
			var chosen []gpu.MIGPlacement
			pls := slices.Clone(prof.Placements)
			slices.SortFunc(pls, func(a, b gpu.MIGPlacement) int { return b.Start - a.Start })
			for _, pl := range pls {
				if len(chosen) < 2 && migFits(g.MIG, prof, pl, chosen) {
					chosen = append(chosen, pl)
				}
			}
			if len(chosen) > len(best.placements) {
				best = migPlan{gpu: g, profile: prof, placements: chosen}
			}
			break // the smallest profile only
		}
		if len(best.placements) == 2 {
			break
		}
		if len(best.placements) == 0 {
			why = append(why, fmt.Sprintf("gpu-%d: no free placement (its %d instances leave none)", g.Minor, len(g.MIG.Instances)))
		}
	}
	if len(best.placements) > 0 {
		return best, ""
	}
	if len(why) == 0 {
		return migPlan{}, "no GPU is in MIG mode: the check never turns MIG mode on (it needs an idle GPU or a reset, an admin's decision; docs/mig.md)"
	}
	return migPlan{}, "no MIG GPU with a free placement (the check creates instances only where nothing is, and destroys none it did not create): " + strings.Join(why, "; ")
}

// migFits reports whether an instance of prof fits at pl beside the GPU's
// instances and the placements already chosen: no memory slice taken, and
// the compute slices, the profile's instance count and each engine within
// what the GPU has (its largest profile's engines), as the driver requires.
func migFits(m *gpu.MIG, prof gpu.MIGProfile, pl gpu.MIGPlacement, chosen []gpu.MIGPlacement) bool {
	for _, in := range m.Instances {
		if in.Placement.Overlaps(pl) {
			return false
		}
	}
	for _, c := range chosen {
		if c.Overlaps(pl) {
			return false
		}
	}
	var full gpu.MIGProfile
	for _, p := range m.Profiles {
		if p.ComputeSlices > full.ComputeSlices || p.ComputeSlices == full.ComputeSlices && p.MemorySlices > full.MemorySlices {
			full = p
		}
	}
	n := len(chosen) + 1
	used := gpu.MIGProfile{}
	same := 0
	for _, in := range m.Instances {
		p, ok := m.Profile(in.ProfileID)
		if !ok {
			return false // an instance of a profile not read: be safe
		}
		if p.ID == prof.ID {
			same++
		}
		used.ComputeSlices += p.ComputeSlices
		used.CopyEngines += p.CopyEngines
		used.Decoders += p.Decoders
		used.Encoders += p.Encoders
		used.JPEGs += p.JPEGs
		used.OFAs += p.OFAs
	}
	within := func(used, each, have int) bool { return each == 0 || used+n*each <= have }
	slicesTotal := m.ComputeSlices
	if slicesTotal == 0 {
		slicesTotal = full.ComputeSlices
	}
	return (prof.MaxInstances == 0 || same+n <= prof.MaxInstances) &&
		within(used.ComputeSlices, prof.ComputeSlices, slicesTotal) &&
		within(used.CopyEngines, prof.CopyEngines, full.CopyEngines) &&
		within(used.Decoders, prof.Decoders, full.Decoders) &&
		within(used.Encoders, prof.Encoders, full.Encoders) &&
		within(used.JPEGs, prof.JPEGs, full.JPEGs) &&
		within(used.OFAs, prof.OFAs, full.OFAs)
}

// guardedMIG is the check's plugin's MIG runner: NVML's (pkg/mig), except
// that it destroys only the instances it created itself, found by the MIG
// UUID it made them with; any other destroy is refused and remembered.
type guardedMIG struct {
	inner *mig.NVML

	mu      sync.Mutex
	made    map[string]bool // MIG UUIDs of the instances this runner created
	refused []string
}

var _ plugin.MIGInstances = (*guardedMIG)(nil)

func (g *guardedMIG) Read(uuid string) (gpu.GPU, error) { return g.inner.Read(uuid) }

func (g *guardedMIG) Create(uuid string, profileID int, pl gpu.MIGPlacement, own string) (mig.Created, error) {
	c, err := g.inner.Create(uuid, profileID, pl, own)
	if err == nil && !c.Existed {
		g.mu.Lock()
		if g.made == nil {
			g.made = map[string]bool{}
		}
		g.made[c.UUID] = true
		g.mu.Unlock()
	}
	return c, err
}

func (g *guardedMIG) Destroy(uuid string, profileID int, pl gpu.MIGPlacement, migUUID string) (bool, error) {
	g.mu.Lock()
	ok := migUUID != "" && g.made[migUUID]
	if !ok {
		g.refused = append(g.refused, fmt.Sprintf("GPU %s: the instance at memory slice %d (MIG device %q)", uuid, pl.Start, migUUID))
	}
	g.mu.Unlock()
	if !ok {
		return false, fmt.Errorf("the GPU check destroys only the MIG instances it created (%s at memory slice %d is not one): %w", migUUID, pl.Start, errNotMine)
	}
	destroyed, err := g.inner.Destroy(uuid, profileID, pl, migUUID)
	if err == nil {
		g.mu.Lock()
		delete(g.made, migUUID)
		g.mu.Unlock()
	}
	return destroyed, err
}

// errNotMine is wrapped by guardedMIG's refusals.
var errNotMine = errors.New("not the check's MIG instance")

// Refused lists the destroys the guard refused.
func (g *guardedMIG) Refused() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.refused)
}

// migPlugin is the kubelet plugin of the MIG checks: the MIG GPU published
// with dynamic MIG, instances made through guardedMIG.
type migPlugin struct {
	plugin  *plugin.Plugin
	guard   *guardedMIG
	cdiDirs []string
}

func (n *node) startMIGPlugin(ctx context.Context, g gpu.GPU) (*migPlugin, error) {
	dir := filepath.Join(n.cfg.WorkDir, "mig")
	store, rec, err := checkpoint.Open(ctx, filepath.Join(dir, "plugin", "checkpoint.json"), "gpu-check-mig")
	if err != nil {
		return nil, err
	}
	specs, err := cdi.NewDir(filepath.Join(dir, "cdi"))
	if err != nil {
		return nil, err
	}
	mp := &migPlugin{guard: &guardedMIG{inner: &mig.NVML{Lib: n.cfg.NVML}}, cdiDirs: []string{specs.Root()}}
	opts := plugin.Options{
		NodeName: n.cfg.NodeName, GPUs: []gpu.GPU{g}, Store: store, Recovery: rec, Specs: specs, Mock: n.cfg.Mock,
		Client: n.client, MIG: mp.guard, DynamicMIG: publish.DynamicMIG{Names: []string{g.UUID}},
	}
	if !n.cfg.Mock {
		opts.DevNodes = isolation.HostDevNodes{DriverRoot: n.cfg.DriverRoot}
		toolkit, err := cdi.NewToolkitSpecs(n.cfg.NVIDIACDISpecDirs...)
		if err != nil {
			return nil, err
		}
		// As for the shares: no runtime reads the spec, so the driver's
		// libraries are not the spec's business here.
		opts.Toolkit, opts.ToolkitSpecDirs, opts.LegacyRuntime = toolkit, n.cfg.NVIDIACDISpecDirs, true
		mp.cdiDirs = append(mp.cdiDirs, n.cfg.NVIDIACDISpecDirs...)
	}
	if mp.plugin, err = plugin.New(ctx, opts); err != nil {
		return nil, err
	}
	return mp, nil
}

// migClaim is an allocated claim of the MIG device at pl.
func (n *node) migClaim(plan migPlan, i int) *resourceapi.ResourceClaim {
	name := fmt.Sprintf("gpucheck-mig-%c", 'a'+i)
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: migNamespace, Name: name, UID: types.UID(name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "mig", Driver: model.DriverName, Pool: n.cfg.NodeName,
				Device: model.MIGPlacementDeviceName(plan.gpu.Minor, plan.profile.Name, plan.placements[i].Start),
			}},
		}}},
	}
}

// migInstance is the instance made for one claim, as NVML lists it.
type migInstance struct {
	claim     *resourceapi.ResourceClaim
	placement gpu.MIGPlacement
	gi        gpu.MIGInstance
	ci        gpu.MIGComputeInstance
	env       []string
	// memory is the MIG device's memory as NVML reports it (0: unknown).
	memory uint64
}

// migChecks runs the MIG checks.
func (n *node) migChecks(ctx context.Context) []Check {
	checks := []Check{{Name: migCreateCheckName}, {Name: migMemoryCheckName}, {Name: migIsolationCheckName}}
	all := func(status, detail string) []Check {
		for i := range checks {
			checks[i].Status, checks[i].Detail = status, detail
		}
		return checks
	}
	nv := &mig.NVML{Lib: n.cfg.NVML}
	var now []gpu.GPU
	var unread []string
	for _, g := range n.allGPUs {
		if !g.MIGEnabled {
			continue
		}
		r, err := nv.Read(g.UUID)
		if err != nil {
			unread = append(unread, fmt.Sprintf("gpu-%d: %v", g.Minor, err))
			continue
		}
		d := g
		d.MIGEnabled, d.MIG, d.MIGError = r.MIGEnabled, r.MIG, r.MIGError
		now = append(now, d)
	}
	plan, why := planMIG(now)
	if why != "" {
		if len(unread) > 0 {
			return all(StatusError, why+"; could not read: "+strings.Join(unread, "; "))
		}
		return all(StatusSkipped, why)
	}
	if !n.cfg.Mock && os.Geteuid() != 0 {
		return all(StatusSkipped, fmt.Sprintf("gpu-%d is in MIG mode, but creating and destroying MIG instances needs root (CAP_SYS_ADMIN, or the mig-config capability; NVIDIA MIG user guide, \"Device Nodes and Capabilities\"); running as uid %d", plan.gpu.Minor, os.Geteuid()))
	}
	before := slices.Clone(plan.gpu.MIG.Instances)
	mp, err := n.startMIGPlugin(ctx, plan.gpu)
	if err != nil {
		return all(StatusError, "the check's MIG plugin: "+err.Error())
	}

	// Prepare one claim per placement.
	var made []migInstance
	var claims []*resourceapi.ResourceClaim
	for i := range plan.placements {
		c := n.migClaim(plan, i)
		if _, err := n.client.ResourceV1().ResourceClaims(migNamespace).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			return all(StatusError, fmt.Sprintf("create claim %s in the fake API: %v", c.Name, err))
		}
		claims = append(claims, c)
	}
	results, err := mp.plugin.PrepareResourceClaims(ctx, claims)
	var prepErrs []string
	if err != nil {
		prepErrs = append(prepErrs, err.Error())
	}
	for i, c := range claims {
		if err != nil {
			break
		}
		if rerr := results[c.UID].Err; rerr != nil {
			prepErrs = append(prepErrs, fmt.Sprintf("%s: %v", c.Name, rerr))
			continue
		}
		in, ierr := n.readMIGInstance(nv, mp, plan, i, c, results[c.UID].Devices)
		if ierr != nil {
			prepErrs = append(prepErrs, fmt.Sprintf("%s: %v", c.Name, ierr))
			continue
		}
		made = append(made, in)
	}

	// Probes in the instances, while they exist.
	ep, probing := n.cfg.Prober.(ExecProber)
	switch {
	case len(prepErrs) > 0:
		checks[1].Status, checks[1].Detail = StatusError, "prepare failed: "+strings.Join(prepErrs, "; ")
		checks[2].Status, checks[2].Detail = StatusError, checks[1].Detail
	case !probing:
		checks[1].Status, checks[1].Detail = StatusSkipped, "no probe processes (--no-probes)"
		checks[2].Status, checks[2].Detail = StatusSkipped, "no probe processes (--no-probes)"
	default:
		// The MIG probes are not the checked GPU's processes: no mock
		// driver lists them there, and the lending sampler has nothing of
		// theirs to judge.
		ep.Observe = nil
		if n.cfg.Mock {
			if err := n.writeSimMIG(nv); err != nil {
				return all(StatusError, err.Error())
			}
		}
		checks[1] = n.migMemoryCheck(ctx, ep, plan, made[0], checks[1])
		if len(made) < 2 {
			checks[2].Status, checks[2].Detail = StatusSkipped, fmt.Sprintf("gpu-%d has room for one %s only: two instances are needed", plan.gpu.Minor, plan.profile.Name)
		} else {
			checks[2] = n.migIsolationCheck(ctx, ep, plan, made[0], made[1], checks[2])
		}
	}

	// Unprepare: the instances go.
	refs := make([]kubeletplugin.NamespacedObject, len(claims))
	for i, c := range claims {
		refs[i] = kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}
	}
	unprep, uerr := mp.plugin.UnprepareResourceClaims(context.WithoutCancel(ctx), refs)
	for _, c := range claims {
		_ = n.client.ResourceV1().ResourceClaims(migNamespace).Delete(context.WithoutCancel(ctx), c.Name, metav1.DeleteOptions{})
	}
	checks[0] = n.judgeMIGLifecycle(nv, plan, before, made, prepErrs, unprep, uerr, mp.guard.Refused(), checks[0])
	return checks
}

// readMIGInstance finds the instance prepare made for claim i and the
// environment its CDI spec gives a process.
func (n *node) readMIGInstance(nv *mig.NVML, mp *migPlugin, plan migPlan, i int, c *resourceapi.ResourceClaim, devices []kubeletplugin.Device) (migInstance, error) {
	in := migInstance{claim: c, placement: plan.placements[i]}
	g, err := nv.Read(plan.gpu.UUID)
	if err != nil {
		return in, err
	}
	found := false
	for _, gi := range g.MIG.Instances {
		if gi.Placement == in.placement && gi.ProfileID == plan.profile.ID && len(gi.ComputeInstances) > 0 {
			in.gi, in.ci, found = gi, gi.ComputeInstances[0], true
		}
	}
	if !found {
		return in, fmt.Errorf("prepare succeeded, yet NVML lists no %s instance with a compute instance at memory slice %d", plan.profile.Name, in.placement.Start)
	}
	in.memory = in.ci.MemoryBytes
	var ids []string
	for _, d := range devices {
		ids = append(ids, d.CDIDeviceIDs...)
	}
	spec, err := Inject(ids, mp.cdiDirs...)
	if err != nil {
		return in, err
	}
	in.env = HostProcessEnv(spec, os.Environ()).Env
	if v, _ := envLookup(in.env, "CUDA_VISIBLE_DEVICES"); v != in.ci.UUID {
		return in, fmt.Errorf("the CDI spec gives CUDA_VISIBLE_DEVICES=%q, not the instance's MIG device %s", v, in.ci.UUID)
	}
	return in, nil
}

// judgeMIGLifecycle is the create-and-destroy check's verdict, after
// unprepare.
func (n *node) judgeMIGLifecycle(nv *mig.NVML, plan migPlan, before []gpu.MIGInstance, made []migInstance, prepErrs []string, unprep map[types.UID]error, uerr error, refused []string, c Check) Check {
	var bad, facts []string
	if len(prepErrs) > 0 {
		bad = append(bad, "prepare: "+strings.Join(prepErrs, "; "))
	}
	for _, in := range made {
		facts = append(facts, fmt.Sprintf("prepare of %s made GPU instance %d (%s at memory slices %d-%d) with compute instance %d, MIG device %s (%.0f MiB), the one its CDI spec names",
			in.claim.Name, in.gi.ID, plan.profile.Name, in.placement.Start, in.placement.Start+in.placement.Size-1, in.ci.ID, in.ci.UUID, float64(in.memory)/mib))
	}
	if uerr != nil {
		bad = append(bad, "unprepare: "+uerr.Error())
	}
	for uid, err := range unprep {
		if err != nil {
			bad = append(bad, fmt.Sprintf("unprepare %s: %v", uid, err))
		}
	}
	g, err := nv.Read(plan.gpu.UUID)
	if err != nil {
		c.Status, c.Detail = StatusError, "read the GPU after unprepare: "+err.Error()
		return c
	}
	var after []gpu.MIGInstance
	if g.MIG != nil {
		after = g.MIG.Instances
	}
	for _, in := range made {
		if slices.ContainsFunc(after, func(a gpu.MIGInstance) bool {
			return slices.ContainsFunc(a.ComputeInstances, func(ci gpu.MIGComputeInstance) bool { return ci.UUID == in.ci.UUID })
		}) {
			bad = append(bad, fmt.Sprintf("MIG device %s is still there after unprepare", in.ci.UUID))
		}
	}
	if len(made) > 0 && !slices.ContainsFunc(bad, func(s string) bool { return strings.Contains(s, "still there") }) {
		facts = append(facts, "unprepare destroyed them")
	}
	for _, b := range before {
		i := slices.IndexFunc(after, func(a gpu.MIGInstance) bool {
			return a.ID == b.ID && a.Placement == b.Placement && a.ProfileID == b.ProfileID
		})
		if i < 0 || len(after[i].ComputeInstances) != len(b.ComputeInstances) {
			bad = append(bad, fmt.Sprintf("GPU instance %d (%s at memory slice %d), which the check did not create, changed or went", b.ID, b.ProfileName, b.Placement.Start))
		}
	}
	if len(before) > 0 {
		facts = append(facts, fmt.Sprintf("the %d instances the check did not create are as they were", len(before)))
	}
	if len(refused) > 0 {
		facts = append(facts, "the check's plugin was kept from destroying: "+strings.Join(refused, "; "))
	}
	facts = append(facts, fmt.Sprintf("gpu-%d's MIG mode was read, never changed", plan.gpu.Minor))
	if n.cfg.Mock {
		facts = append(facts, "mock: the mock NVML's MIG instances, created and destroyed by its placement rules")
	}
	if len(made) == 0 && len(bad) == 0 {
		bad = append(bad, "no instance was made")
	}
	if len(bad) > 0 {
		c.Status, c.Detail = StatusMismatch, strings.Join(bad, "; ")+" — "+strings.Join(facts, "; ")
		if len(made) == 0 {
			c.Status = StatusError
		}
		return c
	}
	c.Status, c.Detail = n.measured(), strings.Join(facts, "; ")
	return c
}

// migProbeBound is how far past an instance's memory a probe may allocate
// before it stops by itself (a process that could would be in another
// instance's memory, or the GPU's).
const migProbeBound = 1 << 30

func (n *node) migMemoryCheck(ctx context.Context, ep ExecProber, plan migPlan, in migInstance, c Check) Check {
	p, err := ep.MemoryWith(ctx, plan.gpu.UUID, in.env, MemoryOptions{StopAfterBytes: migReference(plan, in) + migProbeBound})
	if err != nil {
		c.Status, c.Detail = StatusError, fmt.Sprintf("memory probe in %s: %v", in.ci.UUID, err)
		return c
	}
	detail, bad := judgeMIGMemory(p, in.ci.UUID, plan.profile.MemoryBytes, in.memory, n.targets.MemoryToleranceMiB)
	if n.cfg.Mock {
		detail += "; mock: the simulated probe sees the MIG device the mock NVML lists, with its memory"
	}
	return n.judged(c, bad, detail)
}

func (n *node) migIsolationCheck(ctx context.Context, ep ExecProber, plan migPlan, a, b migInstance, c Check) Check {
	// B holds all it can allocate while A allocates.
	pb, err := ep.start(ctx, b.env, "memory", "--stop-after-mib", fmt.Sprint((migReference(plan, b)+migProbeBound)/mib))
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	defer pb.kill()
	mb, err := pb.next(ep.timeout(), "holding")
	if err != nil || mb.Memory == nil {
		c.Status, c.Detail = StatusError, fmt.Sprintf("memory probe in B (%s): %v", b.ci.UUID, err)
		return c
	}
	pa, err := ep.MemoryWith(ctx, plan.gpu.UUID, a.env, MemoryOptions{StopAfterBytes: migReference(plan, a) + migProbeBound})
	if err != nil {
		c.Status, c.Detail = StatusError, fmt.Sprintf("memory probe in A (%s): %v", a.ci.UUID, err)
		return c
	}
	_ = pb.send("release")
	_, _ = pb.next(ep.timeout(), "result")
	var bad []string
	if slices.Contains(pa.Device.VisibleUUIDs, cuda.BareUUID(b.ci.UUID)) {
		bad = append(bad, fmt.Sprintf("the process in A sees B's MIG device %s", b.ci.UUID))
	}
	da, badA := judgeMIGMemory(pa, a.ci.UUID, plan.profile.MemoryBytes, a.memory, n.targets.MemoryToleranceMiB)
	db, badB := judgeMIGMemory(*mb.Memory, b.ci.UUID, plan.profile.MemoryBytes, b.memory, n.targets.MemoryToleranceMiB)
	bad = append(bad, prefixed("A: ", badA)...)
	bad = append(bad, prefixed("B: ", badB)...)
	detail := fmt.Sprintf("while the process in B (%s) held what it could allocate — %s — the process in A (%s): %s", b.ci.UUID, db, a.ci.UUID, da)
	if n.cfg.Mock {
		detail += "; mock: the simulated probes see the MIG devices the mock NVML lists"
	}
	return n.judged(c, bad, detail)
}

// migReference is the most memory a process in the instance may see: the
// larger of the profile's and the MIG device's (NVML).
func migReference(plan migPlan, in migInstance) uint64 {
	return max(plan.profile.MemoryBytes, in.memory)
}

// judgeMIGMemory holds what a process in the MIG device uuid saw to the
// instance: it lists exactly that device (cuDeviceGetUuid_v2), sees as
// cuMemGetInfo's total no more than the larger of the profile's memory
// (profileBytes) and the MIG device's (deviceBytes, NVML; 0 when unknown)
// and at least migLowFraction of the smaller, allocated at least
// migLowFraction of that total and no more than it, and was stopped by an
// out-of-memory refusal. It returns the detail and what is wrong.
func judgeMIGMemory(p MemoryProbe, uuid string, profileBytes, deviceBytes uint64, tol float64) (string, []string) {
	var bad []string
	ref, low := profileBytes, profileBytes
	if deviceBytes > 0 {
		ref, low = max(profileBytes, deviceBytes), min(profileBytes, deviceBytes)
	}
	want := cuda.BareUUID(uuid)
	switch {
	case len(p.Device.VisibleUUIDs) == 0:
		bad = append(bad, "the probe listed no device UUIDs (no cuDeviceGetCount or cuDeviceGetUuid_v2): which devices it sees is unknown")
	case len(p.Device.VisibleUUIDs) != 1 || p.Device.VisibleUUIDs[0] != want:
		bad = append(bad, fmt.Sprintf("the process sees %d devices %v, not only its MIG device %s", len(p.Device.VisibleUUIDs), p.Device.VisibleUUIDs, uuid))
	}
	total := float64(p.TotalBytes) / mib
	if total > float64(ref)/mib+tol {
		bad = append(bad, fmt.Sprintf("cuMemGetInfo shows %.0f MiB, more than the instance's %.0f MiB", total, float64(ref)/mib))
	}
	if p.TotalBytes < uint64(float64(low)*migLowFraction) {
		bad = append(bad, fmt.Sprintf("cuMemGetInfo shows %.0f MiB, less than %.0f %% of the instance's %.0f MiB", total, migLowFraction*100, float64(low)/mib))
	}
	alloc := float64(p.AllocatedBytes) / mib
	switch {
	case p.Stopped:
		bad = append(bad, fmt.Sprintf("allocated %.0f MiB without a refusal: past its instance", alloc))
	case !outOfMemory(p.LastError):
		bad = append(bad, fmt.Sprintf("the allocations did not end with an out-of-memory refusal (last error %q)", p.LastError))
	}
	if alloc > total+tol {
		bad = append(bad, fmt.Sprintf("allocated %.0f MiB, more than the %.0f MiB it sees", alloc, total))
	}
	if p.AllocatedBytes < uint64(float64(p.TotalBytes)*migLowFraction) {
		bad = append(bad, fmt.Sprintf("allocated %.0f MiB, less than %.0f %% of the %.0f MiB it sees", alloc, migLowFraction*100, total))
	}
	detail := fmt.Sprintf("sees %v, cuMemGetInfo %.0f MiB of an instance of %.0f MiB (profile %.0f MiB), allocated %.0f MiB before %q",
		p.Device.VisibleUUIDs, total, float64(deviceBytes)/mib, float64(profileBytes)/mib, alloc, p.LastError)
	return detail, bad
}

// writeSimMIG writes the mock NVML's MIG devices for the simulated probes.
func (n *node) writeSimMIG(nv *mig.NVML) error {
	var devs []SimMIGDevice
	for _, g := range n.allGPUs {
		if !g.MIGEnabled {
			continue
		}
		r, err := nv.Read(g.UUID)
		if err != nil || r.MIG == nil {
			continue
		}
		for _, gi := range r.MIG.Instances {
			for _, ci := range gi.ComputeInstances {
				mem := ci.MemoryBytes
				if p, ok := r.MIG.Profile(gi.ProfileID); ok && mem == 0 {
					mem = p.MemoryBytes
				}
				devs = append(devs, SimMIGDevice{UUID: ci.UUID, Parent: g.UUID, MemoryBytes: mem})
			}
		}
	}
	data, err := json.Marshal(devs)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(n.simDir(), SimMIGFile), data, 0o644)
}
