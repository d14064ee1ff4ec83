package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// migGPU is GPU i of a fresh node of profile, in MIG mode with no instance.
func migGPU(t *testing.T, profile string, i int) (*MockNode, nvml.Device) {
	t.Helper()
	node := mustMockNode(t, profile)
	must(t, node.SetMIG(i, true))
	return node, node.Devices[i]
}

// profileInfo is the NVML info of the named profile on dev.
func profileInfo(t *testing.T, dev nvml.Device, name string) nvml.GpuInstanceProfileInfo {
	t.Helper()
	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret == nvml.SUCCESS && migProfileName(index, info, gpuTotal(t, dev)) == name {
			return info
		}
	}
	t.Fatalf("no profile %s", name)
	return nvml.GpuInstanceProfileInfo{}
}

func gpuTotal(t *testing.T, dev nvml.Device) uint64 {
	t.Helper()
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return mem.Total
}

// create makes a GPU instance of the named profile at start (-1: the
// driver's choice) and returns its ID and placement start, or the refusal.
func create(t *testing.T, dev nvml.Device, name string, start int) (id, at int, ret nvml.Return) {
	t.Helper()
	info := profileInfo(t, dev, name)
	var gi nvml.GpuInstance
	if start < 0 {
		gi, ret = dev.CreateGpuInstance(&info)
	} else {
		placements, _ := dev.GetGpuInstancePossiblePlacements(&info)
		size := placements[0].Size
		gi, ret = dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: size})
	}
	if ret != nvml.SUCCESS {
		return -1, -1, ret
	}
	gInfo, r := gi.GetInfo()
	if r != nvml.SUCCESS {
		t.Fatal(r)
	}
	return int(gInfo.Id), int(gInfo.Placement.Start), ret
}

func mustCreate(t *testing.T, dev nvml.Device, name string, start int) (id, at int) {
	t.Helper()
	id, at, ret := create(t, dev, name, start)
	if ret != nvml.SUCCESS {
		t.Fatalf("create %s at %d: %v", name, start, ret)
	}
	return id, at
}

