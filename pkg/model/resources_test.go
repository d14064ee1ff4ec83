package model

import (
	"math"
	"math/rand"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// TestResourcesShape pins the complete published object for one GPU: the shape
// ARCHITECTURE.md documents and the scheduler was verified against.
func TestResourcesShape(t *testing.T) {
	g := fixtureGPUs(1, 80, oneDomain)[0]
	g.Minor, g.Index = 3, 1
	got, err := Resources("node-1", []gpu.GPU{g}, WithPCIeRoots(PCIeRootMap{g.PCIBusID: "pci0000:00"}))
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}

	mem, cores := resource.MustParse("80Gi"), resource.MustParse("100")
	counters := map[string]resourceapi.Counter{"memory": {Value: mem}, "cores": {Value: cores}}
	attrs := func(typ string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":                            {StringValue: ptr.To(typ)},
			"uuid":                            {StringValue: ptr.To(g.UUID)},
			"productName":                     {StringValue: ptr.To("NVIDIA H100 80GB HBM3")},
			"architecture":                    {StringValue: ptr.To("hopper")},
			"cudaComputeCapability":           {VersionValue: ptr.To("9.0.0")},
			"driverVersion":                   {VersionValue: ptr.To("580.95.5")},
			"cudaDriverVersion":               {VersionValue: ptr.To("13.0.0")},
			"index":                           {IntValue: ptr.To(int64(1))},
			"minor":                           {IntValue: ptr.To(int64(3))},
			"nvlinkDomain":                    {StringValue: ptr.To("nvl-0")},
			"resource.kubernetes.io/numaNode": {IntValue: ptr.To(int64(0))},
			"resource.kubernetes.io/pcieRoot": {StringValue: ptr.To("pci0000:00")},
		}
	}
	consumes := []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-3", Counters: counters}}
	want := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{"node-1": {Slices: []resourceslice.Slice{
		{SharedCounters: []resourceapi.CounterSet{{Name: "gpu-3", Counters: counters}}},
		{Devices: []resourceapi.Device{
			{
				Name:                     "gpu-3-shared",
				AllowMultipleAllocations: ptr.To(true),
				Attributes:               attrs("shared"),
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					"memory": {Value: mem, RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default:    ptr.To(mem),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Gi")), Step: ptr.To(resource.MustParse("1Mi"))},
					}},
					"cores": {Value: cores, RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default:    ptr.To(resource.MustParse("0")),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("0")), Max: ptr.To(cores), Step: ptr.To(resource.MustParse("1"))},
					}},
				},
				ConsumesCounters: consumes,
			},
			{
				Name:       "gpu-3",
				Attributes: attrs("gpu"),
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					"memory": {Value: mem},
					"cores":  {Value: cores},
				},
				ConsumesCounters: consumes,
			},
		}},
	}}}}
	if diff := cmp.Diff(want, got, cmpQuantity); diff != "" {
		t.Errorf("Resources (-want +got):\n%s", diff)
	}
	if err := Validate(got); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

