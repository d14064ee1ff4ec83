package model

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// Capacity and counter names. They are also the names HAMi and Volcano quota
// tooling read, and what users put under capacity.requests.
const (
	// Memory is framebuffer memory in bytes.
	Memory = modelnames.Memory
	// Cores is the percentage (0–100) of the GPU's compute.
	Cores = modelnames.Cores
)

// CoresPerGPU is the value of the cores capacity and counter of every GPU.
const CoresPerGPU = modelnames.CoresPerGPU

// AttrType tells the kinds of device apart: its values are TypeWhole,
// TypeShared, TypeLent and TypeMIG.
const AttrType = modelnames.AttrType

// Driver-local attribute names. In CEL and in matchAttribute constraints they are
// qualified by the driver name: device.attributes["gpu.tessera.dev"].uuid,
// gpu.tessera.dev/nvlinkDomain.
const (
	AttrUUID                  resourceapi.QualifiedName = "uuid"
	AttrProductName           resourceapi.QualifiedName = "productName"
	AttrArchitecture          resourceapi.QualifiedName = "architecture"
	AttrCUDAComputeCapability resourceapi.QualifiedName = "cudaComputeCapability"
	AttrDriverVersion         resourceapi.QualifiedName = "driverVersion"
	AttrCUDADriverVersion     resourceapi.QualifiedName = "cudaDriverVersion"
	AttrIndex                 resourceapi.QualifiedName = "index"
	AttrMinor                 resourceapi.QualifiedName = "minor"
	AttrNVLinkDomain          resourceapi.QualifiedName = "nvlinkDomain"
	// AttrComputeMode is the GPU's compute mode as discovery read it
	// (gpu.ComputeMode: "Default", "ExclusiveProcess", "Prohibited"); left
	// out when the driver does not report it. A DeviceClass can select GPUs
	// dedicated to one mode with it.
	AttrComputeMode resourceapi.QualifiedName = "computeMode"

	// Attributes of MIG devices, besides type, uuid, index, minor and the
	// GPU's product, architecture and versions (index and minor are the
	// parent GPU's, so that selectors on them keep meaning the GPU).

	// AttrParentUUID is the parent GPU's "GPU-…" UUID.
	AttrParentUUID resourceapi.QualifiedName = "parentUUID"
	// AttrParentMinor is the parent GPU's minor (the same value as minor).
	AttrParentMinor resourceapi.QualifiedName = "parentMinor"
	// AttrProfile is the GPU-instance profile as nvidia-smi names it:
	// "3g.40gb", "1g.10gb+me".
	AttrProfile resourceapi.QualifiedName = "profile"
	// AttrPlacementStart and AttrPlacementSize are the memory slices the
	// GPU instance covers: start, start+1, …, start+size-1.
	AttrPlacementStart resourceapi.QualifiedName = "placementStart"
	AttrPlacementSize  resourceapi.QualifiedName = "placementSize"
	// AttrMultiprocessors is the SM count of the MIG device.
	AttrMultiprocessors resourceapi.QualifiedName = "multiprocessors"
	// AttrComputeInstances is the number of compute instances of a static
	// MIG device's GPU instance (1 unless an admin split it: 1c.3g.40gb).
	// A CUDA process uses only one of them.
	AttrComputeInstances resourceapi.QualifiedName = "computeInstances"
)

// Values of the type attribute.
const (
	// TypeWhole marks gpu-N, the exclusive whole GPU.
	TypeWhole = modelnames.TypeWhole
	// TypeShared marks gpu-N-shared, the device that hands out fractions.
	TypeShared = modelnames.TypeShared
	// TypeLent marks gpu-N-lent, the device that lends a held, idle GPU.
	TypeLent = modelnames.TypeLent
)

// Taints of a lending device (gpu-N-lent). Borrowers never tolerate
// NotLentTaintKey; they may tolerate ReclaimTaintKey for a while
// (tolerationSeconds) to save their work before they are evicted.
const (
	// NotLentTaintKey (effect NoSchedule) is on a lending device while its
	// GPU is not lent: not held, held by an owner that does not lend, busy,
	// or not idle long enough. The value says which.
	NotLentTaintKey = modelnames.NotLentTaintKey
	// ReclaimTaintKey (effect NoExecute) is on a lending device whenever
	// NotLentTaintKey is: kube-controller-manager evicts every pod of a
	// borrower the GPU still has (after the claim's tolerationSeconds).
	ReclaimTaintKey = DriverName + "/reclaim"
)

