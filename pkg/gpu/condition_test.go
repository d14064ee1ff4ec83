package gpu

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// conditionsOf is Conditions of a discovery of node, keyed "<index>/<reason>"
// with the taint as value.
func conditionsOf(t *testing.T, node *MockNode, modes ComputeModePolicy) (map[string]string, []Condition) {
	t.Helper()
	conds := Conditions(mustDiscover(t, node), modes)
	out := map[string]string{}
	for _, c := range conds {
		out[strings.Join([]string{strconv.Itoa(c.Index), string(c.Reason)}, "/")] = c.Taint
		if !strings.HasPrefix(c.Message, "GPU index "+strconv.Itoa(c.Index)+" ("+c.UUID+"): ") {
			t.Errorf("message %q does not name GPU index %d (%s)", c.Message, c.Index, c.UUID)
		}
	}
	return out, conds
}

// An NVML error on a GPU's NVLink or fabric queries no longer drops the GPU:
// it is described in an NVLink domain of its own, with the error, and the
// links of other GPUs that end at it join nothing.
func TestDiscoverNVLinkErrorDegradesToOwnDomain(t *testing.T) {
	t.Run("bridged pair", func(t *testing.T) {
		node := mustMockNode(t, "a100-pairs")
		must(t, node.FailDiscovery(1, "nvmlDeviceGetNvLinkState", nvml.ERROR_UNKNOWN))
		d, err := DiscoverNode(node)
		if err != nil || len(d.Failed) != 0 || len(d.GPUs) != 4 {
			t.Fatalf("discovery: %d GPUs, failed %v, err %v; want all 4 described", len(d.GPUs), d.Failed, err)
		}
		if e := d.GPUs[1].NVLinkError; !strings.Contains(e, "nvmlDeviceGetNvLinkState(link 0)") || !strings.Contains(e, nvml.ERROR_UNKNOWN.Error()) {
			t.Errorf("GPU 1 NVLinkError %q, want the call and its error", e)
		}
		if d.GPUs[0].NVLinkError != "" {
			t.Errorf("GPU 0 NVLinkError %q", d.GPUs[0].NVLinkError)
		}
		// GPU 0's links end at GPU 1: not a peer now, and not a switch.
		if got, want := domainGroups(d.GPUs), [][]int{{0}, {1}, {2, 3}}; !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("domains %v, want %v", got, want)
		}
	})
	t.Run("NVSwitch board", func(t *testing.T) {
		node := mustMockNode(t, "hgx-h100")
		node.Devices[2].GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.ERROR_GPU_IS_LOST }
		node.Devices[2].GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			return 0, nvml.ERROR_UNKNOWN
		}
		gpus := mustDiscover(t, node)
		if got, want := domainGroups(gpus), [][]int{{0, 1, 3, 4, 5, 6, 7}, {2}}; !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("domains %v, want %v", got, want)
		}
		if !strings.Contains(gpus[2].NVLinkError, "nvmlDeviceGetNvLinkRemoteDeviceType(link 0)") {
			t.Errorf("NVLinkError %q", gpus[2].NVLinkError)
		}
	})
	t.Run("fabric query", func(t *testing.T) {
		node := mustMockNode(t, "hgx-h100")
		must(t, node.FailDiscovery(5, "nvmlDeviceGetGpuFabricInfo", nvml.ERROR_UNKNOWN))
		gpus := mustDiscover(t, node)
		if got, want := domainGroups(gpus), [][]int{{0, 1, 2, 3, 4, 6, 7}, {5}}; !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("domains %v, want %v", got, want)
		}
		if !strings.Contains(gpus[5].NVLinkError, "nvmlDeviceGetGpuFabricInfo") {
			t.Errorf("NVLinkError %q", gpus[5].NVLinkError)
		}
		conds, _ := conditionsOf(t, node, ComputeModePolicy{})
		if taint, ok := conds["5/NVLinkUnknown"]; !ok || taint != "" || len(conds) != 1 {
			t.Errorf("conditions %v, want only GPU 5 NVLinkUnknown without a taint", conds)
		}
	})
}

// The pure reduction: an Unknown GPU is alone, and a link that ends at it is
// no evidence of an NVSwitch.
func TestNVLinkDomainsUnknown(t *testing.T) {
	got := partition(NVLinkDomains([]NVLinkPeers{
		{UUID: "a", PCIBusID: bus(0), Remotes: []string{bus(1)}},
		{UUID: "b", PCIBusID: bus(1), Remotes: []string{bus(0)}, Unknown: true},
		{UUID: "c", PCIBusID: bus(2), Switch: true},
		{UUID: "d", PCIBusID: bus(3), Switch: true, Unknown: true, Fabric: "cluster/1"},
		{UUID: "e", PCIBusID: bus(4), Fabric: "cluster/1"},
	}))
	want := [][]string{{"a"}, {"b"}, {"c"}, {"d"}, {"e"}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("domains %v, want %v", got, want)
	}
}

