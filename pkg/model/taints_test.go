package model

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

var unhealthy = resourceapi.DeviceTaint{Key: "gpu.tessera.dev/unhealthy", Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}

// WithTaints taints both devices of the named GPU and nothing else, and the
// published devices do not alias the caller's taints.
func TestWithTaints(t *testing.T) {
	gpus := discover(t, "hgx-h100")
	in := map[string][]resourceapi.DeviceTaint{gpus[2].UUID: {unhealthy}, "GPU-unknown": {unhealthy}}
	res := validResources(t, gpus, WithTaints(in))
	in[gpus[2].UUID][0].Value = "changed"
	tainted := map[string]bool{}
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			if len(d.Taints) == 0 {
				continue
			}
			tainted[d.Name] = true
			if len(d.Taints) != 1 || d.Taints[0] != unhealthy {
				t.Errorf("device %s: taints %+v, want [%+v]", d.Name, d.Taints, unhealthy)
			}
		}
	}
	if len(tainted) != 2 || !tainted["gpu-2"] || !tainted["gpu-2-shared"] {
		t.Errorf("tainted devices %v, want gpu-2 and gpu-2-shared", tainted)
	}

	many := make([]resourceapi.DeviceTaint, resourceapi.DeviceTaintsMaxLength+1)
	if _, err := Resources("node-1", gpus, WithTaints(map[string][]resourceapi.DeviceTaint{gpus[0].UUID: many})); err == nil {
		t.Error("17 taints accepted")
	}
}

// The scheduler's allocator keeps claims off a NoSchedule-tainted GPU: the
// shares that would pack onto gpu-0-shared go to gpu-1-shared, and a whole GPU
// is never the tainted one.
func TestTaintedGPUIsNotAllocated(t *testing.T) {
	gpus := discover(t, "hgx-h100")
	n := newTestNode(t, gpus, WithTaints(map[string][]resourceapi.DeviceTaint{
		gpus[0].UUID: {unhealthy},
		gpus[7].UUID: {unhealthy},
	}))
	for i, name := range []string{"q0", "q1"} {
		res := n.allocate(shareClaim(name, "19Gi", "25"))
		if res == nil || res.Devices.Results[0].Device != "gpu-1-shared" {
			t.Fatalf("share %d: %+v, want gpu-1-shared", i, res)
		}
	}
	res := n.allocate(wholeClaim("w", 1))
	if res == nil || res.Devices.Results[0].Device != "gpu-6" {
		t.Fatalf("whole GPU: %+v, want gpu-6 (gpu-7 is tainted)", res)
	}
}
