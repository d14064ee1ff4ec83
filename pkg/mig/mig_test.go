package mig

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// mockGPU is GPU 1 of the hgx-h100-mig mock node: H100 80GB in MIG mode
// without instances.
func mockGPU(t *testing.T) (*gpu.MockNode, *NVML, string) {
	t.Helper()
	node, err := gpu.NewMockNode("hgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	uuid, _ := node.Devices[1].GetUUID()
	return node, &NVML{Lib: node}, uuid
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
// compute instance of all of it; a second Create finds it; Destroy removes
// both, and a second Destroy finds nothing.
func TestCreateDestroy(t *testing.T) {
	_, n, uuid := mockGPU(t)
	id := profileID(t, n, uuid, "3g.40gb")
	pl := gpu.MIGPlacement{Start: 4, Size: 4}
	c, err := n.Create(uuid, id, pl)
	if err != nil {
		t.Fatal(err)
	}
	if c.Existed || c.Placement != pl || c.Profile != "3g.40gb" || !strings.HasPrefix(c.UUID, "MIG-") || c.Minor != 1 ||
		c.GPUInstanceMinor < 0 || c.ComputeInstanceMinor != c.GPUInstanceMinor+1+c.ComputeInstance || c.MemoryBytes == 0 {
		t.Fatalf("created %+v", c)
	}
	g, _ := n.Read(uuid)
	if len(g.MIG.Instances) != 1 || len(g.MIG.Instances[0].ComputeInstances) != 1 || g.MIG.Instances[0].ComputeInstances[0].UUID != c.UUID {
		t.Fatalf("NVML lists %+v", g.MIG.Instances)
	}
	again, err := n.Create(uuid, id, pl)
	if err != nil || !again.Existed || again.UUID != c.UUID || again.Driver != 0 {
		t.Fatalf("second create: %+v, %v", again, err)
	}
	// Another profile over the same slices is refused, nothing destroyed.
	if _, err := n.Create(uuid, profileID(t, n, uuid, "4g.40gb"), gpu.MIGPlacement{Start: 0, Size: 4}); err != nil {
		t.Fatalf("4g at 0 beside 3g at 4: %v", err)
	}
	if _, err := n.Create(uuid, profileID(t, n, uuid, "1g.10gb"), gpu.MIGPlacement{Start: 5, Size: 1}); err == nil || !strings.Contains(err.Error(), "taken by GPU instance") {
		t.Fatalf("1g at 5 over the 3g: %v", err)
	}
	if ok, err := n.Destroy(uuid, id, pl); !ok || err != nil {
		t.Fatalf("destroy: %v %v", ok, err)
	}
	if ok, err := n.Destroy(uuid, id, pl); ok || err != nil {
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
	if _, err := n.Create(uuid, profileID(t, n, uuid, "4g.40gb"), gpu.MIGPlacement{Start: 4, Size: 4}); err == nil || !strings.Contains(err.Error(), "cannot be placed") {
		t.Fatalf("4g at 4: %v", err)
	}
	if g, _ := n.Read(uuid); len(g.MIG.Instances) != 0 {
		t.Fatalf("instances made: %+v", g.MIG.Instances)
	}
}

// A GPU instance without a compute instance (a crash between the two
// creates) is completed by the next Create.
func TestCreateCompletesHalfMade(t *testing.T) {
	node, n, uuid := mockGPU(t)
	id := profileID(t, n, uuid, "1g.10gb")
	g, _ := n.Read(uuid)
	prof, _ := g.MIG.Profile(id)
	info, _ := node.Devices[1].GetGpuInstanceProfileInfo(prof.Index)
	if _, ret := node.Devices[1].CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 6, Size: 1}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	c, err := n.Create(uuid, id, gpu.MIGPlacement{Start: 6, Size: 1})
	if err != nil || !c.Existed || c.UUID == "" {
		t.Fatalf("completing: %+v %v", c, err)
	}
}

// An instance with processes is not destroyed.
func TestDestroyInUse(t *testing.T) {
	node, n, uuid := mockGPU(t)
	id := profileID(t, n, uuid, "2g.20gb")
	pl := gpu.MIGPlacement{Start: 2, Size: 2}
	c, err := n.Create(uuid, id, pl)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.SetMIGProcesses(1, c.GPUInstance, c.ComputeInstance, []nvml.ProcessInfo{{Pid: 42, UsedGpuMemory: 1 << 30}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.Destroy(uuid, id, pl); !ok || !errors.Is(err, ErrInUse) {
		t.Fatalf("destroy in use: %v %v", ok, err)
	}
	if g, _ := n.Read(uuid); len(g.MIG.Instances) != 1 {
		t.Fatalf("instance destroyed: %+v", g.MIG.Instances)
	}
}
