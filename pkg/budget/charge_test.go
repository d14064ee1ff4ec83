package budget

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// The fallback memory minimum is pkg/model's.
func TestMemoryPolicyMatchesModel(t *testing.T) {
	if modelMemoryPolicy.min != model.MinShareMemory.Value() {
		t.Errorf("the fallback memory minimum %d, model.MinShareMemory %s", modelMemoryPolicy.min, model.MinShareMemory.String())
	}
}

func TestCharge(t *testing.T) {
	firstAvailable := resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "whole", DeviceClassName: modelnames.WholeClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		{Name: "shares", DeviceClassName: modelnames.SharedClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
				"memory": resource.MustParse("50Gi"), "cores": resource.MustParse("30")}}},
	}}
	all := exact("all", modelnames.SharedClassName, 0, map[string]string{"memory": "1Gi", "cores": "5"})
	all.Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
	for _, tc := range []struct {
		name    string
		devices []resourceapi.Device
		claim   *resourceapi.ResourceClaim
		class   string // the budget's deviceClassName
		want    Amount
		unknown []Resource
	}{
		{name: "whole GPU: the largest model's memory", claim: claim("c", exact("gpu", modelnames.WholeClassName, 1, nil)),
			want: Amount{Memory: gi(80), Cores: 100, GPUs: 1}},
		{name: "count 3", claim: claim("c", exact("gpu", modelnames.WholeClassName, 3, nil)),
			want: Amount{Memory: gi(240), Cores: 300, GPUs: 3}},
		{name: "share of 1500Ki: the model's 1Gi minimum (no policy published)", claim: claim("c", exact("s", modelnames.SharedClassName, 1, map[string]string{"memory": "1500Ki", "cores": "25"})),
			want: Amount{Memory: gi(1), Cores: 25}},
		{name: "share of 1Mi: charged 1Gi", claim: claim("c", exact("s", modelnames.SharedClassName, 1, map[string]string{"memory": "1Mi", "cores": "1"})),
			want: Amount{Memory: gi(1), Cores: 1}},
		{name: "share above the minimum: the model's 1Mi step", claim: claim("c", exact("s", modelnames.SharedClassName, 1, map[string]string{"memory": "1025Mi", "cores": "1"})),
			want: Amount{Memory: gi(1) + 1<<20, Cores: 1}},
		{name: "share: the published policy, the largest over the matched devices",
			devices: []resourceapi.Device{
				withPolicy(withPolicy(device("gpu-0-shared", modelnames.TypeShared, "80Gi", 100), modelnames.Memory, "1Gi", "1Mi"), modelnames.Cores, "0", "1"),
				withPolicy(withPolicy(device("gpu-1-shared", modelnames.TypeShared, "40Gi", 100), modelnames.Memory, "2Gi", "512Mi"), modelnames.Cores, "5", "5"),
			},
			claim: claim("c", exact("s", modelnames.SharedClassName, 1, map[string]string{"memory": "2100Mi", "cores": "7"})),
			want:  Amount{Memory: 2560 << 20, Cores: 10}},
		{name: "share below the published minimum", devices: []resourceapi.Device{
			withPolicy(device("gpu-0-shared", modelnames.TypeShared, "80Gi", 100), modelnames.Memory, "1Gi", "1Mi")},
			claim: claim("c", exact("s", modelnames.SharedClassName, 1, map[string]string{"memory": "1Mi", "cores": "3"})),
			want:  Amount{Memory: gi(1), Cores: 3}},
		{name: "share without memory or cores: all of the largest GPU", claim: claim("c", exact("s", modelnames.SharedClassName, 1, nil)),
			want: Amount{Memory: gi(80), Cores: 100}},
		{name: "lent share", devices: append(twoModels(), device("gpu-0-lent", modelnames.TypeLent, "20Gi", 100)),
			claim: claim("c", exact("s", modelnames.LentClassName, 1, map[string]string{"memory": "4Gi"})),
			want:  Amount{Memory: gi(4), Cores: 100}},
		{name: "MIG device: its capacity", claim: claim("c", exact("m", modelnames.MIGClassName, 2, nil)),
			want: Amount{Memory: gi(20), Cores: 28}},
		{name: "legacy nvidia.com/gpu class: whole GPUs", claim: claim("c", exact("g", modelnames.NVIDIAGPUClassName, 1, nil)),
			want: Amount{Memory: gi(80), Cores: 100, GPUs: 1}},
		{name: "firstAvailable: per dimension the largest alternative", claim: claim("c", firstAvailable),
			want: Amount{Memory: gi(100), Cores: 100, GPUs: 1}},
		{name: "allocationMode All: AllocationResultsMaxSize devices", claim: claim("c", all),
			want: Amount{Memory: gi(32), Cores: 160}},
		{name: "requests are summed", claim: claim("c", exact("a", modelnames.WholeClassName, 1, nil), exact("b", modelnames.SharedClassName, 1, map[string]string{"memory": "10Gi", "cores": "10"})),
			want: Amount{Memory: gi(90), Cores: 110, GPUs: 1}},
		{name: "another driver's class: nothing", claim: claim("c", exact("x", "other.example.com", 4, nil))},
		{name: "a class that does not exist: nothing", claim: claim("c", exact("x", "missing.example.com", 1, nil))},
		{name: "own class selecting by size: the 80Gi GPU only", claim: claim("c", exact("x", "big.gpu.tessera.dev", 1, nil)),
			want: Amount{Memory: gi(80), Cores: 100, GPUs: 1}},
		{name: "request selector narrows to the 40Gi GPU", claim: func() *resourceapi.ResourceClaim {
			r := exact("x", modelnames.WholeClassName, 1, nil)
			r.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) <= 0`}}}
			return claim("c", r)
		}(), want: Amount{Memory: gi(40), Cores: 100, GPUs: 1}},
		{name: "budget of one class counts only it", class: modelnames.SharedClassName,
			claim: claim("c", exact("a", modelnames.WholeClassName, 1, nil), exact("b", modelnames.SharedClassName, 1, map[string]string{"memory": "10Gi", "cores": "10"})),
			want:  Amount{Memory: gi(10), Cores: 10}},
		{name: "nothing published: a share names its size", devices: []resourceapi.Device{},
			claim: claim("c", exact("s", modelnames.SharedClassName, 1, map[string]string{"memory": "3Gi", "cores": "30"})),
			want:  Amount{Memory: gi(3), Cores: 30}},
		{name: "nothing published: a whole GPU's memory is unknown", devices: []resourceapi.Device{},
			claim: claim("c", exact("g", modelnames.WholeClassName, 2, nil)),
			want:  Amount{Cores: 200, GPUs: 2}, unknown: []Resource{Memory}},
		{name: "nothing published: a share naming no memory is unknown", devices: []resourceapi.Device{},
			claim: claim("c", exact("s", modelnames.SharedClassName, 1, nil)),
			want:  Amount{Cores: 100}, unknown: []Resource{Memory}},
		{name: "nothing published: MIG unknown", devices: []resourceapi.Device{},
			claim: claim("c", exact("m", modelnames.MIGClassName, 1, nil)), unknown: []Resource{Memory, Cores}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devices := tc.devices
			if devices == nil {
				devices = twoModels()
			}
			cc, err := pricer(devices).Claim(context.Background(), &tc.claim.Spec.Devices)
			if err != nil {
				t.Fatal(err)
			}
			got := cc.For(tc.class)
			if got.Amount != tc.want {
				t.Errorf("charge %+v (%s), want %+v (%s)", got.Amount, got.Amount, tc.want, tc.want)
			}
			if len(got.Unknown) != len(tc.unknown) {
				t.Errorf("unknown %v, want %v", got.Unknown, tc.unknown)
			}
			for _, r := range tc.unknown {
				if !strings.Contains(got.Unknown[r], "published") {
					t.Errorf("unknown %s: %q, want a reason naming what is not published", r, got.Unknown[r])
				}
			}
		})
	}
}

func TestRefusalMessage(t *testing.T) {
	hard := Limits{Memory: ptrInt(gi(40)), GPUs: ptrInt(1)}
	r := Check("team-a", "gpu", hard, Amount{Memory: gi(30)}, Charge{Amount: Amount{Memory: gi(20)}})
	if r == nil {
		t.Fatal("30Gi + 20Gi fits 40Gi")
	}
	if want := "GPU budget team-a/gpu: memory: used 30Gi + this claim 20Gi > hard 40Gi"; r.Error() != want {
		t.Errorf("message %q, want %q", r.Error(), want)
	}
	if r := Check("team-a", "gpu", hard, Amount{Memory: gi(20)}, Charge{Amount: Amount{Memory: gi(20), Cores: 900}}); r != nil {
		t.Errorf("20Gi + 20Gi within 40Gi, cores unlimited: refused %v", r)
	}
	r = Check("team-a", "gpu", hard, Amount{}, Charge{Amount: Amount{GPUs: 1}, Unknown: map[Resource]string{Memory: "no GPU published"}})
	if r == nil || !strings.Contains(r.Error(), "limits memory: no GPU published") {
		t.Errorf("unknown memory against a memory limit: %v", r)
	}
	if r := Check("team-a", "gpu", Limits{GPUs: ptrInt(1)}, Amount{}, Charge{Amount: Amount{GPUs: 1}, Unknown: map[Resource]string{Memory: "x"}}); r != nil {
		t.Errorf("unknown memory, memory unlimited: refused %v", r)
	}
}

func ptrInt(v int64) *int64 { return &v }