// TestResourcesSlicing checks how many slices a node publishes and that each stays
// within the API's limits: counter slices first (≤8 sets), then device slices
// (≤64 devices), and the device order: shares ascending, whole GPUs descending.
func TestResourcesSlicing(t *testing.T) {
	for _, tc := range []struct {
		gpus                        int
		counterSlices, deviceSlices int
	}{
		{gpus: 0, counterSlices: 0, deviceSlices: 0},
		{gpus: 1, counterSlices: 1, deviceSlices: 1},
		{gpus: 4, counterSlices: 1, deviceSlices: 1},
		{gpus: 8, counterSlices: 1, deviceSlices: 1},
		{gpus: 9, counterSlices: 2, deviceSlices: 1},
		{gpus: 16, counterSlices: 2, deviceSlices: 1},
		{gpus: 32, counterSlices: 4, deviceSlices: 1},
		{gpus: 33, counterSlices: 5, deviceSlices: 2},
		{gpus: 64, counterSlices: 8, deviceSlices: 2},
	} {
		t.Run(strconv.Itoa(tc.gpus)+"-gpus", func(t *testing.T) {
			res, err := Resources("node-1", fixtureGPUs(tc.gpus, 80, oneDomain))
			if err != nil {
				t.Fatalf("Resources: %v", err)
			}
			if err := Validate(res); err != nil {
				t.Errorf("Validate: %v", err)
			}
			pool := res.Pools["node-1"]
			var counterSlices, deviceSlices int
			var counterSets, devices []string
			for i, s := range pool.Slices {
				switch {
				case len(s.SharedCounters) > 0:
					if deviceSlices > 0 {
						t.Errorf("slice %d: counter slice after a device slice", i)
					}
					counterSlices++
					for _, cs := range s.SharedCounters {
						counterSets = append(counterSets, cs.Name)
					}
				case len(s.Devices) > 0:
					deviceSlices++
					for _, d := range s.Devices {
						devices = append(devices, d.Name)
					}
				}
			}
			if counterSlices != tc.counterSlices || deviceSlices != tc.deviceSlices {
				t.Errorf("got %d counter + %d device slices, want %d + %d", counterSlices, deviceSlices, tc.counterSlices, tc.deviceSlices)
			}
			if tc.gpus == 0 && len(pool.Slices) != 1 {
				t.Errorf("node without GPUs: got %d slices, want the one empty slice that says so", len(pool.Slices))
			}
			var wantSets, wantDevices []string
			for m := range tc.gpus {
				wantSets = append(wantSets, CounterSetName(m))
				wantDevices = append(wantDevices, SharedDeviceName(m))
			}
			for m := tc.gpus - 1; m >= 0; m-- {
				wantDevices = append(wantDevices, WholeDeviceName(m))
			}
			if diff := cmp.Diff(wantSets, counterSets); diff != "" {
				t.Errorf("counter sets (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantDevices, devices); diff != "" {
				t.Errorf("device order (-want +got):\n%s", diff)
			}
		})
	}
}

// TestResourcesProfiles runs every built-in mock profile through Discover and
// Resources and checks what a user selecting on attributes would rely on.
func TestResourcesProfiles(t *testing.T) {
	wantCC := map[string]string{"dgx-a100": "8.0.0", "hgx-h100": "9.0.0", "l4x4": "8.9.0", "a100-pairs": "8.0.0"}
	for _, profile := range gpu.Profiles() {
		t.Run(profile, func(t *testing.T) {
			gpus := discover(t, profile)
			res, err := Resources("node-1", gpus)
			if err != nil {
				t.Fatalf("Resources: %v", err)
			}
			if err := Validate(res); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			byName := map[string]resourceapi.Device{}
			migDevices := 0
			for _, s := range res.Pools["node-1"].Slices {
				for _, d := range s.Devices {
					byName[d.Name] = d
					if ptr.Deref(d.Attributes[AttrType].StringValue, "") == TypeMIG {
						migDevices++
					}
				}
			}
			// A GPU in MIG mode publishes its compute instances instead
			// (mig_test.go checks them).
			plain := 0
			for _, g := range gpus {
				if !g.MIGEnabled {
					plain++
				}
			}
			if len(byName)-migDevices != 2*plain {
				t.Errorf("%d devices besides %d MIG devices for %d GPUs not in MIG mode, want 2 per GPU", len(byName)-migDevices, migDevices, plain)
			}
			for _, g := range gpus {
				if g.MIGEnabled {
					for name := range byName {
						if m, _, err := ParseDevice(name); err == nil && m == g.Minor {
							t.Errorf("GPU %s in MIG mode: device %s published", g.UUID, name)
						}
					}
					continue
				}
				for _, name := range []string{WholeDeviceName(g.Minor), SharedDeviceName(g.Minor)} {
					d, ok := byName[name]
					if !ok {
						t.Errorf("GPU %s: device %s missing", g.UUID, name)
						continue
					}
					a := d.Attributes
					if got := ptr.Deref(a[AttrUUID].StringValue, ""); got != g.UUID {
						t.Errorf("%s: uuid %q, want %q", name, got, g.UUID)
					}
					if got := ptr.Deref(a[AttrNVLinkDomain].StringValue, ""); got == "" || got != g.NVLinkDomain {
						t.Errorf("%s: nvlinkDomain %q, want %q", name, got, g.NVLinkDomain)
					}
					if got := ptr.Deref(a[AttrDriverVersion].VersionValue, ""); got != "580.95.5" {
						t.Errorf("%s: driverVersion %q, want 580.95.5 (580.95.05 without the leading zero)", name, got)
					}
					if want, ok := wantCC[profile]; ok {
						if got := ptr.Deref(a[AttrCUDAComputeCapability].VersionValue, ""); got != want {
							t.Errorf("%s: cudaComputeCapability %q, want %q", name, got, want)
						}
					}
					if got := ptr.Deref(a[deviceattribute.StandardDeviceAttributePCIeRoot].StringValue, ""); got == "" || got != g.PCIeRoot {
						t.Errorf("%s: pcieRoot %q, want the mock profile's %q", name, got, g.PCIeRoot)
					}
					if g.NUMANode != nil {
						if got := ptr.Deref(a[deviceattribute.StandardDeviceAttributeNUMANode].IntValue, -1); got != int64(*g.NUMANode) {
							t.Errorf("%s: numaNode %d, want %d", name, got, *g.NUMANode)
						}
					}
				}
			}
		})
	}
}

// TestResourcesNVLinkDomains: the domains Discover finds are what constraints match on.
func TestResourcesNVLinkDomains(t *testing.T) {
	for _, tc := range []struct {
		profile string
		domains int
	}{
		{"hgx-h100", 1}, {"dgx-a100", 1}, {"l4x4", 4}, {"a100-pairs", 2},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			res, err := Resources("node-1", discover(t, tc.profile))
			if err != nil {
				t.Fatalf("Resources: %v", err)
			}
			domains := map[string]bool{}
			for _, s := range res.Pools["node-1"].Slices {
				for _, d := range s.Devices {
					domains[*d.Attributes[AttrNVLinkDomain].StringValue] = true
				}
			}
			if len(domains) != tc.domains {
				t.Errorf("%d NVLink domains, want %d: %v", len(domains), tc.domains, domains)
			}
		})
	}
}

