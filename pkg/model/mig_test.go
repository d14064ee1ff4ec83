package model

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// TestMIGDynamicDevicesAndCounters: a dynamic H100 80GB publishes its 25
// placements (7 + 7 + 4 + 3 + 2 + 1 + 1, the guide's -lgipp), small profiles
// first, each from the highest start down, all consuming gpu-0-counters:
// eight memory slices of 1, 7 compute slices and the 7g.80gb's engines.
func TestMIGDynamicDevicesAndCounters(t *testing.T) {
	tb := migTables[h100]
	gpus := tb.migGPUs(1, nil)
	res := validResources(t, gpus, WithDynamicMIG(gpus[0].UUID))
	pool := res.Pools["node-1"]
	if len(pool.Slices) != 2 || len(pool.Slices[0].SharedCounters) != 1 || len(pool.Slices[1].Devices) != 25 {
		t.Fatalf("slices: %d, want one counter slice (1 set) and one device slice (25 devices)", len(pool.Slices))
	}
	wantCounters := map[string]int64{
		"memory-slice-0": 1, "memory-slice-1": 1, "memory-slice-2": 1, "memory-slice-3": 1,
		"memory-slice-4": 1, "memory-slice-5": 1, "memory-slice-6": 1, "memory-slice-7": 1,
		"compute-slices": 7, "decoders": 7, "jpegs": 7, "ofas": 1, "copy-engines": 8,
	}
	cs := pool.Slices[0].SharedCounters[0]
	if cs.Name != "gpu-0-counters" {
		t.Errorf("counter set %q, want gpu-0-counters", cs.Name)
	}
	if diff := cmp.Diff(wantCounters, counterValues(cs.Counters)); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}

	var names []string
	for _, d := range pool.Slices[1].Devices {
		names = append(names, d.Name)
	}
	want := strings.Fields(`gpu-0-mig-1g-10gb-6 gpu-0-mig-1g-10gb-5 gpu-0-mig-1g-10gb-4 gpu-0-mig-1g-10gb-3
		gpu-0-mig-1g-10gb-2 gpu-0-mig-1g-10gb-1 gpu-0-mig-1g-10gb-0
		gpu-0-mig-1g-10gb-me-6 gpu-0-mig-1g-10gb-me-5 gpu-0-mig-1g-10gb-me-4 gpu-0-mig-1g-10gb-me-3
		gpu-0-mig-1g-10gb-me-2 gpu-0-mig-1g-10gb-me-1 gpu-0-mig-1g-10gb-me-0
		gpu-0-mig-1g-20gb-6 gpu-0-mig-1g-20gb-4 gpu-0-mig-1g-20gb-2 gpu-0-mig-1g-20gb-0
		gpu-0-mig-2g-20gb-4 gpu-0-mig-2g-20gb-2 gpu-0-mig-2g-20gb-0
		gpu-0-mig-3g-40gb-4 gpu-0-mig-3g-40gb-0 gpu-0-mig-4g-40gb-0 gpu-0-mig-7g-80gb-0`)
	if !slices.Equal(names, want) {
		t.Errorf("device order:\n got %v\nwant %v", names, want)
	}

	byName := map[string]resourceapi.Device{}
	for _, d := range pool.Slices[1].Devices {
		byName[d.Name] = d
	}
	me := byName["gpu-0-mig-1g-10gb-me-6"]
	if diff := cmp.Diff(map[string]int64{"memory-slice-6": 1, "compute-slices": 1, "decoders": 1, "jpegs": 1, "ofas": 1, "copy-engines": 1},
		counterValues(me.ConsumesCounters[0].Counters)); diff != "" || me.ConsumesCounters[0].CounterSet != "gpu-0-counters" {
		t.Errorf("1g.10gb+me at 6 consumes %s (-want +got):\n%s", me.ConsumesCounters[0].CounterSet, diff)
	}
	three := byName["gpu-0-mig-3g-40gb-4"]
	if diff := cmp.Diff(map[string]int64{"memory-slice-4": 1, "memory-slice-5": 1, "memory-slice-6": 1, "memory-slice-7": 1,
		"compute-slices": 3, "decoders": 3, "jpegs": 3, "copy-engines": 3}, counterValues(three.ConsumesCounters[0].Counters)); diff != "" {
		t.Errorf("3g.40gb at 4 consumes (-want +got):\n%s", diff)
	}
	wantAttrs := map[resourceapi.QualifiedName]string{
		AttrType: "mig", AttrParentUUID: gpus[0].UUID, AttrParentMinor: "0", AttrIndex: "0", AttrMinor: "0",
		AttrProfile: "3g.40gb", AttrPlacementStart: "4", AttrPlacementSize: "4", AttrMultiprocessors: "60",
		AttrProductName: "NVIDIA H100 80GB HBM3", AttrArchitecture: "hopper",
		AttrCUDAComputeCapability: "9.0.0", AttrDriverVersion: "580.95.5", AttrCUDADriverVersion: "13.0.0",
		"resource.kubernetes.io/pcieRoot": "", "resource.kubernetes.io/numaNode": "0",
	}
	delete(wantAttrs, "resource.kubernetes.io/pcieRoot") // fixtureGPUs know no root
	if diff := cmp.Diff(wantAttrs, attrStrings(three.Attributes)); diff != "" {
		t.Errorf("3g.40gb attributes (-want +got):\n%s", diff)
	}
	if got := three.Capacity[Cores].Value; got.Cmp(resource.MustParse("42")) != 0 {
		t.Errorf("3g.40gb cores %s, want 42 (100 × 3/7, rounded down)", got.String())
	}
	if got := three.Capacity[Memory].Value; got.Value() != 40448<<20 {
		t.Errorf("3g.40gb memory %s, want 40448Mi", got.String())
	}
}

