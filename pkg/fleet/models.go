package fleet

import (
	"fmt"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/accounting"
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
	// Bound is the GPU-boundary bound: a job starts iff the share requests of
	// the running jobs and its own can be packed into the fleet's GPUs, every
	// running job free to move (optimal repacking at every event). See boundPlacer.
	Bound Kind = "bound"
	// Fluid is the ideal bound: a job runs iff the fleet's total free capacity
	// covers its demand (no GPU boundaries, no fragmentation).
	Fluid Kind = "fluid"
)

// AllKinds is the report order.
var AllKinds = []Kind{Whole, Partition, Tessera, TesseraBestFit, Bound, Fluid}

// deviceModel is an allocation model whose devices the real allocator hands out.
type deviceModel interface {
	kind() Kind
	// slices is what the kubelet plugin of node would publish.
	slices(node string) ([]*resourceapi.ResourceSlice, error)
	classes() []*resourceapi.DeviceClass
	// claim is the ResourceClaim a job with this demand creates.
	claim(j *Job) (*resourceapi.ResourceClaim, error)
	// sizeKey orders claims by size in two dimensions: if a claim of size k fails
	// on an unchanged node, every claim at least as large in both fails there too,
	// and if it fits, every claim at most as large in both fits. The simulation
	// relies on this to skip allocator calls it knows the answer of.
	sizeKey(j *Job) size
	// use maps one allocated device to its GPU (0..7) on the node and what it takes
	// of that GPU.
	use(r *resourceapi.DeviceRequestAllocationResult) (int, gpuUse, error)
}

func newDeviceModel(k Kind) (deviceModel, error) {
	switch k {
	case Whole:
		return wholeModel{}, nil
	case Partition:
		return partitionModel{}, nil
	case Tessera:
		return tesseraModel{}, nil
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

func claimFor(j *Job, className string, capacity map[resourceapi.QualifiedName]resource.Quantity) *resourceapi.ResourceClaim {
	req := &resourceapi.ExactDeviceRequest{
		DeviceClassName: className,
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           1,
	}
	if capacity != nil {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: capacity}
	}
	name := "job-" + strconv.Itoa(j.ID)
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fleet", UID: types.UID("uid-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}},
		}},
	}
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func integer(i int) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i))}
}

// --- (a) whole GPUs only ---------------------------------------------------------

type wholeModel struct{}

func (wholeModel) kind() Kind { return Whole }

func (wholeModel) slices(node string) ([]*resourceapi.ResourceSlice, error) {
	devices := make([]resourceapi.Device, GPUsPerNode)
	for i := range devices {
		devices[i] = resourceapi.Device{
			Name:       model.WholeDeviceName(i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("gpu"), "index": integer(i)},
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: gpuMemory}},
		}
	}
	return own(node, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: []resourceslice.Slice{{Devices: devices}}}}})
}

func (wholeModel) classes() []*resourceapi.DeviceClass {
	return []*resourceapi.DeviceClass{class(WholeClass, typeSelector("gpu"))}
}

