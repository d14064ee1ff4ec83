package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
)

type fixedSource Snapshot

func (s fixedSource) MetricsSnapshot() Snapshot { return Snapshot(s) }

type podMap map[types.UID]PodRef

func (m podMap) Pod(uid types.UID) (PodRef, bool) { r, ok := m[uid]; return r, ok }

const (
	podA = "0f1e2d3c-4b5a-6978-8a9b-acbdcedf0011"
	podB = "11111111-2222-3333-4444-555555555555"
)

func TestPodUIDFromCgroup(t *testing.T) {
	for _, tc := range []struct{ name, content, want string }{
		{"cgroup v2, systemd", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_acbdcedf0011.slice/cri-containerd-abc.scope\n", podA},
		{"cgroup v2, cgroupfs", "0::/kubepods/besteffort/pod0f1e2d3c-4b5a-6978-8a9b-acbdcedf0011/0123abcd\n", podA},
		{"cgroup v1, cgroupfs", "12:pids:/kubepods/pod11111111-2222-3333-4444-555555555555/abc\n11:memory:/kubepods/pod11111111-2222-3333-4444-555555555555/abc\n", podB},
		{"guaranteed, systemd", "0::/kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice/cri-containerd-1.scope", podB},
		{"not a pod", "0::/system.slice/nvidia-persistenced.service\n", ""},
		{"empty", "", ""},
	} {
		got, ok := PodUIDFromCgroup(tc.content)
		if string(got) != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: %q %v, want %q", tc.name, got, ok, tc.want)
		}
	}
}

// scrape returns the text exposition of m.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustContain(t *testing.T, text string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(text, l+"\n") {
			t.Errorf("missing line %q", l)
		}
	}
}

