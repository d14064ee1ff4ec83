package fleet

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/accounting"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

// GPUsPerNode is the size of the hgx-h100 node profile every simulated node has.
const GPUsPerNode = 8

// gpuMemory is what one H100 80GB publishes (the mock profile hgx-h100, which a
// test checks): NVML's 81559Mi less the 470Mi its driver reserves.
var gpuMemory = resource.MustParse("81089Mi")

// Driver is the driver name on every simulated device (the real one, so the
// DeviceClass selectors are the ones users get).
const Driver = model.DriverName

// Class names used by the simulated claims. The first two are the classes the chart
// installs; the partition classes exist only in this package (scenario (b)).
const (
	WholeClass  = model.WholeClassName
	SharedClass = model.SharedClassName
)

// partitionSizes are the fixed partitions of scenario (b), in eighths of a GPU.
var partitionSizes = []int{1, 2, 4, 8}

func partitionClass(eighths int) string {
	return "eighths-" + strconv.Itoa(eighths) + ".partition.fleet.tessera.dev"
}

// Kind names one of the allocation models the simulation compares.
type Kind string

const (
	// Whole is today's Kubernetes: one device per GPU, one job per GPU.
	Whole Kind = "whole"
	// Partition is fixed partitions published with the partitionable-devices API:
	// per GPU one device of each of 1/1, 2×1/2, 4×1/4, 8×1/8, consuming slot counters
	// so that overlapping partitions exclude each other (the MIG way).
	Partition Kind = "partition"
	// Tessera is the driver's model: gpu-N (exclusive) and gpu-N-shared
	// (allowMultipleAllocations, consumable memory/cores) over counter set gpu-N.
	Tessera Kind = "tessera"
	// TesseraBestFit is Tessera's capacities packed best-fit by an oracle instead of
	// the allocator's first-fit; it shows what first-fit costs. Not the scheduler.
	TesseraBestFit Kind = "tessera-bestfit"
	// Migrating is a reference policy, not a bound: a job starts iff the share
	// requests of the running jobs and its own can be packed into the fleet's
	// GPUs with every running job free to move (repacking at every event, the
	// same queue). It moves running jobs, which no DRA driver can. See
	// migratingPlacer.
	Migrating Kind = "migrating"
	// Fluid is a reference policy without GPU boundaries: a job runs iff the
	// fleet's total free capacity covers its demand.
	Fluid Kind = "fluid"
)

// AllKinds is the report order.
var AllKinds = []Kind{Whole, Partition, Tessera, TesseraBestFit, Migrating, Fluid}

// deviceModel is an allocation model whose devices the real allocator hands out.
type deviceModel interface {
	kind() Kind
	// slices is what the kubelet plugin of node would publish for a node of spec s.
	slices(node string, s NodeSpec) ([]*resourceapi.ResourceSlice, error)
	classes() []*resourceapi.DeviceClass
	// claim is the ResourceClaim job j creates (nil for a CPU-only job).
	claim(j *Job) (*resourceapi.ResourceClaim, error)
	// sizeKey orders claims by size: if a claim of size k fails on an
	// unchanged node, every claim of the same class at least as large fails
	// there too, and if it fits, every claim of the class at most as large
	// fits. The simulation relies on this to skip allocator calls it knows
	// the answer of.
	sizeKey(j *Job) size
	// use maps one allocated device to its GPU on a node of spec s and what
	// it takes of that GPU.
	use(r *resourceapi.DeviceRequestAllocationResult, s NodeSpec) (int, gpuUse, error)
}

func newDeviceModel(k Kind, f Fleet) (deviceModel, error) {
	switch k {
	case Whole:
		return wholeModel{}, nil
	case Partition:
		return partitionModel{}, nil
	case Tessera:
		return newTesseraModel(f)
	case MIG:
		return newMIGModel(f)
	case MIGBySlices:
		m, err := newMIGModel(f)
		if m != nil {
			m.bySlices = true
		}
		return m, err
	}
	return nil, fmt.Errorf("model %q has no devices", k)
}

func class(name, cel string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}},
		},
	}
}

func typeSelector(t string) string {
	return fmt.Sprintf(`device.driver == %q && device.attributes[%q].type == %q`, Driver, Driver, t)
}

// productSelector selects the devices of the job's allowed models by their
// productName attribute ("" when the job takes any).
func productSelector(models []string) string {
	if len(models) == 0 {
		return ""
	}
	var names []string
	for _, n := range models {
		if m, ok := LookupModel(n); ok && !slices.Contains(names, strconv.Quote(m.Product)) {
			names = append(names, strconv.Quote(m.Product))
		}
	}
	if len(names) == 0 {
		names = []string{`"none"`}
	}
	attrs := fmt.Sprintf("device.attributes[%q]", Driver)
	return fmt.Sprintf(`"productName" in %s && %s.productName in [%s]`, attrs, attrs, strings.Join(names, ", "))
}

