package gpucheck

import (
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/mig"
)

// migGPUs is the hgx-h100-mig node's GPUs as discovery sees them now: GPU 0
// in MIG mode with a 4g.40gb at 0-3 and a 3g.40gb at 4-7, GPU 1 in MIG
// mode without instances, the others not in MIG mode.
func migGPUs(t *testing.T, node *gpu.MockNode) []gpu.GPU {
	t.Helper()
	d, err := gpu.DiscoverNode(node)
	if err != nil {
		t.Fatal(err)
	}
	return d.GPUs
}

func TestPlanMIG(t *testing.T) {
	node := gputest.MockNode(t, "hgx-h100-mig")
	plan, why := planMIG(migGPUs(t, node))
	if why != "" || plan.gpu.Minor != 1 || plan.profile.Name != "1g.10gb" || len(plan.placements) != 2 || plan.placements[0].Start != 6 || plan.placements[1].Start != 5 {
		t.Fatalf("plan %+v (%s), want 1g.10gb at 6 and 5 on gpu-1 (gpu-0 is full)", plan, why)
	}
	// Six 1g.10gb on GPU 1 leave one slot: one placement, the free one.
	for _, start := range []int{0, 1, 2, 4, 5, 6} {
		if _, _, err := node.CreateMIGInstance(1, "1g.10gb", start); err != nil {
			t.Fatal(err)
		}
	}
	if plan, why = planMIG(migGPUs(t, node)); why != "" || len(plan.placements) != 1 || plan.placements[0].Start != 3 {
		t.Errorf("one slot left: %+v (%s), want 1g.10gb at 3 only", plan, why)
	}
	// A seventh fills it: nothing is free anywhere.
	if _, _, err := node.CreateMIGInstance(1, "1g.10gb", 3); err != nil {
		t.Fatal(err)
	}
	if _, why = planMIG(migGPUs(t, node)); !strings.Contains(why, "no MIG GPU with a free placement") || !strings.Contains(why, "gpu-1: no free placement") {
		t.Errorf("full: %q", why)
	}
	// A node without MIG GPUs is a skip that says the check never turns
	// MIG mode on.
	plain := gputest.MockNode(t, "hgx-h100")
	if _, why = planMIG(migGPUs(t, plain)); !strings.Contains(why, "never turns MIG mode on") {
		t.Errorf("no MIG GPU: %q", why)
	}
	// A GPU whose MIG mode change is pending is left alone.
	node = gputest.MockNode(t, "hgx-h100-mig")
	if err := node.SetMIGPending(1, false); err != nil {
		t.Fatal(err)
	}
	if _, why = planMIG(migGPUs(t, node)); !strings.Contains(why, "gpu-1: MIG mode change pending") {
		t.Errorf("pending: %q", why)
	}
}

// TestRunMockMIG: on the hgx-h100-mig mock node the MIG checks run through
// the check's own plugin (dynamic MIG on gpu-1): two 1g.10gb instances
// created by prepare and destroyed by unprepare, probes in each seeing
// their own MIG device and its memory; an admin's idle instance on gpu-1 is
// left alone (the planner places around it), and gpu-0's static instances
// too.
func TestRunMockMIG(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulated probes")
	}
	_, ctx := ktesting.NewTestContext(t)
	cfg := simConfigOf(t, "hgx-h100-mig", configapi.IsolationAdvisory)
	node := cfg.NVML.(*gpu.MockNode)
	gi, _, err := node.CreateMIGInstance(1, "1g.10gb", 0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(ctx, cfg, DefaultTargets)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Errorf("not OK: %v", r.Incomplete)
	}
	create := checkNamed(t, r, migCreateCheckName)
	if create.Status != StatusSimulated || strings.Count(create.Detail, "prepare of gpucheck-mig-") != 2 || !strings.Contains(create.Detail, "unprepare destroyed them") ||
		!strings.Contains(create.Detail, "the 1 instances the check did not create are as they were") || strings.Contains(create.Detail, "kept from destroying") {
		t.Errorf("create: %s: %s", create.Status, create.Detail)
	}
	for _, name := range []string{migMemoryCheckName, migIsolationCheckName} {
		if c := checkNamed(t, r, name); c.Status != StatusSimulated {
			t.Errorf("%s: %s: %s", name, c.Status, c.Detail)
		}
	}
	uuid1, _ := node.Devices[1].GetUUID()
	g1, err := (&mig.NVML{Lib: node}).Read(uuid1)
	if err != nil {
		t.Fatal(err)
	}
	if len(g1.MIG.Instances) != 1 || g1.MIG.Instances[0].ID != gi || g1.MIG.Instances[0].Placement.Start != 0 {
		t.Errorf("gpu-1's instances after the check: %+v, want only the admin's at 0", g1.MIG.Instances)
	}
	uuid0, _ := node.Devices[0].GetUUID()
	if g0, _ := (&mig.NVML{Lib: node}).Read(uuid0); len(g0.MIG.Instances) != 2 {
		t.Errorf("gpu-0's static instances: %+v", g0.MIG.Instances)
	}
}