// The GPU and claim gauges add up what the source says; latency and errors
// are counted; per-pod memory is mapped through /proc/<pid>/cgroup.
func TestMetrics(t *testing.T) {
	node := gputest.MockNode(t, "l4x4")
	uuid0, _ := node.Devices[0].GetUUID()
	uuid1, _ := node.Devices[1].GetUUID()
	src := fixedSource{
		GPUs: []GPU{
			{UUID: uuid0, Minor: 0, ProductName: "NVIDIA L4", MemoryBytes: 23034 << 20, Healthy: true},
			{UUID: uuid1, Minor: 1, ProductName: "NVIDIA L4", MemoryBytes: 23034 << 20, Healthy: false, Taint: "NoExecute"},
		},
		Claims: []Claim{
			{UID: "c1", Namespace: "ml", Name: "a", Pods: []string{"train-0"}, Devices: []Device{{Request: "gpu", Device: "gpu-0-shared", ShareID: "s1",
				UUID: uuid0, Minor: 0, Shared: true, ConsumedMemory: 4 << 30, ConsumedCores: 25, MemoryLimit: 4 << 30, CoresLimit: 50, Isolation: "MPS"}}},
			{UID: "c2", Namespace: "ml", Name: "b", Devices: []Device{{Request: "gpu", Device: "gpu-0-shared", ShareID: "s2",
				UUID: uuid0, Minor: 0, Shared: true, ConsumedMemory: 6 << 30, ConsumedCores: 30, MemoryLimit: 6 << 30, CoresLimit: 30, Isolation: "Advisory"}}},
			{UID: "c3", Namespace: "ml", Name: "w", Devices: []Device{{Request: "gpu", Device: "gpu-1", UUID: uuid1, Minor: 1}}},
		},
	}

	proc := t.TempDir()
	writeCgroup := func(pid, content string) {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCgroup("100", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_acbdcedf0011.slice/cri-containerd-a.scope\n")
	writeCgroup("101", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_acbdcedf0011.slice/cri-containerd-b.scope\n")
	writeCgroup("200", "0::/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/c\n")
	writeCgroup("300", "0::/system.slice/some-daemon.service\n")
	if err := node.SetProcesses(0, []nvml.ProcessInfo{
		{Pid: 100, UsedGpuMemory: 1 << 30}, {Pid: 101, UsedGpuMemory: 512 << 20}, // two processes of pod A
		{Pid: 200, UsedGpuMemory: 2 << 30}, // pod B, which holds no Tessera claim
		{Pid: 300, UsedGpuMemory: 100 << 20},
		{Pid: 999, UsedGpuMemory: 1 << 30}, // exited: no /proc entry
	}); err != nil {
		t.Fatal(err)
	}

	m := New("node-a")
	m.AddState(src, &Usage{Lib: node, ProcRoot: proc, Pods: podMap{podA: {UID: podA, Namespace: "ml", Name: "train-0"}}})
	m.ObservePrepare(3*time.Millisecond, nil)
	m.ObservePrepare(7*time.Millisecond, errors.New("boom"))
	m.ObserveUnprepare(time.Millisecond, nil)
	m.ObserveStatusWrite(nil)
	m.ObserveStatusWrite(errors.New("forbidden"))

	text := scrape(t, m)
	g0 := `gpu="gpu-0",node="node-a",uuid="` + uuid0 + `"`
	g1 := `gpu="gpu-1",node="node-a",uuid="` + uuid1 + `"`
	a := `claim="a",device="gpu-0-shared",gpu="gpu-0",isolation="MPS",namespace="ml",node="node-a",pod="train-0",request="gpu",share="s1",uid="c1",uuid="` + uuid0 + `"`
	b := `claim="b",device="gpu-0-shared",gpu="gpu-0",isolation="Advisory",namespace="ml",node="node-a",pod="",request="gpu",share="s2",uid="c2",uuid="` + uuid0 + `"`
	// withLimit adds the label limit to a claim series' labels, in order.
	withLimit := func(labels, limit string) string {
		return strings.Replace(labels, `,namespace=`, `,limit="`+limit+`",namespace=`, 1)
	}
	w := `claim="w",device="gpu-1",gpu="gpu-1",isolation="",namespace="ml",node="node-a",pod="",request="gpu",share="",uid="c3",uuid="` + uuid1 + `"`
	mustContain(t, text,
		`tessera_gpu_info{gpu="gpu-0",node="node-a",product="NVIDIA L4",uuid="`+uuid0+`"} 1`,
		`tessera_gpu_memory_bytes{`+g0+`} 2.4152899584e+10`,
		`tessera_gpu_cores{`+g0+`} 100`,
		`tessera_gpu_allocated_memory_bytes{`+g0+`} 1.073741824e+10`,
		`tessera_gpu_allocated_cores{`+g0+`} 55`,
		`tessera_gpu_shares{`+g0+`} 2`,
		`tessera_gpu_allocated_memory_bytes{`+g1+`} 2.4152899584e+10`,
		`tessera_gpu_allocated_cores{`+g1+`} 100`,
		`tessera_gpu_shares{`+g1+`} 0`,
		`tessera_gpu_healthy{effect="",`+g0+`} 1`,
		`tessera_gpu_healthy{effect="NoExecute",`+g1+`} 0`,
		`tessera_claim_memory_limit_bytes{`+a+`} 4.294967296e+09`,
		`tessera_claim_cores_limit{`+a+`} 50`,
		`tessera_claim_cores{`+a+`} 25`,
		`tessera_claim_limit_enforced{`+withLimit(a, "memory")+`} 1`,
		`tessera_claim_limit_enforced{`+withLimit(a, "cores")+`} 1`,
		`tessera_claim_limit_enforced{`+withLimit(b, "memory")+`} 0`,
		`tessera_claim_limit_enforced{`+withLimit(b, "cores")+`} 0`,
		`tessera_claim_status_write_errors_total{node="node-a"} 1`,
		`tessera_claim_memory_bytes{`+w+`} 2.4152899584e+10`,
		`tessera_claim_cores{`+w+`} 100`,
		`tessera_prepare_duration_seconds_count{node="node-a"} 2`,
		`tessera_prepare_errors_total{node="node-a"} 1`,
		`tessera_unprepare_duration_seconds_count{node="node-a"} 1`,
		`tessera_unprepare_errors_total{node="node-a"} 0`,
		`tessera_pod_gpu_memory_used_bytes{gpu="gpu-0",namespace="ml",node="node-a",pod="train-0",pod_uid="`+podA+`",uuid="`+uuid0+`"} 1.610612736e+09`,
		`tessera_pod_gpu_memory_used_bytes{gpu="gpu-0",namespace="",node="node-a",pod="",pod_uid="`+podB+`",uuid="`+uuid0+`"} 2.147483648e+09`,
		`tessera_pod_gpu_memory_used_bytes{gpu="gpu-0",namespace="",node="node-a",pod="",pod_uid="",uuid="`+uuid0+`"} 1.048576e+08`,
	)
	for _, name := range []string{"tessera_claim_memory_limit_bytes", "tessera_claim_limit_enforced"} {
		if strings.Contains(text, name+`{claim="w"`) {
			t.Errorf("a whole GPU has a %s series", name)
		}
	}
	if t.Failed() {
		t.Log(text)
	}
}

// Regression: a claim holding two shares of one GPU (two requests, or one
// request with two shares of the device) made two series with equal labels,
// and the whole scrape failed with 500. Each allocation result now has its
// own series; the GPU's totals add the shares up and leave admin access out.
func TestTwoSharesOfOneGPU(t *testing.T) {
	const uuid0, uuid1 = "GPU-0", "GPU-1"
	share := func(request, id string, memory, cores int64) Device {
		return Device{Request: request, Device: "gpu-0-shared", ShareID: id, UUID: uuid0, Minor: 0, Shared: true,
			ConsumedMemory: memory, ConsumedCores: cores, MemoryLimit: memory, CoresLimit: 2 * cores, Isolation: "MPS"}
	}
	src := fixedSource{
		GPUs: []GPU{
			{UUID: uuid0, Minor: 0, ProductName: "NVIDIA L4", MemoryBytes: 20 << 30, Healthy: true},
			{UUID: uuid1, Minor: 1, ProductName: "NVIDIA L4", MemoryBytes: 20 << 30, Healthy: true},
		},
		Claims: []Claim{{UID: "c1", Namespace: "ml", Name: "pair", Pods: []string{"b", "a"}, Devices: []Device{
			share("first", "s1", 2<<30, 10),
			share("second", "s2", 3<<30, 20),
			share("second", "s3", 4<<30, 30),
			share("second", "s3", 4<<30, 30), // listed twice: summed, not sent twice
			// Admin access observes: it holds nothing of either GPU.
			{Request: "debug", Device: "gpu-0-shared", ShareID: "s4", UUID: uuid0, Minor: 0, Shared: true, AdminAccess: true, ConsumedMemory: 1 << 30, ConsumedCores: 5},
			{Request: "debug", Device: "gpu-1", UUID: uuid1, Minor: 1, AdminAccess: true},
		}}},
	}
	m := New("node-a")
	m.AddState(src, nil)
	if _, err := m.Registry.Gather(); err != nil {
		t.Fatalf("gather: %v", err)
	}
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("scrape: %s", resp.Status)
	}

	text := scrape(t, m)
	g0 := `gpu="gpu-0",node="node-a",uuid="` + uuid0 + `"`
	g1 := `gpu="gpu-1",node="node-a",uuid="` + uuid1 + `"`
	claim := func(request, device, share, gpu, uuid, isolation string) string {
		return `claim="pair",device="` + device + `",gpu="` + gpu + `",isolation="` + isolation + `",namespace="ml",node="node-a",pod="a,b",request="` +
			request + `",share="` + share + `",uid="c1",uuid="` + uuid + `"`
	}
	mustContain(t, text,
		`tessera_gpu_allocated_memory_bytes{`+g0+`} 1.3958643712e+10`, // 2+3+4+4 GiB
		`tessera_gpu_allocated_cores{`+g0+`} 90`,
		`tessera_gpu_shares{`+g0+`} 4`,
		`tessera_gpu_allocated_memory_bytes{`+g1+`} 0`,
		`tessera_gpu_allocated_cores{`+g1+`} 0`,
		`tessera_claim_memory_bytes{`+claim("first", "gpu-0-shared", "s1", "gpu-0", uuid0, "MPS")+`} 2.147483648e+09`,
		`tessera_claim_memory_bytes{`+claim("second", "gpu-0-shared", "s2", "gpu-0", uuid0, "MPS")+`} 3.221225472e+09`,
		`tessera_claim_memory_bytes{`+claim("second", "gpu-0-shared", "s3", "gpu-0", uuid0, "MPS")+`} 8.589934592e+09`,
		`tessera_claim_cores_limit{`+claim("second", "gpu-0-shared", "s3", "gpu-0", uuid0, "MPS")+`} 120`,
		`tessera_claim_memory_bytes{`+claim("debug", "gpu-0-shared", "s4", "gpu-0", uuid0, "")+`} 0`,
		`tessera_claim_memory_bytes{`+claim("debug", "gpu-1", "", "gpu-1", uuid1, "")+`} 0`,
		`tessera_claim_cores{`+claim("debug", "gpu-1", "", "gpu-1", uuid1, "")+`} 0`,
	)
	if strings.Contains(text, `tessera_claim_memory_limit_bytes{`+claim("debug", "gpu-0-shared", "s4", "gpu-0", uuid0, "")) {
		t.Error("an admin-access share has a limit series")
	}
	if t.Failed() {
		t.Log(text)
	}
}

// A lost GPU's processes cannot be read; the others still are.
func TestUsageLostGPU(t *testing.T) {
	node := gputest.MockNode(t, "l4x4")
	uuid0, _ := node.Devices[0].GetUUID()
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "5"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "5", "cgroup"), []byte("0::/kubepods/pod"+podB+"/x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = node.SetProcesses(0, []nvml.ProcessInfo{{Pid: 5, UsedGpuMemory: 7}})
	_ = node.SetLost(0, true)
	u := &Usage{Lib: node, ProcRoot: proc}
	if got := u.Collect([]GPU{{UUID: uuid0}}); len(got) != 0 {
		t.Errorf("lost GPU reported %v", got)
	}
	_ = node.SetLost(0, false)
	if got := u.Collect([]GPU{{UUID: uuid0}}); len(got) != 1 || got[0].UsedBytes != 7 || got[0].PodUID != podB {
		t.Errorf("got %+v", got)
	}
}
