// Package fraction turns "a fraction of a GPU" into the memory and cores of a
// Tessera share, per GPU model, so that shares of 1/k tile every model: exactly
// k of them fit on one GPU and k+1 do not.
//
// The memory a GPU publishes is what workloads can use, NVML's total less the
// driver's reserved memory (an H100 80GB publishes about 81089Mi of NVML's
// 81559Mi), so fixed sizes do not tile: two 40Gi shares do not fit on an
// H100. A fraction is computed from each model's own capacity, rounded down
// to the step of the shared device's request policy, and the request names
// one firstAvailable subrequest per model, each with a selector on that
// model's product names, so a claim takes the same fraction of whichever
// model it lands on.
//
// A model's capacity is the smallest memory any node publishes for it. Nodes
// of one product do not all publish the same: during a rolling upgrade of
// Tessera old nodes publish NVML's total and new ones total − reserved, and a
// driver update can change what the driver reserves. Sized from the smallest,
// k shares of 1/k fit on every node of the model; selected by product rather
// than by exact memory, a claim expanded before a node changed what it
// publishes still matches that node.
package fraction

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// The names of the resource model that a fraction depends on, from
// modelnames (pkg/model links NVML; the admission webhook, a static binary,
// uses this package). The two attributes not in modelnames are repeated (a
// test keeps them equal to pkg/model's).
const (
	driverName      = modelnames.DriverName
	sharedClassName = modelnames.SharedClassName
	attrType        = modelnames.AttrType
	attrProductName = resourceapi.QualifiedName("productName")
	typeShared      = modelnames.TypeShared
	capMemory       = resourceapi.QualifiedName("memory")
	capCores        = resourceapi.QualifiedName("cores")
	coresPerGPU     = 100
)

// Annotation on a ResourceClaim (or in a ResourceClaimTemplate's
// spec.metadata, which the resourceclaim controller copies onto the claims it
// creates) asking the admission webhook to turn the claim's share requests
// into this fraction of whichever GPU model they land on.
const Annotation = driverName + "/fraction"

// MaxDenominator bounds fractions: a share needs at least one core of 100.
const MaxDenominator = coresPerGPU

// Fraction is Num/Den of one GPU, 0 < Num/Den <= 1, in lowest terms.
type Fraction struct {
	Num, Den int64
}

// Parse reads "1/4", "3/8" or a decimal such as "0.25" (at most four
// decimal places). The result is in lowest terms and at most one GPU.
func Parse(s string) (Fraction, error) {
	s = strings.TrimSpace(s)
	bad := func(why string) (Fraction, error) {
		return Fraction{}, fmt.Errorf("fraction %q: %s (write 1/4, 3/8 or 0.25)", s, why)
	}
	var r big.Rat
	if num, den, ok := strings.Cut(s, "/"); ok {
		n, err1 := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
		d, err2 := strconv.ParseInt(strings.TrimSpace(den), 10, 64)
		if err1 != nil || err2 != nil {
			return bad("numerator and denominator must be integers")
		}
		if d <= 0 {
			return bad("the denominator must be positive")
		}
		r.SetFrac64(n, d)
	} else {
		if _, frac, ok := strings.Cut(s, "."); ok && len(frac) > 4 {
			return bad("at most four decimal places")
		}
		if _, ok := r.SetString(s); !ok || strings.ContainsAny(s, "eE") {
			return bad("not a number")
		}
	}
	if r.Sign() <= 0 {
		return bad("must be more than 0")
	}
	if r.Cmp(big.NewRat(1, 1)) > 0 {
		return bad("must be at most 1 (one whole GPU)")
	}
	if r.Cmp(big.NewRat(1, MaxDenominator)) < 0 {
		return bad(fmt.Sprintf("must be at least 1/%d (one core of %d)", MaxDenominator, coresPerGPU))
	}
	return Fraction{Num: r.Num().Int64(), Den: r.Denom().Int64()}, nil
}

// MustParse is Parse that panics; for constants in tests and tools.
func MustParse(s string) Fraction {
	f, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return f
}

// String is "Num/Den".
func (f Fraction) String() string { return fmt.Sprintf("%d/%d", f.Num, f.Den) }

// Tiles is how many shares of f fit on one GPU: floor(Den/Num).
func (f Fraction) Tiles() int64 { return f.Den / f.Num }

// Model is what a GPU model's shared devices publish: their memory and cores
// and the steps and minimum their request policy rounds requests up to.
type Model struct {
	// Products are the productName attributes of the GPUs of this model.
	// Empty for devices that publish no product name: they are told apart
	// by their memory alone.
	Products []string
	// Memory is the smallest memory any shared device of the model publishes.
	Memory     resource.Quantity
	MemoryStep resource.Quantity
	// MemoryMin is the least memory a share is charged (the request
	// policy's validRange.min, the largest any device of the model has);
	// zero when the devices publish none.
	MemoryMin resource.Quantity
	Cores     int64
	CoresStep int64
}

