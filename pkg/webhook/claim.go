package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// ValidateDeviceClaim checks the devices of a ResourceClaim (spec.devices, or
// spec.spec.devices of a ResourceClaimTemplate) for everything about driver
// gpu.tessera.dev that the kubelet plugin would refuse when it prepares the
// claim, so that the claim is refused when it is written instead of leaving
// its pod in ContainerCreating. path is where devices sits in the object; every
// error carries the field path below it. It is pure and safe for concurrent use.
//
// Each opaque config of the driver must decode (configapi.DecodeStrict), pass
// GpuConfig.Validate and merge (configapi.ConfigForRequest) for every request
// and subrequest. Then, for each request and each firstAvailable subrequest,
// with the values prepare uses for it: what the claim's own config sets, else
// (ValidateDeviceClaimWithClasses, which reads the request's DeviceClass)
// what the class's config sets, since a claim config wins over a class config
// field by field:
//
//   - a share (class shared.gpu.tessera.dev) whose sharing.computeLimit is below
//     its capacity.requests cores, or whose sharing.memoryLimit is above its
//     capacity.requests memory (rounded up to whole MiB, as the scheduler
//     allocates it), is refused: configapi.GpuConfig.ShareLimits decides, as at
//     prepare;
//   - a share with sharing.isolation MPS, HAMiCore or DriverMemory, and a
//     MIG device with MPS, must be the claim's only device: its request must
//     ask for one device (count 1, not allocationMode All), and no other
//     request may add a gpu.tessera.dev device (a whole GPU, a share, a MIG
//     device), unless both are shares that a matchAttribute
//     gpu.tessera.dev/uuid constraint puts on one GPU;
//   - shares (and MPS MIG devices) of different requests with different
//     sharing.isolation are refused: a claim uses one isolation backend;
//   - topology.nvlink Required on a claim that may get more than one GPU (a
//     request for several, allocationMode All, or several requests) needs
//     matchAttribute gpu.tessera.dev/nvlinkDomain constraints that keep all of
//     them in one NVLink domain (or gpu.tessera.dev/uuid: the same GPU);
//   - a request for MIG devices (class mig.gpu.tessera.dev, or, with the
//     classes, a class whose selector asks for type "mig") may not have
//     sharing.isolation HAMiCore or DriverMemory (MIG is the isolation; MPS
//     is allowed) nor lending.lendWhenIdle true (MIG devices are not
//     lendable): checkMIG.
//
// Every alternative of a firstAvailable request is checked: an alternative
// prepare refuses would leave the pod stuck whenever the scheduler picks it.
// Shares with adminAccess get no limits and no backend at prepare, so their
// limits and isolation are not checked either.
//
// A claim's config may not set sharing.allowedIsolations: only a DeviceClass
// config may (configapi.GpuConfig.ValidateForClaim).
//
// Requests are told apart by their DeviceClass name (modelnames.WholeClassName,
// modelnames.SharedClassName, modelnames.LentClassName, modelnames.MIGClassName); requests of other classes
// are not checked and add no device of this driver, except that
// ValidateDeviceClaimWithClasses reads them for MIG selectors (selectsMIG). What the claim does not show cannot be checked here:
// without the classes, a DeviceClass config (spec.config) can still make
// prepare refuse a claim this allows, and the node's --default-isolation
// always can. ValidateDeviceClaimWithClasses also reads the classes for
// their sharing.allowedIsolations, and checks a claim without configs of
// its own against its classes' configs.
//
// warnings are for what prepare accepts but users rarely mean: a share that
// names no memory is allocated all of its GPU's memory (the shared device's
// requestPolicy default). They start with the field path.
func ValidateDeviceClaim(devices *resourceapi.DeviceClaim, path *field.Path) (errs field.ErrorList, warnings []string) {
	errs, warnings, _ = validateDeviceClaim(context.Background(), devices, path, false, nil)
	return errs, warnings
}

