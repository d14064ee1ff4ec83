package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

// containerEnv is what a container that references ids sees of Tessera: its
// TESSERA_GPU_* variables, sorted.
func containerEnv(t *testing.T, e *env, ids []string) []string {
	t.Helper()
	var out []string
	for _, kv := range inject(t, ids, e.cdiRoot).Process.Env {
		if strings.HasPrefix(kv, "TESSERA_GPU_") {
			out = append(out, kv)
		}
	}
	slices.Sort(out)
	return out
}

// idsOf are the CDI IDs of the devices of the named requests, as the kubelet
// passes them for a container that references those requests.
func idsOf(devs []any, requests ...string) []string {
	var ids []string
	for _, x := range devs {
		for _, d := range x.([]deviceResult) {
			if len(requests) == 0 || slices.Contains(requests, d.request) {
				ids = append(ids, d.ids...)
			}
		}
	}
	return ids
}

type deviceResult struct {
	request string
	ids     []string
}

func results(t *testing.T, p *Plugin, c *resourceapi.ResourceClaim) []deviceResult {
	t.Helper()
	var out []deviceResult
	for _, d := range mustPrepare(t, p, c) {
		out = append(out, deviceResult{request: d.Requests[0], ids: d.CDIDeviceIDs})
	}
	return out
}

