package plugin

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// Capacity names in consumedCapacity (see the resource model).
const (
	capacityMemory resourceapi.QualifiedName = "memory"
	capacityCores  resourceapi.QualifiedName = "cores"
)

// plannedDevice is one device result of this driver, checked and with its
// limits computed.
type plannedDevice struct {
	request     string
	pool        string
	device      string
	shareID     types.UID
	adminAccess bool
	gpu         gpu.GPU
	shared      bool // a share: gpu-N-shared, or gpu-N-lent
	// lent is true for a borrower's share of a lent GPU (gpu-N-lent).
	lent bool
	// lend is the owner's consent to lend the GPU (whole and shared devices).
	lend        bool
	isolation   configapi.Isolation // shares only
	memoryLimit int64               // shares only, bytes
	coresLimit  int64               // shares only, percent
	// consumedMemory (bytes) and consumedCores (percent) are the share's
	// consumedCapacity: what it takes from the GPU.
	consumedMemory int64
	consumedCores  int64
	// mpsDomain is the trust domain whose MPS daemon serves an MPS share
	// (or MPS on a MIG device): the claim's namespace ("" in records of
	// releases that ran one daemon per GPU).
	mpsDomain string
	// mig is set for a MIG device: the instance it is, or (dynamic, before
	// prepare created it) the one it is to get. gpu is its parent.
	mig *checkpoint.MIGDevice
}

// plan is everything prepare decided before it changes anything.
type plan struct {
	devices []plannedDevice // in device order (NVLink domain, then PCI bus id)
	// isolation is the one backend of the claim's shares ("" without shares).
	isolation configapi.Isolation
	// nvlinkWarning is set when topology.nvlink is Preferred and the GPUs do
	// not share an NVLink domain; it becomes a condition in the claim status.
	nvlinkWarning string
	// config is the merged config per request, for the checkpoint.
	config json.RawMessage
}

// deviceError names the device in an error, as in
// "device gpu-3-shared: …".
func deviceError(device string, format string, args ...any) error {
	return fmt.Errorf("device %s: %s", device, fmt.Sprintf(format, args...))
}

// planClaim checks the claim's allocation results of this driver and
// computes limits and order. It reads no files and changes nothing, so every
// error it returns leaves nothing behind.
func (p *Plugin) planClaim(claim *resourceapi.ResourceClaim) (*plan, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("not allocated")
	}
	alloc := claim.Status.Allocation.Devices
	configs, err := p.resolveConfigs(alloc)
	if err != nil {
		return nil, err
	}
	pl := &plan{}
	nvlinkPolicy := configapi.NVLinkIgnore
	for _, r := range alloc.Results {
		if r.Driver != model.DriverName {
			continue
		}
		d, nvlink, err := p.planDevice(claim, r, configs)
		if err != nil {
			return nil, err
		}
		if d.isolation != "" {
			if pl.isolation != "" && pl.isolation != d.isolation {
				return nil, deviceError(r.Device, "isolation %s differs from %s of the claim's other devices; a claim uses one isolation backend", d.isolation, pl.isolation)
			}
			pl.isolation = d.isolation
		}
		if stricter(nvlink, nvlinkPolicy) {
			nvlinkPolicy = nvlink
		}
		pl.devices = append(pl.devices, d)
	}
	sortDevices(pl.devices)
	if err := checkNVLink(pl, nvlinkPolicy); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(configs.byRequest)
	if err != nil {
		return nil, fmt.Errorf("encode config: %w", err)
	}
	pl.config = raw
	return pl, nil
}

// requestConfigs are a claim's opaque configs resolved per request.
type requestConfigs struct {
	// byRequest is the merged GpuConfig of each request with a device of
	// this driver, its sharing.isolation filled in.
	byRequest map[string]*configapi.GpuConfig
	// isolationFrom says, per request, who chose its sharing.isolation.
	isolationFrom map[string]isolationSource
}

