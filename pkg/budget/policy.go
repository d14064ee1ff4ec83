package budget

import (
	"math"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// policy is a device capacity's requestPolicy as the scheduler applies it to
// a request (k8s.io/dynamic-resource-allocation
// structured/internal/experimental/consumable_capacity.go,
// calculateConsumedCapacity and roundUpRange): below validRange.min the
// request is raised to min; above it, rounded up to min + n × step;
// with validValues, raised to the first value not below it. In whole units
// (Quantity.Value, rounded up), saturating at math.MaxInt64.
type policy struct {
	ranged    bool
	min, step int64
	values    []int64
}

// The model's policies of the shared device (pkg/model/resources.go
// sharedDevice: memory validRange.min MinShareMemory (1Gi), step 1Mi; cores
// min 0, step 1), used when no matched device publishes one (none is
// published yet, or a model older than the policies). A GPU too small for
// 1Gi + 1Mi gets min 1Mi from the model; charging 1Gi there over-counts,
// never under-counts.
var (
	modelMemoryPolicy = policy{ranged: true, min: 1 << 30, step: memoryStep}
	modelCoresPolicy  = policy{ranged: true, min: 0, step: 1}
)

// maxPolicies bounds the distinct policies kept per dimension of a match
// (one per GPU model in practice); beyond it, policies are not added and the
// charge falls back to the largest of those kept and the model's.
const maxPolicies = 16

// quantityValue is q in whole units, rounded up, saturating at
// math.MaxInt64 (and math.MinInt64) instead of Quantity.Value's wrap.
func quantityValue(q resource.Quantity) int64 {
	if q.CmpInt64(math.MaxInt64) > 0 {
		return math.MaxInt64
	}
	if q.CmpInt64(math.MinInt64) < 0 {
		return math.MinInt64
	}
	return q.Value()
}

// policyOf is c's requestPolicy, false when it publishes none that rounds.
func policyOf(c resourceapi.DeviceCapacity) (policy, bool) {
	rp := c.RequestPolicy
	switch {
	case rp == nil:
		return policy{}, false
	case rp.ValidRange != nil && rp.ValidRange.Min != nil:
		p := policy{ranged: true, min: max(quantityValue(*rp.ValidRange.Min), 0)}
		if rp.ValidRange.Step != nil {
			p.step = max(quantityValue(*rp.ValidRange.Step), 0)
		}
		return p, true
	case len(rp.ValidValues) > 0:
		p := policy{}
		for _, v := range rp.ValidValues {
			p.values = append(p.values, quantityValue(v))
		}
		return p, true
	}
	return policy{}, false
}

// roundUp is what the scheduler allocates for a request of v.
func (p policy) roundUp(v int64) int64 {
	if p.ranged {
		if v < p.min {
			return p.min
		}
		if p.step <= 0 {
			return v
		}
		added := v - p.min
		n := added / p.step
		if added%p.step != 0 {
			n++
		}
		if n > (math.MaxInt64-p.min)/p.step {
			return math.MaxInt64
		}
		return p.min + n*p.step
	}
	for _, valid := range p.values {
		if v <= valid {
			return valid
		}
	}
	return v
}

func (p policy) equal(o policy) bool {
	return p.ranged == o.ranged && p.min == o.min && p.step == o.step && slices.Equal(p.values, o.values)
}

// addPolicy adds p to ps unless it is there or ps is full.
func addPolicy(ps []policy, p policy) []policy {
	if len(ps) >= maxPolicies || slices.ContainsFunc(ps, p.equal) {
		return ps
	}
	return append(slices.Clip(ps), p)
}

// roundUpAll is the largest allocation of v over the policies, the model's
// (fallback) when there are none.
func roundUpAll(ps []policy, fallback policy, v int64) int64 {
	if len(ps) == 0 {
		return fallback.roundUp(v)
	}
	var out int64
	for _, p := range ps {
		out = max(out, p.roundUp(v))
	}
	return out
}
