package gpu

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestProfiles(t *testing.T) {
	want := []string{"a100-pairs", "dgx-a100", "hgx-h100", "hgx-h100-dynamic-mig", "hgx-h100-mig", "l4x4"}
	if got := Profiles(); !slices.Equal(got, want) {
		t.Errorf("Profiles() = %v, want %v", got, want)
	}
}

func TestNewMockUnknownProfile(t *testing.T) {
	lib, err := NewMock("x")
	if lib != nil || err == nil {
		t.Fatalf("NewMock(x) = %v, %v; want an error", lib, err)
	}
	const want = `unknown mock profile "x" (valid: a100-pairs, dgx-a100, hgx-h100, hgx-h100-dynamic-mig, hgx-h100-mig, l4x4)`
	if err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}

func TestMockUUIDsAreDeterministicAndDistinct(t *testing.T) {
	seen := map[string]string{}
	for _, profile := range Profiles() {
		a, b := mustMockNode(t, profile), mustMockNode(t, profile)
		for i := range a.Devices {
			ua, _ := a.Devices[i].GetUUID()
			ub, _ := b.Devices[i].GetUUID()
			if ua != ub {
				t.Errorf("%s GPU %d: UUID %s, then %s", profile, i, ua, ub)
			}
			if other, dup := seen[ua]; dup {
				t.Errorf("%s GPU %d has the UUID of %s", profile, i, other)
			}
			seen[ua] = profile
		}
	}
}

// The handle look-ups other packages use (by UUID, by PCI bus id in NVML's or
// the canonical spelling) find the same device as the index.
func TestMockHandleLookups(t *testing.T) {
	node := mustMockNode(t, "hgx-h100")
	for i, d := range node.Devices {
		uuid, _ := d.GetUUID()
		if got, ret := node.DeviceGetHandleByUUID(uuid); ret != nvml.SUCCESS || got != d {
			t.Errorf("GPU %d: DeviceGetHandleByUUID = %v, %v", i, got, ret)
		}
		pci, _ := d.GetPciInfo()
		canonical, err := pciBusID(pci)
		if err != nil {
			t.Fatal(err)
		}
		raw := string(pci.BusId[:slices.Index(pci.BusId[:], 0)])
		for _, id := range []string{raw, canonical} {
			if got, ret := node.DeviceGetHandleByPciBusId(id); ret != nvml.SUCCESS || got != d {
				t.Errorf("GPU %d: DeviceGetHandleByPciBusId(%s) = %v, %v", i, id, got, ret)
			}
		}
	}
	if _, ret := node.DeviceGetHandleByIndex(8); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("DeviceGetHandleByIndex(8) = %v, want ERROR_INVALID_ARGUMENT", ret)
	}
	if _, ret := node.DeviceGetHandleByUUID("GPU-nope"); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("DeviceGetHandleByUUID(GPU-nope) = %v, want ERROR_NOT_FOUND", ret)
	}
}

// The HTTP knob reaches the event sets.
func TestMockFaultHandler(t *testing.T) {
	node := mustMockNode(t, "l4x4")
	set, _ := node.EventSetCreate()
	if ret := node.Devices[2].RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	h := node.FaultHandler()
	for _, tc := range []struct {
		target string
		code   int
	}{
		{"/mock/xid?gpu=2&xid=79", http.StatusOK},
		{"/mock/xid?gpu=9&xid=79", http.StatusBadRequest},
		{"/mock/xid?gpu=2", http.StatusBadRequest},
		{"/mock/lost?gpu=1&lost=maybe", http.StatusBadRequest},
		{"/mock/discovery?gpu=1&fail=true", http.StatusOK},
		{"/mock/discovery?gpu=3&fail=true&call=nvmlDeviceGetPciInfo", http.StatusOK},
		{"/mock/discovery?gpu=0&fail=true&call=nvmlDeviceGetName", http.StatusBadRequest},
		{"/mock/discovery?gpu=0&fail=yes", http.StatusBadRequest},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, tc.target, nil))
		if rec.Code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.target, rec.Code, rec.Body, tc.code)
		}
	}
	data, ret := node.EventSetWait(set, 1000)
	if ret != nvml.SUCCESS || data.EventData != 79 || data.Device != node.Devices[2] {
		t.Errorf("wait: %+v %v", data, ret)
	}
	if _, ret := node.EventSetWait(set, 1); ret != nvml.ERROR_TIMEOUT {
		t.Errorf("second wait: %v, want a timeout", ret)
	}
	d, err := DiscoverNode(node)
	if err != nil || len(d.Failed) != 2 || d.Failed[0].Index != 1 || d.Failed[1].Index != 3 || d.Failed[1].Partial == nil {
		t.Errorf("after /mock/discovery: failed %+v, err %v", d.Failed, err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mock/discovery?gpu=1&fail=false", nil))
	if d, _ := DiscoverNode(node); rec.Code != http.StatusOK || len(d.Failed) != 1 {
		t.Errorf("fail=false: %d %s, failed %+v", rec.Code, rec.Body, d.Failed)
	}
}

// The flag form of FailDiscovery.
func TestMockFailDiscoverySpec(t *testing.T) {
	node := mustMockNode(t, "l4x4")
	for _, bad := range []string{"", "x", "9", "1:nvmlDeviceGetName"} {
		if err := node.FailDiscoverySpec(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := node.FailDiscoverySpec("1"); err != nil {
		t.Fatal(err)
	}
	if err := node.FailDiscoverySpec("2:nvmlDeviceGetUUID"); err != nil {
		t.Fatal(err)
	}
	d, err := DiscoverNode(node)
	if err != nil || len(d.Failed) != 2 {
		t.Fatalf("failed %+v, err %v", d.Failed, err)
	}
	if f := d.Failed[0]; !strings.Contains(f.Error(), DefaultMockDiscoveryCall) || f.UUID == "" {
		t.Errorf("GPU 1: %v", f)
	}
	if f := d.Failed[1]; !strings.Contains(f.Error(), "nvmlDeviceGetUUID") || f.UUID != "" {
		t.Errorf("GPU 2: %v", f)
	}
}
