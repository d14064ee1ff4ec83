package gpucheck

import (
	"context"
	"os"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/internal/gpucheck/cuda"
	"github.com/tessera-dev/tessera/pkg/gpu"
)

// simNode is a started node of a mock check whose probes are the built
// probe's simulated mode given faults, with the mock driver playing its
// part as Run sets it up: the node for calling one check directly.
func simNode(t *testing.T, faults []string, isos ...configapi.Isolation) (*node, ExecProber, context.Context) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	cfg := simConfig(t, isos...)
	ep := cfg.Prober.(ExecProber)
	for _, f := range faults {
		ep.Command = append(ep.Command, "--simulate-fault", f)
	}
	disc, err := gpu.DiscoverNode(cfg.NVML)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{cfg: cfg, targets: DefaultTargets, memory: 4 << 30, gpu: disc.GPUs[2]}
	ep.Observe = mockDriverObserver(cfg.NVML.(*gpu.MockNode), n.gpu.Index, n.simDir())
	ep.ProcessMemory = NVMLProcessMemory(cfg.NVML)
	n.cfg.Prober = ep
	if err := os.MkdirAll(n.simDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(n.simDir(), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := n.start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.stop(ctx) })
	return n, ep, ctx
}

// TestMPSUIDCheckJudgesTheWaitFromCuInit: a uid-1000 client that starts
// slowly and then gets its context at once, without the wait legacy MPS
// imposes, is a mismatch: the wait is judged from its "loading" (cuInit),
// not from its start.
func TestMPSUIDCheckJudgesTheWaitFromCuInit(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("runs the simulated probes as uid 1000 (root only)")
	}
	n, ep, ctx := simNode(t, []string{SimFaultMPSNoWait}, configapi.IsolationMPS)
	c := n.mpsUIDCheck(ctx, ep, Check{Name: "uid"})
	if c.Status != StatusMismatch || !strings.Contains(c.Detail, "within 3s of cuInit") {
		t.Errorf("%s: %s, want a mismatch: the client did not wait", c.Status, c.Detail)
	}
}

// TestMPSMemoryCheckNeedsTheServer: clients that went through no MPS
// server measure no server context; that is a mismatch, not a pass.
func TestMPSMemoryCheckNeedsTheServer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulated probes")
	}
	n, ep, ctx := simNode(t, []string{SimFaultMPSNoServer}, configapi.IsolationMPS)
	c := n.mpsMemoryCheck(ctx, ep, Check{Name: "memory"})
	if c.Status != StatusMismatch || !strings.Contains(c.Detail, "lists 0 servers") || !strings.Contains(c.Detail, "no server context was measured") {
		t.Errorf("%s: %s", c.Status, c.Detail)
	}
}

// TestHAMiChecksHaveALowerBound: a HAMi-core that refuses at half the
// claim's limit fails both HAMi-core checks.
func TestHAMiChecksHaveALowerBound(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulated probes")
	}
	n, _, ctx := simNode(t, []string{SimFaultHAMiLow}, configapi.IsolationHAMiCore)
	checks := n.hamiChecks(ctx)
	if len(checks) != 2 {
		t.Fatalf("%+v", checks)
	}
	if c := checks[0]; c.Status != StatusMismatch || strings.Count(c.Detail, "more than 1 MiB from the limit") != 3 {
		t.Errorf("allocators: %s: %s", c.Status, c.Detail)
	}
	if c := checks[1]; c.Status != StatusMismatch || !strings.Contains(c.Detail, "short of the limit") {
		t.Errorf("N processes: %s: %s", c.Status, c.Detail)
	}
}

