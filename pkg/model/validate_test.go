package model

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// TestValidate breaks a valid 16-GPU model in the ways the API server or the
// allocator would reject, and checks Validate says which object is wrong.
func TestValidate(t *testing.T) {
	valid := func(t *testing.T) resourceslice.DriverResources {
		res, err := Resources("node-1", fixtureGPUs(16, 80, oneDomain))
		if err != nil {
			t.Fatalf("Resources: %v", err)
		}
		return res
	}
	pool := func(res resourceslice.DriverResources) *resourceslice.Pool {
		p := res.Pools["node-1"]
		return &p
	}
	for _, tc := range []struct {
		name    string
		mutate  func(res resourceslice.DriverResources)
		wantErr string
	}{
		{name: "valid"},
		{
			name: "nine counter sets in one slice",
			mutate: func(res resourceslice.DriverResources) {
				p := pool(res)
				p.Slices[0].SharedCounters = append(p.Slices[0].SharedCounters, p.Slices[1].SharedCounters[0])
				p.Slices[1].SharedCounters = p.Slices[1].SharedCounters[1:]
			},
			wantErr: `pool "node-1": slice 0: 9 counter sets, more than 8`,
		},
		{
			name: "devices and counters in one slice",
			mutate: func(res resourceslice.DriverResources) {
				p := pool(res)
				p.Slices[0].Devices = p.Slices[2].Devices[:1]
				p.Slices[2].Devices = p.Slices[2].Devices[1:]
			},
			wantErr: "slice 0: has both devices and sharedCounters",
		},
		{
			name: "65 devices consuming counters",
			mutate: func(res resourceslice.DriverResources) {
				p := pool(res)
				extra := p.Slices[2].Devices[0].DeepCopy()
				extra.Name = "gpu-99"
				for range 33 {
					p.Slices[2].Devices = append(p.Slices[2].Devices, *extra)
				}
			},
			wantErr: "slice 2: 65 devices, more than 64",
		},
		{
			name:    "duplicate device",
			mutate:  func(res resourceslice.DriverResources) { pool(res).Slices[2].Devices[1].Name = "gpu-0-shared" },
			wantErr: `device "gpu-0-shared": duplicate`,
		},
		{
			name: "unknown counter set",
			mutate: func(res resourceslice.DriverResources) {
				pool(res).Slices[2].Devices[0].ConsumesCounters[0].CounterSet = "gpu-77"
			},
			wantErr: `device "gpu-0-shared": consumes counter set "gpu-77"`,
		},
		{
			name: "version not semver",
			mutate: func(res resourceslice.DriverResources) {
				pool(res).Slices[2].Devices[0].Attributes[AttrDriverVersion] = resourceapi.DeviceAttribute{VersionValue: ptr.To("580.95.05")}
			},
			wantErr: `attribute "driverVersion": version "580.95.05" is not a semantic version`,
		},
		{
			name: "two values",
			mutate: func(res resourceslice.DriverResources) {
				pool(res).Slices[2].Devices[0].Attributes[AttrIndex] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(1)), StringValue: ptr.To("1")}
			},
			wantErr: `attribute "index": 2 values set`,
		},
		{
			name: "bad attribute name",
			mutate: func(res resourceslice.DriverResources) {
				pool(res).Slices[2].Devices[0].Attributes["gpu.tessera.dev/nv-link"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(1))}
			},
			wantErr: `attribute "gpu.tessera.dev/nv-link": not a C identifier`,
		},
		{
			name: "string too long",
			mutate: func(res resourceslice.DriverResources) {
				pool(res).Slices[2].Devices[0].Attributes[AttrUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(strings.Repeat("u", 65))}
			},
			wantErr: `attribute "uuid": string longer than 64`,
		},
		{
			name: "counter name not a DNS label",
			mutate: func(res resourceslice.DriverResources) {
				pool(res).Slices[0].SharedCounters[0].Counters["memory_slice_0"] = resourceapi.Counter{Value: resource.MustParse("1")}
			},
			wantErr: `counter set "gpu-0": counter "memory_slice_0": name:`,
		},
		{
			name: "negative counter",
			mutate: func(res resourceslice.DriverResources) {
				pool(res).Slices[0].SharedCounters[0].Counters[string(Cores)] = resourceapi.Counter{Value: resource.MustParse("-1")}
			},
			wantErr: `counter set "gpu-0": counter "cores": negative value -1`,
		},
		{
			name: "33 counters consumed",
			mutate: func(res resourceslice.DriverResources) {
				c := pool(res).Slices[2].Devices[0].ConsumesCounters[0].Counters
				for i := range 31 {
					c[fmt.Sprintf("c%d", i)] = resourceapi.Counter{Value: resource.MustParse("1")}
				}
			},
			wantErr: `device "gpu-0-shared": consumes 33 counters of counter set "gpu-0", more than 32`,
		},
		{
			name: "17 taints",
			mutate: func(res resourceslice.DriverResources) {
				d := &pool(res).Slices[2].Devices[0]
				for i := range 17 {
					d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: fmt.Sprintf("t%d", i), Effect: resourceapi.DeviceTaintEffectNoSchedule})
				}
			},
			wantErr: `device "gpu-0-shared": 17 taints, more than 16`,
		},
		{
			name: "49 attribute values",
			mutate: func(res resourceslice.DriverResources) {
				pool(res).Slices[2].Devices[0].Attributes["list"] = resourceapi.DeviceAttribute{StringValues: make([]string, 40)}
			},
			wantErr: `device "gpu-0-shared": 5`, // 40 + the device's own values
		},
		{
			name: "slice over a MiB",
			mutate: func(res resourceslice.DriverResources) {
				pool(res).Slices[2].Devices[0].Attributes[AttrProductName] = resourceapi.DeviceAttribute{StringValue: ptr.To(strings.Repeat("x", MaxResourceSliceBytes))}
			},
			wantErr: `bytes of JSON, more than 1048576`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := valid(t)
			if tc.mutate != nil {
				tc.mutate(res)
			}
			err := Validate(res)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Validate error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