// claimFor is a claim for count devices of className, with the job's
// GPU-type selector and, for an NVLink job of several devices, a
// matchAttribute constraint on nvlinkDomain.
func claimFor(j *Job, className string, count int, capacity map[resourceapi.QualifiedName]resource.Quantity) *resourceapi.ResourceClaim {
	req := &resourceapi.ExactDeviceRequest{
		DeviceClassName: className,
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           int64(count),
	}
	if capacity != nil {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: capacity}
	}
	if sel := productSelector(j.Models); sel != "" {
		req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: sel}}}
	}
	name := "job-" + strconv.Itoa(j.ID)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fleet", UID: types.UID("uid-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}},
		}},
	}
	if j.NVLink && count > 1 {
		claim.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(Driver + "/" + string(model.AttrNVLinkDomain)))}}
	}
	return claim
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func integer(i int) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i))}
}

// gpuAttributes are the attributes the models (a) and (b) publish for GPU g
// of a node: Tessera's names for the index, product and NVLink domain, so
// that type constraints and NVLink constraints read alike in all three.
func gpuAttributes(typ string, g gpu.GPU) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str(typ), "index": integer(g.Minor)}
	if g.ProductName != "" {
		a[model.AttrProductName] = str(g.ProductName)
	}
	if g.NVLinkDomain != "" {
		a[model.AttrNVLinkDomain] = str(g.NVLinkDomain)
	}
	return a
}

// classKey is the part of a size key that makes claims comparable: the
// same kind of request with the same type constraint and NVLink need.
func classKey(prefix string, j *Job) string {
	k := prefix + "|" + strings.Join(j.Models, "|")
	if j.NVLink && j.GPUs > 1 {
		k += "|nvlink"
	}
	return k
}

// --- (a) whole GPUs only ---------------------------------------------------------

type wholeModel struct{}

func (wholeModel) kind() Kind { return Whole }

func (wholeModel) slices(node string, s NodeSpec) ([]*resourceapi.ResourceSlice, error) {
	gpus, err := gpusOf(s)
	if err != nil {
		return nil, err
	}
	devices := make([]resourceapi.Device, len(gpus))
	for i, g := range gpus {
		devices[i] = resourceapi.Device{
			Name:       model.WholeDeviceName(g.Minor),
			Attributes: gpuAttributes("gpu", g),
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: *resource.NewQuantity(int64(g.MemoryBytes), resource.BinarySI)}},
		}
	}
	return own(node, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: []resourceslice.Slice{{Devices: devices}}}}})
}

func (wholeModel) classes() []*resourceapi.DeviceClass {
	return []*resourceapi.DeviceClass{class(WholeClass, typeSelector("gpu"))}
}

func (wholeModel) claim(j *Job) (*resourceapi.ResourceClaim, error) {
	if j.CPUOnly {
		return nil, nil
	}
	return claimFor(j, WholeClass, j.gpuCount(), nil), nil
}

func (wholeModel) sizeKey(j *Job) size {
	return size{class: classKey("whole", j), count: j.gpuCount(), mem: 1, cores: 1}
}

func (wholeModel) use(r *resourceapi.DeviceRequestAllocationResult, s NodeSpec) (int, gpuUse, error) {
	minor, _, err := model.ParseDeviceName(r.Device)
	return minor, gpuUse{whole: true, memory: s.Model.MemoryBytes(), cores: 100, slots: 0xff}, err
}

// --- (b) fixed partitions over counters --------------------------------------------

type partitionModel struct{}

func (partitionModel) kind() Kind { return Partition }

// partitionEighths is the smallest fixed partition, in eighths, that covers demand.
func partitionEighths(demand float64) int {
	for _, s := range partitionSizes {
		if demand <= float64(s)/8+1e-12 {
			return s
		}
	}
	return 8
}

func partitionDeviceName(gpu, eighths, k int) string {
	return fmt.Sprintf("gpu-%d-p%d-%d", gpu, eighths, k)
}

func (partitionModel) slices(node string, s NodeSpec) ([]*resourceapi.ResourceSlice, error) {
	// Slot counters slot0..slot7 encode where in the GPU a partition sits, so two
	// partitions that overlap (a half and a quarter inside it) exclude each other,
	// as MIG's memory-slice counters do. memory/cores are charged alongside.
	gpus, err := gpusOf(s)
	if err != nil {
		return nil, err
	}
	counters := make([]resourceapi.CounterSet, len(gpus))
	out := []resourceslice.Slice{{SharedCounters: counters}}
	for i, gg := range gpus {
		g := gg.Minor
		memory := int64(gg.MemoryBytes)
		cs := resourceapi.CounterSet{Name: model.CounterSetName(g), Counters: map[string]resourceapi.Counter{
			"memory": {Value: *resource.NewQuantity(memory, resource.BinarySI)}, "cores": {Value: resource.MustParse("100")},
		}}
		for s := range 8 {
			cs.Counters["slot"+strconv.Itoa(s)] = resourceapi.Counter{Value: resource.MustParse("1")}
		}
		counters[i] = cs
		var devices []resourceapi.Device
		for _, eighths := range partitionSizes {
			mem := resource.NewQuantity(memory*int64(eighths)/8, resource.BinarySI)
			cores := resource.NewQuantity(int64(100*eighths/8), resource.DecimalSI)
			for k := range 8 / eighths {
				consumed := map[string]resourceapi.Counter{"memory": {Value: *mem}, "cores": {Value: *cores}}
				for s := k * eighths; s < (k+1)*eighths; s++ {
					consumed["slot"+strconv.Itoa(s)] = resourceapi.Counter{Value: resource.MustParse("1")}
				}
				attrs := gpuAttributes("partition", gg)
				attrs["eighths"] = integer(eighths)
				devices = append(devices, resourceapi.Device{
					Name:       partitionDeviceName(g, eighths, k),
					Attributes: attrs,
					Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
						"memory": {Value: *mem}, "cores": {Value: *cores},
					},
					ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: cs.Name, Counters: consumed}},
				})
			}
		}
		out = append(out, resourceslice.Slice{Devices: devices})
	}
	return own(node, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: out}}})
}

