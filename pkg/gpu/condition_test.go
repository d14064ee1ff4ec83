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

// A GPU in MIG mode is published (as MIG devices), without a taint, and the
// other conditions still apply to it.
func TestDiscoverMIGCondition(t *testing.T) {
	node := mustMockNode(t, "hgx-h100")
	must(t, node.SetMIG(3, true))
	must(t, node.SetComputeMode(3, ComputeModeProhibited))
	conds, list := conditionsOf(t, node, ComputeModePolicy{})
	if !mapsEqual(conds, map[string]string{"3/MIGEnabled": "", "3/ComputeMode": "ComputeModeProhibited"}) {
		t.Fatalf("conditions %v, want GPU 3 MIGEnabled without a taint, and its compute mode", conds)
	}
	if c := list[0]; c.Reason != ReasonMIGEnabled || !c.Published || !strings.Contains(c.Message, "published as MIG devices only") ||
		!strings.Contains(c.Message, "0 GPU instances") || !strings.Contains(c.Message, "nvidia-smi mig -i 3 -cgi") {
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

// A GPU whose pending MIG mode differs from the current one is tainted
// MIGModePending, whichever way the change goes, until a reset of the idle
// GPU makes them agree; the message says what is published meanwhile and
// how to finish.
func TestDiscoverMIGPendingCondition(t *testing.T) {
	node := mustMockNode(t, "hgx-h100-mig")
	must(t, node.SetMIGPending(0, false)) // in MIG mode, pending disable
	must(t, node.SetMIGPending(5, true))  // not in MIG mode, pending enable
	gpus := mustDiscover(t, node)
	if !gpus[0].MIGPendingChange() || !gpus[5].MIGPendingChange() || gpus[1].MIGPendingChange() || gpus[4].MIGPendingChange() {
		t.Errorf("pending changes: %v %v %v %v", gpus[0].MIGPendingChange(), gpus[1].MIGPendingChange(), gpus[4].MIGPendingChange(), gpus[5].MIGPendingChange())
	}
	if len(gpus[0].MIG.Instances) != 2 {
		t.Errorf("GPU 0 lost its instances before the reset: %+v", gpus[0].MIG.Instances)
	}
	conds, list := conditionsOf(t, node, ComputeModePolicy{})
	want := map[string]string{"0/MIGEnabled": "", "0/MIGModePending": "MIGModePending", "1/MIGEnabled": "", "5/MIGModePending": "MIGModePending"}
	if !mapsEqual(conds, want) {
		t.Fatalf("conditions %v, want %v", conds, want)
	}
	for _, c := range list {
		if c.Reason != ReasonMIGModePending {
			continue
		}
		says := map[int][]string{
			0: {"pending disable", "publishes its MIG devices tainted MIGModePending", "nvidia-smi -r -i 0", "published whole and in shares", "nvidia-smi -i 0 -mig 1"},
			5: {"pending enable", "publishes its whole and shared devices tainted MIGModePending", "nvidia-smi -r -i 5", "published as MIG devices only", "nvidia-smi -i 5 -mig 0"},
		}[c.Index]
		for _, s := range says {
			if !strings.Contains(c.Message, s) {
				t.Errorf("GPU %d: message %q does not say %q", c.Index, c.Message, s)
			}
		}
		if !c.Published {
			t.Errorf("GPU %d not published", c.Index)
		}
	}

	// The reset waits for the GPU to be idle, then applies the mode: the
	// taint goes, GPU 0 leaves MIG mode (its instances go with it).
	must(t, node.SetMIGProcesses(0, 1, 0, []nvml.ProcessInfo{{Pid: 7}}))
	if err := node.ResetGPU(0); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("reset of a busy GPU: %v", err)
	}
	must(t, node.SetMIGProcesses(0, 1, 0, nil))
	must(t, node.ResetGPU(0))
	must(t, node.ResetGPU(5))
	conds, _ = conditionsOf(t, node, ComputeModePolicy{})
	if !mapsEqual(conds, map[string]string{"1/MIGEnabled": "", "5/MIGEnabled": ""}) {
		t.Errorf("after the resets: conditions %v", conds)
	}
	if g := mustDiscover(t, node)[0]; g.MIGEnabled || len(g.MIG.Instances) != 0 {
		t.Errorf("GPU 0 after the reset: MIGEnabled %v, instances %v", g.MIGEnabled, g.MIG.Instances)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