func TestJudgeMPSMemory(t *testing.T) {
	one := []mpsServer{{ID: "7", Clients: []int{1, 2}}}
	const reserve = 512 << 20
	for name, tc := range map[string]struct {
		servers         []mpsServer
		server, client2 int64
		want            string
	}{
		"ok":             {one, 300 << 20, 500 << 20, ""},
		"no server":      {nil, 300 << 20, 500 << 20, "lists 0 servers"},
		"two servers":    {append(one, mpsServer{ID: "8"}), 300 << 20, 500 << 20, "lists 2 servers"},
		"other server":   {[]mpsServer{{ID: "7", Clients: []int{1}}}, 300 << 20, 500 << 20, "not both clients"},
		"below floor":    {one, 20 << 20, 500 << 20, "not above"},
		"zero":           {one, 0, 500 << 20, "no server context was measured"},
		"client2 < 0":    {one, 300 << 20, -1 << 20, "lowered the GPU's used memory"},
		"over reserve":   {one, 600 << 20, 500 << 20, "larger than"},
		"server is none": {one, 32 << 20, 0, "not above"},
	} {
		t.Run(name, func(t *testing.T) {
			bad := judgeMPSMemory(tc.servers, [2]int{1, 2}, tc.server, tc.client2, reserve)
			got := strings.Join(bad, "; ")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestJudgeHAMiAllocation(t *testing.T) {
	const limit = 4 << 30
	oom := "cuMemAllocAsync(1048576): CUDA_ERROR_OUT_OF_MEMORY (2)"
	probe := func(alloc, process uint64, last string, stopped bool) MemoryProbe {
		return MemoryProbe{AllocatedBytes: alloc, ProcessBytes: process, ProcessBytesKnown: true, LastError: last, Stopped: stopped}
	}
	for name, tc := range map[string]struct {
		p    MemoryProbe
		ok   bool
		want string
	}{
		"at the limit":   {probe(limit-500<<20, limit, oom, false), true, "refused at"},
		"far below":      {probe(limit/2-500<<20, limit/2, oom, false), false, "more than 1 MiB from the limit"},
		"over":           {probe(limit, limit+2<<20, oom, false), false, "more than 1 MiB from the limit"},
		"not refused":    {probe(limit-500<<20, limit, "", false), false, "did not end with an out-of-memory refusal"},
		"other error":    {probe(limit-500<<20, limit, "cuMemAllocAsync: CUDA_ERROR_INVALID_VALUE (1)", false), false, "did not end with an out-of-memory"},
		"stopped":        {probe(limit+2<<30, limit+2<<30, "", true), false, "not enforced"},
		"CUresult 2 ok":  {probe(limit-500<<20, limit, "cuMemCreate: CUresult 2", false), true, "refused at"},
		"one MiB within": {probe(limit-500<<20, limit-1<<20, oom, false), true, "refused at"},
	} {
		t.Run(name, func(t *testing.T) {
			msg, ok := judgeHAMiAllocation(limit, 1, cuda.AllocAsync, tc.p)
			if ok != tc.ok || !strings.Contains(msg, tc.want) {
				t.Errorf("%v %q, want %v %q", ok, msg, tc.ok, tc.want)
			}
		})
	}
}

func TestJudgeHAMiShared(t *testing.T) {
	const limit = 4 << 30
	oom := "cuMemAlloc(1048576): CUDA_ERROR_OUT_OF_MEMORY (2)"
	nvml := func(alloc, process uint64) MemoryProbe {
		return MemoryProbe{AllocatedBytes: alloc, ProcessBytes: process, ProcessBytesKnown: true, LastError: oom, TotalBytes: limit}
	}
	cuInfo := func(alloc, freeAfter uint64) MemoryProbe {
		return MemoryProbe{AllocatedBytes: alloc, LastError: oom, TotalBytes: limit, FreeAfterBytes: freeAfter}
	}
	for name, tc := range map[string]struct {
		probes []MemoryProbe
		want   string
	}{
		"nvml ok":        {[]MemoryProbe{nvml(1500<<20, 2000<<20), nvml(1596<<20, 2096<<20)}, ""},
		"nvml over":      {[]MemoryProbe{nvml(2000<<20, 2500<<20), nvml(1596<<20, 2096<<20)}, "over the limit"},
		"nvml short":     {[]MemoryProbe{nvml(500<<20, 1000<<20), nvml(500<<20, 1000<<20)}, "short of the limit"},
		"stopped":        {[]MemoryProbe{{AllocatedBytes: 1, Stopped: true, ProcessBytesKnown: true, ProcessBytes: limit}}, "not enforced"},
		"cuInfo ok":      {[]MemoryProbe{cuInfo(1500<<20, 0), cuInfo(1596<<20, 512<<10)}, ""},
		"cuInfo short":   {[]MemoryProbe{cuInfo(500<<20, 2<<30), cuInfo(500<<20, 2<<30)}, "HAMi-core charged the claim"},
		"cuInfo over":    {[]MemoryProbe{cuInfo(3<<30, 0), cuInfo(2<<30, 0)}, "allocations alone are over"},
		"cuInfo total":   {[]MemoryProbe{{AllocatedBytes: 1 << 30, LastError: oom, TotalBytes: 80 << 30, FreeAfterBytes: 76 << 30}}, "not the claim's limit"},
		"no refusal":     {[]MemoryProbe{nvml(1500<<20, 2000<<20), {ProcessBytesKnown: true, ProcessBytes: 2096 << 20}}, "did not end with an out-of-memory refusal"},
		"no figures yet": {nil, "short of the limit"},
	} {
		t.Run(name, func(t *testing.T) {
			detail, bad := judgeHAMiShared(limit, 1, tc.probes)
			got := strings.Join(bad, "; ")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("got %q (%s), want %q", got, detail, tc.want)
			}
		})
	}
}