// resolveConfigs merges the class and claim configs of every request with a
// device of this driver (configapi.ConfigForRequest). A claim uses one
// backend: a share request whose configs set no isolation takes the one
// another share request of the claim sets, and only failing that the
// node's default. An error names the first device whose request's configs
// are invalid.
func (p *Plugin) resolveConfigs(alloc resourceapi.DeviceAllocationResult) (requestConfigs, error) {
	rc := requestConfigs{byRequest: map[string]*configapi.GpuConfig{}, isolationFrom: map[string]isolationSource{}}
	var claimIsolation configapi.Isolation
	for _, r := range alloc.Results {
		_, kind, err := model.ParseDevice(r.Device)
		if r.Driver != model.DriverName || err != nil || kind == model.KindWhole || (r.AdminAccess != nil && *r.AdminAccess) ||
			isolationSetBy(alloc.Config, r.Request) == isolationFromNode {
			continue
		}
		if c, err := configapi.ConfigForRequest(alloc.Config, r.Request); err == nil && claimIsolation == "" {
			claimIsolation = c.Sharing.Isolation
		}
	}
	for _, r := range alloc.Results {
		if _, done := rc.byRequest[r.Request]; done || r.Driver != model.DriverName {
			continue
		}
		c, err := configapi.ConfigForRequest(alloc.Config, r.Request)
		if err != nil {
			return requestConfigs{}, deviceError(r.Device, "request %q: %v", r.Request, err)
		}
		source := isolationSetBy(alloc.Config, r.Request)
		switch {
		case source != isolationFromNode:
		case claimIsolation != "":
			c.Sharing.Isolation = claimIsolation
		case p.opts.DefaultIsolation != "":
			c.Sharing.Isolation = p.opts.DefaultIsolation
		}
		rc.byRequest[r.Request] = c
		rc.isolationFrom[r.Request] = source
	}
	return rc, nil
}

// planDevice checks one device result of this driver and computes its
// limits; nvlink is its request's topology.nvlink (NVLinkIgnore for MIG
// devices).
func (p *Plugin) planDevice(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult, configs requestConfigs) (d plannedDevice, nvlink configapi.NVLinkPolicy, err error) {
	if r.Pool != p.opts.NodeName {
		return d, "", deviceError(r.Device, "in pool %q, but this is the plugin of node %q: the allocation is for another node", r.Pool, p.opts.NodeName)
	}
	if err := checkTolerations(r); err != nil {
		return d, "", err
	}
	cfg, source := configs.byRequest[r.Request], configs.isolationFrom[r.Request]
	if name, err := model.ParseMIGDevice(r.Device); err == nil {
		g, ok := p.gpuByMinor(name.Minor)
		if !ok {
			return d, "", deviceError(r.Device, "unknown on node %s (it has %s)", p.opts.NodeName, p.knownDevices())
		}
		// MIG devices are never lent, and carry no shares.
		d = plannedDevice{request: r.Request, pool: r.Pool, device: r.Device, gpu: g, adminAccess: r.AdminAccess != nil && *r.AdminAccess}
		err := p.planMIG(claim, &d, name, cfg, source)
		return d, configapi.NVLinkIgnore, err
	}
	minor, kind, err := model.ParseDevice(r.Device)
	if err != nil {
		return d, "", deviceError(r.Device, "%v", err)
	}
	g, ok := p.gpuByMinor(minor)
	if !ok {
		return d, "", deviceError(r.Device, "unknown on node %s (it has %s)", p.opts.NodeName, p.knownDevices())
	}
	if g.MIGEnabled {
		return d, "", deviceError(r.Device, "GPU %s (index %d) is in MIG mode now: it is handed out only as MIG devices, never whole or in shares (was MIG enabled since the claim was allocated?)", g.UUID, g.Index)
	}
	d = plannedDevice{
		request:     r.Request,
		pool:        r.Pool,
		device:      r.Device,
		gpu:         g,
		shared:      kind != model.KindWhole,
		lent:        kind == model.KindLent,
		lend:        kind != model.KindLent && cfg.LendsWhenIdle(),
		adminAccess: r.AdminAccess != nil && *r.AdminAccess,
	}
	if r.ShareID != nil {
		d.shareID = *r.ShareID
	}
	if d.shared && !d.adminAccess {
		if err := planShare(claim, &d, r, cfg, source); err != nil {
			return d, "", err
		}
	}
	nvlink = configapi.NVLinkIgnore
	if cfg.Topology != nil {
		nvlink = cfg.Topology.NVLink
	}
	return d, nvlink, nil
}