// LentBelowMinimumShare is the lending taints' value on a GPU that would lend
// less than MinShareMemory: no share that small can be allocated.
const LentBelowMinimumShare = "BelowMinimumShare"

// Lent is what a GPU's lending device publishes (see WithLending).
type Lent struct {
	// Open is true while the GPU is lent: the device has no lending taint.
	Open bool
	// Memory is the memory the GPU lends, in bytes; 0 publishes the GPU's
	// whole memory (with the device tainted, nobody can take it). Less than
	// MinShareMemory plus one MiB is published as 0 and closes the device
	// (LentBelowMinimumShare).
	Memory int64
	// Reason is the value of the lending taints (NotLent when empty).
	Reason string
}

// Request policy of the shared device's memory capacity: shares are whole MiB.
var memoryStep = resource.MustParse("1Mi")

// MinShareMemory is the least memory a share is charged. It is the
// validRange.min of the shared device's memory request policy, so the
// scheduler rounds a smaller request up to it and charges the GPU that much.
//
// A share's memory includes the CUDA contexts of its processes: HAMi-core
// counts each context (about 0.5 GiB on an H100) against the share's limit,
// and whatever MPS or the driver's limit count, the context comes out of the
// same GPU: nothing is set aside for it outside the shares. A share smaller
// than one context cannot start a CUDA process at all; 1 GiB leaves one
// process about half of it for its own allocations. Whoever runs N
// processes in one share asks for N contexts more (docs/fractions.md).
var MinShareMemory = resource.MustParse("1Gi")

// minShareMemory is MinShareMemory, or one step for a device with too little
// memory to offer it (the API wants min + step within the capacity).
func minShareMemory(capacity resource.Quantity) resource.Quantity {
	least := MinShareMemory.DeepCopy()
	least.Add(memoryStep)
	if capacity.Cmp(least) < 0 {
		return memoryStep.DeepCopy()
	}
	return MinShareMemory.DeepCopy()
}

// PCIeRoots resolves the PCIe root complex of a GPU, the value of the standard
// attribute resource.kubernetes.io/pcieRoot. Implementations may read sysfs; the
// model only calls them, so Resources stays free of I/O. On a real node the kubelet
// plugin wraps deviceattribute.GetPCIeRootAttributeByPCIBusID.
type PCIeRoots interface {
	// PCIeRoot returns the root complex ("pci0000:00") of the PCI device with this
	// bus id ("0000:07:00.0"), or ok=false when it is not known. Unknown roots are
	// left out of the published attributes; they never fail the model.
	PCIeRoot(pciBusID string) (root string, ok bool)
}

// PCIeRootMap is a PCIeRoots resolved up front: bus id → root complex.
type PCIeRootMap map[string]string

// PCIeRoot implements PCIeRoots.
func (m PCIeRootMap) PCIeRoot(pciBusID string) (string, bool) {
	root, ok := m[pciBusID]
	return root, ok && root != ""
}

// Option adjusts Resources.
type Option func(*options)

type options struct {
	pcieRoots PCIeRoots
	taints    map[string][]resourceapi.DeviceTaint
	lending   map[string]Lent
	// driverMemoryLimits is published as AttrDriverMemoryLimits when set
	// (WithDriverMemoryLimits).
	driverMemoryLimits *bool
	// localityVerdicts puts the locality binding conditions on shared
	// devices (WithLocalityVerdicts).
	localityVerdicts bool
	// dynamicMIG names, by UUID, the MIG-mode GPUs published with dynamic
	// MIG (WithDynamicMIG); migHeld the GPU instances Tessera's claims hold
	// (WithMIGHeld).
	dynamicMIG map[string]bool
	migHeld    map[string][]MIGHold
}

// WithPCIeRoots makes Resources publish resource.kubernetes.io/pcieRoot for the GPUs
// whose root r knows (sysfs on real nodes). Without it, or for a GPU r does not
// know, the GPU's own PCIeRoot is published (what a mock profile's discovery
// knows); a GPU with neither is published without the attribute.
func WithPCIeRoots(r PCIeRoots) Option {
	return func(o *options) { o.pcieRoots = r }
}

