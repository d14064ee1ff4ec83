package why

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/model"
)

// migGPUs are the GPUs of the hgx-h100-mig mock node: GPU 0 in MIG mode with
// a static 4g.40gb (GPU instance 1) and 3g.40gb (2), GPU 1 in MIG mode
// without instances, GPUs 2-7 not in MIG mode.
func migGPUs(t *testing.T) []gpu.GPU {
	return gputest.GPUs(t, "hgx-h100-mig")
}

func migClaim(name, profile string) *resourceapi.ResourceClaim {
	return newClaim(name, []resourceapi.DeviceRequest{{Name: "mig", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: model.MIGClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.attributes["gpu.tessera.dev"].profile == "` + profile + `"`}}},
	}}})
}

// h100Profile is the H100 80GB's MIG profile called name (the mock table).
func h100Profile(t *testing.T, name string) gpu.MIGProfile {
	t.Helper()
	table, _ := gpu.MockMIGTable("NVIDIA H100 80GB HBM3")
	for _, p := range table.Profiles {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no H100 MIG profile %s", name)
	return gpu.MIGProfile{}
}

// allocatedDevice is the device a recorded claim holds.
func (c *cluster) allocatedDevice(claim string) string {
	for _, cl := range c.in.Claims {
		if cl.Name == claim && cl.Status.Allocation != nil {
			return cl.Status.Allocation.Devices.Results[0].Device
		}
	}
	c.t.Fatalf("claim %s is not allocated", claim)
	return ""
}

// eighthOneG allocates seven 1g.10gb claims one-0 … one-6 on node-1 and
// asks why pod-8's eighth one does not fit, which it must not, with no MIG
// profile free.
func eighthOneG(t *testing.T, c *cluster) Report {
	t.Helper()
	for i := range 7 {
		c.allocate("node-1", migClaim(fmt.Sprintf("one-%d", i), "1g.10gb"))
	}
	c.in.Claims = append(c.in.Claims, *migClaim("eighth", "1g.10gb"))
	r := c.why("pod-8", podFor("pod-8", "eighth"))
	if n := nodeOf(t, r, "node-1"); n.Fits || len(n.FitsNow.MIG) != 0 {
		t.Fatalf("node %+v: want no fit and no MIG profile free", n)
	}
	return r
}

// Seven 1g.10gb fill a dynamic-MIG H100; an eighth does not fit, and tessera
// why names, for each 1g.10gb placement, the memory slice it needs and the
// claim that holds it, that no compute slice is free, and once for the GPU
// who uses its compute slices.
func TestWhyMIGEighthOneG(t *testing.T) {
	g := migGPUs(t)
	c := newCluster(t, map[string][]gpu.GPU{"node-1": g[1:2]}, model.WithDynamicMIG(g[1].UUID))
	r := eighthOneG(t, c)
	got := gpuReasons(t, r, "node-1", "gpu-1")
	var users []string
	for i := range 7 {
		dev := c.allocatedDevice(fmt.Sprintf("one-%d", i))
		var slice int
		if _, err := fmt.Sscanf(dev, "gpu-1-mig-1g-10gb-%d", &slice); err != nil {
			t.Fatalf("claim one-%d holds %s, want a 1g.10gb placement", i, dev)
		}
		wantContains(t, "gpu-1", got, fmt.Sprintf(`request "mig": %s: held by default/one-%d (MIG device %s, memory slice %d)`, dev, i, dev, slice))
		users = append(users, fmt.Sprintf("default/one-%d 1", i))
	}
	wantContains(t, "gpu-1", got,
		`request "mig": 18 MIG devices (1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb): selector device.attributes["gpu.tessera.dev"].profile == "1g.10gb" is false`,
		"MIG counters of gpu-1-counters: memory slices 0-6 used (", "compute slices 7 of 7 used ("+strings.Join(users, ", ")+")")
	wantContains(t, "table", table(t, r), "fits now: no share; 0 whole GPU(s)\n")
	t.Logf("\n%s", table(t, r))
}

// A 4g.40gb after a 3g.40gb and a 1g.10gb on a dynamic GPU: its only
// placement needs memory slices 0-3, of which slice 3 is held, and more
// compute slices and engines than are free; the free profiles are listed.
// On the static GPU its instance is held, and the 3g.40gb is another
// profile.
func TestWhyMIGFourGBlocked(t *testing.T) {
	g := migGPUs(t)
	c := newCluster(t, map[string][]gpu.GPU{"node-1": g[:2]}, model.WithDynamicMIG(g[1].UUID))
	c.allocate("node-1", migClaim("static-4g", "4g.40gb"))
	c.allocate("node-1", migClaim("static-3g", "3g.40gb"))
	c.allocate("node-1", migClaim("three", "3g.40gb"))
	c.allocate("node-1", migClaim("one", "1g.10gb"))
	if d := c.allocatedDevice("three"); d != "gpu-1-mig-3g-40gb-4" {
		t.Fatalf("the dynamic 3g.40gb is %s, want gpu-1-mig-3g-40gb-4", d)
	}
	if d := c.allocatedDevice("one"); d != "gpu-1-mig-1g-10gb-3" {
		t.Fatalf("the 1g.10gb is %s, want gpu-1-mig-1g-10gb-3", d)
	}
	c.in.Claims = append(c.in.Claims, *migClaim("late", "4g.40gb"))
	r := c.why("claim/late")
	wantContains(t, "gpu-0", gpuReasons(t, r, "node-1", "gpu-0"),
		`request "mig": gpu-0-mig-1: held by default/static-4g (MIG device gpu-0-mig-1)`,
		`request "mig": 1 MIG device (3g.40gb): selector device.attributes["gpu.tessera.dev"].profile == "4g.40gb" is false`)
	wantContains(t, "gpu-1", gpuReasons(t, r, "node-1", "gpu-1"),
		`request "mig": gpu-1-mig-4g-40gb-0: 4g.40gb at 0 needs memory slices 0-3, 4 compute slices, 4 copy engines, 4 decoders, 4 JPEG engines: `+
			`memory slice 3 held by default/one (gpu-1-mig-1g-10gb-3); needs 4 compute slices, 3 free; needs 4 decoders, 3 free; needs 4 JPEG engines, 3 free`,
		`MIG counters of gpu-1-counters: memory slices 3-7 used (3 default/one, 4-7 default/three); compute slices 4 of 7 used (default/one 1, default/three 3)`)
	n := nodeOf(t, r, "node-1")
	if len(n.FitsNow.MIG) != 1 || n.FitsNow.MIG[0].GPU != "gpu-1" || strings.Join(n.FitsNow.MIG[0].Profiles, " ") != "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb" {
		t.Errorf("fits now %+v, want gpu-1's 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb", n.FitsNow.MIG)
	}
	wantContains(t, "table", table(t, r), "MIG on gpu-1: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb")
}

// An instance that no claim holds (an admin's) takes its slices: a 7g.80gb
// is told that memory slice 6 is used by an instance no claim holds.
func TestWhyMIGForeignInstance(t *testing.T) {
	g := migGPUs(t)
	p := h100Profile(t, "1g.10gb")
	g[1].MIG.Instances = []gpu.MIGInstance{{ID: 9, ProfileID: p.ID, ProfileName: p.Name, Placement: gpu.MIGPlacement{Start: 6, Size: 1},
		ComputeInstances: []gpu.MIGComputeInstance{{ID: 0, UUID: "MIG-admin", Processes: 1}}}}
	c := newCluster(t, map[string][]gpu.GPU{"node-1": g[1:2]}, model.WithDynamicMIG(g[1].UUID))
	c.in.Claims = append(c.in.Claims, *migClaim("all", "7g.80gb"))
	r := c.why("claim/all")
	wantContains(t, "gpu-1", gpuReasons(t, r, "node-1", "gpu-1"),
		`gpu-1-mig-7g-80gb-0: 7g.80gb at 0 needs memory slices 0-7, 7 compute slices, 8 copy engines, 7 decoders, 7 JPEG engines, 1 OFA: `+
			`memory slice 6 used by a MIG instance no claim holds (made by an admin, or left behind); needs 7 compute slices, 6 free`,
		`MIG counters of gpu-1-counters: memory slice 6 used (6 instances no claim holds); compute slices 1 of 7 used (instances no claim holds 1)`)
}

// Seven 1g.10gb instances exist and Tessera's claims hold them, as on a node
// after prepare: the GPU publishes only their placements and the full-GPU
// profile's. tessera why still names each placement's holder, and the
// GPU's totals come from the full-GPU placement.
func TestWhyMIGEighthOneGPrepared(t *testing.T) {
	g := migGPUs(t)
	p := h100Profile(t, "1g.10gb")
	var held []model.MIGHold
	for start := range 7 {
		pl := gpu.MIGPlacement{Start: start, Size: 1}
		g[1].MIG.Instances = append(g[1].MIG.Instances, gpu.MIGInstance{ID: start + 1, ProfileID: p.ID, ProfileName: p.Name, Placement: pl,
			ComputeInstances: []gpu.MIGComputeInstance{{ID: 0, UUID: fmt.Sprintf("MIG-%d", start), Processes: 1}}})
		held = append(held, model.MIGHold{ProfileID: p.ID, Placement: pl})
	}
	c := newCluster(t, map[string][]gpu.GPU{"node-1": g[1:2]}, model.WithDynamicMIG(g[1].UUID),
		model.WithMIGHeld(map[string][]model.MIGHold{g[1].UUID: held}))
	r := eighthOneG(t, c)
	got := gpuReasons(t, r, "node-1", "gpu-1")
	for i := range 7 {
		dev := c.allocatedDevice(fmt.Sprintf("one-%d", i))
		wantContains(t, "gpu-1", got, fmt.Sprintf(`request "mig": %s: held by default/one-%d (MIG device %s`, dev, i, dev))
	}
	wantContains(t, "gpu-1", got,
		`request "mig": 1 MIG device (7g.80gb): selector device.attributes["gpu.tessera.dev"].profile == "1g.10gb" is false`,
		"MIG counters of gpu-1-counters: memory slices 0-6 used (", "compute slices 7 of 7 used (")
	t.Logf("\n%s", table(t, r))
}