// checkTolerations refuses a device result whose request tolerates a taint
// only the driver sets (modelnames.ToleratedInternalTaint): not-lent and
// mig-in-use keep claims off a device for the driver's own reasons, and an
// allocation that tolerated them may be on such a device. Results with
// adminAccess reserve nothing and are not checked. The admission webhook
// refuses the same tolerations when the claim is written.
func checkTolerations(r resourceapi.DeviceRequestAllocationResult) error {
	if r.AdminAccess != nil && *r.AdminAccess {
		return nil
	}
	for _, t := range r.Tolerations {
		if key := modelnames.ToleratedInternalTaint(t); key != "" {
			return deviceError(r.Device, "request %q tolerates the taint %s (toleration key %q, operator %s), which only %s sets to keep claims off the device; "+
				"refusing an allocation that may have ignored it: tolerate the taints you mean by their keys instead", r.Request, key, t.Key, t.Operator, model.DriverName)
		}
	}
	return nil
}

// planShare computes a share's limits from its consumedCapacity and its
// request's config, and checks its isolation against the config's floor.
func planShare(claim *resourceapi.ResourceClaim, d *plannedDevice, r resourceapi.DeviceRequestAllocationResult, cfg *configapi.GpuConfig, source isolationSource) error {
	if d.shareID == "" {
		return deviceError(r.Device, "share without a shareID in the allocation result")
	}
	mem, ok := r.ConsumedCapacity[capacityMemory]
	if !ok {
		return deviceError(r.Device, "share %s has no consumedCapacity %q in the allocation result; cannot compute its limits", d.shareID, capacityMemory)
	}
	cores := r.ConsumedCapacity[capacityCores] // absent: 0, a best-effort share
	d.consumedMemory, d.consumedCores = mem.Value(), cores.Value()
	var err error
	d.memoryLimit, d.coresLimit, err = cfg.ShareLimits(mem.Value(), cores.Value())
	if err != nil {
		return deviceError(r.Device, "request %q: %v", r.Request, err)
	}
	if d.memoryLimit <= 0 {
		return deviceError(r.Device, "share %s has a memory limit of %d bytes", d.shareID, d.memoryLimit)
	}
	d.isolation = cfg.Sharing.Isolation
	if !cfg.Sharing.Allows(d.isolation) {
		return deviceError(r.Device, "request %q: %s", r.Request, floorError(d.isolation, source, cfg.Sharing.AllowedIsolations))
	}
	if d.isolation == configapi.IsolationMPS {
		// No two namespaces share an MPS daemon, pipe directory or
		// shared memory (docs/mps.md).
		d.mpsDomain = claim.Namespace
	}
	return nil
}

// isolationSource is who chose a request's sharing.isolation.
type isolationSource int

const (
	// isolationFromNode: no config that applies sets it; the node's
	// --default-isolation (Advisory unless changed) fills it in.
	isolationFromNode isolationSource = iota
	// isolationFromClass: a DeviceClass config sets it, no claim config does.
	isolationFromClass
	// isolationFromClaim: a claim config sets it; it wins over the class's.
	isolationFromClaim
)

// isolationSetBy reports who sets sharing.isolation for request: a claim
// config that applies to it, else a class config, else nobody (the node's
// --default-isolation fills only what neither class nor claim chose). Entries
// were validated by ConfigForRequest.
func isolationSetBy(configs []resourceapi.DeviceAllocationConfiguration, request string) isolationSource {
	source := isolationFromNode
	for _, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != model.DriverName || !configapi.AppliesTo(c.Requests, request) {
			continue
		}
		raw := c.Opaque.Parameters.Raw
		if len(raw) == 0 && c.Opaque.Parameters.Object != nil {
			// Set by Go callers that build an allocation in memory, as
			// ConfigForRequest reads it.
			raw, _ = json.Marshal(c.Opaque.Parameters.Object)
		}
		cfg, err := configapi.DecodeLenient(raw)
		if err != nil || cfg.Sharing == nil || cfg.Sharing.Isolation == "" {
			continue
		}
		switch c.Source {
		case resourceapi.AllocationConfigSourceClaim:
			return isolationFromClaim
		case resourceapi.AllocationConfigSourceClass:
			source = isolationFromClass
		}
	}
	return source
}

