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