// WithTaints puts device taints on every device of the GPUs named by UUID
// (gpu-N, gpu-N-shared, gpu-N-lent, or the MIG devices of a GPU in MIG
// mode); the health monitor taints unhealthy GPUs this way.
// The taints are copied. GPUs not in the map, and UUIDs of no published GPU,
// change nothing; more than resourceapi.DeviceTaintsMaxLength taints for one
// GPU make Resources fail.
func WithTaints(taints map[string][]resourceapi.DeviceTaint) Option {
	return func(o *options) { o.taints = taints }
}

// WithLending publishes a third device per GPU, gpu-N-lent: it lends the
// spare capacity of a GPU that its owners hold but do not use to preemptible
// borrowers. It consumes none of the GPU's counters, so it can be allocated
// while the GPU is held whole or in shares, and an owner never waits for it.
// lent says, by GPU UUID, what each lends; a GPU not in it is published
// tainted NotLentTaintKey=NotLent. The device carries the GPU's other taints
// too (health). A GPU in MIG mode has no lending device: MIG devices are not
// lent.
func WithLending(lent map[string]Lent) Option {
	return func(o *options) {
		o.lending = lent
		if o.lending == nil {
			o.lending = map[string]Lent{}
		}
	}
}

// Resources is what the kubelet plugin of node nodeName publishes for these GPUs:
// one pool named after the node, holding the counter slices first and then the
// device slices, in the shape described in the package documentation.
//
// The caller may assume:
//
//   - The result depends only on the arguments (no I/O, no clock, no randomness)
//     and not on the order of gpus: publishing it twice changes nothing.
//   - Counter sets are grouped ResourceSliceMaxCounterSets per slice by ascending
//     minor; device slices hold at most ResourceSliceMaxDevicesWithAdvancedFeatures
//     devices, and each MIG-mode GPU's devices sit in slices of their own. An
//     8-GPU node publishes 1 counter slice + 1 device slice; a 16-GPU node
//     2 + 1; 8 GPUs with dynamic MIG 1 + 8. The result passes Validate.
//   - Device order is the allocator's preference, because kube-scheduler's
//     allocator walks slices by name and devices in slice order and takes the
//     first that fits. Shared devices come first, by ascending minor, so shares
//     pack first-fit onto gpu-0-shared, then gpu-1-shared, …; whole devices follow
//     by descending minor, so whole-GPU claims take the highest free GPU. Shares and
//     whole GPUs thus fill the node from opposite ends, which keeps GPUs free of
//     shares for whole claims for as long as possible. Shares, the common request,
//     come first so that they find their device without the allocator evaluating
//     the class selector on every whole device (BenchmarkAllocate: a share costs
//     ~170–440 allocations per node, a whole GPU ~680, on 8 GPUs).
//   - A GPU in MIG mode publishes only MIG devices (type "mig"), never whole,
//     shared or lent ones: its memory and compute belong to its MIG instances.
//     Statically (the default) every existing compute instance is an exclusive
//     device; with WithDynamicMIG every placement of every profile is a device,
//     and the GPU's counter set MIGCounterSetName holds its memory slices,
//     compute slices and engines (see mig.go and docs/mig.md). MIG devices come
//     after all others, by ascending minor; within a GPU small profiles come
//     first and each profile's placements from the highest start down, which
//     keeps the large profiles placeable (migPlacementOrder).
//   - Version attributes are semantic versions: "9.0" → "9.0.0" and driver
//     "580.95.05" → "580.95.5" (semver allows no leading zeros). A version that is
//     not one to three dot-separated numbers is left out rather than guessed.
//     numaNode is published as a scalar int (the form that needs no feature gate)
//     when NUMANode is known and not negative.
//
// It returns an error, naming the GPU, for input that cannot be published: an
// invalid node name, a duplicate minor or UUID, a negative minor, no memory,
// memory beyond int64, or a string attribute longer than the API allows.
func Resources(nodeName string, gpus []gpu.GPU, opts ...Option) (resourceslice.DriverResources, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if errs := validation.IsDNS1123Subdomain(nodeName); len(errs) > 0 {
		return resourceslice.DriverResources{}, fmt.Errorf("node name %q is not a valid pool name: %v", nodeName, errs)
	}

	published := make([]gpu.GPU, 0, len(gpus))
	var migGPUs []gpu.GPU
	minors := make(map[int]string, len(gpus))
	uuids := make(map[string]int, len(gpus))
	for _, g := range gpus {
		if err := checkGPU(g, o); err != nil {
			return resourceslice.DriverResources{}, err
		}
		if other, dup := minors[g.Minor]; dup {
			return resourceslice.DriverResources{}, fmt.Errorf("GPU %s: minor %d already used by GPU %s", g.UUID, g.Minor, other)
		}
		if other, dup := uuids[g.UUID]; dup {
			return resourceslice.DriverResources{}, fmt.Errorf("GPU minor %d: UUID %s already used by GPU minor %d", g.Minor, g.UUID, other)
		}
		minors[g.Minor], uuids[g.UUID] = g.UUID, g.Minor
		if g.MIGEnabled {
			migGPUs = append(migGPUs, g)
			continue
		}
		published = append(published, g)
	}
	byMinor := func(a, b gpu.GPU) int { return cmp.Compare(a.Minor, b.Minor) }
	slices.SortFunc(published, byMinor)
	slices.SortFunc(migGPUs, byMinor)

	// Counter sets of all GPUs that have one, by ascending minor.
	var counterSets []resourceapi.CounterSet
	for _, g := range slices.SortedFunc(slices.Values(append(slices.Clone(published), migGPUs...)), byMinor) {
		switch {
		case !g.MIGEnabled:
			counterSets = append(counterSets, resourceapi.CounterSet{Name: CounterSetName(g.Minor), Counters: counters(g)})
		case migHasCounters(g, o):
			counterSets = append(counterSets, migCounterSet(g, o.migHeld[g.UUID]))
		}
	}
	var pool resourceslice.Pool
	for chunk := range slices.Chunk(counterSets, resourceapi.ResourceSliceMaxCounterSets) {
		pool.Slices = append(pool.Slices, resourceslice.Slice{SharedCounters: chunk})
	}

	devices := make([]resourceapi.Device, 0, 3*len(published))
	for _, g := range published {
		devices = append(devices, sharedDevice(g, o))
	}
	for _, g := range slices.Backward(published) {
		devices = append(devices, wholeDevice(g, o))
	}
	if o.lending != nil {
		for _, g := range published {
			d, err := lentDevice(g, o)
			if err != nil {
				return resourceslice.DriverResources{}, err
			}
			devices = append(devices, d)
		}
	}
	for chunk := range slices.Chunk(devices, resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures) {
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: chunk})
	}
	// Each MIG-mode GPU's devices in slices of their own: a dynamic GPU's
	// change as instances come and go (migBlocked) then rewrites only its
	// slice, where a change to several slices of a pool makes the
	// resourceslice controller start a new pool generation, during which
	// the scheduler skips the whole pool.
	for _, g := range migGPUs {
		for chunk := range slices.Chunk(migDevices(g, o), resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures) {
			pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: chunk})
		}
	}
	if len(pool.Slices) == 0 {
		// A node without publishable GPUs still publishes its (empty) pool, so that
		// the scheduler sees "no devices" rather than "pool not published yet".
		pool.Slices = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: pool}}, nil
}