// TestRunMockMIGSeesAnother: a process in one instance that sees another
// instance's MIG device fails the isolation check (and the memory check).
func TestRunMockMIGSeesAnother(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulated probes")
	}
	_, ctx := ktesting.NewTestContext(t)
	cfg := simConfigOf(t, "hgx-h100-mig", configapi.IsolationAdvisory)
	ep := cfg.Prober.(ExecProber)
	ep.Command = append(ep.Command, "--simulate-fault", SimFaultMIGSeesAll)
	cfg.Prober = ep
	r, err := Run(ctx, cfg, DefaultTargets)
	if err != nil {
		t.Fatal(err)
	}
	if c := checkNamed(t, r, migIsolationCheckName); c.Status != StatusMismatch || !strings.Contains(c.Detail, "the process in A sees B's MIG device") {
		t.Errorf("isolation: %s: %s", c.Status, c.Detail)
	}
	if c := checkNamed(t, r, migMemoryCheckName); c.Status != StatusMismatch || !strings.Contains(c.Detail, "not only its MIG device") {
		t.Errorf("memory: %s: %s", c.Status, c.Detail)
	}
	if c := checkNamed(t, r, migCreateCheckName); c.Status != StatusSimulated {
		t.Errorf("create: %s: %s", c.Status, c.Detail)
	}
}

func TestJudgeMIGMemory(t *testing.T) {
	const uuid = "MIG-aaaaaaaa-0000-5000-8000-000000000001"
	const profile, device = 9984 << 20, 9984 << 20
	oom := "cuMemAlloc(1048576): CUDA_ERROR_OUT_OF_MEMORY (2)"
	probe := func(visible []string, total, alloc uint64, last string) MemoryProbe {
		p := MemoryProbe{TotalBytes: total, AllocatedBytes: alloc, LastError: last}
		p.Device.VisibleUUIDs = visible
		return p
	}
	own := []string{"aaaaaaaa-0000-5000-8000-000000000001"}
	for name, tc := range map[string]struct {
		p    MemoryProbe
		want string
	}{
		"ok":              {probe(own, 9728<<20, 9200<<20, oom), ""},
		"sees two":        {probe(append(own, "bbbbbbbb-0000-5000-8000-000000000002"), 9728<<20, 9200<<20, oom), "not only its MIG device"},
		"sees the GPU":    {probe([]string{"cccccccc-0000-5000-8000-000000000003"}, 9728<<20, 9200<<20, oom), "not only its MIG device"},
		"lists nothing":   {probe(nil, 9728<<20, 9200<<20, oom), "which devices it sees is unknown"},
		"whole GPU":       {probe(own, 81559<<20, 81000<<20, oom), "more than the instance's"},
		"too little":      {probe(own, 4096<<20, 4000<<20, oom), "less than 80 % of the instance's"},
		"cannot allocate": {probe(own, 9728<<20, 1024<<20, oom), "less than 80 % of the 9728 MiB it sees"},
		"not refused":     {probe(own, 9728<<20, 9200<<20, ""), "did not end with an out-of-memory refusal"},
		"beyond":          {probe(own, 9728<<20, 10240<<20, oom), "more than the 9728 MiB it sees"},
	} {
		t.Run(name, func(t *testing.T) {
			detail, bad := judgeMIGMemory(tc.p, uuid, profile, device, 1)
			got := strings.Join(bad, "; ")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("got %q (%s), want %q", got, detail, tc.want)
			}
		})
	}
}