func counterValues(c map[string]resourceapi.Counter) map[string]int64 {
	out := map[string]int64{}
	for k, v := range c {
		out[k] = v.Value.Value()
	}
	return out
}

func attrStrings(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) map[resourceapi.QualifiedName]string {
	out := map[resourceapi.QualifiedName]string{}
	for k, a := range attrs {
		switch {
		case a.StringValue != nil:
			out[k] = *a.StringValue
		case a.VersionValue != nil:
			out[k] = *a.VersionValue
		case a.IntValue != nil:
			out[k] = fmt.Sprint(*a.IntValue)
		case a.BoolValue != nil:
			out[k] = fmt.Sprint(*a.BoolValue)
		}
	}
	return out
}

// TestMIGEightH100Limits states what an 8×H100 80GB node with every GPU in
// dynamic MIG publishes, and that it is within the API's limits (the numbers
// are in docs/mig.md; these fixtures are NVIDIA's tables, not a real node).
func TestMIGEightH100Limits(t *testing.T) {
	tb := migTables[h100]
	gpus := tb.migGPUs(8, nil)
	var uuids []string
	for _, g := range gpus {
		uuids = append(uuids, g.UUID)
	}
	res, err := Resources("node-1", gpus, WithDynamicMIG(uuids...))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(res); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	objs, err := ResourceSlices("node-1", res)
	if err != nil {
		t.Fatal(err)
	}
	var devices, counterSlices, deviceSlices, counters, maxConsumed, largest int
	for i, s := range objs {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("slice %d: %d counter sets, %d devices, %d bytes of JSON", i, len(s.Spec.SharedCounters), len(s.Spec.Devices), len(b))
		largest = max(largest, len(b))
		if len(s.Spec.SharedCounters) > 0 {
			counterSlices++
		}
		if len(s.Spec.Devices) > 0 {
			deviceSlices++
		}
		devices += len(s.Spec.Devices)
		for _, cs := range s.Spec.SharedCounters {
			counters = max(counters, len(cs.Counters))
		}
		for _, d := range s.Spec.Devices {
			for _, c := range d.ConsumesCounters {
				maxConsumed = max(maxConsumed, len(c.Counters))
			}
		}
	}
	t.Logf("8×H100 80GB, all dynamic MIG: %d devices in %d device slices (≤%d each), %d counter slice(s) of 8 sets, %d counters per set (≤%d), ≤%d counters per consumption (≤%d), largest slice %d bytes of JSON",
		devices, deviceSlices, resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures, counterSlices, counters,
		resourceapi.ResourceSliceMaxCountersPerCounterSet, maxConsumed, resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption, largest)
	if devices != 200 || deviceSlices != 8 || counterSlices != 1 || counters != 13 || maxConsumed != 13 {
		t.Errorf("got %d devices in %d slices, %d counter slices, %d counters per set, %d per consumption; want 200 in 8 (one per GPU), 1, 13, 13",
			devices, deviceSlices, counterSlices, counters, maxConsumed)
	}
	if largest > 96<<10 {
		t.Errorf("largest slice %d bytes of JSON, docs/mig.md says under 96 KiB", largest)
	}
}