// TestResourcesPCIeRoots: what PCIeRoots resolves wins over the GPU's own
// PCIeRoot (a mock profile's); a GPU neither knows is published without
// the attribute, on every one of its devices.
func TestResourcesPCIeRoots(t *testing.T) {
	gpus := fixtureGPUs(3, 80, oneDomain)
	gpus[0].PCIeRoot = "pci0000:99"
	gpus[2].PCIeRoot = "pci0000:80"
	res, err := Resources("node-1", gpus,
		WithPCIeRoots(PCIeRootMap{gpus[0].PCIBusID: "pci0000:00", gpus[1].PCIBusID: ""}),
		WithLending(map[string]Lent{}))
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}
	want := map[int]string{0: "pci0000:00", 1: "", 2: "pci0000:80"}
	seen := 0
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			seen++
			got := ptr.Deref(d.Attributes[deviceattribute.StandardDeviceAttributePCIeRoot].StringValue, "")
			_, hasAttr := d.Attributes[deviceattribute.StandardDeviceAttributePCIeRoot]
			minor, _, _ := ParseDevice(d.Name)
			if got != want[minor] || hasAttr != (want[minor] != "") {
				t.Errorf("%s: pcieRoot %q (published: %v), want %q", d.Name, got, hasAttr, want[minor])
			}
		}
	}
	if seen != 9 {
		t.Errorf("%d devices, want 9 (whole, shared and lent per GPU)", seen)
	}
}

// TestResourcesMIGSkipped: a GPU in MIG mode whose MIG facts discovery did not
// read publishes neither devices nor counters (mig_test.go has the others).
func TestResourcesMIGSkipped(t *testing.T) {
	gpus := fixtureGPUs(3, 80, oneDomain)
	gpus[1].MIGEnabled = true
	gpus[1].MemoryBytes = 0 // MIG GPUs are not checked further
	res, err := Resources("node-1", gpus)
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}
	for _, s := range res.Pools["node-1"].Slices {
		for _, cs := range s.SharedCounters {
			if cs.Name == CounterSetName(1) {
				t.Errorf("counter set of the MIG GPU published")
			}
		}
		for _, d := range s.Devices {
			if m, _, _ := ParseDeviceName(d.Name); m == 1 {
				t.Errorf("device %s of the MIG GPU published", d.Name)
			}
		}
	}
}

// TestResourcesDeterministic: the input order does not matter, and two calls give
// equal results, so republishing never churns ResourceSlices.
func TestResourcesDeterministic(t *testing.T) {
	gpus := fixtureGPUs(16, 80, func(m int) string { return "nvl-" + strconv.Itoa(m/4) })
	want, err := Resources("node-1", gpus)
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}
	rng := rand.New(rand.NewSource(1))
	for range 5 {
		shuffled := slices.Clone(gpus)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		got, err := Resources("node-1", shuffled)
		if err != nil {
			t.Fatalf("Resources: %v", err)
		}
		if diff := cmp.Diff(want, got, cmpQuantity); diff != "" {
			t.Fatalf("Resources depends on input order (-first +shuffled):\n%s", diff)
		}
	}
}