// ValidateDeviceClaimWithClasses is ValidateDeviceClaim, and also checks the
// claim against the floor of each DeviceClass its requests name: the class's
// sharing.allowedIsolations (see checkFloor). classes reads a class by name;
// it is the only input besides devices, so the check stays pure when classes
// is (a map in tests, the API server's classes in the webhook). A nil classes
// reads none: the same as ValidateDeviceClaim.
func ValidateDeviceClaimWithClasses(devices *resourceapi.DeviceClaim, path *field.Path, classes DeviceClassLookup) (errs field.ErrorList, warnings []string) {
	errs, warnings, _ = validateDeviceClaim(context.Background(), devices, path, false, classes)
	return errs, warnings
}

// unit is one way a request of the claim is allocated: the request itself, or
// one subrequest of a firstAvailable request.
type unit struct {
	// name is the request name of its device results: "gpus" or "gpus/nvlink".
	name string
	// request is the index of the request in spec.devices.requests.
	request int
	// path is spec.devices.requests[i].exactly (the request itself in
	// v1beta1) or spec.devices.requests[i].firstAvailable[j].
	path  *field.Path
	class string
	// adminAccess devices are not reserved and get no limits at prepare.
	adminAccess bool
	all         bool  // allocationMode All
	count       int64 // devices of an ExactCount request, at least 1
	capacity    map[resourceapi.QualifiedName]resource.Quantity
	tolerations []resourceapi.DeviceToleration
	// mig: the unit's class selects MIG devices (modelnames.MIGClassName, or a class
	// whose selector asks for type "mig"; see markMIG).
	mig bool
	// Index of the claim config entry that sets each field for this unit last
	// (the one whose value prepare uses), -1 when none does.
	isolation, computeLimit, memoryLimit, nvlink, lending int
}

func (u *unit) ours() bool {
	return u.class == modelnames.WholeClassName || u.shared()
}

func (u *unit) shared() bool {
	return u.class == modelnames.SharedClassName || u.class == modelnames.LentClassName
}

// limited reports whether prepare computes limits and an isolation backend for
// the unit's devices: shares, except with adminAccess.
func (u *unit) limited() bool { return u.shared() && !u.adminAccess }

// multi reports whether the unit alone may get more than one device.
func (u *unit) multi() bool { return u.all || u.count > 1 }

func (u *unit) describeCount() string {
	if u.all {
		return "all matching GPUs (allocationMode All)"
	}
	return fmt.Sprintf("%d GPUs", u.count)
}

// claimChecker holds what the checks of one claim share.
type claimChecker struct {
	devices *resourceapi.DeviceClaim
	path    *field.Path
	units   []unit
	// byRequest lists the units of each request, by request index.
	byRequest [][]int
	// decoded is the decoded config entry at each index of spec.devices.config;
	// nil for entries of other drivers.
	decoded []*configapi.GpuConfig
	// classes reads the DeviceClasses the requests name (nil: none is read),
	// and floors holds what was read of each, by name.
	classes DeviceClassLookup
	floors  map[string]*classFloor
	// ownConfig is set when the claim has a config of this driver.
	ownConfig bool
}