// TestMIGStaticDevices: a static GPU publishes one exclusive device per
// compute instance, small first, with the MIG UUID and no counters; a GPU
// instance with two compute instances gives two devices with their share of
// its compute slices.
func TestMIGStaticDevices(t *testing.T) {
	tb := migTables[h100]
	gpus := tb.migGPUs(1, func(minor int) []gpu.MIGInstance {
		split := tb.instance(minor, 2, tb.three, 0)
		split.ComputeInstances = []gpu.MIGComputeInstance{
			{ID: 0, UUID: "MIG-split-0", MemoryBytes: 40448 << 20, Multiprocessors: 40, AccessMinor: -1},
			{ID: 1, UUID: "MIG-split-1", MemoryBytes: 40448 << 20, Multiprocessors: 20, AccessMinor: -1},
		}
		return []gpu.MIGInstance{tb.instance(minor, 1, tb.three, 4), split, tb.instance(minor, 9, tb.small, 6)}
	})
	taint := resourceapi.DeviceTaint{Key: DriverName + "/mig-pending", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	res := validResources(t, gpus, WithTaints(map[string][]resourceapi.DeviceTaint{gpus[0].UUID: {taint}}))
	pool := res.Pools["node-1"]
	if len(pool.Slices) != 1 {
		t.Fatalf("%d slices, want 1 (devices only: a static GPU has no counter set)", len(pool.Slices))
	}
	var got []string
	for _, d := range pool.Slices[0].Devices {
		got = append(got, fmt.Sprintf("%s %s %s cores=%s", d.Name, ptr.Deref(d.Attributes[AttrUUID].StringValue, "-"),
			ptr.Deref(d.Attributes[AttrProfile].StringValue, "-"), ptr.To(d.Capacity[Cores].Value).String()))
		if len(d.ConsumesCounters) > 0 {
			t.Errorf("%s consumes counters", d.Name)
		}
		if len(d.Taints) != 1 || d.Taints[0].Key != taint.Key {
			t.Errorf("%s taints %v, want the GPU's", d.Name, d.Taints)
		}
	}
	// One device per GPU instance: the split 3g.40gb (two compute
	// instances sharing its memory, L2 and engines) is one device with all
	// of it, not two devices each advertising the whole memory; it has no
	// single MIG UUID.
	want := []string{
		"gpu-0-mig-9 MIG-00000000-0000-0000-0000-000000000009 1g.10gb cores=14",
		"gpu-0-mig-1 MIG-00000000-0000-0000-0000-000000000001 3g.40gb cores=42",
		"gpu-0-mig-2 - 3g.40gb cores=42",
	}
	if !slices.Equal(got, want) {
		t.Errorf("static devices:\n got %q\nwant %q", got, want)
	}
	for _, d := range pool.Slices[0].Devices {
		n := int64(1)
		if d.Name == "gpu-0-mig-2" {
			n = 2
		}
		if got := ptr.Deref(d.Attributes[AttrComputeInstances].IntValue, -1); got != n {
			t.Errorf("%s: computeInstances %d, want %d", d.Name, got, n)
		}
		if memory := d.Capacity[Memory].Value; d.Name == "gpu-0-mig-2" && (memory.Value() != int64(tb.profile(tb.three).MemoryBytes) ||
			ptr.Deref(d.Attributes[AttrMultiprocessors].IntValue, 0) != int64(tb.profile(tb.three).Multiprocessors)) {
			t.Errorf("split GPU instance: memory %v, multiprocessors %v; want the 3g.40gb's", d.Capacity[Memory].Value, d.Attributes[AttrMultiprocessors].IntValue)
		}
	}
}

// TestMIGStaticInUseOutsideTessera: a static GPU instance whose compute
// instances run processes that no Tessera claim holds (another device
// plugin's pod, after an upgrade that starts publishing MIG-mode GPUs) is
// tainted NoSchedule until it is idle or a claim holds it; unknown process
// counts taint nothing.
func TestMIGStaticInUseOutsideTessera(t *testing.T) {
	tb := migTables[h100]
	gpus := tb.migGPUs(1, func(minor int) []gpu.MIGInstance {
		busy, idle, unknown := tb.instance(minor, 1, tb.three, 4), tb.instance(minor, 2, tb.four, 0), tb.instance(minor, 9, tb.small, 6)
		busy.ComputeInstances[0].Processes = 2
		unknown.ComputeInstances[0].Processes = -1
		return []gpu.MIGInstance{busy, idle, unknown}
	})
	taintsOfDevices := func(opts ...Option) map[string][]string {
		res, err := Resources("node-1", gpus, opts...)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, d := range res.Pools["node-1"].Slices[0].Devices {
			for _, tn := range d.Taints {
				out[d.Name] = append(out[d.Name], tn.Key+"="+tn.Value+":"+string(tn.Effect))
			}
		}
		return out
	}
	want := map[string][]string{"gpu-0-mig-1": {MIGInUseTaintKey + "=" + MIGInUseOutsideTessera + ":NoSchedule"}}
	if got := taintsOfDevices(); !reflect.DeepEqual(got, want) {
		t.Errorf("taints %v, want %v", got, want)
	}
	busy := gpus[0].MIG.Instances[0]
	held := WithMIGHeld(map[string][]MIGHold{gpus[0].UUID: {{ProfileID: busy.ProfileID, Placement: busy.Placement}}})
	if got := taintsOfDevices(held); len(got) != 0 {
		t.Errorf("held by a claim: taints %v, want none", got)
	}
	// Held by placement with another profile is not this instance.
	other := WithMIGHeld(map[string][]MIGHold{gpus[0].UUID: {{ProfileID: busy.ProfileID + 1, Placement: busy.Placement}}})
	if got := taintsOfDevices(other); !reflect.DeepEqual(got, want) {
		t.Errorf("a hold of another profile at its placement: taints %v, want %v", got, want)
	}
}

// TestMIGModeGPUPublishesNoWholeOrShared: a GPU in MIG mode publishes no
// whole, shared or lent device and no gpu-N counter set, whatever it holds:
// without instances (static) or without MIG facts it publishes nothing, and
// WithDynamicMIG on a GPU not in MIG mode changes nothing.
func TestMIGModeGPUPublishesNoWholeOrShared(t *testing.T) {
	tb := migTables["NVIDIA A100-SXM4-40GB"]
	gpus := fixtureGPUs(3, 40, oneDomain)
	gpus[1].MIGEnabled, gpus[1].MIG = true, tb.migFacts()
	gpus[2].MIGEnabled = true // MIG mode, facts not read
	var lent = map[string]Lent{}
	res, err := Resources("node-1", gpus, WithLending(lent), WithDynamicMIG(gpus[0].UUID))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Resources("node-1", gpus[:1], WithLending(lent))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(plain, res, cmpQuantity); diff != "" {
		t.Errorf("two MIG-mode GPUs without instances changed what the node publishes (-plain GPU alone +with them):\n%s", diff)
	}
}

func TestMIGChecks(t *testing.T) {
	tb := migTables[h100]
	cases := []struct {
		name   string
		change func(*gpu.GPU)
		want   string
	}{
		{"placement outside", func(g *gpu.GPU) { profileOf(g, "1g.10gb").Placements[0].Start = 8 }, "placement 8:1 outside the GPU's 8 memory slices"},
		{"same slug", func(g *gpu.GPU) { profileOf(g, "1g.20gb").Name = "1g-10gb+me" }, `would have the names of profile`},
		{"too many slices", func(g *gpu.GPU) { g.MIG.MemorySlices = MaxMIGMemorySlices + 1 }, "27 MIG memory slices, want 1 to 26"},
		{"compute", func(g *gpu.GPU) { profileOf(g, "7g.80gb").ComputeSlices = 8 }, "8 compute slices, want 1 to 7"},
		{"no memory", func(g *gpu.GPU) { profileOf(g, "2g.20gb").MemoryBytes = 0 }, "memory size 0 bytes"},
		{"name", func(g *gpu.GPU) { profileOf(g, "2g.20gb").Name = "2g_20gb" }, `device name "gpu-0-mig-2g_20gb-0" is not a DNS label`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gpus := tb.migGPUs(1, nil)
			c.change(&gpus[0])
			_, err := Resources("node-1", gpus, WithDynamicMIG(gpus[0].UUID))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
			// Static MIG does not place profiles: the same facts publish.
			if _, err := Resources("node-1", gpus); err != nil {
				t.Errorf("static: %v", err)
			}
		})
	}
	gpus := tb.migGPUs(1, func(minor int) []gpu.MIGInstance { return []gpu.MIGInstance{tb.instance(minor, 1, tb.seven, 0)} })
	gpus[0].MIG.Instances[0].ComputeInstances[0].UUID = "MIG-" + strings.Repeat("x", 61)
	if _, err := Resources("node-1", gpus); err == nil || !strings.Contains(err.Error(), "longer than 64") {
		t.Errorf("static with a 65-character UUID: %v", err)
	}
}

