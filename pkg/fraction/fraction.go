// Package fraction turns "a fraction of a GPU" into the memory and cores of a
// Tessera share, per GPU model, so that shares of 1/k tile every model: exactly
// k of them fit on one GPU and k+1 do not.
//
// The memory a GPU publishes is what NVML reports (an H100 80GB is 81559Mi),
// so fixed sizes do not tile: two 40Gi shares do not fit on an H100. A
// fraction is computed from each model's own capacity, rounded down to the
// step of the shared device's request policy, and the request names one
// firstAvailable subrequest per model, each with a selector on that model's
// memory, so a claim takes the same fraction of whichever model it lands on.
package fraction

import (
	"cmp"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The names of pkg/model's resource model that a fraction depends on. They
// are repeated here (a test keeps them equal) because pkg/model links NVML,
// and the admission webhook, a static binary, uses this package.
const (
	driverName      = "gpu.tessera.dev"
	sharedClassName = "shared." + driverName
	attrType        = resourceapi.QualifiedName("type")
	attrProductName = resourceapi.QualifiedName("productName")
	typeShared      = "shared"
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

// Model is what a GPU model's shared device publishes: its memory and cores
// and the steps its request policy rounds requests up to.
type Model struct {
	// Products are the productName attributes of the GPUs with this capacity.
	Products   []string
	Memory     resource.Quantity
	MemoryStep resource.Quantity
	Cores      int64
	CoresStep  int64
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
// smaller than one step.
func (f Fraction) Share(m Model) (Share, error) {
	memStep := max(m.MemoryStep.Value(), 1)
	coresStep := max(m.CoresStep, 1)
	mem := floorTo(m.Memory.Value(), f, memStep)
	cores := floorTo(m.Cores, f, coresStep)
	if mem < memStep || cores < coresStep {
		return Share{}, fmt.Errorf("%s of %s (%s, %d cores) is less than one step (%s, %d cores)",
			f, m.name(), m.Memory.String(), m.Cores, m.MemoryStep.String(), coresStep)
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
// publishes in slices, by capacity (GPUs with equal memory and steps share a
// model whatever their product names), smallest memory first.
func Models(slices []resourceapi.ResourceSlice) []Model {
	var out []Model
	for i := range slices {
		s := &slices[i]
		if s.Spec.Driver != driverName {
			continue
		}
		for j := range s.Spec.Devices {
			if m, ok := modelOf(&s.Spec.Devices[j]); ok {
				out = addModel(out, m)
			}
		}
	}
	sortModels(out)
	return out
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
	if p := mem.RequestPolicy; p != nil && p.ValidRange != nil && p.ValidRange.Step != nil {
		m.MemoryStep = *p.ValidRange.Step
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
		if o.Memory.Cmp(m.Memory) == 0 && o.MemoryStep.Cmp(m.MemoryStep) == 0 && o.Cores == m.Cores && o.CoresStep == m.CoresStep {
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
// model's memory. Subrequests are named after the model's memory ("m81559mi").
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
// memory in MiB ("m81559mi"), or in bytes ("m85520809984b").
func SubrequestName(m Model) string {
	b := m.Memory.Value()
	if b%(1<<20) == 0 {
		return fmt.Sprintf("m%dmi", b>>20)
	}
	return fmt.Sprintf("m%db", b)
}

// Selector is the CEL expression that selects m's devices: their memory
// capacity is m's.
func Selector(m Model) string {
	return fmt.Sprintf(`device.capacity[%q].%s.compareTo(quantity(%q)) == 0`, driverName, capMemory, m.Memory.String())
}
