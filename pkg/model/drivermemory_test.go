package model

import (
	"testing"
)

// TestDriverMemoryLimitsAttribute: with the option every device of the node
// carries the bool attribute (true or false, so that a CEL selector reading
// it never fails on a node that cannot), without it none does.
func TestDriverMemoryLimitsAttribute(t *testing.T) {
	gpus := fixtureGPUs(2, 80, oneDomain)
	for _, tc := range []struct {
		name string
		opts []Option
		want *bool
	}{
		{"not detected", nil, nil},
		{"capable", []Option{WithDriverMemoryLimits(true)}, boolPtr(true)},
		{"incapable", []Option{WithDriverMemoryLimits(false)}, boolPtr(false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Resources("node-a", gpus, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := Validate(res); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			n := 0
			for _, s := range res.Pools["node-a"].Slices {
				for _, d := range s.Devices {
					n++
					a, ok := d.Attributes[AttrDriverMemoryLimits]
					switch {
					case tc.want == nil && ok:
						t.Errorf("device %s: attribute %s published without the option", d.Name, AttrDriverMemoryLimits)
					case tc.want != nil && (!ok || a.BoolValue == nil || *a.BoolValue != *tc.want):
						t.Errorf("device %s: attribute %s = %+v, want %v", d.Name, AttrDriverMemoryLimits, a, *tc.want)
					}
				}
			}
			if n == 0 {
				t.Fatal("no devices")
			}
		})
	}
}

func boolPtr(b bool) *bool { return &b }
