package fleet

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/internal/cli/claimtemplate"
	"github.com/tessera-dev/tessera/pkg/fraction"
)

// A job's share is formed the way a user forms one, with pkg/fraction (what
// `tessera claim-template --fraction` and the webhook's fraction annotation
// use): the job's demand as a fraction (exact for n/k, else rounded up to
// four decimal places) becomes each GPU model's share, memory and cores rounded down to the
// request policy's step so that k shares of 1/k tile the GPU.

// fractionModels is what pkg/fraction reads from the slices of a node of
// each catalogue model (one GPU is enough: a model is per product), by model name.
var fractionModels sync.Map // string -> fraction.Model

func fractionModel(m GPUModel) (fraction.Model, error) {
	if v, ok := fractionModels.Load(m.Name); ok {
		return v.(fraction.Model), nil
	}
	n := GPUsPerNode
	if m.Name != h100.Name {
		n = 1
	}
	sl, err := tesseraSlices("node-000", NodeSpec{Model: m, GPUs: n})
	if err != nil {
		return fraction.Model{}, err
	}
	plain := make([]resourceapi.ResourceSlice, len(sl))
	for i := range sl {
		plain[i] = *sl[i]
	}
	models := fraction.Models(plain)
	if len(models) != 1 {
		return fraction.Model{}, fmt.Errorf("GPU model %s: %d fraction models in its slices, want 1", m.Name, len(models))
	}
	fractionModels.Store(m.Name, models[0])
	return models[0], nil
}

// demandFraction is x as the fraction a user writes: n/k when x is one with
// k <= fraction.MaxDenominator (1/3 stays 1/3, so three tile a GPU), else x
// rounded up to four decimal places; at least the smallest fraction.
func demandFraction(x float64) (fraction.Fraction, error) {
	for k := int64(1); k <= fraction.MaxDenominator; k++ {
		if n := math.Round(x * float64(k)); n >= 1 && math.Abs(x*float64(k)-n) < 1e-9 {
			return fraction.Parse(strconv.FormatInt(int64(n), 10) + "/" + strconv.FormatInt(k, 10))
		}
	}
	n := int64(math.Ceil(x*10000 - 1e-9))
	n = max(n, 10000/fraction.MaxDenominator)
	return fraction.Parse(strconv.FormatInt(n, 10) + "/10000")
}

// memoryFraction is demandFraction for memory, raised to the smallest
// fraction of m whose share is at least m's minimum share: a job that needs
// less memory than that asks for the minimum, which is what the scheduler
// would charge it anyway.
func memoryFraction(x float64, m fraction.Model) (fraction.Fraction, error) {
	f, err := demandFraction(x)
	if err != nil {
		return f, err
	}
	if s, err := f.Share(m); err == nil && s.Memory.Cmp(m.MemoryMin) >= 0 {
		return f, nil
	}
	least := float64(m.MemoryMin.Value()+m.MemoryStep.Value()) / float64(m.Memory.Value())
	return demandFraction(max(x, least))
}

// ShareRequest is the capacity a job of this demand asks for on an H100 of
// the KubeShare fleet: the memory of its memory fraction's share and the
// cores of its cores fraction's share (the same fraction when they are equal).
func ShareRequest(d Demand) (memory, cores resource.Quantity) {
	mem, c, err := shareRequest(d, h100)
	if err != nil {
		panic(err) // the demand is in [MinDemand, 1] and the model is the mock profile's
	}
	return mem, c
}

// shareRequests caches shareRequest by demand and model: the reference
// models ask at every attempt.
var shareRequests sync.Map // shareKey -> [2]resource.Quantity

type shareKey struct {
	d     Demand
	model string
}

// shareRequest is the share of demand d on GPU model m.
func shareRequest(d Demand, m GPUModel) (memory, cores resource.Quantity, err error) {
	k := shareKey{d, m.Name}
	if v, ok := shareRequests.Load(k); ok {
		q := v.([2]resource.Quantity)
		return q[0], q[1], nil
	}
	fm, err := fractionModel(m)
	if err != nil {
		return memory, cores, err
	}
	memory, cores, err = formShare(d, fm)
	if err == nil {
		shareRequests.Store(k, [2]resource.Quantity{memory, cores})
	}
	return memory, cores, err
}

func formShare(d Demand, model fraction.Model) (memory, cores resource.Quantity, err error) {
	fm, err := memoryFraction(d.Memory, model)
	if err != nil {
		return memory, cores, err
	}
	fc, err := demandFraction(d.Cores)
	if err != nil {
		return memory, cores, err
	}
	sm, err := fm.Share(model)
	if err != nil {
		return memory, cores, err
	}
	// Only the cores of fc's share are used: its memory may be below the
	// minimum share, which is not what this share asks for.
	coresOnly := model
	coresOnly.MemoryMin = resource.Quantity{}
	sc, err := fc.Share(coresOnly)
	if err != nil {
		return memory, cores, err
	}
	return sm.Memory, *resource.NewQuantity(sc.Cores, resource.DecimalSI), nil
}

// shareForms forms share claims for the GPU models of one fleet.
type shareForms struct {
	models []GPUModel // the fleet's, smallest memory first (fraction.Models' order)
	fms    []fraction.Model
}

func newShareForms(f Fleet) (*shareForms, error) {
	sf := &shareForms{}
	for _, m := range f.GPUModels() {
		fm, err := fractionModel(m)
		if err != nil {
			return nil, err
		}
		sf.models, sf.fms = append(sf.models, m), append(sf.fms, fm)
	}
	order := make([]int, len(sf.models))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return sf.fms[a].Memory.Cmp(sf.fms[b].Memory)
	})
	models, fms := make([]GPUModel, len(order)), make([]fraction.Model, len(order))
	for i, k := range order {
		models[i], fms[i] = sf.models[k], sf.fms[k]
	}
	sf.models, sf.fms = models, fms
	return sf, nil
}

// claim is the ResourceClaim of a job's share, as pkg/fraction's Request
// writes it (claimtemplate's request name, one firstAvailable subrequest per
// GPU model, smallest memory first, each selecting the model's products)
// with each model's share of the job's memory and cores fractions: the
// same fraction of whichever allowed model it lands on. A job whose allowed
// models the fleet lacks gets a claim nothing satisfies.
func (sf *shareForms) claim(j *Job) (*resourceapi.ResourceClaim, error) {
	name := "job-" + strconv.Itoa(j.ID)
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fleet", UID: types.UID("uid-" + name)}}
	req := resourceapi.DeviceRequest{Name: claimtemplate.RequestName}
	for i, m := range sf.models {
		if !allowed(j.Models, m) {
			continue
		}
		mem, cores, err := shareRequest(Demand{j.Memory, j.Cores}, m)
		if err != nil {
			return nil, fmt.Errorf("job %d on %s: %w", j.ID, m.Name, err)
		}
		req.FirstAvailable = append(req.FirstAvailable, resourceapi.DeviceSubRequest{
			Name:            fraction.SubrequestName(sf.fms[i]),
			DeviceClassName: SharedClass,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           1,
			Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fraction.Selector(sf.fms[i])}}},
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
				"memory": mem, "cores": cores,
			}},
		})
	}
	if len(req.FirstAvailable) == 0 {
		return claimFor(j, SharedClass, 1, nil), nil // its selector matches no product of this fleet
	}
	claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{req}
	return claim, nil
}
