package model

import (
	"slices"
	"testing"
)

// The scheduler's allocator copies a shared device's binding conditions into
// the allocation result; that is what makes it wait for the locality verdict.
// Whole GPUs stay without conditions.
func TestLocalityVerdictsReachTheAllocation(t *testing.T) {
	gpus := fixtureGPUs(2, 80, oneDomain)
	res, err := Resources("node-a", gpus, WithLocalityVerdicts())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Pools["node-a"].Slices {
		for _, d := range s.Devices {
			shared := d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
			if got := len(d.BindingConditions) > 0; got != shared {
				t.Errorf("device %s: binding conditions %v, want them only on shared devices", d.Name, d.BindingConditions)
			}
		}
	}

	node := newTestNode(t, gpus, WithLocalityVerdicts())
	share := node.allocate(shareClaim("share", "10Gi", "10"))
	if got := share.Devices.Results[0]; !slices.Equal(got.BindingConditions, []string{LocalityAcceptedCondition}) ||
		!slices.Equal(got.BindingFailureConditions, []string{LocalityRejectedCondition}) {
		t.Errorf("share result: conditions %v, failure conditions %v", got.BindingConditions, got.BindingFailureConditions)
	}
	whole := node.allocate(wholeClaim("whole", 1))
	if got := whole.Devices.Results[0]; len(got.BindingConditions) != 0 {
		t.Errorf("whole GPU result %s has binding conditions %v", got.Device, got.BindingConditions)
	}

	plain := newTestNode(t, gpus).allocate(shareClaim("share", "10Gi", "10"))
	if got := plain.Devices.Results[0]; len(got.BindingConditions) != 0 {
		t.Errorf("without WithLocalityVerdicts: binding conditions %v", got.BindingConditions)
	}
}

// With lending on too, the lending devices carry no binding conditions: the
// locality controller judges shares of gpu-N-shared only, so a borrower
// waiting for a verdict would wait forever.
func TestLocalityVerdictsNotOnLendingDevices(t *testing.T) {
	res, err := Resources("node-a", fixtureGPUs(2, 80, oneDomain), WithLocalityVerdicts(), WithLending(nil))
	if err != nil {
		t.Fatal(err)
	}
	lent := 0
	for _, s := range res.Pools["node-a"].Slices {
		for _, d := range s.Devices {
			if t2 := d.Attributes[AttrType].StringValue; t2 != nil && *t2 == TypeLent {
				lent++
				if len(d.BindingConditions)+len(d.BindingFailureConditions) > 0 {
					t.Errorf("lending device %s: binding conditions %v, failure conditions %v", d.Name, d.BindingConditions, d.BindingFailureConditions)
				}
			}
		}
	}
	if lent != 2 {
		t.Errorf("%d lending devices, want 2", lent)
	}
}