func TestResourcesBadVersionsOmitted(t *testing.T) {
	g := fixtureGPUs(1, 80, oneDomain)[0]
	g.DriverVersion, g.CUDADriverVersion, g.CUDAComputeCapability = "N/A", "", "12.4-rc1"
	res, err := Resources("node-1", []gpu.GPU{g})
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}
	if err := Validate(res); err != nil {
		t.Errorf("Validate: %v", err)
	}
	for _, d := range res.Pools["node-1"].Slices[1].Devices {
		for _, attr := range []resourceapi.QualifiedName{AttrDriverVersion, AttrCUDADriverVersion, AttrCUDAComputeCapability} {
			if v, ok := d.Attributes[attr]; ok {
				t.Errorf("%s: %s = %v published from an unparseable version", d.Name, attr, v)
			}
		}
	}
}

func TestResourcesErrors(t *testing.T) {
	base := func() []gpu.GPU { return fixtureGPUs(2, 80, oneDomain) }
	for _, tc := range []struct {
		name    string
		node    string
		mutate  func([]gpu.GPU)
		wantErr string
	}{
		{name: "empty node name", node: "", wantErr: `node name ""`},
		{name: "node name not a DNS subdomain", node: "Node_1", wantErr: `node name "Node_1"`},
		{name: "duplicate minor", mutate: func(g []gpu.GPU) { g[1].Minor = 0 }, wantErr: "minor 0 already used by GPU " + base()[0].UUID},
		{name: "duplicate UUID", mutate: func(g []gpu.GPU) { g[1].UUID = g[0].UUID }, wantErr: "UUID " + base()[0].UUID + " already used"},
		{name: "no UUID", mutate: func(g []gpu.GPU) { g[1].UUID = "" }, wantErr: "GPU minor 1: no UUID"},
		{name: "negative minor", mutate: func(g []gpu.GPU) { g[1].Minor = -1 }, wantErr: "negative minor -1"},
		{name: "no memory", mutate: func(g []gpu.GPU) { g[1].MemoryBytes = 0 }, wantErr: base()[1].UUID + ": memory size is 0"},
		{name: "memory beyond int64", mutate: func(g []gpu.GPU) { g[0].MemoryBytes = math.MaxUint64 }, wantErr: "does not fit a quantity"},
		{name: "product name too long", mutate: func(g []gpu.GPU) { g[0].ProductName = strings.Repeat("x", 65) }, wantErr: "attribute productName"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus := base()
			if tc.mutate != nil {
				tc.mutate(gpus)
			}
			node := tc.node
			if node == "" && !strings.Contains(tc.name, "node") {
				node = "node-1"
			}
			_, err := Resources(node, gpus)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Resources error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestSemver(t *testing.T) {
	for in, want := range map[string]string{
		"9.0":                    "9.0.0",
		"12.4":                   "12.4.0",
		"13":                     "13.0.0",
		"580.95.05":              "580.95.5",
		"550.54.15":              "550.54.15",
		"007.0.00":               "7.0.0",
		"":                       "",
		"N/A":                    "",
		"12.4-rc1":               "",
		"1.2.3.4":                "",
		"1..2":                   "",
		"-1.0":                   "",
		"1.0.":                   "",
		"99999999999999999999.0": "",
	} {
		got, ok := semver(in)
		if got != want || ok != (want != "") {
			t.Errorf("semver(%q) = %q, %v; want %q, %v", in, got, ok, want, want != "")
		}
	}
}

// The qualified attribute names the webhook checks constraints by are this
// package's attributes.
func TestQualifiedAttributeNames(t *testing.T) {
	if got, want := string(modelnames.UUIDAttribute), DriverName+"/"+string(AttrUUID); got != want {
		t.Errorf("UUIDAttribute %q, want %q", got, want)
	}
	if got, want := string(modelnames.NVLinkDomainAttribute), DriverName+"/"+string(AttrNVLinkDomain); got != want {
		t.Errorf("NVLinkDomainAttribute %q, want %q", got, want)
	}
}