// validateDeviceClaim is ValidateDeviceClaimWithClasses; inline says that the
// fields of an exact request sit in the request itself
// (resource.k8s.io/v1beta1), which only changes the field paths. A claim
// over the API's list sizes (checkLimits) gets only those errors. err is
// ctx's error when ctx ended before the checks did.
func validateDeviceClaim(ctx context.Context, devices *resourceapi.DeviceClaim, path *field.Path, inline bool, classes DeviceClassLookup) (field.ErrorList, []string, error) {
	if errs := checkLimits(devices, path); len(errs) > 0 {
		return errs, nil, nil
	}
	c := &claimChecker{devices: devices, path: path}
	c.collectUnits(inline)
	if classes != nil {
		// markMIG, checkFloor and the class settings read the same
		// classes: once each.
		classes = memoize(classes)
		c.classes = classes
		c.markMIG(classes)
	}
	warnings := append(c.warnings(), c.migAdminWarnings()...)

	errs, ours := c.decodeConfigs()
	errs = append(errs, c.checkTolerations()...)
	c.ownConfig = len(ours) > 0
	if len(errs) > 0 || (len(ours) == 0 && classes == nil) {
		// Without configs of its own, a claim gets only its classes'.
		return errs, warnings, ctx.Err()
	}
	// Units to which the same config entries apply merge to the same config:
	// merge once per distinct set of entries (configs are at most 32, see
	// checkLimits), so the cost grows with the configs, not with requests ×
	// configs.
	merged := map[uint64]error{}
	for _, u := range c.units {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		key := c.appliesMask(u.name)
		err, done := merged[key]
		if !done {
			_, err = configapi.ConfigForRequest(ours, u.name)
			merged[key] = err
		}
		if err != nil {
			errs = append(errs, field.Invalid(path.Child("config"), "", fmt.Sprintf("request %q: %v", u.name, err)))
		}
	}
	if len(errs) > 0 {
		return errs, warnings, nil
	}
	c.resolveSettings()
	for _, check := range []func() field.ErrorList{c.checkShareLimits, c.checkIsolation, c.checkNVLink, c.checkMIG} {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		errs = append(errs, check()...)
	}
	if classes != nil {
		floorErrs, floorWarnings := c.checkFloor(classes)
		errs = append(errs, floorErrs...)
		warnings = append(warnings, floorWarnings...)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if len(errs) == 0 {
		warnings = append(warnings, c.hamiSharingWarnings()...)
	}
	return errs, warnings, nil
}

// appliesMask has bit i set when config entry i of the driver applies to
// request (configapi.AppliesTo). checkLimits keeps the entries within 32.
func (c *claimChecker) appliesMask(request string) uint64 {
	var mask uint64
	for i, cfg := range c.decoded {
		if cfg != nil && configapi.AppliesTo(c.devices.Config[i].Requests, request) {
			mask |= 1 << i
		}
	}
	return mask
}

// hamiSharingWarnings warns about a standalone ResourceClaim (its devices at
// spec.devices; a template's are at spec.spec.devices) whose config picks
// HAMiCore for a share. HAMi-core keeps the claim's usage in one shared
// region with a slot per process, keyed by the process's PID in its own PID
// namespace: processes of two pods (or of two containers of a pod without
// shareProcessNamespace) that use the claim may get the same PID and
// overwrite each other's slot, so the region undercounts and the limit no
// longer holds. A standalone claim is the kind that several pods reference;
// that a template's claim is used by several containers of its pod is not
// visible here (docs/ARCHITECTURE.md, "HAMiCore and PID namespaces"). The
// class default (DeviceClass config) is not looked at.
func (c *claimChecker) hamiSharingWarnings() []string {
	if c.path.String() != "spec.devices" {
		return nil
	}
	for k := range c.units {
		u := &c.units[k]
		if !u.limited() || c.isolationOf(u) != configapi.IsolationHAMiCore {
			continue
		}
		return []string{fmt.Sprintf("%s: HAMiCore counts usage per PID namespace: reference this claim from one pod only "+
			"(several containers: shareProcessNamespace), or processes overwrite each other's usage and exceed the limit",
			c.paramsPath(u.isolation).Child("sharing", "isolation"))}
	}
	return nil
}

func (c *claimChecker) collectUnits(inline bool) {
	c.byRequest = make([][]int, len(c.devices.Requests))
	add := func(u unit) {
		u.isolation, u.computeLimit, u.memoryLimit, u.nvlink, u.lending = -1, -1, -1, -1, -1
		u.mig = u.class == modelnames.MIGClassName
		c.byRequest[u.request] = append(c.byRequest[u.request], len(c.units))
		c.units = append(c.units, u)
	}
	for i, r := range c.devices.Requests {
		rpath := c.path.Child("requests").Index(i)
		if len(r.FirstAvailable) == 0 {
			u := unit{name: r.Name, request: i, path: rpath.Child("exactly"), count: 1}
			if inline {
				u.path = rpath
			}
			if ex := r.Exactly; ex != nil {
				u.class = ex.DeviceClassName
				u.all = ex.AllocationMode == resourceapi.DeviceAllocationModeAll
				u.count = max(ex.Count, 1)
				u.adminAccess = ex.AdminAccess != nil && *ex.AdminAccess
				if ex.Capacity != nil {
					u.capacity = ex.Capacity.Requests
				}
				u.tolerations = ex.Tolerations
			}
			add(u)
			continue
		}
		for j, sub := range r.FirstAvailable {
			u := unit{
				name:        r.Name + "/" + sub.Name,
				request:     i,
				path:        rpath.Child("firstAvailable").Index(j),
				class:       sub.DeviceClassName,
				all:         sub.AllocationMode == resourceapi.DeviceAllocationModeAll,
				count:       max(sub.Count, 1),
				tolerations: sub.Tolerations,
			}
			if sub.Capacity != nil {
				u.capacity = sub.Capacity.Requests
			}
			add(u)
		}
	}
}

// warnings names each share that asks for no memory: the shared device's
// requestPolicy default is all of the GPU's memory.
func (c *claimChecker) warnings() []string {
	var warnings []string
	for _, u := range c.units {
		if !u.limited() {
			continue
		}
		if _, ok := u.capacity[modelnames.Memory]; ok {
			continue
		}
		warnings = append(warnings, fmt.Sprintf("%s: not set, so request %q of class %s is allocated all of a GPU's memory "+
			"and no other share fits on that GPU", u.path.Child("capacity", "requests").Key(string(modelnames.Memory)), u.name, u.class))
	}
	return warnings
}

// decodeConfigs decodes and validates every opaque config entry of the driver
// on its own, and returns them as the allocation will carry them.
func (c *claimChecker) decodeConfigs() (field.ErrorList, []resourceapi.DeviceAllocationConfiguration) {
	var errs field.ErrorList
	var ours []resourceapi.DeviceAllocationConfiguration
	c.decoded = make([]*configapi.GpuConfig, len(c.devices.Config))
	for i, entry := range c.devices.Config {
		if entry.Opaque == nil || entry.Opaque.Driver != configapi.GroupName {
			continue
		}
		paramsPath := c.paramsPath(i)
		raw := entry.Opaque.Parameters.Raw
		if len(raw) == 0 && entry.Opaque.Parameters.Object != nil {
			// Set by Go callers that build the object in memory; the API
			// server always delivers Raw.
			var err error
			if raw, err = json.Marshal(entry.Opaque.Parameters.Object); err != nil {
				errs = append(errs, field.Invalid(paramsPath, "", fmt.Sprintf("encode parameters: %v", err)))
				continue
			}
		}
		cfg, err := configapi.DecodeStrict(raw)
		if err != nil {
			errs = append(errs, field.Invalid(paramsPath, "", err.Error()))
			continue
		}
		for _, e := range append(cfg.Validate(), cfg.ValidateForClaim()...) {
			rooted := *e
			rooted.Field = paramsPath.String() + "." + e.Field
			errs = append(errs, &rooted)
		}
		c.decoded[i] = cfg
		ours = append(ours, resourceapi.DeviceAllocationConfiguration{
			Source:   resourceapi.AllocationConfigSourceClaim,
			Requests: entry.Requests,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver:     entry.Opaque.Driver,
				Parameters: runtime.RawExtension{Raw: raw},
			}},
		})
	}
	return errs, ours
}