// The driver's placement rules on an H100 80GB, with the refusals it gives.
func TestMockMIGPlacementRules(t *testing.T) {
	t.Run("3g and 4g fit in either order", func(t *testing.T) {
		for _, order := range [][]string{{"3g.40gb", "4g.40gb"}, {"4g.40gb", "3g.40gb"}} {
			_, dev := migGPU(t, "hgx-h100", 0)
			starts := map[string]int{"3g.40gb": 4, "4g.40gb": 0}
			for _, name := range order {
				mustCreate(t, dev, name, starts[name])
			}
		}
		// Without placements too: the driver puts the first 3g at 4.
		for _, order := range [][]string{{"3g.40gb", "4g.40gb"}, {"4g.40gb", "3g.40gb"}} {
			_, dev := migGPU(t, "hgx-h100", 0)
			for _, name := range order {
				mustCreate(t, dev, name, -1)
			}
		}
	})
	t.Run("4g and 4g do not", func(t *testing.T) {
		_, dev := migGPU(t, "hgx-h100", 0)
		mustCreate(t, dev, "4g.40gb", 0)
		if _, _, ret := create(t, dev, "4g.40gb", -1); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("second 4g.40gb: %v, want INSUFFICIENT_RESOURCES", ret)
		}
		if _, _, ret := create(t, dev, "4g.40gb", 0); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("second 4g.40gb at 0: %v, want INSUFFICIENT_RESOURCES", ret)
		}
	})
	t.Run("overlap", func(t *testing.T) {
		_, dev := migGPU(t, "hgx-h100", 0)
		mustCreate(t, dev, "3g.40gb", 4)
		for _, tc := range []struct {
			name  string
			start int
		}{{"1g.10gb", 5}, {"2g.20gb", 4}, {"1g.20gb", 6}, {"3g.40gb", 4}, {"7g.80gb", 0}} {
			if _, _, ret := create(t, dev, tc.name, tc.start); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
				t.Errorf("%s at %d over 3g.40gb at 4: %v, want INSUFFICIENT_RESOURCES", tc.name, tc.start, ret)
			}
		}
		mustCreate(t, dev, "2g.20gb", 2) // beside it
	})
	t.Run("placement not possible", func(t *testing.T) {
		_, dev := migGPU(t, "hgx-h100", 0)
		for _, tc := range []struct {
			name  string
			start int
		}{{"3g.40gb", 2}, {"4g.40gb", 4}, {"2g.20gb", 6}, {"1g.10gb", 7}, {"1g.20gb", 1}} {
			if _, _, ret := create(t, dev, tc.name, tc.start); ret != nvml.ERROR_INVALID_ARGUMENT {
				t.Errorf("%s at %d: %v, want INVALID_ARGUMENT", tc.name, tc.start, ret)
			}
		}
		info := profileInfo(t, dev, "3g.40gb")
		if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 2}); ret != nvml.ERROR_INVALID_ARGUMENT {
			t.Errorf("3g.40gb with size 2: %v, want INVALID_ARGUMENT", ret)
		}
	})
	t.Run("one +me", func(t *testing.T) {
		_, dev := migGPU(t, "hgx-h100", 0)
		mustCreate(t, dev, "1g.10gb+me", 0)
		if _, _, ret := create(t, dev, "1g.10gb+me", 3); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("second +me: %v, want INSUFFICIENT_RESOURCES", ret)
		}
		// One +me and six 1g.10gb fill the GPU (seven decoders of seven).
		_, dev = migGPU(t, "hgx-h100", 1)
		mustCreate(t, dev, "1g.10gb+me", 6)
		for range 6 {
			mustCreate(t, dev, "1g.10gb", -1)
		}
	})
	t.Run("seven 1g.10gb and no eighth", func(t *testing.T) {
		_, dev := migGPU(t, "hgx-h100", 0)
		var got []string
		for range 7 {
			id, at := mustCreate(t, dev, "1g.10gb", -1)
			got = append(got, fmt.Sprintf("%d@%d", id, at))
		}
		// The order and IDs of `nvidia-smi mig -cgi 19,19,19,19,19,19,19`
		// on an H100 80GB HBM3 (a published transcript).
		if want := []string{"13@6", "11@4", "12@5", "7@0", "8@1", "9@2", "10@3"}; !slices.Equal(got, want) {
			t.Errorf("created %v, want %v", got, want)
		}
		if _, _, ret := create(t, dev, "1g.10gb", -1); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("eighth 1g.10gb: %v, want INSUFFICIENT_RESOURCES", ret)
		}
		info := profileInfo(t, dev, "1g.10gb")
		if n, ret := dev.GetGpuInstanceRemainingCapacity(&info); ret != nvml.SUCCESS || n != 0 {
			t.Errorf("remaining capacity %d, %v", n, ret)
		}
	})
	t.Run("not in MIG mode", func(t *testing.T) {
		node := mustMockNode(t, "hgx-h100")
		info, _ := node.Devices[0].GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
		if _, ret := node.Devices[0].CreateGpuInstance(&info); ret != nvml.ERROR_NOT_SUPPORTED {
			t.Errorf("create outside MIG mode: %v, want NOT_SUPPORTED", ret)
		}
		if _, ret := mustMockNode(t, "l4x4").Devices[0].GetGpuInstanceProfileInfo(0); ret != nvml.ERROR_NOT_SUPPORTED {
			t.Errorf("profile of an L4: %v, want NOT_SUPPORTED", ret)
		}
	})
}