// Share is one share's capacity requests.
type Share struct {
	Memory resource.Quantity
	Cores  int64
}

// Share is the share of f on m: memory and cores each f of the model's,
// rounded down to the request policy's step, so that Tiles() of them fit on
// one GPU. Rounding down keeps a share on the step (the allocator would round
// a request up to it, and k rounded-up shares can overflow the GPU). For f up
// to 1/8 and the models Tessera knows, Tiles()+1 shares never fit (tested
// through the scheduler's allocator); it errors when the share would be
// smaller than one step or than the model's minimum share (the allocator
// would charge the minimum, and Tiles() of those need not fit).
func (f Fraction) Share(m Model) (Share, error) {
	memStep := max(m.MemoryStep.Value(), 1)
	coresStep := max(m.CoresStep, 1)
	mem := floorTo(m.Memory.Value(), f, memStep)
	cores := floorTo(m.Cores, f, coresStep)
	if mem < memStep || cores < coresStep {
		return Share{}, fmt.Errorf("%s of %s (%s, %d cores) is less than one step (%s, %d cores)",
			f, m.name(), m.Memory.String(), m.Cores, m.MemoryStep.String(), coresStep)
	}
	if mem < m.MemoryMin.Value() {
		return Share{}, fmt.Errorf("%s of %s (%s) is %s of memory, less than the smallest share the GPU gives (%s)",
			f, m.name(), m.Memory.String(), ptr.To(quantity(mem, memStep)).String(), m.MemoryMin.String())
	}
	return Share{Memory: quantity(mem, memStep), Cores: cores}, nil
}

// floorTo is floor(v*f/step)*step without overflow.
func floorTo(v int64, f Fraction, step int64) int64 {
	x := new(big.Int).Mul(big.NewInt(v), big.NewInt(f.Num))
	x.Quo(x, big.NewInt(f.Den*step))
	return x.Int64() * step
}

// quantity writes bytes in Mi when they are whole MiB (as users write them).
func quantity(bytes, step int64) resource.Quantity {
	if bytes%(1<<20) == 0 && step%(1<<20) == 0 {
		return resource.MustParse(strconv.FormatInt(bytes>>20, 10) + "Mi")
	}
	return *resource.NewQuantity(bytes, resource.BinarySI)
}

func (m Model) name() string {
	if len(m.Products) == 0 {
		return "GPU with " + m.Memory.String()
	}
	return strings.Join(m.Products, ", ")
}

// Models are the distinct GPU models among the shared devices Tessera
// publishes in slices, smallest memory first. Devices are grouped by product
// name and each product takes the smallest memory, the largest minimum share
// and the coarsest steps any of its devices publishes, so that a share sized
// for it fits on every one of them; products that come out equal are one
// model. Devices without a product name are grouped by their memory.
func Models(published []resourceapi.ResourceSlice) []Model {
	byProduct := map[string]Model{}
	var anonymous []Model
	for i := range published {
		s := &published[i]
		if s.Spec.Driver != driverName {
			continue
		}
		for j := range s.Spec.Devices {
			m, ok := modelOf(&s.Spec.Devices[j])
			switch {
			case !ok:
			case len(m.Products) == 0:
				anonymous = addModel(anonymous, m)
			default:
				p := m.Products[0]
				if o, seen := byProduct[p]; seen {
					m = smallest(o, m)
				}
				byProduct[p] = m
			}
		}
	}
	var out []Model
	for _, p := range slices.Sorted(maps.Keys(byProduct)) {
		out = addModel(out, byProduct[p])
	}
	out = append(out, anonymous...)
	sortModels(out)
	return out
}

// smallest is what shares of one product can count on across its devices a
// and b: the smaller memory and cores, the larger minimum and steps.
func smallest(a, b Model) Model {
	if b.Memory.Cmp(a.Memory) < 0 {
		a.Memory = b.Memory
	}
	if b.MemoryStep.Cmp(a.MemoryStep) > 0 {
		a.MemoryStep = b.MemoryStep
	}
	if b.MemoryMin.Cmp(a.MemoryMin) > 0 {
		a.MemoryMin = b.MemoryMin
	}
	a.Cores, a.CoresStep = min(a.Cores, b.Cores), max(a.CoresStep, b.CoresStep)
	return a
}