func (c *claimChecker) paramsPath(entry int) *field.Path {
	return c.path.Child("config").Index(entry).Child("opaque", "parameters")
}

// resolveSettings records, per unit, which config entry sets each field last:
// later entries win field by field, as in configapi.ConfigForRequest.
func (c *claimChecker) resolveSettings() {
	for k := range c.units {
		u := &c.units[k]
		for i, cfg := range c.decoded {
			if cfg == nil || !configapi.AppliesTo(c.devices.Config[i].Requests, u.name) {
				continue
			}
			if s := cfg.Sharing; s != nil {
				if s.Isolation != "" {
					u.isolation = i
				}
				if s.ComputeLimit != nil {
					u.computeLimit = i
				}
				if s.MemoryLimit != nil {
					u.memoryLimit = i
				}
			}
			if t := cfg.Topology; t != nil && t.NVLink != "" {
				u.nvlink = i
			}
			if l := cfg.Lending; l != nil && l.LendWhenIdle != nil {
				u.lending = i
			}
		}
	}
}

func (c *claimChecker) isolationOf(u *unit) configapi.Isolation {
	if u.isolation < 0 {
		return ""
	}
	return c.decoded[u.isolation].Sharing.Isolation
}

// setting is where a value that prepare uses for a unit is set: in a
// config entry of the claim, or in the config of the unit's DeviceClass
// (which applies when no claim config sets the field).
type setting struct {
	// path is the claim config's field, or the request's deviceClassName.
	path *field.Path
	// where names it in messages.
	where string
	// fromClass is set for the class's config.
	fromClass bool
}

