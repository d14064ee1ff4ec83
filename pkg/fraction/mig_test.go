package fraction

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

func TestMIGNamesAreTheModels(t *testing.T) {
	if migClassName != model.MIGClassName || string(attrProfile) != string(model.AttrProfile) {
		t.Errorf("%q, %q here; %q, %q in pkg/model", migClassName, attrProfile, model.MIGClassName, model.AttrProfile)
	}
}

// TestMIGModelsAreTheMockTables: the MIG tables here (profile names and
// slices) are the mock NVML's, which are NVIDIA's MIG user guide's; every
// mock product has one, and every model here names a mock product first.
func TestMIGModelsAreTheMockTables(t *testing.T) {
	for _, product := range gpu.MockMIGProducts() {
		table, _ := gpu.MockMIGTable(product)
		m, ok := MIGModelOf(product)
		if !ok {
			t.Errorf("%s: no MIG model here", product)
			continue
		}
		if m.ComputeSlices != table.ComputeSlices || m.MemorySlices != table.MemorySlices {
			t.Errorf("%s: %d compute and %d memory slices here, %d and %d in the mock", product, m.ComputeSlices, m.MemorySlices, table.ComputeSlices, table.MemorySlices)
		}
		var mock []MIGProfile
		for _, p := range table.Profiles {
			mock = append(mock, MIGProfile{Name: p.Name, ComputeSlices: p.ComputeSlices, MemorySlices: p.MemorySlices})
		}
		sortMIGProfiles(mock)
		if !slices.Equal(m.Profiles, mock) {
			t.Errorf("%s: profiles\n here %+v\n mock %+v", product, m.Profiles, mock)
		}
	}
	for _, m := range MIGModels() {
		if !slices.Contains(gpu.MockMIGProducts(), m.Products[0]) {
			t.Errorf("model %s: first product %q has no mock table", m.Key, m.Products[0])
		}
	}
	if n := len(MIGModels()); n > resourceapi.FirstAvailableDeviceRequestMaxSize {
		t.Errorf("%d MIG models, more than one firstAvailable request lists", n)
	}
}

// TestMIGProfileForFraction: the smallest profile whose compute and memory
// both cover the fraction, per model (the guide's slice counts). 2/7 of an
// H100 is a 3g.40gb: a 2g.20gb has 2 of 7 compute slices but 2 of 8 memory
// slices, less than 2/7.
func TestMIGProfileForFraction(t *testing.T) {
	want := map[string]map[string]string{
		"NVIDIA H100 80GB HBM3": {"1/8": "1g.10gb", "1/7": "1g.20gb", "1/4": "2g.20gb", "2/7": "3g.40gb", "1/3": "3g.40gb", "3/7": "3g.40gb", "1/2": "4g.40gb", "4/7": "7g.80gb", "1": "7g.80gb"},
		"NVIDIA A100-SXM4-40GB": {"1/8": "1g.5gb", "1/7": "1g.10gb", "1/4": "2g.10gb", "1/3": "3g.20gb", "1/2": "4g.20gb", "0.6": "7g.40gb"},
		"NVIDIA A100 80GB PCIe": {"1/7": "1g.20gb", "1/2": "4g.40gb"},
		"NVIDIA H200":           {"1/8": "1g.18gb", "1/7": "1g.35gb", "1/2": "4g.71gb", "1": "7g.141gb"},
	}
	for product, cases := range want {
		m, ok := MIGModelOf(product)
		if !ok {
			t.Fatalf("%s: no model", product)
		}
		for f, profile := range cases {
			p, err := m.Profile(MustParse(f))
			if err != nil || p.Name != profile {
				t.Errorf("%s of %s: %s, %v; want %s", f, product, p.Name, err, profile)
			}
		}
	}
}

