package metrics

import (
	"strings"
	"testing"
)

type fixedDiscovery Discovery

func (d fixedDiscovery) DiscoverySnapshot() Discovery { return Discovery(d) }

// A GPU that failed discovery and a node without usable NVML show up.
func TestDiscoveryMetrics(t *testing.T) {
	m := New("node-a")
	m.AddDiscovery(fixedDiscovery{Up: true, GPUs: 7, Errors: 3, Failed: []FailedGPU{
		{Index: 3, UUID: "GPU-3", Published: true},
		{Index: 5},
	}})
	out := scrape(t, m)
	for _, want := range []string{
		`tessera_gpu_discovery_up{node="node-a"} 1`,
		`tessera_gpus_discovered{node="node-a"} 7`,
		`tessera_gpu_discovery_failed{index="3",node="node-a",published="true",uuid="GPU-3"} 1`,
		`tessera_gpu_discovery_failed{index="5",node="node-a",published="false",uuid=""} 1`,
		`tessera_gpu_discovery_errors_total{node="node-a"} 3`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %s", want)
		}
	}

	m = New("node-b")
	m.AddDiscovery(fixedDiscovery{Errors: 1})
	out = scrape(t, m)
	for _, want := range []string{`tessera_gpu_discovery_up{node="node-b"} 0`, `tessera_gpus_discovered{node="node-b"} 0`} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %s", want)
		}
	}
	if strings.Contains(out, "tessera_gpu_discovery_failed{") {
		t.Error("a failed-GPU series without failed GPUs")
	}
}

// GPUs left unpublished are counted by reason, and every condition of a
// described GPU is a series naming it.
func TestDiscoverySkippedAndConditions(t *testing.T) {
	m := New("node-a")
	m.AddDiscovery(fixedDiscovery{Up: true, GPUs: 8, Failed: []FailedGPU{{Index: 5}}, Conditions: []GPUCondition{
		{Index: 2, UUID: "GPU-2", Reason: "MIGEnabled"},
		{Index: 3, UUID: "GPU-3", Reason: "MIGEnabled"},
		{Index: 4, UUID: "GPU-4", Reason: "FabricNotReady", Published: true, Taint: "FabricNotReady"},
		{Index: 6, UUID: "GPU-6", Reason: "NVLinkUnknown", Published: true},
	}})
	out := scrape(t, m)
	for _, want := range []string{
		`tessera_gpus_skipped{node="node-a",reason="MIGEnabled"} 2`,
		`tessera_gpus_skipped{node="node-a",reason="DiscoveryFailed"} 1`,
		`tessera_gpu_condition{index="2",node="node-a",published="false",reason="MIGEnabled",taint="",uuid="GPU-2"} 1`,
		`tessera_gpu_condition{index="4",node="node-a",published="true",reason="FabricNotReady",taint="FabricNotReady",uuid="GPU-4"} 1`,
		`tessera_gpu_condition{index="6",node="node-a",published="true",reason="NVLinkUnknown",taint="",uuid="GPU-6"} 1`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %s in\n%s", want, out)
		}
	}
	// Nothing skipped: the series are there, at 0.
	m = New("node-b")
	m.AddDiscovery(fixedDiscovery{Up: true, GPUs: 8})
	if out := scrape(t, m); !strings.Contains(out, `tessera_gpus_skipped{node="node-b",reason="MIGEnabled"} 0`+"\n") {
		t.Errorf("no zero MIGEnabled series in\n%s", out)
	}
}