// Geometries the MIG user guide builds on an A100 (its "Getting Started"
// examples): 3g.20gb + 1g.5gb + 2g.10gb + 1g.5gb, and 2g.10gb + five
// 1g.5gb, with the GPU instance IDs and placements the guide lists; and its
// "19,19,14,9" example whose 3g.20gb fails with Insufficient Resources.
func TestMockMIGGuideGeometries(t *testing.T) {
	for _, tc := range []struct {
		name     string
		profiles []string
		want     []string // ID@start, or the refusal
	}{
		{"3-2-1-1", []string{"3g.20gb", "1g.5gb", "2g.10gb", "1g.5gb"}, []string{"2@4", "7@0", "4@2", "8@1"}},
		{"2-1-1-1-1-1", []string{"2g.10gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"}, []string{"5@4", "13@6", "7@0", "8@1", "9@2", "10@3"}},
		{"3g last", []string{"1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"}, []string{"13@6", "11@4", "3@0", "ERROR_INSUFFICIENT_RESOURCES"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, dev := migGPU(t, "dgx-a100", 0)
			var got []string
			for _, p := range tc.profiles {
				id, at, ret := create(t, dev, p, -1)
				if ret != nvml.SUCCESS {
					got = append(got, ret.Error())
					continue
				}
				got = append(got, fmt.Sprintf("%d@%d", id, at))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("created %v, want %v", got, tc.want)
			}
		})
	}
}

// GPU instance IDs follow the placement: a destroyed instance's ID is the
// one the next instance at its placement gets.
func TestMockMIGIDReuse(t *testing.T) {
	_, dev := migGPU(t, "hgx-h100", 0)
	for _, s := range []int{0, 1, 2, 3} {
		mustCreate(t, dev, "1g.10gb", s)
	}
	gi, ret := dev.GetGpuInstanceById(9) // slice 2
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("destroying it twice: %v, want INVALID_ARGUMENT", ret)
	}
	if id, at := mustCreate(t, dev, "1g.10gb", 2); id != 9 || at != 2 {
		t.Errorf("re-created at 2: ID %d, want 9", id)
	}
	gi, _ = dev.GetGpuInstanceById(9)
	must(t, errOf(gi.Destroy()))
	// Placed by the driver: slice 2 blocks fewest placements now (the
	// 4-slice one at 0 and 2-slice one at 2 are gone already).
	if id, at := mustCreate(t, dev, "1g.10gb", -1); id != 9 || at != 2 {
		t.Errorf("driver-placed after the destroy: ID %d at %d, want 9 at 2", id, at)
	}
}

func errOf(ret nvml.Return) error {
	if ret != nvml.SUCCESS {
		return ret
	}
	return nil
}

// Compute instances: a GPU instance with one is not destroyed, nor one with
// processes; IDs are the lowest free; the MIG device handle is invalid
// after the destroy.
func TestMockMIGComputeInstances(t *testing.T) {
	node, dev := migGPU(t, "dgx-a100", 2)
	info := profileInfo(t, dev, "3g.20gb")
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 4})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	one, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS || one.InstanceCount != 3 || one.MultiprocessorCount != 14 {
		t.Fatalf("1-slice compute profile %+v, %v", one, ret)
	}
	if _, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("4-slice compute profile in a 3g: %v, want NOT_SUPPORTED", ret)
	}
	var cis []nvml.ComputeInstance
	for range 3 {
		ci, ret := gi.CreateComputeInstance(&one)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		cis = append(cis, ci)
	}
	if _, ret := gi.CreateComputeInstance(&one); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("fourth compute instance: %v, want INSUFFICIENT_RESOURCES", ret)
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("destroy with compute instances: %v, want IN_USE", ret)
	}
	giInfo, _ := gi.GetInfo()
	must(t, node.SetMIGProcesses(2, int(giInfo.Id), 1, []nvml.ProcessInfo{{Pid: 9, UsedGpuMemory: 1 << 20}}))
	if ret := cis[1].Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("destroy with a process: %v, want IN_USE", ret)
	}
	mig, ret := dev.GetMigDeviceHandleByIndex(1)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if procs, ret := mig.GetComputeRunningProcesses(); ret != nvml.SUCCESS || len(procs) != 1 || procs[0].ComputeInstanceId != 1 || procs[0].GpuInstanceId != giInfo.Id {
		t.Errorf("MIG device 1 processes %+v, %v", procs, ret)
	}
	if name, _ := mig.GetName(); name != "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb" {
		t.Errorf("name %q", name)
	}
	must(t, node.SetMIGProcesses(2, int(giInfo.Id), 1, nil))
	must(t, errOf(cis[1].Destroy()))
	if _, ret := mig.GetUUID(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("UUID of a destroyed MIG device: %v, want INVALID_ARGUMENT", ret)
	}
	// The freed ID 1 is the next one.
	ci, _ := gi.CreateComputeInstance(&one)
	if ciInfo, _ := ci.GetInfo(); ciInfo.Id != 1 {
		t.Errorf("new compute instance ID %d, want 1", ciInfo.Id)
	}
	for _, c := range append([]nvml.ComputeInstance{ci}, cis[0], cis[2]) {
		must(t, errOf(c.Destroy()))
	}
	must(t, errOf(gi.Destroy()))
	if _, ret := dev.GetMigDeviceHandleByIndex(0); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("MIG device after all destroys: %v, want NOT_FOUND", ret)
	}
}