func (partitionModel) classes() []*resourceapi.DeviceClass {
	var out []*resourceapi.DeviceClass
	for _, s := range partitionSizes {
		out = append(out, class(partitionClass(s),
			typeSelector("partition")+fmt.Sprintf(` && device.attributes[%q].eighths == %d`, Driver, s)))
	}
	return out
}

func (partitionModel) claim(j *Job) (*resourceapi.ResourceClaim, error) {
	switch {
	case j.CPUOnly:
		return nil, nil
	case j.GPUs > 0:
		return claimFor(j, partitionClass(8), j.GPUs, nil), nil
	}
	return claimFor(j, partitionClass(partitionEighths(j.Demand)), 1, nil), nil
}

func (partitionModel) sizeKey(j *Job) size {
	if j.GPUs > 0 {
		return size{class: classKey("partition-whole", j), count: j.GPUs, mem: 8, cores: 8}
	}
	e := float64(partitionEighths(j.Demand))
	return size{class: classKey("partition", j), count: 1, mem: e, cores: e}
}

func (partitionModel) use(r *resourceapi.DeviceRequestAllocationResult, s NodeSpec) (int, gpuUse, error) {
	var g, eighths, k int
	if n, err := fmt.Sscanf(r.Device, "gpu-%d-p%d-%d", &g, &eighths, &k); n != 3 || err != nil || r.Device != partitionDeviceName(g, eighths, k) {
		return 0, gpuUse{}, fmt.Errorf("device %q: not a partition device", r.Device)
	}
	mask := uint8((1<<eighths - 1) << (k * eighths))
	return g, gpuUse{memory: s.Model.MemoryBytes() * int64(eighths) / 8, cores: int64(100 * eighths / 8), slots: mask}, nil
}

// --- (c) Tessera -------------------------------------------------------------------

// tesseraModel is the driver's slices for every node, and claims formed as
// users form them: a share as a fraction of whichever allowed GPU model it
// lands on (pkg/fraction's firstAvailable request), whole GPUs from
// gpu.tessera.dev.
type tesseraModel struct {
	shares *shareForms
}

func newTesseraModel(f Fleet) (tesseraModel, error) {
	sf, err := newShareForms(f)
	return tesseraModel{shares: sf}, err
}

func (tesseraModel) kind() Kind { return Tessera }

func (tesseraModel) slices(node string, s NodeSpec) ([]*resourceapi.ResourceSlice, error) {
	return tesseraSlices(node, s)
}

func (tesseraModel) classes() []*resourceapi.DeviceClass { return tesseraClasses() }

func (m tesseraModel) claim(j *Job) (*resourceapi.ResourceClaim, error) {
	switch {
	case j.CPUOnly:
		return nil, nil
	case j.GPUs > 0:
		return claimFor(j, WholeClass, j.GPUs, nil), nil
	}
	return m.shares.claim(j)
}

func (tesseraModel) sizeKey(j *Job) size {
	if j.GPUs > 0 {
		return size{class: classKey("tessera-whole", j), count: j.GPUs, mem: 1, cores: 1}
	}
	return size{class: classKey("tessera-share", j), count: 1, mem: j.Memory, cores: j.Cores}
}

// use counts what the device holds by package accounting, the rule the
// plugin's metrics and `tessera status` count by.
func (tesseraModel) use(r *resourceapi.DeviceRequestAllocationResult, s NodeSpec) (int, gpuUse, error) {
	d, ok := accounting.FromResult(*r)
	if !ok {
		return 0, gpuUse{}, fmt.Errorf("device %q of driver %q: not a %s device", r.Device, r.Driver, Driver)
	}
	if d.Shared && !d.AdminAccess && r.ShareID == nil {
		return 0, gpuUse{}, fmt.Errorf("device %q: allocated without a shareID", r.Device)
	}
	a := accounting.Allocated([]accounting.Device{d}, func(accounting.GPU) (accounting.Capacity, bool) {
		return accounting.Capacity{MemoryBytes: s.Model.MemoryBytes(), Cores: model.CoresPerGPU}, true
	})[d.GPU]
	return d.GPU.Minor, gpuUse{whole: a.Whole, memory: a.MemoryBytes, cores: a.Cores}, nil
}