// floorError explains why a share's isolation is refused: the device class's
// sharing.allowedIsolations does not list it. It names the isolation, who
// chose it and what the class allows, and what to change.
func floorError(isolation configapi.Isolation, source isolationSource, allowed []configapi.Isolation) string {
	var chosenBy, hint string
	switch source {
	case isolationFromClaim:
		chosenBy = "set by the claim's config"
		hint = "; the claim may ask only for one of those, or leave sharing.isolation to the class"
	case isolationFromClass:
		chosenBy = "set by the device class's config"
		hint = "; the class's sharing.isolation must be one of its sharing.allowedIsolations"
	default:
		chosenBy = "the node's --default-isolation, as neither the claim's nor the class's config sets one"
		hint = "; the admin sets sharing.isolation in the class's config to one it allows, or the claim asks for one"
	}
	return fmt.Sprintf("isolation %s (%s) is not allowed by the device class's config (allowed: %s)%s",
		isolation, chosenBy, configapi.FormatIsolations(allowed), hint)
}

// stricter orders NVLink policies Required > Preferred > Ignore.
func stricter(a, b configapi.NVLinkPolicy) bool {
	rank := map[configapi.NVLinkPolicy]int{configapi.NVLinkIgnore: 0, configapi.NVLinkPreferred: 1, configapi.NVLinkRequired: 2}
	return rank[a] > rank[b]
}

// sortDevices puts devices in the order containers see them: by NVLink domain,
// then PCI bus id, so that GPUs talking over NVLink get adjacent CUDA indices
// and the order is the same on every prepare.
func sortDevices(devs []plannedDevice) {
	slices.SortStableFunc(devs, func(a, b plannedDevice) int {
		return cmp.Or(
			cmp.Compare(a.gpu.NVLinkDomain, b.gpu.NVLinkDomain),
			cmp.Compare(a.gpu.PCIBusID, b.gpu.PCIBusID),
			cmp.Compare(a.device, b.device),
			cmp.Compare(a.shareID, b.shareID))
	})
}

// checkNVLink applies the claim's NVLink policy to its distinct GPUs.
func checkNVLink(pl *plan, policy configapi.NVLinkPolicy) error {
	if policy == configapi.NVLinkIgnore {
		return nil
	}
	var names []string
	domains := map[string]bool{}
	seen := map[int]bool{}
	connected := true
	for _, d := range pl.devices {
		if seen[d.gpu.Minor] || d.mig != nil {
			// MIG devices have no NVLink peer-to-peer (they publish no
			// nvlinkDomain): the policy is about the claim's GPUs.
			continue
		}
		seen[d.gpu.Minor] = true
		domain := d.gpu.NVLinkDomain
		names = append(names, fmt.Sprintf("%s (nvlinkDomain %q)", model.WholeDeviceName(d.gpu.Minor), domain))
		if domain == "" {
			connected = false
		}
		domains[domain] = true
	}
	if len(seen) < 2 {
		return nil
	}
	if connected && len(domains) == 1 {
		return nil
	}
	msg := "GPUs " + strings.Join(names, ", ") + " do not share an NVLink domain"
	if policy == configapi.NVLinkRequired {
		return fmt.Errorf("topology.nvlink is Required: %s", msg)
	}
	pl.nvlinkWarning = msg
	return nil
}

func (p *Plugin) knownDevices() string {
	p.gpusMu.RLock()
	defer p.gpusMu.RUnlock()
	minors := make([]int, 0, len(p.gpus))
	for m := range p.gpus {
		minors = append(minors, m)
	}
	slices.Sort(minors)
	names := make([]string, len(minors))
	for i, m := range minors {
		names[i] = model.WholeDeviceName(m)
	}
	if len(names) == 0 {
		return "no GPUs"
	}
	return strings.Join(names, ", ")
}
