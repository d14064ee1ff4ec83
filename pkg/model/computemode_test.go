package model

import (
	"testing"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// Every device of a GPU carries its compute mode, so that a DeviceClass can
// select GPUs dedicated to a mode; a GPU whose driver does not report one
// has no such attribute.
func TestResourcesComputeMode(t *testing.T) {
	gpus := fixtureGPUs(2, 80, oneDomain)
	gpus[0].ComputeMode = gpu.ComputeModeExclusiveProcess
	res, err := Resources("node-a", gpus, WithLending(nil))
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, s := range res.Pools["node-a"].Slices {
		for _, d := range s.Devices {
			attr, ok := d.Attributes[AttrComputeMode]
			minor := *d.Attributes[AttrMinor].IntValue
			switch {
			case minor == 0 && (!ok || attr.StringValue == nil || *attr.StringValue != "ExclusiveProcess"):
				t.Errorf("%s: computeMode %+v, want ExclusiveProcess", d.Name, attr)
			case minor == 1 && ok:
				t.Errorf("%s: computeMode %+v published for an unknown mode", d.Name, attr)
			}
			seen++
		}
	}
	if seen != 6 {
		t.Errorf("%d devices, want 6 (whole, shared and lent of 2 GPUs)", seen)
	}
}
