package checkpoint

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

// A MIG device's record (intent, then IDs) survives a restart unchanged,
// and the store never aliases it.
func TestMIGDeviceRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	s, _ := mustOpen(t, path, "boot", osFS{})
	c := Claim{UID: "mig", Namespace: "default", Name: "isolated", State: PrepareStarted, Devices: []Device{{
		Request: "mig", Pool: "node-a", Device: "gpu-1-mig-3g-40gb-4", UUID: "GPU-1", Minor: 1,
		MIG: &MIGDevice{Dynamic: true, Profile: "3g.40gb", ProfileID: 9, Start: 4, Size: 4, MemoryBytes: 40 << 30},
	}}}
	if c.Devices[0].MIG.Created() {
		t.Fatal("an intent counts as created")
	}
	if err := s.Put(c); err != nil {
		t.Fatal(err)
	}
	c.Devices[0].MIG.Start = 0 // the caller's copy
	got, _ := s.Get("mig")
	if got.Devices[0].MIG.Start != 4 {
		t.Fatalf("store aliases the caller's MIG record")
	}
	got.Devices[0].MIG.Start = 0
	if again, _ := s.Get("mig"); again.Devices[0].MIG.Start != 4 {
		t.Fatalf("Get returns the stored MIG record itself")
	}
	created, _ := s.Get("mig")
	m := created.Devices[0].MIG
	m.UUID, m.GPUInstance, m.ComputeInstance, m.GPUInstanceMinor, m.ComputeInstanceMinor = "MIG-1", 2, 0, 21, 22
	if err := s.Put(created); err != nil {
		t.Fatal(err)
	}
	reopened, _ := mustOpen(t, path, "boot", osFS{})
	back, ok := reopened.Get(types.UID("mig"))
	if !ok || !back.Devices[0].MIG.Created() {
		t.Fatalf("after reopening: %+v", back)
	}
	if diff := cmp.Diff(created, back); diff != "" {
		t.Errorf("MIG record changed through the file (-put +read):\n%s", diff)
	}
}