func (wholeModel) claim(j *Job) (*resourceapi.ResourceClaim, error) {
	return claimFor(j, WholeClass, nil), nil
}
func (wholeModel) sizeKey(*Job) size { return size{1, 1} }
func (wholeModel) use(r *resourceapi.DeviceRequestAllocationResult) (int, gpuUse, error) {
	minor, _, err := model.ParseDeviceName(r.Device)
	return minor, gpuUse{whole: true, memory: gpuMemory.Value(), cores: 100, slots: 0xff}, err
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

func (partitionModel) slices(node string) ([]*resourceapi.ResourceSlice, error) {
	// Slot counters slot0..slot7 encode where in the GPU a partition sits, so two
	// partitions that overlap (a half and a quarter inside it) exclude each other,
	// as MIG's memory-slice counters do. memory/cores are charged alongside.
	counters := make([]resourceapi.CounterSet, GPUsPerNode)
	out := []resourceslice.Slice{{SharedCounters: counters}}
	for g := range GPUsPerNode {
		cs := resourceapi.CounterSet{Name: model.CounterSetName(g), Counters: map[string]resourceapi.Counter{
			"memory": {Value: gpuMemory}, "cores": {Value: resource.MustParse("100")},
		}}
		for s := range 8 {
			cs.Counters["slot"+strconv.Itoa(s)] = resourceapi.Counter{Value: resource.MustParse("1")}
		}
		counters[g] = cs
		var devices []resourceapi.Device
		for _, eighths := range partitionSizes {
			mem := resource.NewQuantity(gpuMemory.Value()*int64(eighths)/8, resource.BinarySI)
			cores := resource.NewQuantity(int64(100*eighths/8), resource.DecimalSI)
			for k := range 8 / eighths {
				consumed := map[string]resourceapi.Counter{"memory": {Value: *mem}, "cores": {Value: *cores}}
				for s := k * eighths; s < (k+1)*eighths; s++ {
					consumed["slot"+strconv.Itoa(s)] = resourceapi.Counter{Value: resource.MustParse("1")}
				}
				devices = append(devices, resourceapi.Device{
					Name: partitionDeviceName(g, eighths, k),
					Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
						"type": str("partition"), "index": integer(g), "eighths": integer(eighths),
					},
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
	return claimFor(j, partitionClass(partitionEighths(j.Demand)), nil), nil
}

func (partitionModel) sizeKey(j *Job) size {
	e := float64(partitionEighths(j.Demand))
	return size{e, e}
}

func (partitionModel) use(r *resourceapi.DeviceRequestAllocationResult) (int, gpuUse, error) {
	var g, eighths, k int
	if n, err := fmt.Sscanf(r.Device, "gpu-%d-p%d-%d", &g, &eighths, &k); n != 3 || err != nil || r.Device != partitionDeviceName(g, eighths, k) {
		return 0, gpuUse{}, fmt.Errorf("device %q: not a partition device", r.Device)
	}
	mask := uint8((1<<eighths - 1) << (k * eighths))
	return g, gpuUse{memory: gpuMemory.Value() * int64(eighths) / 8, cores: int64(100 * eighths / 8), slots: mask}, nil
}

// --- (c) Tessera -------------------------------------------------------------------

type tesseraModel struct{}

func (tesseraModel) kind() Kind { return Tessera }

func (tesseraModel) slices(node string) ([]*resourceapi.ResourceSlice, error) {
	return tesseraSlices(node)
}

func (tesseraModel) classes() []*resourceapi.DeviceClass { return tesseraClasses() }

func (tesseraModel) claim(j *Job) (*resourceapi.ResourceClaim, error) { return shareClaim(j) }

func (tesseraModel) sizeKey(j *Job) size { return size{j.Memory, j.Cores} }

// use counts what the device holds by package accounting, the rule the
// plugin's metrics and `tessera status` count by.
func (tesseraModel) use(r *resourceapi.DeviceRequestAllocationResult) (int, gpuUse, error) {
	d, ok := accounting.FromResult(*r)
	if !ok {
		return 0, gpuUse{}, fmt.Errorf("device %q of driver %q: not a %s device", r.Device, r.Driver, Driver)
	}
	if d.Shared && !d.AdminAccess && r.ShareID == nil {
		return 0, gpuUse{}, fmt.Errorf("device %q: allocated without a shareID", r.Device)
	}
	a := accounting.Allocated([]accounting.Device{d}, func(accounting.GPU) (accounting.Capacity, bool) {
		return accounting.Capacity{MemoryBytes: gpuMemory.Value(), Cores: model.CoresPerGPU}, true
	})[d.GPU]
	return d.GPU.Minor, gpuUse{whole: a.Whole, memory: a.MemoryBytes, cores: a.Cores}, nil
}