// checkGPU rejects a GPU that cannot become valid API objects.
func checkGPU(g gpu.GPU, o options) error {
	name := g.UUID
	if name == "" {
		name = fmt.Sprintf("minor %d", g.Minor)
	}
	switch {
	case g.UUID == "":
		return fmt.Errorf("GPU %s: no UUID", name)
	case g.Minor < 0:
		return fmt.Errorf("GPU %s: negative minor %d", name, g.Minor)
	case g.MIGEnabled:
		// Published as MIG devices: the GPU's own memory does not matter.
		if err := checkMIG(g, o.migDynamic(g)); err != nil {
			return err
		}
	case g.MemoryBytes == 0:
		return fmt.Errorf("GPU %s: memory size is 0", name)
	case g.MemoryBytes > math.MaxInt64:
		return fmt.Errorf("GPU %s: memory size %d bytes does not fit a quantity", name, g.MemoryBytes)
	}
	if n := len(o.taints[g.UUID]); n > resourceapi.DeviceTaintsMaxLength {
		return fmt.Errorf("GPU %s: %d taints, at most %d allowed", name, n, resourceapi.DeviceTaintsMaxLength)
	}
	for attr, v := range map[resourceapi.QualifiedName]string{
		AttrUUID: g.UUID, AttrProductName: g.ProductName, AttrArchitecture: g.Architecture, AttrNVLinkDomain: g.NVLinkDomain,
	} {
		if len(v) > resourceapi.DeviceAttributeMaxValueLength {
			return fmt.Errorf("GPU %s: attribute %s: %q is longer than %d characters", name, attr, v, resourceapi.DeviceAttributeMaxValueLength)
		}
	}
	return nil
}