// migNode is what the kubelet plugin publishes for the hgx-h100-mig mock
// node (GPU 0 static MIG with a 4g.40gb and a 3g.40gb, GPU 1 in MIG mode
// without instances, the others not in MIG mode), GPU 1 with dynamic MIG.
// edit changes the discovered GPUs first.
func migNode(t *testing.T, edit func([]gpu.GPU)) []resourceapi.ResourceSlice {
	t.Helper()
	gpus := profileGPUs(t, "hgx-h100-mig", 0)
	if edit != nil {
		edit(gpus)
	}
	return publish(t, gpus, model.WithDynamicMIG(gpus[1].UUID))
}

// TestMIGFractionsThroughTheAllocator: kube-scheduler's allocator places
// MIG fraction requests on the hgx-h100-mig mock node as the profile table
// says: 1/7 is a 1g.20gb, four of which fit on the dynamic GPU and a fifth
// does not (the static GPU has none); 1/2 is a 4g.40gb: the static one, then
// the dynamic GPU's, then none; 1/3 is a 3g.40gb: the static one and two on
// the dynamic GPU.
func TestMIGFractionsThroughTheAllocator(t *testing.T) {
	slices := migNode(t, nil)
	for _, tc := range []struct {
		fraction string
		want     []string
	}{
		{"1/7", []string{"gpu-1-mig-1g-20gb-6", "gpu-1-mig-1g-20gb-4", "gpu-1-mig-1g-20gb-2", "gpu-1-mig-1g-20gb-0"}},
		{"1/2", []string{"gpu-0-mig-1", "gpu-1-mig-4g-40gb-0"}},
		{"1/3", []string{"gpu-0-mig-2", "gpu-1-mig-3g-40gb-4", "gpu-1-mig-3g-40gb-0"}},
	} {
		req, err := MIGRequest("mig", MustParse(tc.fraction), MIGModels())
		if err != nil {
			t.Fatal(err)
		}
		n := newNode(slices)
		var got []string
		for i := range len(tc.want) + 1 {
			results := n.allocate(t, fmt.Sprintf("c%d", i), req)
			if results == nil {
				break
			}
			if want := "mig/h100-80gb-"; !strings.HasPrefix(results[0].Request, want) {
				t.Errorf("%s: request %s, want the H100 subrequest", tc.fraction, results[0].Request)
			}
			got = append(got, results[0].Device)
		}
		if !slicesEqual(got, tc.want) {
			t.Errorf("%s: allocated %v, want %v and then nothing", tc.fraction, got, tc.want)
		}
	}
}

// TestMIGFractionSkipsPartialComputeInstances: a static compute instance
// that takes part of its 3g.40gb GPU instance's SMs publishes fewer cores,
// and a fraction that needs the whole 3g does not get it.
func TestMIGFractionSkipsPartialComputeInstances(t *testing.T) {
	slices := migNode(t, func(gpus []gpu.GPU) {
		for i, gi := range gpus[0].MIG.Instances {
			if gi.ProfileName == "3g.40gb" {
				gpus[0].MIG.Instances[i].ComputeInstances[0].Multiprocessors = 20 // of 60
			}
		}
	})
	req, err := MIGRequest("mig", MustParse("1/3"), MIGModels())
	if err != nil {
		t.Fatal(err)
	}
	results := newNode(slices).allocate(t, "c", req)
	if len(results) != 1 || results[0].Device != "gpu-1-mig-3g-40gb-4" {
		t.Errorf("results %+v, want the dynamic GPU's 3g.40gb at 4, not the static 1c.3g", results)
	}
}

// TestMIGProfileRequest: a named profile selects that profile; names that
// are not profiles are refused before they reach CEL.
func TestMIGProfileRequest(t *testing.T) {
	if err := CheckMIGProfile("1g.10gb+me"); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"", `3g" || true || "`, "3g 40gb", strings.Repeat("1", 65)} {
		if err := CheckMIGProfile(bad); err == nil {
			t.Errorf("CheckMIGProfile(%q) accepted", bad)
		}
	}
	if got := KnownMIGProfile("3g.40gb"); len(got) != 2 || got[0].Key != "a100-80gb" || got[1].Key != "h100-80gb" {
		t.Errorf("KnownMIGProfile(3g.40gb) = %+v, want the A100 80GB and H100 models", got)
	}
}

func slicesEqual(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }
