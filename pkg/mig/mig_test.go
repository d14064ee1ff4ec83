package mig

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
)

// mockGPU is GPU 1 of the hgx-h100-mig mock node: H100 80GB in MIG mode
// without instances.
func mockGPU(t *testing.T) (*gpu.MockNode, *NVML, string) {
	t.Helper()
	node := gputest.MockNode(t, "hgx-h100-mig")
	uuid, _ := node.Devices[1].GetUUID()
	return node, &NVML{Lib: node}, uuid
}

// create makes an instance of the named profile at pl on the mock GPU
// and returns the profile's ID and what Create returned.
func create(t *testing.T, n *NVML, uuid, profile string, pl gpu.MIGPlacement) (int, Created) {
	t.Helper()
	id := profileID(t, n, uuid, profile)
	c, err := n.Create(uuid, id, pl, "")
	if err != nil {
		t.Fatal(err)
	}
	return id, c
}

func profileID(t *testing.T, n *NVML, uuid, name string) int {
	t.Helper()
	g, err := n.Read(uuid)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range g.MIG.Profiles {
		if p.Name == name {
			return p.ID
		}
	}
	t.Fatalf("no profile %s", name)
	return 0
}

// Create makes the GPU instance at exactly the placement asked for and a
// compute instance of all of it; a second Create with the MIG UUID the first
// returned finds it; Destroy removes both, and a second Destroy finds
// nothing.
func TestCreateDestroy(t *testing.T) {
	_, n, uuid := mockGPU(t)
	pl := gpu.MIGPlacement{Start: 4, Size: 4}
	id, c := create(t, n, uuid, "3g.40gb", pl)
	if c.Existed || c.Placement != pl || c.Profile != "3g.40gb" || !strings.HasPrefix(c.UUID, "MIG-") || c.Minor != 1 ||
		c.GPUInstanceMinor < 0 || c.ComputeInstanceMinor != c.GPUInstanceMinor+1+c.ComputeInstance || c.MemoryBytes == 0 {
		t.Fatalf("created %+v", c)
	}
	g, _ := n.Read(uuid)
	if len(g.MIG.Instances) != 1 || len(g.MIG.Instances[0].ComputeInstances) != 1 || g.MIG.Instances[0].ComputeInstances[0].UUID != c.UUID {
		t.Fatalf("NVML lists %+v", g.MIG.Instances)
	}
	again, err := n.Create(uuid, id, pl, c.UUID)
	if err != nil || !again.Existed || again.UUID != c.UUID || again.Driver != 0 {
		t.Fatalf("second create: %+v, %v", again, err)
	}
	// Without the recorded UUID the same instance is not taken over.
	if _, err := n.Create(uuid, id, pl, ""); !errors.Is(err, ErrOccupied) || !strings.Contains(err.Error(), c.UUID) {
		t.Fatalf("create over it without its UUID: %v", err)
	}
	// Another profile over the same slices is refused, nothing destroyed.
	if _, err := n.Create(uuid, profileID(t, n, uuid, "4g.40gb"), gpu.MIGPlacement{Start: 0, Size: 4}, ""); err != nil {
		t.Fatalf("4g at 0 beside 3g at 4: %v", err)
	}
	if _, err := n.Create(uuid, profileID(t, n, uuid, "1g.10gb"), gpu.MIGPlacement{Start: 5, Size: 1}, c.UUID); !errors.Is(err, ErrOccupied) ||
		!strings.Contains(err.Error(), "taken by GPU "+uuid+" (index 1): GPU instance") {
		t.Fatalf("1g at 5 over the 3g: %v", err)
	}
	if ok, err := n.Destroy(uuid, id, pl, c.UUID); !ok || err != nil {
		t.Fatalf("destroy: %v %v", ok, err)
	}
	if ok, err := n.Destroy(uuid, id, pl, c.UUID); ok || err != nil {
		t.Fatalf("second destroy: %v %v", ok, err)
	}
	g, _ = n.Read(uuid)
	if len(g.MIG.Instances) != 1 || g.MIG.Instances[0].ProfileName != "4g.40gb" {
		t.Fatalf("after destroy NVML lists %+v", g.MIG.Instances)
	}
}

// A placement the profile does not have is refused before anything is made.
func TestCreateInvalidPlacement(t *testing.T) {
	_, n, uuid := mockGPU(t)
	if _, err := n.Create(uuid, profileID(t, n, uuid, "4g.40gb"), gpu.MIGPlacement{Start: 4, Size: 4}, ""); err == nil || !strings.Contains(err.Error(), "cannot be placed") {
		t.Fatalf("4g at 4: %v", err)
	}
	if g, _ := n.Read(uuid); len(g.MIG.Instances) != 0 {
		t.Fatalf("instances made: %+v", g.MIG.Instances)
	}
}

// An instance an admin made at exactly the placement and profile (Create
// used to take it over as a retry) is refused, named, and left; so is a GPU
// instance without a compute instance (nobody's proven), and one with the
// recorded UUID that processes already run on.
func TestCreateRefusesForeign(t *testing.T) {
	node, n, uuid := mockGPU(t)
	id := profileID(t, n, uuid, "1g.10gb")
	pl := gpu.MIGPlacement{Start: 6, Size: 1}
	gi, ci, err := node.CreateMIGInstance(1, "1g.10gb", 6)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := n.Read(uuid)
	admins := g.MIG.Instances[0].ComputeInstances[0].UUID
	c, err := n.Create(uuid, id, pl, "")
	if !errors.Is(err, ErrOccupied) || !strings.Contains(err.Error(), fmt.Sprintf("GPU instance %d (1g.10gb at memory slices 6-6; compute instance %d %s)", gi, ci, admins)) {
		t.Fatalf("create over the admin's instance: %+v, %v", c, err)
	}
	if _, err := n.Create(uuid, id, pl, "MIG-some-other-claims"); !errors.Is(err, ErrOccupied) {
		t.Fatalf("create over it with another UUID: %v", err)
	}
	// Its own instance, with a process already: refused.
	if err := node.SetMIGProcesses(1, gi, ci, []nvml.ProcessInfo{{Pid: 5}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Create(uuid, id, pl, admins); !errors.Is(err, ErrInUse) {
		t.Fatalf("own instance with a process: %v", err)
	}
	if g, _ := n.Read(uuid); len(g.MIG.Instances) != 1 || g.MIG.Instances[0].ComputeInstances[0].UUID != admins {
		t.Fatalf("the admin's instance changed: %+v", g.MIG.Instances)
	}
	// A GPU instance without a compute instance.
	half, err := node.CreateMIGGPUInstance(1, "1g.10gb", 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Create(uuid, id, gpu.MIGPlacement{Start: 5, Size: 1}, ""); !errors.Is(err, ErrOccupied) || !strings.Contains(err.Error(), fmt.Sprintf("GPU instance %d (1g.10gb at memory slices 5-5, no compute instance)", half)) {
		t.Fatalf("create over a GPU instance without compute instances: %v", err)
	}
}

// Destroy with a recorded MIG UUID touches only the instance that has it:
// one re-made at the placement since (a fresh UUID) is left, ErrChanged.
func TestDestroyRecordedUUID(t *testing.T) {
	node, n, uuid := mockGPU(t)
	pl := gpu.MIGPlacement{Start: 2, Size: 2}
	id, c := create(t, n, uuid, "2g.20gb", pl)
	if err := node.DestroyMIGInstance(1, c.GPUInstance); err != nil {
		t.Fatal(err)
	}
	gi, _, err := node.CreateMIGInstance(1, "2g.20gb", 2)
	if err != nil || gi != c.GPUInstance {
		t.Fatalf("re-made: GPU instance %d, %v (want the reused ID %d)", gi, err, c.GPUInstance)
	}
	if ok, err := n.Destroy(uuid, id, pl, c.UUID); ok || !errors.Is(err, ErrChanged) {
		t.Fatalf("destroy of the re-made instance by the old UUID: %v %v", ok, err)
	}
	if g, _ := n.Read(uuid); len(g.MIG.Instances) != 1 {
		t.Fatalf("the re-made instance was destroyed: %+v", g.MIG.Instances)
	}
	// With only the intent recorded (no UUID) the instance there goes.
	if ok, err := n.Destroy(uuid, id, pl, ""); !ok || err != nil {
		t.Fatalf("destroy by intent: %v %v", ok, err)
	}
}

// An instance with processes is not destroyed.
func TestDestroyInUse(t *testing.T) {
	node, n, uuid := mockGPU(t)
	pl := gpu.MIGPlacement{Start: 2, Size: 2}
	id, c := create(t, n, uuid, "2g.20gb", pl)
	if err := node.SetMIGProcesses(1, c.GPUInstance, c.ComputeInstance, []nvml.ProcessInfo{{Pid: 42, UsedGpuMemory: 1 << 30}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.Destroy(uuid, id, pl, c.UUID); !ok || !errors.Is(err, ErrInUse) {
		t.Fatalf("destroy in use: %v %v", ok, err)
	}
	if g, _ := n.Read(uuid); len(g.MIG.Instances) != 1 {
		t.Fatalf("instance destroyed: %+v", g.MIG.Instances)
	}
}