// valueIs begins a message about the value v of the setting at: nothing
// for a claim config's field (the error's path names it), the class config
// and its value for a class's.
func (at setting) valueIs(v any) string {
	if !at.fromClass {
		return ""
	}
	return fmt.Sprintf("%s is %v, which ", at.where, v)
}

func (c *claimChecker) claimSetting(entry int, fields ...string) setting {
	path := c.paramsPath(entry).Child(fields[0], fields[1:]...)
	return setting{path: path, where: path.String()}
}

func (c *claimChecker) classSetting(u *unit, fields ...string) setting {
	return setting{path: u.path.Child("deviceClassName"), where: fmt.Sprintf("%s of DeviceClass %s's config", strings.Join(fields, "."), u.class), fromClass: true}
}

// classOf is what the configs of u's DeviceClass set; nil when no classes
// are read, or the class cannot be read or is invalid (checkFloor reports
// both).
func (c *claimChecker) classOf(u *unit) *classFloor {
	if c.classes == nil || u.class == "" {
		return nil
	}
	floor := c.readFloor(c.classes, u.class)
	if floor.lookupErr != nil || floor.invalid != "" {
		return nil
	}
	return floor
}

// isolationAt is the sharing.isolation prepare gives u from the configs
// (the claim's, else its class's) and where it is set; "" when neither
// sets it and the node's --default-isolation decides.
func (c *claimChecker) isolationAt(u *unit) (configapi.Isolation, setting) {
	if u.isolation >= 0 {
		return c.decoded[u.isolation].Sharing.Isolation, c.claimSetting(u.isolation, "sharing", "isolation")
	}
	if class := c.classOf(u); class != nil && class.isolation != "" {
		return class.isolation, c.classSetting(u, "sharing", "isolation")
	}
	return "", setting{}
}

// nvlinkAt is the topology.nvlink prepare applies to u (the claim's, else
// its class's) and where it is set; "" when neither sets it.
func (c *claimChecker) nvlinkAt(u *unit) (configapi.NVLinkPolicy, setting) {
	if u.nvlink >= 0 {
		return c.decoded[u.nvlink].Topology.NVLink, c.claimSetting(u.nvlink, "topology", "nvlink")
	}
	if class := c.classOf(u); class != nil && class.nvlink != "" {
		return class.nvlink, c.classSetting(u, "topology", "nvlink")
	}
	return "", setting{}
}