// Fabric registration is read for every GPU; one that has not completed it
// (or completed it with an error) is tainted, one without a fabric never.
func TestDiscoverFabricStates(t *testing.T) {
	node := mustMockNode(t, "hgx-h100")
	must(t, node.SetFabric(3, FabricNotStarted))
	must(t, node.SetFabric(4, FabricInProgress))
	must(t, node.SetFabric(5, FabricFailed))
	must(t, node.SetFabric(6, FabricCompleted))
	gpus := mustDiscover(t, node)
	for i, want := range []FabricState{FabricNone, FabricNone, FabricNone, FabricNotStarted, FabricInProgress, FabricFailed, FabricCompleted, FabricNone} {
		if gpus[i].Fabric != want {
			t.Errorf("GPU %d: Fabric %q, want %q", i, gpus[i].Fabric, want)
		}
	}
	if gpus[5].FabricError != nvml.ERROR_UNKNOWN.Error() {
		t.Errorf("GPU 5: FabricError %q", gpus[5].FabricError)
	}
	conds, list := conditionsOf(t, node, ComputeModePolicy{})
	want := map[string]string{"3/FabricNotReady": "FabricNotReady", "4/FabricNotReady": "FabricNotReady", "5/FabricNotReady": "FabricNotReady"}
	if !mapsEqual(conds, want) {
		t.Errorf("conditions %v, want %v", conds, want)
	}
	for _, c := range list {
		if !c.Published || !strings.Contains(c.Message, "nvidia-fabricmanager") {
			t.Errorf("condition %+v: want published, naming the Fabric Manager", c)
		}
	}
	if err := mustMockNode(t, "l4x4").SetFabric(0, FabricNotStarted); err == nil {
		t.Error("SetFabric accepted on a profile without fabric info")
	}
	// NOT_SUPPORTED from the call (PCIe GPUs, pre-Hopper): no fabric, no taint.
	if conds, _ := conditionsOf(t, mustMockNode(t, "dgx-a100"), ComputeModePolicy{}); len(conds) != 0 {
		t.Errorf("dgx-a100: conditions %v, want none", conds)
	}
}

// Compute mode is read, published as a fact and compared with the mode
// expected of each GPU.
func TestDiscoverComputeMode(t *testing.T) {
	node := mustMockNode(t, "l4x4")
	must(t, node.SetComputeMode(2, ComputeModeExclusiveProcess))
	must(t, node.SetComputeMode(3, ComputeModeProhibited))
	gpus := mustDiscover(t, node)
	for i, want := range []ComputeMode{ComputeModeDefault, ComputeModeDefault, ComputeModeExclusiveProcess, ComputeModeProhibited} {
		if gpus[i].ComputeMode != want {
			t.Errorf("GPU %d: ComputeMode %q, want %q", i, gpus[i].ComputeMode, want)
		}
	}
	for _, tc := range []struct {
		name  string
		modes ComputeModePolicy
		want  map[string]string
	}{
		{"default policy", ComputeModePolicy{}, map[string]string{"2/ComputeMode": "ComputeModeExclusiveProcess", "3/ComputeMode": "ComputeModeProhibited"}},
		{"node expects exclusive", ComputeModePolicy{Default: ComputeModeExclusiveProcess},
			map[string]string{"0/ComputeMode": "ComputeModeDefault", "1/ComputeMode": "ComputeModeDefault", "3/ComputeMode": "ComputeModeProhibited"}},
		{"per GPU", ComputeModePolicy{PerGPU: func(g GPU) (ComputeMode, bool) { return ComputeModeExclusiveProcess, g.Index == 2 }},
			map[string]string{"3/ComputeMode": "ComputeModeProhibited"}},
		{"any", ComputeModePolicy{Default: ComputeModeAny}, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := conditionsOf(t, node, tc.modes); !mapsEqual(got, tc.want) {
				t.Errorf("conditions %v, want %v", got, tc.want)
			}
		})
	}
	_, list := conditionsOf(t, node, ComputeModePolicy{})
	if msg := list[0].Message; !strings.Contains(msg, "compute mode is ExclusiveProcess, Tessera expects Default") || !strings.Contains(msg, "nvidia-smi -i 2 -c DEFAULT") {
		t.Errorf("message %q, want the modes and the fix", msg)
	}
	// A driver that does not report it: unknown, never a condition.
	node.Devices[3].GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	if conds, _ := conditionsOf(t, node, ComputeModePolicy{}); len(conds) != 1 {
		t.Errorf("conditions %v, want GPU 2's only", conds)
	}
}

func TestParseComputeMode(t *testing.T) {
	for in, want := range map[string]ComputeMode{
		"Default": ComputeModeDefault, "DEFAULT": ComputeModeDefault, "0": ComputeModeDefault,
		"ExclusiveProcess": ComputeModeExclusiveProcess, "EXCLUSIVE_PROCESS": ComputeModeExclusiveProcess, "3": ComputeModeExclusiveProcess,
		"prohibited": ComputeModeProhibited, "Any": ComputeModeAny,
	} {
		if got, err := ParseComputeMode(in); err != nil || got != want {
			t.Errorf("ParseComputeMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "ExclusiveThread", "1", "shared"} {
		if _, err := ParseComputeMode(bad); err == nil {
			t.Errorf("ParseComputeMode(%q) accepted", bad)
		}
	}
}

// A MIG GPU is described (so that it can be reported) and its condition says
// it is not published; nothing else is said about it.
func TestDiscoverMIGCondition(t *testing.T) {
	node := mustMockNode(t, "hgx-h100")
	must(t, node.SetMIG(3, true))
	must(t, node.SetComputeMode(3, ComputeModeProhibited))
	conds, list := conditionsOf(t, node, ComputeModePolicy{})
	if !mapsEqual(conds, map[string]string{"3/MIGEnabled": ""}) {
		t.Fatalf("conditions %v, want GPU 3 MIGEnabled only", conds)
	}
	if c := list[0]; c.Published || !strings.Contains(c.Message, "nvidia-smi -i 3 -mig 0") {
		t.Errorf("condition %+v", c)
	}
	must(t, node.SetMIG(3, false))
	if conds, _ := conditionsOf(t, node, ComputeModePolicy{}); !mapsEqual(conds, map[string]string{"3/ComputeMode": "ComputeModeProhibited"}) {
		t.Errorf("MIG off again: conditions %v", conds)
	}
	if err := mustMockNode(t, "l4x4").SetMIG(0, true); err == nil {
		t.Error("SetMIG accepted on an L4")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