// memoryOf is the memory a GPU publishes: its usable memory rounded down to
// whole MiB. NVML's reserved memory need not be a whole MiB, and the shared
// device's default request (all of it) must be a whole number of steps.
func memoryOf(g gpu.GPU) resource.Quantity {
	step := memoryStep.Value()
	return *resource.NewQuantity(int64(g.MemoryBytes)/step*step, resource.BinarySI)
}

func coresOf() resource.Quantity {
	return *resource.NewQuantity(CoresPerGPU, resource.DecimalSI)
}

// counters is the full counter set of a GPU; both of its devices consume all of it.
func counters(g gpu.GPU) map[string]resourceapi.Counter {
	return map[string]resourceapi.Counter{
		string(Memory): {Value: memoryOf(g)},
		string(Cores):  {Value: coresOf()},
	}
}

func consumesAll(g gpu.GPU) []resourceapi.DeviceCounterConsumption {
	return []resourceapi.DeviceCounterConsumption{{CounterSet: CounterSetName(g.Minor), Counters: counters(g)}}
}

func wholeDevice(g gpu.GPU, o options) resourceapi.Device {
	return resourceapi.Device{
		Name:       WholeDeviceName(g.Minor),
		Attributes: attributes(g, TypeWhole, o),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			Memory: {Value: memoryOf(g)},
			Cores:  {Value: coresOf()},
		},
		ConsumesCounters: consumesAll(g),
		Taints:           taintsOf(g, o),
	}
}

// taintsOf is a copy of the GPU's taints, nil without any.
func taintsOf(g gpu.GPU, o options) []resourceapi.DeviceTaint {
	in := o.taints[g.UUID]
	if len(in) == 0 {
		return nil
	}
	out := make([]resourceapi.DeviceTaint, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
}

func sharedDevice(g gpu.GPU, o options) resourceapi.Device {
	memory, cores := memoryOf(g), coresOf()
	var bindingConditions, bindingFailureConditions []string
	if o.localityVerdicts {
		bindingConditions = []string{LocalityAcceptedCondition}
		bindingFailureConditions = []string{LocalityRejectedCondition}
	}
	return resourceapi.Device{
		Name:                     SharedDeviceName(g.Minor),
		AllowMultipleAllocations: ptr.To(true),
		Attributes:               attributes(g, TypeShared, o),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			// A share that names no memory is charged all of it: a workload that
			// did not say how much it needs may use everything, so nothing else
			// may be promised memory on that GPU.
			Memory: {Value: memory, RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: ptr.To(memory.DeepCopy()),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  ptr.To(minShareMemory(memory)),
					Step: ptr.To(memoryStep.DeepCopy()),
				},
			}},
			// A share that names no cores gets no guaranteed compute (best effort).
			Cores: {Value: cores, RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: ptr.To(resource.MustParse("0")),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  ptr.To(resource.MustParse("0")),
					Max:  ptr.To(cores.DeepCopy()),
					Step: ptr.To(resource.MustParse("1")),
				},
			}},
		},
		ConsumesCounters:         consumesAll(g),
		Taints:                   taintsOf(g, o),
		BindingConditions:        bindingConditions,
		BindingFailureConditions: bindingFailureConditions,
	}
}