// checkShareLimits refuses a share's computeLimit below the cores, and its
// memoryLimit above the memory, the scheduler will allocate for its request.
func (c *claimChecker) checkShareLimits() field.ErrorList {
	var errs field.ErrorList
	for k := range c.units {
		u := &c.units[k]
		if !u.limited() {
			continue
		}
		requests := u.path.Child("capacity", "requests")
		class := c.classOf(u)
		var computeLimit *int32
		var computeAt setting
		switch {
		case u.computeLimit >= 0:
			computeLimit, computeAt = c.decoded[u.computeLimit].Sharing.ComputeLimit, c.claimSetting(u.computeLimit, "sharing", "computeLimit")
		case class != nil && class.computeLimit != nil:
			computeLimit, computeAt = class.computeLimit, c.classSetting(u, "sharing", "computeLimit")
		}
		if computeLimit != nil {
			if cores, ok := allocatedCores(u.capacity); ok {
				check := &configapi.GpuConfig{Sharing: &configapi.SharingConfig{ComputeLimit: computeLimit}}
				if _, _, err := check.ShareLimits(0, cores); err != nil {
					requested := u.capacity[modelnames.Cores]
					errs = append(errs, field.Invalid(computeAt.path, *computeLimit,
						fmt.Sprintf("%sis below the %d cores request %q is allocated (%s: %s); the limit must be at least the guarantee, so prepare would refuse the claim",
							computeAt.valueIs(*computeLimit), cores, u.name, requests.Key(string(modelnames.Cores)), requested.String())))
				}
			}
		}
		var memoryLimit *resource.Quantity
		var memoryAt setting
		switch {
		case u.memoryLimit >= 0:
			memoryLimit, memoryAt = c.decoded[u.memoryLimit].Sharing.MemoryLimit, c.claimSetting(u.memoryLimit, "sharing", "memoryLimit")
		case class != nil && class.memoryLimit != nil:
			memoryLimit, memoryAt = class.memoryLimit, c.classSetting(u, "sharing", "memoryLimit")
		}
		if memoryLimit != nil {
			if memory, ok := allocatedMemory(u.capacity); ok {
				check := &configapi.GpuConfig{Sharing: &configapi.SharingConfig{MemoryLimit: memoryLimit}}
				if _, _, err := check.ShareLimits(memory, 0); err != nil {
					requested := u.capacity[modelnames.Memory]
					errs = append(errs, field.Invalid(memoryAt.path, memoryLimit.String(),
						fmt.Sprintf("%sis above the %s of memory request %q is allocated (%s: %s); memory cannot be overcommitted, so prepare would refuse the claim",
							memoryAt.valueIs(memoryLimit), resource.NewQuantity(memory, resource.BinarySI), u.name, requests.Key(string(modelnames.Memory)), requested.String())))
				}
			}
		}
	}
	return errs
}

// allocatedCores is the cores capacity the scheduler allocates for requested
// cores: rounded up to a whole percent (the shared device's requestPolicy has
// step 1). ok is false when no cores are requested (ShareLimits then accepts
// any limit) or the request is outside 0..100 (the claim cannot be allocated).
func allocatedCores(requests map[resourceapi.QualifiedName]resource.Quantity) (int64, bool) {
	q, ok := requests[modelnames.Cores]
	if !ok || q.Sign() < 0 || q.CmpInt64(configapi.MaxCores) > 0 {
		return 0, false
	}
	return q.Value(), true
}

// allocatedMemory is the memory capacity the scheduler allocates for
// requested memory: rounded up to whole MiB, at least 1Mi (the shared device's
// requestPolicy, see pkg/model). ok is false when no memory is requested (all of
// an unknown GPU's memory) or the request does not fit in an int64.
func allocatedMemory(requests map[resourceapi.QualifiedName]resource.Quantity) (int64, bool) {
	const step = configapi.MinMemoryLimitBytes
	q, ok := requests[modelnames.Memory]
	if !ok || q.CmpInt64(math.MaxInt64) > 0 {
		return 0, false
	}
	if q.CmpInt64(step) < 0 {
		return step, true
	}
	n := q.Value() / step
	if q.Value()%step != 0 {
		n++
	}
	if n > math.MaxInt64/step {
		return 0, false
	}
	return n * step, true
}