// profileOf is g's MIG profile with this name, to change in place.
func profileOf(g *gpu.GPU, name string) *gpu.MIGProfile {
	for i := range g.MIG.Profiles {
		if g.MIG.Profiles[i].Name == name {
			return &g.MIG.Profiles[i]
		}
	}
	panic("no profile " + name)
}

func TestParseMIGDevice(t *testing.T) {
	for _, c := range []struct {
		name string
		want MIGDeviceName
	}{
		{MIGStaticDeviceName(3, 1), MIGDeviceName{Minor: 3, Static: true, GPUInstance: 1, ComputeInstance: -1}},
		{MIGStaticDeviceName(12, 13), MIGDeviceName{Minor: 12, Static: true, GPUInstance: 13, ComputeInstance: -1}},
		// The names of releases before one device per GPU instance.
		{"gpu-3-mig-1-0", MIGDeviceName{Minor: 3, Static: true, GPUInstance: 1, ComputeInstance: 0}},
		{"gpu-12-mig-13-2", MIGDeviceName{Minor: 12, Static: true, GPUInstance: 13, ComputeInstance: 2}},
		{MIGPlacementDeviceName(3, "1g.10gb+me", 6), MIGDeviceName{Minor: 3, ProfileSlug: "1g-10gb-me", Start: 6}},
		{MIGPlacementDeviceName(0, "7g.80gb", 0), MIGDeviceName{Minor: 0, ProfileSlug: "7g-80gb", Start: 0}},
	} {
		got, err := ParseMIGDevice(c.name)
		if err != nil || got != c.want {
			t.Errorf("ParseMIGDevice(%q) = %+v, %v; want %+v", c.name, got, err, c.want)
		}
		if _, _, err := ParseDevice(c.name); err == nil {
			t.Errorf("ParseDevice(%q) accepted a MIG device", c.name)
		}
	}
	if got := MIGPlacementDeviceName(3, "1g.10gb+me", 6); got != "gpu-3-mig-1g-10gb-me-6" {
		t.Errorf("placement name %q", got)
	}
	if got := MIGStaticDeviceName(3, 2); got != "gpu-3-mig-2" {
		t.Errorf("static name %q", got)
	}
	for _, bad := range []string{"gpu-3", "gpu-3-shared", "gpu-3-mig-", "gpu-3-mig-01", "gpu-3-mig--1", "gpu-03-mig-1-0", "gpu-3-mig-1-00", "gpu-3-mig-x-y", "gpu-3-mig--1", "node-3-mig-1-0"} {
		if got, err := ParseMIGDevice(bad); err == nil {
			t.Errorf("ParseMIGDevice(%q) = %+v, want an error", bad, got)
		}
	}
}