// lentDevice is gpu-N-lent: capacity like a share's, no counters, and the
// lending taints unless the GPU is lent.
func lentDevice(g gpu.GPU, o options) (resourceapi.Device, error) {
	l := o.lending[g.UUID]
	memory := memoryOf(g)
	if least := MinShareMemory.Value() + memoryStep.Value(); l.Memory > 0 && l.Memory < least {
		// Less than the smallest share cannot be lent (and would not be a
		// valid request policy): closed, offering the whole GPU as when
		// nothing is lendable.
		if l.Open {
			l.Open, l.Reason = false, LentBelowMinimumShare
		}
	} else if l.Memory > 0 && l.Memory < memory.Value() {
		step := memoryStep.Value()
		memory = *resource.NewQuantity(l.Memory/step*step, resource.BinarySI)
	}
	d := sharedDevice(g, o)
	d.Name = LentDeviceName(g.Minor)
	d.Attributes[AttrType] = resourceapi.DeviceAttribute{StringValue: ptr.To(TypeLent)}
	d.ConsumesCounters = nil
	// Borrowers are not judged by the locality controller (it judges shares
	// of gpu-N-shared only): a binding condition here would never be met.
	d.BindingConditions, d.BindingFailureConditions = nil, nil
	mem := d.Capacity[Memory]
	mem.Value = memory
	mem.RequestPolicy.Default = ptr.To(memory.DeepCopy())
	mem.RequestPolicy.ValidRange.Min = ptr.To(minShareMemory(memory))
	d.Capacity[Memory] = mem
	reason := l.Reason
	if reason == "" {
		reason = "NotLent"
	}
	if errs := validation.IsValidLabelValue(reason); len(errs) > 0 {
		return resourceapi.Device{}, fmt.Errorf("GPU %s: lending reason %q is not a valid taint value: %v", g.UUID, reason, errs)
	}
	if !l.Open {
		// NoSchedule keeps borrowers off (they never tolerate it); NoExecute
		// evicts any borrower the GPU still has, after the tolerationSeconds
		// its claim may carry for the reclaim taint.
		d.Taints = append(d.Taints,
			resourceapi.DeviceTaint{Key: NotLentTaintKey, Value: reason, Effect: resourceapi.DeviceTaintEffectNoSchedule},
			resourceapi.DeviceTaint{Key: ReclaimTaintKey, Value: reason, Effect: resourceapi.DeviceTaintEffectNoExecute})
	}
	if len(d.Taints) > resourceapi.DeviceTaintsMaxLength {
		return resourceapi.Device{}, fmt.Errorf("GPU %s: %d taints on %s, at most %d allowed", g.UUID, len(d.Taints), d.Name, resourceapi.DeviceTaintsMaxLength)
	}
	return d, nil
}

// attributes are the same on both devices of a GPU except for type, so that
// selectors and matchAttribute constraints work the same for whole GPUs and shares.
func attributes(g gpu.GPU, typ string, o options) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrType:  {StringValue: ptr.To(typ)},
		AttrUUID:  {StringValue: ptr.To(g.UUID)},
		AttrIndex: {IntValue: ptr.To(int64(g.Index))},
		AttrMinor: {IntValue: ptr.To(int64(g.Minor))},
	}
	for name, v := range map[resourceapi.QualifiedName]string{
		AttrProductName:  g.ProductName,
		AttrArchitecture: g.Architecture,
		AttrNVLinkDomain: g.NVLinkDomain,
		AttrComputeMode:  string(g.ComputeMode),
	} {
		if v != "" {
			attrs[name] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
		}
	}
	for name, v := range map[resourceapi.QualifiedName]string{
		AttrCUDAComputeCapability: g.CUDAComputeCapability,
		AttrDriverVersion:         g.DriverVersion,
		AttrCUDADriverVersion:     g.CUDADriverVersion,
	} {
		if sv, ok := semver(v); ok {
			attrs[name] = resourceapi.DeviceAttribute{VersionValue: ptr.To(sv)}
		}
	}
	if g.NUMANode != nil && *g.NUMANode >= 0 {
		attrs[deviceattribute.StandardDeviceAttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(*g.NUMANode))}
	}
	root := g.PCIeRoot
	if o.pcieRoots != nil && g.PCIBusID != "" {
		if r, ok := o.pcieRoots.PCIeRoot(g.PCIBusID); ok {
			root = r
		}
	}
	if root != "" && len(root) <= resourceapi.DeviceAttributeMaxValueLength {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(root)}
	}
	if o.driverMemoryLimits != nil {
		attrs[AttrDriverMemoryLimits] = resourceapi.DeviceAttribute{BoolValue: ptr.To(*o.driverMemoryLimits)}
	}
	return attrs
}
