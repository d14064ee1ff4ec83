package fleet

import (
	"fmt"
	"math"
	"strconv"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/claimtemplate"
	"github.com/tessera-dev/tessera/pkg/fraction"
)

// A job's share is formed the way a user forms one, with pkg/fraction (what
// `tessera claim-template --fraction` and the webhook's fraction annotation
// use): the job's demand as a fraction (exact for n/k, else rounded up to
// four decimal places) becomes each GPU model's share, memory and cores rounded down to the
// request policy's step so that k shares of 1/k tile the GPU.

// gpuModels are the GPU models the fleet's slices publish (one: the H100 of
// the hgx-h100 profile).
var gpuModels = sync.OnceValues(func() ([]fraction.Model, error) {
	sl, err := tesseraSlices("node-000")
	if err != nil {
		return nil, err
	}
	plain := make([]resourceapi.ResourceSlice, len(sl))
	for i := range sl {
		plain[i] = *sl[i]
	}
	models := fraction.Models(plain)
	if len(models) == 0 {
		return nil, fraction.ErrNoModels
	}
	return models, nil
})

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

// ShareRequest is the capacity a job of this demand asks for on the fleet's GPU
// model: the memory of its memory fraction's share and the cores of its cores
// fraction's share (the same fraction when they are equal).
func ShareRequest(d Demand) (memory, cores resource.Quantity) {
	mem, c, err := shareRequest(d)
	if err != nil {
		panic(err) // the demand is in [MinDemand, 1] and the model is the mock profile's
	}
	return mem, c
}

// shareRequests caches shareRequest by demand: the bound and fluid models ask
// at every attempt.
var shareRequests sync.Map // Demand -> [2]resource.Quantity

func shareRequest(d Demand) (memory, cores resource.Quantity, err error) {
	if v, ok := shareRequests.Load(d); ok {
		q := v.([2]resource.Quantity)
		return q[0], q[1], nil
	}
	memory, cores, err = formShare(d)
	if err == nil {
		shareRequests.Store(d, [2]resource.Quantity{memory, cores})
	}
	return memory, cores, err
}

func formShare(d Demand) (memory, cores resource.Quantity, err error) {
	models, err := gpuModels()
	if err != nil {
		return memory, cores, err
	}
	fm, err := memoryFraction(d.Memory, models[0])
	if err != nil {
		return memory, cores, err
	}
	fc, err := demandFraction(d.Cores)
	if err != nil {
		return memory, cores, err
	}
	sm, err := fm.Share(models[0])
	if err != nil {
		return memory, cores, err
	}
	// Only the cores of fc's share are used: its memory may be below the
	// minimum share, which is not what this share asks for.
	coresOnly := models[0]
	coresOnly.MemoryMin = resource.Quantity{}
	sc, err := fc.Share(coresOnly)
	if err != nil {
		return memory, cores, err
	}
	return sm.Memory, *resource.NewQuantity(sc.Cores, resource.DecimalSI), nil
}

// shareClaim is the ResourceClaim of a job's share: fraction.Request (one
// firstAvailable subrequest per GPU model) when memory and cores are the same
// fraction, as `tessera claim-template --fraction` writes it; otherwise
// pkg/claimtemplate's share with the two shares' memory and cores.
func shareClaim(j *Job) (*resourceapi.ResourceClaim, error) {
	name := "job-" + strconv.Itoa(j.ID)
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fleet", UID: types.UID("uid-" + name)}}
	models, err := gpuModels()
	if err != nil {
		return nil, err
	}
	fm, err := memoryFraction(j.Memory, models[0])
	if err != nil {
		return nil, fmt.Errorf("job %d: %w", j.ID, err)
	}
	fc, err := demandFraction(j.Cores)
	if err != nil {
		return nil, fmt.Errorf("job %d: %w", j.ID, err)
	}
	if fm == fc {
		req, err := fraction.Request(claimtemplate.RequestName, fm, models)
		if err != nil {
			return nil, fmt.Errorf("job %d: %w", j.ID, err)
		}
		claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{req}
		return claim, nil
	}
	mem, cores, err := shareRequest(Demand{j.Memory, j.Cores})
	if err != nil {
		return nil, fmt.Errorf("job %d: %w", j.ID, err)
	}
	tmpl, _, err := claimtemplate.Build(claimtemplate.Options{Name: name, Namespace: "fleet", Memory: mem.String(), Cores: int(cores.Value())})
	if err != nil {
		return nil, fmt.Errorf("job %d: claim template: %w", j.ID, err)
	}
	claim.Spec = tmpl.Spec.Spec
	return claim, nil
}