// The state file keeps modes, instances and processes across nodes, as an
// e2e's plugin restart needs; a bad file is refused.
func TestMockMIGStateFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mig.json")
	opts := MockOptions{MIGStateFile: file}
	node, err := NewMockNodeWith("hgx-h100-mig", opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("initial state not written: %v", err)
	}
	gi, _, err := node.CreateMIGInstance(1, "1g.10gb", 6)
	must(t, err)
	must(t, node.SetMIGProcesses(1, gi, 0, []nvml.ProcessInfo{{Pid: 77, UsedGpuMemory: 5 << 20}}))
	must(t, node.DestroyMIGInstance(0, 2))
	must(t, node.SetMIGPending(3, true))
	want := mustDiscover(t, node)

	again, err := NewMockNodeWith("hgx-h100-mig", opts)
	if err != nil {
		t.Fatal(err)
	}
	got := mustDiscover(t, again)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("restored node differs:\n%+v\n%+v", got[:4], want[:4])
	}
	if got[1].MIG.Instances[0].ComputeInstances[0].Processes != 1 || len(got[0].MIG.Instances) != 1 || !got[3].MIGPendingChange() {
		t.Errorf("restored: GPU 1 %+v, GPU 0 %+v, GPU 3 pending %v", got[1].MIG.Instances, got[0].MIG.Instances, got[3].MIGPendingChange())
	}
	// The restored node enforces the rules over the restored instances.
	if _, _, err := again.CreateMIGInstance(1, "1g.20gb", 6); !errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Errorf("overlapping the restored instance: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("files left in the state directory: %v", entries)
	}
	// Without the file option a node starts from its profile.
	if g := mustDiscover(t, mustMockNode(t, "hgx-h100-mig"))[0]; len(g.MIG.Instances) != 2 {
		t.Errorf("a node without the file: %d instances on GPU 0, want the profile's 2", len(g.MIG.Instances))
	}

	for name, content := range map[string]string{
		"not JSON":      "{",
		"wrong version": `{"version": 9, "gpus": {}}`,
		"no such GPU":   `{"version": 1, "gpus": {"8": {"current": true}}}`,
		"no MIG on GPU": `{"version": 1, "gpus": {"x": {"current": true}}}`,
		"overlap": `{"version": 1, "gpus": {"0": {"current": true, "pending": true, "instances": [
			{"id": 1, "profileID": 5, "start": 0}, {"id": 9, "profileID": 19, "start": 2}]}}}`,
		"wrong ID": `{"version": 1, "gpus": {"0": {"current": true, "pending": true, "instances": [{"id": 4, "profileID": 5, "start": 0}]}}}`,
		"bad compute": `{"version": 1, "gpus": {"0": {"current": true, "pending": true, "instances": [{"id": 1, "profileID": 5, "start": 0,
			"computeInstances": [{"id": 0, "slices": 3, "start": 0}]}]}}}`,
	} {
		path := filepath.Join(t.TempDir(), "bad.json")
		must(t, os.WriteFile(path, []byte(content), 0o644))
		if _, err := NewMockNodeWith("hgx-h100-mig", MockOptions{MIGStateFile: path}); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}

	// A write that fails changes nothing and says so.
	ro, err := NewMockNodeWith("hgx-h100-mig", MockOptions{MIGStateFile: filepath.Join(t.TempDir(), "gone", "mig.json")})
	if err == nil {
		t.Fatalf("a state file in a missing directory accepted: %v", ro)
	}
}