// TestContainerCombinations: whatever combination of claims and requests a
// container references, it sees exactly the GPUs of those and, for each
// share, that share's limits. The kubelet passes a container the CDI IDs of
// the requests it references, of every claim it references, and the runtime
// merges their edits.
func TestContainerCombinations(t *testing.T) {
	e := newEnv(t)
	p := e.start(nil)
	twoRequests := results(t, p.Plugin, newClaim("uid-two", []result{
		share("small", "gpu-0-shared", "s-1", "8Gi", "10"),
		whole("big", "gpu-2"),
	}))
	shared := results(t, p.Plugin, newClaim("uid-shared", []result{share("gpu", "gpu-1-shared", "s-2", "20Gi", "25")}))
	wholeGPU := results(t, p.Plugin, newClaim("uid-whole", []result{whole("gpu", "gpu-3")}))

	gpu := func(minor int) string { return isolation.GPUVariable(minor) + "=" + publishtest.UUID(minor) }
	for name, tc := range map[string]struct {
		ids  []string
		want []string
	}{
		"one request (share) of a two-request claim": {
			ids:  idsOf([]any{twoRequests}, "small"),
			want: []string{gpu(0), "TESSERA_GPU_0_CORES_LIMIT=10", "TESSERA_GPU_0_MEMORY_LIMIT=8589934592"},
		},
		"the other request (whole) of the same claim": {
			ids:  idsOf([]any{twoRequests}, "big"),
			want: []string{gpu(2)},
		},
		"two claims in one container": {
			ids: idsOf([]any{shared, twoRequests}),
			want: []string{gpu(0), "TESSERA_GPU_0_CORES_LIMIT=10", "TESSERA_GPU_0_MEMORY_LIMIT=8589934592",
				gpu(1), "TESSERA_GPU_1_CORES_LIMIT=25", "TESSERA_GPU_1_MEMORY_LIMIT=21474836480", gpu(2)},
		},
		"a shared claim and a whole-GPU claim": {
			ids:  idsOf([]any{wholeGPU, shared}),
			want: []string{gpu(1), "TESSERA_GPU_1_CORES_LIMIT=25", "TESSERA_GPU_1_MEMORY_LIMIT=21474836480", gpu(3)},
		},
		"init container with the whole-GPU claim": {
			ids:  idsOf([]any{wholeGPU}),
			want: []string{gpu(3)},
		},
		"main container with the shared claim": {
			ids:  idsOf([]any{shared}),
			want: []string{gpu(1), "TESSERA_GPU_1_CORES_LIMIT=25", "TESSERA_GPU_1_MEMORY_LIMIT=21474836480"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			slices.Sort(tc.want)
			if diff := cmp.Diff(tc.want, containerEnv(t, e, tc.ids)); diff != "" {
				t.Errorf("TESSERA_GPU_* in the container (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAdminAccessSurvivesRestart: an admin-access result holds nothing, before
// and after a restart: no double grant is reported, the GPU's real owner stays
// in the index, and unpreparing the admin claim leaves the owner's hold.
func TestAdminAccessSurvivesRestart(t *testing.T) {
	e := newEnv(t)
	p := e.start(nil)
	owner := newClaim("uid-owner", []result{whole("gpu", "gpu-0")})
	admin := newClaim("uid-admin", []result{whole("gpu", "gpu-0")})
	admin.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	mustPrepare(t, p.Plugin, owner)
	mustPrepare(t, p.Plugin, admin)
	if c, _ := p.store.Get("uid-admin"); !c.Devices[0].AdminAccess {
		t.Fatalf("checkpoint lost admin access: %+v", c.Devices[0])
	}

	p = e.start(nil)
	for _, ev := range e.events.List() {
		if strings.Contains(ev, "DoubleGrant") {
			t.Errorf("restart reported %q", ev)
		}
	}
	mustUnprepare(t, p.Plugin, "uid-admin")
	if r := prepare(t, p.Plugin, newClaim("uid-thief", []result{whole("gpu", "gpu-0")})); r.Err == nil {
		t.Error("gpu-0 given to a second claim: the owner was dropped from the index")
	}
	mustUnprepare(t, p.Plugin, "uid-owner")
	e.assertClean(p)
}

// TestSharesNeverOversubscribe: whatever the allocation says, prepare refuses
// shares that would take more than a GPU's memory or cores, with an event on
// the claim naming the GPU and the totals; the capacity counts what each
// share consumes, also after a restart.
func TestSharesNeverOversubscribe(t *testing.T) {
	for name, tc := range map[string]struct {
		first, second result
		want          string
	}{
		"memory": {
			first:  share("gpu", "gpu-0-shared", "s-1", "50Gi", "10"),
			second: share("gpu", "gpu-0-shared", "s-2", "40Gi", "10"),
			want:   "memory 96636764160 bytes > 85899345920",
		},
		"cores": {
			first:  share("gpu", "gpu-0-shared", "s-1", "10Gi", "60"),
			second: share("gpu", "gpu-0-shared", "s-2", "10Gi", "50"),
			want:   "cores 110% > 100%",
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			p := e.start(nil)
			mustPrepare(t, p.Plugin, newClaim("uid-a", []result{tc.first}))
			p = e.start(nil) // consumed capacity comes back from the checkpoint
			r := prepare(t, p.Plugin, newClaim("uid-b", []result{tc.second}))
			if r.Err == nil || !strings.Contains(r.Err.Error(), tc.want) || !strings.Contains(r.Err.Error(), "gpu-0") {
				t.Fatalf("prepare = %v, want an error naming gpu-0 and %q", r.Err, tc.want)
			}
			var claimEvents []string
			for _, ev := range e.events.List() {
				if strings.HasPrefix(ev, "claim default/claim-uid-b: Warning GPUOversubscribed") {
					claimEvents = append(claimEvents, ev)
				}
			}
			if len(claimEvents) != 1 {
				t.Errorf("events %q, want one GPUOversubscribed on the claim", e.events.List())
			}
			// A share that fits still prepares.
			mustPrepare(t, p.Plugin, newClaim("uid-c", []result{share("gpu", "gpu-0-shared", "s-3", "10Gi", "10")}))
		})
	}
}

// TestSharesAllocatedBeforeReservedMemoryPrepare: claims the scheduler
// allocated while the GPU published NVML's total (before an upgrade to
// total − reserved, or before a driver update raised the reserved memory)
// still prepare once the GPU publishes less, up to NVML's total and no
// further.
func TestSharesAllocatedBeforeReservedMemoryPrepare(t *testing.T) {
	e := newEnv(t)
	gpus := publishtest.GPUs()
	for i := range gpus {
		gpus[i].MemoryTotalBytes = gpus[i].MemoryBytes
		gpus[i].MemoryReservedBytes = 470 << 20
		gpus[i].MemoryBytes -= gpus[i].MemoryReservedBytes
	}
	p := e.start(func(o *Options) { o.GPUs = gpus })
	mustPrepare(t, p.Plugin, newClaim("uid-a", []result{share("gpu", "gpu-0-shared", "s-1", "40Gi", "10")}))
	mustPrepare(t, p.Plugin, newClaim("uid-b", []result{share("gpu", "gpu-0-shared", "s-2", "40Gi", "10")}))
	p = e.start(func(o *Options) { o.GPUs = gpus })
	for _, ev := range e.events.List() {
		if strings.Contains(ev, "DoubleGrant") || strings.Contains(ev, "Oversubscribed") {
			t.Errorf("restart reported %q", ev)
		}
	}
	if r := prepare(t, p.Plugin, newClaim("uid-c", []result{share("gpu", "gpu-0-shared", "s-3", "1Mi", "10")})); r.Err == nil {
		t.Error("a share beyond NVML's total prepared")
	}
}

// TestRecoveryWaitsForTheLock: a surge instance starting while the old one is
// inside a prepare (holding the helper's serialize.lock) waits for it, and
// then loses nothing of what the old one prepared.
func TestRecoveryWaitsForTheLock(t *testing.T) {
	e := newEnv(t)
	lockPath := filepath.Join(filepath.Dir(e.checkpoint), "serialize.lock")
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o755); err != nil {
		t.Fatal(err)
	}
	old := e.start(nil)

	// The old instance is inside a prepare: the helper holds the lock (taken
	// as kubeletplugin takes it), the checkpoint says PrepareStarted.
	held, err := fileutil.LockFile(lockPath, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	unlock := func() { _ = held.Close() }
	c := newClaim("uid-mid", []result{share("gpu", "gpu-1-shared", "s", "4Gi", "10")}, claimConfig(isolationConfig(configapi.IsolationMPS)))
	if err := old.store.Put(checkpoint.Claim{UID: c.UID, Namespace: "default", Name: c.Name, State: checkpoint.PrepareStarted}); err != nil {
		t.Fatal(err)
	}

	started := make(chan *Plugin, 1)
	go func() {
		p, err := Open(ctxFor(t), lockPath, e.checkpoint, e.bootID, Options{
			NodeName: testNode, GPUs: publishtest.GPUs(), Specs: old.specs, Mock: true,
			MPS: isolation.NewMPS(e.mpsRoot, e.runner), Events: e.events,
		})
		if err != nil {
			t.Errorf("Open: %v", err)
		}
		started <- p
	}()
	select {
	case <-started:
		t.Fatal("the surge instance recovered while the old one held the lock")
	case <-time.After(300 * time.Millisecond):
	}

	// The old instance finishes its prepare and the helper unlocks.
	if err := old.store.Delete(c.UID); err != nil {
		t.Fatal(err)
	}
	devs := mustPrepare(t, old.Plugin, c)
	unlock()

	var surge *Plugin
	select {
	case surge = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the surge instance did not start after the lock was released")
	}
	if surge == nil {
		return
	}
	if got, ok := surge.opts.Store.Get(c.UID); !ok || got.State != checkpoint.PrepareCompleted {
		t.Fatalf("surge instance lost the claim the old one prepared: %+v %v", got, ok)
	}
	if _, err := os.Stat(old.specs.Path(c.UID)); err != nil {
		t.Errorf("spec of the claim removed: %v", err)
	}
	if got := mustPrepare(t, surge, c); !cmp.Equal(got, devs) {
		t.Errorf("surge instance answers %v, want %v", got, devs)
	}
}

// TestPrepareRewritesMissingSpec: a prepared claim whose CDI spec vanished
// (a cleared /var/run/cdi) or was changed gets it back on the next prepare,
// so the IDs the kubelet gets resolve.
func TestPrepareRewritesMissingSpec(t *testing.T) {
	e := newEnv(t)
	p := e.start(nil)
	c := newClaim("uid-gone", []result{share("gpu", "gpu-0-shared", "s", "8Gi", "10")})
	devs := mustPrepare(t, p.Plugin, c)
	want := inject(t, cdiIDs(devs), e.cdiRoot).Process.Env
	mustPrepare(t, p.Plugin, c)
	for _, ev := range e.events.List() {
		if strings.Contains(ev, "CDISpecRewritten") {
			t.Fatalf("an intact spec was rewritten: %s", ev)
		}
	}

	for name, damage := range map[string]func(path string) error{
		"removed":   os.Remove,
		"truncated": func(path string) error { return os.WriteFile(path, []byte("{"), 0o644) },
	} {
		if err := damage(p.specs.Path(c.UID)); err != nil {
			t.Fatal(err)
		}
		again := mustPrepare(t, p.Plugin, c)
		if !cmp.Equal(again, devs) {
			t.Errorf("%s: prepare again = %v, want %v", name, again, devs)
		}
		if got := inject(t, cdiIDs(again), e.cdiRoot).Process.Env; !cmp.Equal(got, want) {
			t.Errorf("%s: env after rewrite %v, want %v", name, got, want)
		}
	}
	// The kubelet does not prepare a prepared claim again; a restarted
	// plugin checks every spec at start.
	if err := os.Remove(p.specs.Path(c.UID)); err != nil {
		t.Fatal(err)
	}
	p = e.start(nil)
	if got := inject(t, cdiIDs(devs), e.cdiRoot).Process.Env; !cmp.Equal(got, want) {
		t.Errorf("after restart: env %v, want %v", got, want)
	}
	mustUnprepare(t, p.Plugin, c.UID)
	e.assertClean(p)
}

// notDurableStore reports every Delete as written but not durable
// (checkpoint.ErrNotDurable), as a failing directory sync does.
type notDurableStore struct{ checkpoint.Store }

func (s notDurableStore) Delete(uid types.UID) error {
	if err := s.Store.Delete(uid); err != nil {
		return err
	}
	return fmt.Errorf("checkpoint: %w", checkpoint.ErrNotDurable)
}

// TestNotDurableDeleteLeavesNoHold: an unprepare whose checkpoint delete was
// not durable is still done: the GPU is free for the next claim.
func TestNotDurableDeleteLeavesNoHold(t *testing.T) {
	e := newEnv(t)
	p := e.start(func(o *Options) { o.Store = notDurableStore{o.Store} })
	mustPrepare(t, p.Plugin, newClaim("uid-a", []result{whole("gpu", "gpu-0")}))
	mustUnprepare(t, p.Plugin, "uid-a")
	mustPrepare(t, p.Plugin, newClaim("uid-b", []result{whole("gpu", "gpu-0")}))
}

// TestUnsetIsolationFollowsTheClaim: a share request whose configs set no
// isolation takes the backend another share request of the claim sets, not
// the node's default (which would make the claim's backends differ).
func TestUnsetIsolationFollowsTheClaim(t *testing.T) {
	e := newEnv(t)
	p := e.start(func(o *Options) { o.DefaultIsolation = configapi.IsolationMPS })
	c := newClaim("uid-mixed", []result{
		share("a", "gpu-0-shared", "s-a", "8Gi", "10"),
		share("b", "gpu-1-shared", "s-b", "8Gi", "10"),
	}, claimConfig(isolationConfig(configapi.IsolationAdvisory), "a"))
	mustPrepare(t, p.Plugin, c)
	got, _ := p.store.Get(c.UID)
	for _, d := range got.Devices {
		if d.Isolation != string(configapi.IsolationAdvisory) {
			t.Errorf("device %s: isolation %s, want Advisory", d.Device, d.Isolation)
		}
	}
}