// oneShareOnly are the backends whose claims must be exactly one share, and
// why.
var oneShareOnly = map[configapi.Isolation]string{
	configapi.IsolationMPS:      "a client talks to one MPS daemon, which serves one GPU",
	configapi.IsolationHAMiCore: "its limits are per process, for the one GPU CUDA sees",
	// The hook's NVIDIA_GPU_MEMORY_LIMIT is one value for the whole container.
	configapi.IsolationDriverMemory: "the driver's memory limit variables are one value for the whole container",
}

// backendIsolation is the isolation backend prepare runs for u's devices,
// from the claim's config, else its class's, and where it is set: a
// share's isolation, or MPS inside a MIG device (Advisory there runs no
// backend). "" for other units, and when no config sets it (the node's
// --default-isolation decides).
func (c *claimChecker) backendIsolation(u *unit) (configapi.Isolation, setting) {
	switch {
	case u.limited():
		return c.isolationAt(u)
	case u.mig && !u.adminAccess:
		if isolation, at := c.isolationAt(u); isolation == configapi.IsolationMPS {
			return isolation, at
		}
	}
	return "", setting{}
}

// checkIsolation refuses an MPS, HAMiCore or DriverMemory share (or an MPS
// MIG device) that is not the claim's only device, and shares of different
// requests with different isolation backends. The isolation is the claim
// config's, else the DeviceClass config's, as at prepare.
func (c *claimChecker) checkIsolation() field.ErrorList {
	var errs field.ErrorList
	reportedRequest := map[int]bool{}
	reportedPair := map[[2]int]bool{}
	for k := range c.units {
		u := &c.units[k]
		isolation, at := c.backendIsolation(u)
		if isolation == "" {
			continue
		}
		isolationPath := at.where
		if why, ok := oneShareOnly[isolation]; ok {
			mps := fmt.Sprintf("request %q has isolation %s (%s) and may get %s; an %s claim must be exactly one share "+
				"(%s), so prepare would refuse the claim",
				u.name, isolation, isolationPath, u.describeCount(), isolation, why)
			switch {
			case u.all:
				errs = append(errs, field.Invalid(u.path.Child("allocationMode"), string(resourceapi.DeviceAllocationModeAll), mps))
			case u.count > 1:
				errs = append(errs, field.Invalid(u.path.Child("count"), u.count, mps))
			}
			reportedRequest[u.request] = true
			for j := range c.devices.Requests {
				if reportedRequest[j] || !c.requestAddsDevice(j) || c.sameGPU(u, j) {
					continue
				}
				reportedRequest[j] = true
				errs = append(errs, field.Invalid(c.path.Child("requests").Index(j), "", fmt.Sprintf(
					"request %q adds a second %s device to a claim whose request %q has isolation %s (%s); an %s claim must be exactly one share, "+
						"so prepare would refuse the claim (two shares are one GPU only when a matchAttribute %s constraint covers both requests)",
					c.devices.Requests[j].Name, modelnames.DriverName, u.name, isolation, isolationPath, isolation, modelnames.UUIDAttribute)))
			}
		}
		// One backend per claim: compare with the shares of earlier requests.
		for m := range k {
			other := &c.units[m]
			if other.request == u.request {
				continue
			}
			otherIsolation, otherAt := c.backendIsolation(other)
			pair := [2]int{other.request, u.request}
			if otherIsolation == "" || otherIsolation == isolation || reportedPair[pair] {
				continue
			}
			reportedPair[pair] = true
			errs = append(errs, field.Invalid(at.path, string(isolation), fmt.Sprintf(
				"request %q would use isolation %s, but request %q uses %s (%s); a claim uses one isolation backend, so prepare would refuse the claim",
				u.name, isolation, other.name, otherIsolation, otherAt.where)))
		}
	}
	return errs
}

// requestIsOurs reports whether request j surely adds a device of this
// driver: each of its alternatives asks for a class of this driver.
func (c *claimChecker) requestIsOurs(j int) bool {
	for _, k := range c.byRequest[j] {
		if !c.units[k].ours() {
			return false
		}
	}
	return len(c.byRequest[j]) > 0
}