// A write of the state file that fails after the start: the NVML call
// answers ERROR_UNKNOWN and the instance does not exist.
func TestMockMIGStateWriteFailure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	must(t, os.Mkdir(dir, 0o755))
	node, err := NewMockNodeWith("hgx-h100-mig", MockOptions{MIGStateFile: filepath.Join(dir, "mig.json")})
	must(t, err)
	must(t, os.RemoveAll(dir))
	dev := node.Devices[1]
	if _, _, ret := create(t, dev, "1g.10gb", 0); ret != nvml.ERROR_UNKNOWN {
		t.Errorf("create with an unwritable state file: %v, want ERROR_UNKNOWN", ret)
	}
	if node.MIGStateError() == nil {
		t.Error("MIGStateError nil")
	}
	if g := mustDiscover(t, node)[1]; len(g.MIG.Instances) != 0 {
		t.Errorf("instances %+v after a failed create", g.MIG.Instances)
	}
	if err := node.SetMIGPending(1, false); err == nil {
		t.Error("SetMIGPending with an unwritable state file succeeded")
	}
}

// XID events on a MIG device carry its GPU and compute instance IDs; other
// events carry NVML's "none" (0xFFFFFFFF), which EventMIGInstance reads as
// the whole GPU.
func TestMockMIGEvents(t *testing.T) {
	node := mustMockNode(t, "hgx-h100-mig")
	set, _ := node.EventSetCreate()
	must(t, errOf(node.Devices[0].RegisterEvents(nvml.EventTypeXidCriticalError, set)))
	if _, err := node.InjectMIGXID(0, 2, 0, 43); err != nil {
		t.Fatal(err)
	}
	if _, err := node.InjectMIGXID(0, 1, -1, 31); err != nil {
		t.Fatal(err)
	}
	if _, err := node.InjectXID(0, 79); err != nil {
		t.Fatal(err)
	}
	if _, err := node.InjectMIGXID(0, 5, 0, 43); err == nil {
		t.Error("an XID on a GPU instance that does not exist accepted")
	}
	type scope struct{ gi, ci int }
	for _, want := range []struct {
		xid   uint64
		scope *scope
	}{{43, &scope{2, 0}}, {31, &scope{1, -1}}, {79, nil}} {
		e, ret := set.Wait(1000)
		if ret != nvml.SUCCESS || e.EventData != want.xid {
			t.Fatalf("event %+v, %v; want XID %d", e, ret, want.xid)
		}
		gi, ci, ok := EventMIGInstance(e.GpuInstanceId, e.ComputeInstanceId)
		switch {
		case want.scope == nil && ok:
			t.Errorf("XID %d: attributed to %d/%d, want the whole GPU", want.xid, gi, ci)
		case want.scope != nil && (!ok || gi != want.scope.gi || ci != want.scope.ci):
			t.Errorf("XID %d: %d/%d (%v), want %+v", want.xid, gi, ci, ok, *want.scope)
		}
	}
	g := mustDiscover(t, node)[0]
	if in, c, ok := g.MIG.ComputeInstance(2, 0); !ok || in.ProfileName != "3g.40gb" || c.UUID == "" {
		t.Errorf("ComputeInstance(2, 0) = %+v, %+v, %v", in, c, ok)
	}
}