func modelOf(d *resourceapi.Device) (Model, bool) {
	if t := d.Attributes[attrType].StringValue; t == nil || *t != typeShared {
		return Model{}, false
	}
	mem, ok1 := d.Capacity[capMemory]
	cores, ok2 := d.Capacity[capCores]
	if !ok1 || !ok2 {
		return Model{}, false
	}
	m := Model{Memory: mem.Value, MemoryStep: resource.MustParse("1"), Cores: cores.Value.Value(), CoresStep: 1}
	if p := mem.RequestPolicy; p != nil && p.ValidRange != nil {
		if p.ValidRange.Step != nil {
			m.MemoryStep = *p.ValidRange.Step
		}
		if p.ValidRange.Min != nil {
			m.MemoryMin = *p.ValidRange.Min
		}
	}
	if p := cores.RequestPolicy; p != nil && p.ValidRange != nil && p.ValidRange.Step != nil {
		m.CoresStep = p.ValidRange.Step.Value()
	}
	if p := d.Attributes[attrProductName].StringValue; p != nil {
		m.Products = []string{*p}
	}
	return m, true
}

func addModel(models []Model, m Model) []Model {
	for i := range models {
		o := &models[i]
		if o.Memory.Cmp(m.Memory) == 0 && o.MemoryStep.Cmp(m.MemoryStep) == 0 && o.MemoryMin.Cmp(m.MemoryMin) == 0 &&
			o.Cores == m.Cores && o.CoresStep == m.CoresStep {
			for _, p := range m.Products {
				if !slices.Contains(o.Products, p) {
					o.Products = append(o.Products, p)
				}
			}
			return models
		}
	}
	return append(models, m)
}

func sortModels(models []Model) {
	for i := range models {
		slices.Sort(models[i].Products)
	}
	slices.SortFunc(models, func(a, b Model) int {
		return cmp.Or(a.Memory.Cmp(b.Memory), cmp.Compare(a.Cores, b.Cores))
	})
}

// ErrNoModels: nothing publishes Tessera shared devices, so a fraction has
// nothing to be a fraction of.
var ErrNoModels = errors.New("no GPU model publishes Tessera shared devices (is the kubelet plugin running on a GPU node?)")

// Request is a share request named name for f of whichever model it lands on:
// one firstAvailable subrequest per model (smallest memory first), each of
// class shared.gpu.tessera.dev with the model's share and a selector on the
// model's products (Selector). Subrequests are named after the model's memory
// ("m81089mi").
func Request(name string, f Fraction, models []Model) (resourceapi.DeviceRequest, error) {
	if len(models) == 0 {
		return resourceapi.DeviceRequest{}, ErrNoModels
	}
	if len(models) > resourceapi.FirstAvailableDeviceRequestMaxSize {
		return resourceapi.DeviceRequest{}, fmt.Errorf("%d GPU models: a request lists at most %d (firstAvailable)", len(models), resourceapi.FirstAvailableDeviceRequestMaxSize)
	}
	req := resourceapi.DeviceRequest{Name: name}
	var errs []error
	for _, m := range models {
		share, err := f.Share(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		req.FirstAvailable = append(req.FirstAvailable, resourceapi.DeviceSubRequest{
			Name:            SubrequestName(m),
			DeviceClassName: sharedClassName,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           1,
			Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: Selector(m)}}},
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
				capMemory: share.Memory,
				capCores:  *resource.NewQuantity(share.Cores, resource.DecimalSI),
			}},
		})
	}
	if len(errs) > 0 {
		return resourceapi.DeviceRequest{}, errors.Join(errs...)
	}
	return req, nil
}

// SubrequestName names a model's subrequest after its memory: "m" and the
// memory in MiB ("m81089mi"), or in bytes ("m85027880960b").
func SubrequestName(m Model) string {
	b := m.Memory.Value()
	if b%(1<<20) == 0 {
		return fmt.Sprintf("m%dmi", b>>20)
	}
	return fmt.Sprintf("m%db", b)
}

// Selector is the CEL expression that selects m's devices: their product
// name is one of m's, or, for a model without product names, their memory
// is m's. Devices that publish no product name are not errors for a
// product selector (the guard keeps CEL from failing the whole claim).
func Selector(m Model) string {
	if len(m.Products) == 0 {
		return fmt.Sprintf(`device.capacity[%q].%s.compareTo(quantity(%q)) == 0`, driverName, capMemory, m.Memory.String())
	}
	attrs := fmt.Sprintf("device.attributes[%q]", driverName)
	names := make([]string, len(m.Products))
	for i, p := range m.Products {
		names[i] = strconv.Quote(p)
	}
	return fmt.Sprintf(`%q in %s && %s.%s in [%s]`, string(attrProductName), attrs, attrs, attrProductName, strings.Join(names, ", "))
}