// requestAddsDevice reports whether request j surely adds a device of this
// driver to the claim: each of its alternatives asks for a class of this
// driver or for MIG devices.
func (c *claimChecker) requestAddsDevice(j int) bool {
	for _, k := range c.byRequest[j] {
		if u := &c.units[k]; !u.ours() && !u.mig {
			return false
		}
	}
	return len(c.byRequest[j]) > 0
}

// covers reports whether constraint covers unit u and every alternative of
// request j (j < 0: none).
func (c *claimChecker) covers(constraint resourceapi.DeviceConstraint, u *unit, j int) bool {
	if !configapi.AppliesTo(constraint.Requests, u.name) {
		return false
	}
	if j < 0 {
		return true
	}
	for _, k := range c.byRequest[j] {
		if !configapi.AppliesTo(constraint.Requests, c.units[k].name) {
			return false
		}
	}
	return true
}

// sameGPU reports whether share u and every alternative of request j are
// shares that a matchAttribute uuid constraint puts on one GPU: prepare counts
// two shares of one GPU as one GPU.
func (c *claimChecker) sameGPU(u *unit, j int) bool {
	if !u.shared() {
		return false
	}
	for _, k := range c.byRequest[j] {
		if !c.units[k].shared() {
			return false
		}
	}
	return c.constrained(u, j, modelnames.UUIDAttribute)
}

// constrained reports whether a matchAttribute constraint on one of
// attributes covers u and request j (j < 0: u alone).
func (c *claimChecker) constrained(u *unit, j int, attributes ...resourceapi.FullyQualifiedName) bool {
	for _, constraint := range c.devices.Constraints {
		if constraint.MatchAttribute == nil {
			continue
		}
		for _, a := range attributes {
			if *constraint.MatchAttribute == a && c.covers(constraint, u, j) {
				return true
			}
		}
	}
	return false
}

// checkNVLink refuses topology.nvlink Required on a claim that may get GPUs
// of different NVLink domains: prepare checks the policy on all of the
// claim's GPUs, so a constraint must keep the scheduler within one domain.
func (c *claimChecker) checkNVLink() field.ErrorList {
	var errs field.ErrorList
	reportedPair := map[[2]int]bool{}
	constraints := c.path.Child("constraints")
	for k := range c.units {
		u := &c.units[k]
		policy, at := c.nvlinkAt(u)
		if !u.ours() || policy != configapi.NVLinkRequired {
			continue
		}
		var problems []string
		if u.multi() && !c.constrained(u, -1, modelnames.NVLinkDomainAttribute) {
			problems = append(problems, fmt.Sprintf("request %q (%s) may get %s, and no matchAttribute %s constraint in %s covers it",
				u.name, u.path, u.describeCount(), modelnames.NVLinkDomainAttribute, constraints))
		}
		for j := range c.devices.Requests {
			pair := [2]int{min(j, u.request), max(j, u.request)}
			if j == u.request || reportedPair[pair] || !c.requestIsOurs(j) ||
				c.constrained(u, j, modelnames.NVLinkDomainAttribute) || c.sameGPU(u, j) {
				continue
			}
			reportedPair[pair] = true
			problems = append(problems, fmt.Sprintf("requests %q and %q may get different GPUs, and no matchAttribute %s constraint in %s covers both",
				u.name, c.devices.Requests[j].Name, modelnames.NVLinkDomainAttribute, constraints))
		}
		if len(problems) == 0 {
			continue
		}
		detail := strings.Join(problems, "; ") + ": the scheduler may pick GPUs of different NVLink domains, and prepare then refuses the claim"
		if at.fromClass {
			detail = fmt.Sprintf("%s is Required: %s", at.where, detail)
		}
		errs = append(errs, field.Invalid(at.path, string(configapi.NVLinkRequired), detail))
	}
	return errs
}