// The HTTP knobs reach the MIG state.
func TestMockMIGFaultHandler(t *testing.T) {
	node := mustMockNode(t, "hgx-h100-mig")
	srv := httptest.NewServer(node.FaultHandler())
	defer srv.Close()
	post := func(query string) (int, string) {
		resp, err := http.Post(srv.URL+query, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		query string
		code  int
		says  string
	}{
		{"/mock/mig-create?gpu=1&profile=2g.20gb&start=2", 200, "GPU instance 4 compute instance 0"},
		{"/mock/mig-create?gpu=1&profile=3g.40gb&start=0", 400, "ERROR_INSUFFICIENT_RESOURCES"},
		{"/mock/mig-process?gpu=1&gi=4&ci=0&pid=12&memory=1024", 200, "1 processes"},
		{"/mock/mig-destroy?gpu=1&gi=4", 400, "ERROR_IN_USE"},
		{"/mock/mig-process?gpu=1&gi=4&ci=0", 200, "0 processes"},
		{"/mock/mig-destroy?gpu=1&gi=4", 200, "destroyed"},
		{"/mock/mig?gpu=2&pending=true", 200, "pending=true"},
		{"/mock/mig?gpu=2", 400, "want pending"},
		{"/mock/mig-reset?gpu=2", 200, "reset"},
		{"/mock/xid?gpu=0&xid=43&gi=2&ci=0", 200, "GPU instance 2 compute instance 0"},
		{"/mock/xid?gpu=0&xid=43&ci=0", 400, "without gi"},
		{"/mock/mig?gpu=7&enabled=true", 200, "enabled=true"},
		{"/mock/mig?gpu=4&enabled=true&pending=true", 400, "not both"},
	} {
		code, body := post(tc.query)
		if code != tc.code || !strings.Contains(body, tc.says) {
			t.Errorf("%s: %d %q, want %d saying %q", tc.query, code, body, tc.code, tc.says)
		}
	}
	gpus := mustDiscover(t, node)
	if !gpus[2].MIGEnabled || !gpus[7].MIGEnabled || len(gpus[1].MIG.Instances) != 0 {
		t.Errorf("after the knobs: GPU 2 MIG %v, GPU 7 MIG %v, GPU 1 instances %v", gpus[2].MIGEnabled, gpus[7].MIGEnabled, gpus[1].MIG.Instances)
	}
}

// A mock node's mig-minors is the driver's numbering.
func TestMockMIGMinors(t *testing.T) {
	if node := mustMockNode(t, "hgx-h100-mig"); !bytes.Equal(node.MIGMinors(), driverMIGMinors()) {
		t.Error("the mock node's mig-minors is not the driver's numbering")
	}
}

// migUUIDAt is the MIG UUID of the first compute instance of the GPU
// instance at memory slice start of GPU i, as discovery reads it.
func migUUIDAt(t *testing.T, node *MockNode, i, start int) string {
	t.Helper()
	for _, in := range mustDiscover(t, node)[i].MIG.Instances {
		if in.Placement.Start == start && len(in.ComputeInstances) > 0 {
			return in.ComputeInstances[0].UUID
		}
	}
	t.Fatalf("GPU %d: no instance at %d", i, start)
	return ""
}

// Every compute instance created gets a MIG UUID of its own, as a real
// driver gives one per creation: destroyed and re-created at the same
// placement with the same IDs, it has a new one; the state file keeps the
// count, so a restored node does not hand out an old UUID again. A state
// file written before serials keeps the UUIDs of that older mock.
func TestMockMIGFreshUUIDs(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mig.json")
	node, err := NewMockNodeWith("hgx-h100-mig", MockOptions{MIGStateFile: file})
	must(t, err)
	staticUUID := migUUIDAt(t, node, 0, 4)
	gi, ci, err := node.CreateMIGInstance(1, "1g.10gb", 6)
	must(t, err)
	first := migUUIDAt(t, node, 1, 6)
	must(t, node.DestroyMIGInstance(1, gi))
	gi2, ci2, err := node.CreateMIGInstance(1, "1g.10gb", 6)
	must(t, err)
	second := migUUIDAt(t, node, 1, 6)
	if gi2 != gi || ci2 != ci {
		t.Fatalf("re-created with IDs %d/%d, want the freed %d/%d", gi2, ci2, gi, ci)
	}
	if second == first || !strings.HasPrefix(second, "MIG-") {
		t.Errorf("re-created instance has UUID %s, the destroyed one had %s: want a fresh one", second, first)
	}
	// Restored from the file: the same UUIDs, and the next create is fresh.
	again, err := NewMockNodeWith("hgx-h100-mig", MockOptions{MIGStateFile: file})
	must(t, err)
	if got := migUUIDAt(t, again, 1, 6); got != second {
		t.Errorf("restored UUID %s, want %s", got, second)
	}
	if got := migUUIDAt(t, again, 0, 4); got != staticUUID {
		t.Errorf("restored static UUID %s, want %s", got, staticUUID)
	}
	must(t, again.DestroyMIGInstance(1, gi))
	_, _, err = again.CreateMIGInstance(1, "1g.10gb", 6)
	must(t, err)
	if third := migUUIDAt(t, again, 1, 6); third == first || third == second {
		t.Errorf("after restore the re-created instance has an earlier UUID again: %s (earlier %s, %s)", third, first, second)
	}
	// A file without serials (written by the older mock): UUIDs from the IDs.
	old := filepath.Join(t.TempDir(), "old.json")
	must(t, os.WriteFile(old, []byte(`{"version": 1, "profile": "hgx-h100-mig", "gpus": {"0": {"current": true, "pending": true, "instances": [
		{"id": 1, "profileID": 5, "start": 0, "computeInstances": [{"id": 0, "slices": 4, "start": 0}]}]}}}`), 0o644))
	legacy, err := NewMockNodeWith("hgx-h100-mig", MockOptions{MIGStateFile: old})
	must(t, err)
	parent, _ := legacy.Devices[0].GetUUID()
	if got, want := migUUIDAt(t, legacy, 0, 0), mockMIGUUID(parent, &mockCI{id: 0, gi: &mockGI{id: 1}}); got != want {
		t.Errorf("UUID from a file without serials %s, want the IDs' %s", got, want)
	}
	// A serial two compute instances claim is refused.
	dup := filepath.Join(t.TempDir(), "dup.json")
	must(t, os.WriteFile(dup, []byte(`{"version": 1, "profile": "hgx-h100-mig", "gpus": {"0": {"current": true, "pending": true, "instances": [
		{"id": 1, "profileID": 5, "start": 0, "computeInstances": [{"id": 0, "slices": 4, "start": 0, "serial": 3}]},
		{"id": 2, "profileID": 9, "start": 4, "computeInstances": [{"id": 0, "slices": 3, "start": 0, "serial": 3}]}]}}}`), 0o644))
	if _, err := NewMockNodeWith("hgx-h100-mig", MockOptions{MIGStateFile: dup}); err == nil || !strings.Contains(err.Error(), "serial 3") {
		t.Errorf("duplicate serial: %v", err)
	}
}

// An admin's split GPU instance (a 3g.40gb with a 2-slice and a 1-slice
// compute instance: 2c.3g.40gb and 1c.3g.40gb): each compute instance is a
// MIG device of its own with its own UUID; a third does not fit.
func TestMockMIGCreateComputeInstance(t *testing.T) {
	node := mustMockNode(t, "hgx-h100-mig")
	gi, err := node.CreateMIGGPUInstance(1, "3g.40gb", 4)
	must(t, err)
	if g := mustDiscover(t, node)[1]; len(g.MIG.Instances) != 1 || len(g.MIG.Instances[0].ComputeInstances) != 0 {
		t.Fatalf("GPU instance without compute instances: %+v", g.MIG.Instances)
	}
	two, err := node.CreateMIGComputeInstance(1, gi, 2)
	must(t, err)
	one, err := node.CreateMIGComputeInstance(1, gi, 1)
	must(t, err)
	if _, err := node.CreateMIGComputeInstance(1, gi, 1); !errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Errorf("a third compute instance: %v, want INSUFFICIENT_RESOURCES", err)
	}
	if _, err := node.CreateMIGComputeInstance(1, 9, 1); err == nil {
		t.Errorf("compute instance in a GPU instance that does not exist: no error")
	}
	cis := mustDiscover(t, node)[1].MIG.Instances[0].ComputeInstances
	if len(cis) != 2 || cis[0].ID != two || cis[1].ID != one || cis[0].UUID == cis[1].UUID || cis[0].Multiprocessors <= cis[1].Multiprocessors {
		t.Errorf("compute instances %+v", cis)
	}
}
