package budget

import (
	"math"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// A hard memory beyond int64 (the CRD accepts any quantity) is a cap of
// MaxInt64 bytes, not 0: it limits nothing a cluster can have.
func TestHugeQuantitiesSaturate(t *testing.T) {
	huge := resource.MustParse("1e30")
	l := limits(configapi.BudgetLimits{Memory: &huge})
	if l.Memory == nil || *l.Memory != math.MaxInt64 {
		t.Fatalf("hard.memory 1e30 read as %v, want MaxInt64", l.Memory)
	}
	if r := Check("team-a", "gpu", l, Amount{}, Charge{Amount: Amount{Memory: gi(80)}}); r != nil {
		t.Errorf("80Gi refused under hard.memory 1e30: %v", r)
	}
	if got := amount(configapi.BudgetAmount{Memory: huge}); got.Memory != math.MaxInt64 {
		t.Errorf("used.memory 1e30 read as %d, want MaxInt64", got.Memory)
	}
}
