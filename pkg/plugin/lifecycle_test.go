package plugin

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

// TestRestartUnprepareFromCheckpoint: prepare in one plugin instance,
// unprepare in a fresh one built from the same directories (the claim object
// is not available to it); nothing is left behind.
func TestRestartUnprepareFromCheckpoint(t *testing.T) {
	e := newEnv(t)
	a := e.start(nil)
	claims := []*resourceapi.ResourceClaim{
		newClaim("uid-r1", []result{whole("gpu", "gpu-2")}),
		newClaim("uid-r2", []result{share("gpu", "gpu-1-shared", "s-1", "8Gi", "20")}, claimConfig(isolationConfig(configapi.IsolationMPS))),
		newClaim("uid-r3", []result{share("gpu", "gpu-1-shared", "s-2", "8Gi", "20")}, claimConfig(isolationConfig(configapi.IsolationMPS))),
		newClaim("uid-r4", []result{share("gpu", "gpu-3-shared", "s-3", "4Gi", "10")}, claimConfig(isolationConfig(configapi.IsolationHAMiCore))),
	}
	first := map[types.UID][]string{}
	for _, c := range claims {
		first[c.UID] = cdiIDs(mustPrepare(t, a.Plugin, c))
	}
	if starts, _ := e.runner.Counts(); starts != 1 {
		t.Fatalf("want one MPS daemon for two MPS shares of gpu-1, started %d", starts)
	}

	b := e.start(nil) // a "crashed": no shutdown
	if b.rec.Kind != checkpoint.RecoveryNone {
		t.Errorf("recovery %q, want None", b.rec.Kind)
	}
	// Prepare is idempotent across the restart: same CDI IDs.
	if got := cdiIDs(mustPrepare(t, b.Plugin, claims[1])); !cmp.Equal(first[claims[1].UID], got) {
		t.Errorf("CDI IDs after restart %v, want %v", got, first[claims[1].UID])
	}
	// The restored holder count keeps the daemon up until the last share goes.
	mustUnprepare(t, b.Plugin, claims[1].UID)
	if running, _ := e.runner.Running(ctxFor(t)); len(running) != 1 {
		t.Errorf("daemon stopped while uid-r3 still holds gpu-1: running %v", running)
	}
	for _, c := range claims {
		mustUnprepare(t, b.Plugin, c.UID)
	}
	// Unknown claims unprepare fine, twice.
	mustUnprepare(t, b.Plugin, "uid-never-prepared")
	mustUnprepare(t, b.Plugin, claims[0].UID)
	e.assertClean(b)
	if starts, stops := e.runner.Counts(); starts != 1 || stops != 1 {
		t.Errorf("MPS daemon starts/stops = %d/%d, want 1/1", starts, stops)
	}
}

// faultyStore and faultySpecs inject failures at the seams of prepare.
type faultyStore struct {
	checkpoint.Store
	put func(c checkpoint.Claim) error
}

func (f faultyStore) Put(c checkpoint.Claim) error {
	if err := f.put(c); err != nil {
		return err
	}
	return f.Store.Put(c)
}

type faultySpecs struct {
	Specs
	write func(uid types.UID) error
}

func (f faultySpecs) Write(uid types.UID, devs []cdi.Device, record []byte) ([]string, error) {
	if err := f.write(uid); err != nil {
		return nil, err
	}
	return f.Specs.Write(uid, devs, record)
}

// crash ends the calling goroutine on the spot, like a killed process: no
// error path, no rollback runs (deferred unlocks do, which a dead process
// does not need).
func crash() error { runtime.Goexit(); return nil }

// prepareUntilCrash runs prepare in its own goroutine and waits for it to end.
func prepareUntilCrash(t *testing.T, p *Plugin, c *resourceapi.ResourceClaim) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = p.PrepareResourceClaims(ctxFor(t), []*resourceapi.ResourceClaim{c})
		t.Errorf("prepare of %s returned instead of crashing", c.Name)
	}()
	<-done
}

// TestCrashConsistency injects a failure, as an error and as a crash, after
// the CDI write and before the checkpoint write, and before the CDI write
// after the checkpoint write. The next prepare (same or restarted instance)
// converges and, after unprepare, nothing leaks.
func TestCrashConsistency(t *testing.T) {
	mpsClaim := func(uid string) *resourceapi.ResourceClaim {
		return newClaim(uid, []result{share("gpu", "gpu-0-shared", "s-"+uid, "8Gi", "20")}, claimConfig(isolationConfig(configapi.IsolationMPS)))
	}
	boom := errors.New("injected failure")
	afterCDIBeforeCheckpoint := func(fail func() error) func(*Options) {
		return func(o *Options) {
			o.Store = faultyStore{Store: o.Store, put: func(c checkpoint.Claim) error {
				if c.State == checkpoint.PrepareCompleted {
					return fail()
				}
				return nil
			}}
		}
	}
	afterCheckpointBeforeCDI := func(fail func() error) func(*Options) {
		return func(o *Options) {
			o.Specs = faultySpecs{Specs: o.Specs, write: func(types.UID) error { return fail() }}
		}
	}

	for name, tc := range map[string]struct {
		inject func(*Options)
		crash  bool
	}{
		"error after CDI write, before checkpoint write": {inject: afterCDIBeforeCheckpoint(func() error { return boom })},
		"crash after CDI write, before checkpoint write": {inject: afterCDIBeforeCheckpoint(crash), crash: true},
		"error after checkpoint write, before CDI write": {inject: afterCheckpointBeforeCDI(func() error { return boom })},
		"crash after checkpoint write, before CDI write": {inject: afterCheckpointBeforeCDI(crash), crash: true},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			// Another claim on the same GPU keeps its daemon: rollback must
			// release only the failed claim's hold.
			healthy := mpsClaim("uid-healthy")
			victim := mpsClaim("uid-victim")
			mustPrepare(t, e.start(nil).Plugin, healthy)

			faulty := e.start(tc.inject)
			if tc.crash {
				prepareUntilCrash(t, faulty.Plugin, victim)
				// The crash left a half-done prepare behind.
				if c, ok := faulty.store.Get(victim.UID); !ok || c.State != checkpoint.PrepareStarted {
					t.Fatalf("after the crash the checkpoint holds %v (present %v), want PrepareStarted", c, ok)
				}
			} else {
				r := prepare(t, faulty.Plugin, victim)
				if r.Err == nil || !strings.Contains(r.Err.Error(), boom.Error()) {
					t.Fatalf("want the injected error, got %v", r.Err)
				}
				// Rolled back at once: the healthy claim is all there is.
				if got := faulty.store.List(); len(got) != 1 || got[0].UID != healthy.UID {
					t.Errorf("checkpoint after failed prepare: %v", got)
				}
				if uids, _ := faulty.specs.List(); !cmp.Equal(uids, []types.UID{healthy.UID}) {
					t.Errorf("CDI specs after failed prepare: %v", uids)
				}
			}

			// A fresh instance (after the crash, or the kubelet's retry)
			// converges: the retry prepares, unprepare leaves nothing.
			next := e.start(nil)
			if uids, _ := next.specs.List(); !cmp.Equal(uids, []types.UID{healthy.UID}) {
				t.Errorf("CDI specs after restart: %v, want only the healthy claim's", uids)
			}
			if c, ok := next.store.Get(victim.UID); ok {
				t.Errorf("victim still in checkpoint after restart: %v", c)
			}
			devs := mustPrepare(t, next.Plugin, victim)
			inject(t, cdiIDs(devs), e.cdiRoot)
			if h := next.opts.MPS.Holders()[publishtest.UUID(0)]; !cmp.Equal(h, []types.UID{healthy.UID, victim.UID}) {
				t.Errorf("MPS holders of gpu-0: %v", h)
			}
			mustUnprepare(t, next.Plugin, victim.UID)
			mustUnprepare(t, next.Plugin, healthy.UID)
			e.assertClean(next)
		})
	}
}

// TestParallelClaims prepares and unprepares 50 claims concurrently (run with
// -race) and checks the accounting exactly: specs, checkpoint entries, MPS
// holders and daemon starts.
func TestParallelClaims(t *testing.T) {
	e := newEnv(t)
	p := e.start(nil)
	const n = 50
	claims := make([]*resourceapi.ResourceClaim, n)
	mps := 0
	for i := range claims {
		uid := fmt.Sprintf("uid-par-%02d", i)
		switch i % 4 {
		case 0: // Advisory on gpu-0
			claims[i] = newClaim(uid, []result{share("gpu", "gpu-0-shared", "s"+uid, "1Gi", "2")})
		case 1: // MPS on gpu-1
			claims[i] = newClaim(uid, []result{share("gpu", "gpu-1-shared", "s"+uid, "1Gi", "2")}, claimConfig(isolationConfig(configapi.IsolationMPS)))
			mps++
		case 2: // HAMiCore on gpu-3
			claims[i] = newClaim(uid, []result{share("gpu", "gpu-3-shared", "s"+uid, "1Gi", "2")}, claimConfig(isolationConfig(configapi.IsolationHAMiCore)))
		case 3: // Advisory on gpu-2, one claim asking for the whole gpu-2 too
			claims[i] = newClaim(uid, []result{share("gpu", "gpu-2-shared", "s"+uid, "1Gi", "2")})
		}
	}
	parallel := func(f func(c *resourceapi.ResourceClaim)) {
		var wg sync.WaitGroup
		for _, c := range claims {
			wg.Go(func() { f(c) })
		}
		wg.Wait()
	}

	parallel(func(c *resourceapi.ResourceClaim) { mustPrepare(t, p.Plugin, c) })
	if got := len(p.store.List()); got != n {
		t.Errorf("checkpoint has %d claims, want %d", got, n)
	}
	for _, c := range p.store.List() {
		if c.State != checkpoint.PrepareCompleted {
			t.Errorf("claim %s in state %s", c, c.State)
		}
	}
	if uids, _ := p.specs.List(); len(uids) != n {
		t.Errorf("%d CDI specs, want %d", len(uids), n)
	}
	if got := len(p.opts.MPS.Holders()[publishtest.UUID(1)]); got != mps {
		t.Errorf("gpu-1 MPS daemon has %d holders, want %d", got, mps)
	}
	if starts, _ := e.runner.Counts(); starts != 1 {
		t.Errorf("MPS daemon started %d times, want 1", starts)
	}
	if got := p.grants.count(); got != n {
		t.Errorf("%d claims hold GPUs, want %d", got, n)
	}
	// A whole GPU under shares is refused (double grant), concurrently too.
	if r := prepare(t, p.Plugin, newClaim("uid-whole-2", []result{whole("gpu", "gpu-2")})); r.Err == nil {
		t.Error("whole gpu-2 prepared while it holds shares")
	}

	// Unprepare all while preparing them again: each claim's calls are
	// serialized, the end state depends only on the last call per claim.
	parallel(func(c *resourceapi.ResourceClaim) {
		mustUnprepare(t, p.Plugin, c.UID)
		mustPrepare(t, p.Plugin, c)
		mustUnprepare(t, p.Plugin, c.UID)
	})
	e.assertClean(p)
	if starts, stops := e.runner.Counts(); starts != stops {
		t.Errorf("MPS daemon starts %d != stops %d", starts, stops)
	}
}

// TestBadInput: every bad allocation or config fails that claim with a clear
// message naming the claim and device, and writes nothing.
func TestBadInput(t *testing.T) {
	mpsCfg := claimConfig(isolationConfig(configapi.IsolationMPS))
	for name, tc := range map[string]struct {
		claim     *resourceapi.ResourceClaim
		noHAMiLib bool
		want      []string
	}{
		"device of another node's pool": {
			claim: newClaim("uid-b1", []result{{request: "gpu", device: "gpu-0", pool: "node-b"}}),
			want:  []string{`claim default/claim-uid-b1 (uid uid-b1): device gpu-0: in pool "node-b", but this is the plugin of node "node-a"`},
		},
		"unknown device": {
			claim: newClaim("uid-b2", []result{whole("gpu", "gpu-9")}),
			want:  []string{"device gpu-9: unknown on node node-a (it has gpu-0, gpu-1, gpu-2, gpu-3)"},
		},
		"not a device name of this driver": {
			claim: newClaim("uid-b3", []result{whole("gpu", "nic-0")}),
			want:  []string{`device nic-0: device name "nic-0": not a gpu.tessera.dev device`},
		},
		"share without consumedCapacity": {
			claim: newClaim("uid-b4", []result{share("gpu", "gpu-0-shared", "s-4", "", "")}),
			want:  []string{`device gpu-0-shared: share s-4 has no consumedCapacity "memory"`},
		},
		"NVLink Required across domains": {
			claim: newClaim("uid-b5", []result{whole("gpus", "gpu-0"), whole("gpus", "gpu-2")},
				claimConfig(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","topology":{"nvlink":"Required"}}`)),
			want: []string{`topology.nvlink is Required: GPUs gpu-0 (nvlinkDomain "nvl-a"), gpu-2 (nvlinkDomain "nvl-b") do not share an NVLink domain`},
		},
		"HAMi-core library missing": {
			claim:     newClaim("uid-b6", []result{share("gpu", "gpu-3-shared", "s-6", "4Gi", "10")}, claimConfig(isolationConfig(configapi.IsolationHAMiCore))),
			noHAMiLib: true,
			want:      []string{"device gpu-3-shared: isolation HAMiCore: library ", "(--hami-core-library): not found; refusing to run the share without limits"},
		},
		"invalid GpuConfig": {
			claim: newClaim("uid-b7", []result{share("gpu", "gpu-0-shared", "s-7", "4Gi", "10")},
				claimConfig(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolaton":"MPS"}}`)),
			want: []string{"device gpu-0-shared: request \"gpu\": config 0 (FromClaim, all requests)", "isolaton"},
		},
		"compute limit below the guarantee": {
			claim: newClaim("uid-b8", []result{share("gpu", "gpu-0-shared", "s-8", "4Gi", "30")},
				claimConfig(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"computeLimit":20}}`)),
			want: []string{"device gpu-0-shared: request \"gpu\": sharing.computeLimit 20 is below the 30 cores"},
		},
		"MPS share together with a second GPU": {
			claim: newClaim("uid-b9", []result{share("a", "gpu-0-shared", "s-9", "4Gi", "10"), whole("b", "gpu-1")}, mpsCfg),
			want:  []string{"isolation MPS: the claim has 2 GPUs"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			if tc.noHAMiLib {
				if err := os.Remove(e.hamiLib); err != nil {
					t.Fatal(err)
				}
			}
			p := e.start(nil)
			r := prepare(t, p.Plugin, tc.claim)
			if r.Err == nil {
				t.Fatalf("prepare succeeded with devices %v", r.Devices)
			}
			for _, want := range tc.want {
				if !strings.Contains(r.Err.Error(), want) {
					t.Errorf("error %q\ndoes not contain %q", r.Err, want)
				}
			}
			if !strings.HasPrefix(r.Err.Error(), fmt.Sprintf("claim default/%s (uid %s): ", tc.claim.Name, tc.claim.UID)) {
				t.Errorf("error does not name the claim first: %q", r.Err)
			}
			e.assertClean(p)
		})
	}
}

// TestDoubleGrant: the plugin refuses a GPU already prepared for another
// claim in a conflicting way, naming both claims.
func TestDoubleGrant(t *testing.T) {
	e := newEnv(t)
	p := e.start(nil)
	owner := newClaim("uid-owner", []result{whole("gpu", "gpu-0")})
	mustPrepare(t, p.Plugin, owner)
	for _, c := range []*resourceapi.ResourceClaim{
		newClaim("uid-second", []result{whole("gpu", "gpu-0")}),
		newClaim("uid-share", []result{share("gpu", "gpu-0-shared", "s-1", "4Gi", "10")}),
	} {
		r := prepare(t, p.Plugin, c)
		if r.Err == nil {
			t.Fatalf("%s prepared on a GPU held by %s", c.Name, owner.Name)
		}
		for _, want := range []string{"device gpu-0 is already prepared for claim default/claim-uid-owner (uid uid-owner)", "claim default/" + c.Name} {
			if !strings.Contains(r.Err.Error(), want) {
				t.Errorf("error %q does not contain %q", r.Err, want)
			}
		}
	}
	// Survives a restart (rebuilt from the checkpoint).
	p = e.start(nil)
	if r := prepare(t, p.Plugin, newClaim("uid-third", []result{whole("gpu", "gpu-0")})); r.Err == nil {
		t.Fatal("double grant not detected after restart")
	}
	mustUnprepare(t, p.Plugin, owner.UID)
	mustPrepare(t, p.Plugin, newClaim("uid-second", []result{whole("gpu", "gpu-0")}))
	mustUnprepare(t, p.Plugin, "uid-second")
	e.assertClean(p)
}

// TestRecoveryAtStart: a corrupt checkpoint and a changed boot id are
// reported (log and Node event) and recovered from; CDI specs of claims the
// checkpoint does not hold are removed.
func TestRecoveryAtStart(t *testing.T) {
	t.Run("corrupt checkpoint", func(t *testing.T) {
		// Pods keep running when the checkpoint is lost: nothing may be
		// cleaned up on the grounds that the empty store lacks it.
		e := newEnv(t)
		p := e.start(nil)
		c1 := newClaim("uid-c1", []result{whole("gpu", "gpu-0")})
		c2 := newClaim("uid-c2", []result{share("gpu", "gpu-1-shared", "s", "4Gi", "10")}, claimConfig(isolationConfig(configapi.IsolationMPS)))
		want1, want2 := mustPrepare(t, p.Plugin, c1), mustPrepare(t, p.Plugin, c2)
		// A spec from an older Tessera carries no record: it cannot be
		// adopted, so nothing at all is cleaned up.
		if _, err := p.specs.Write("uid-old", []cdi.Device{{Name: "gpu-3", Edits: cdiEnv("A=1")}}, nil); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(e.checkpoint, []byte(`{"version":"v1","claims":{`), 0o600); err != nil {
			t.Fatal(err)
		}
		p = e.start(nil)
		if p.rec.Kind != checkpoint.RecoveryCorrupt {
			t.Fatalf("recovery %q, want Corrupt", p.rec.Kind)
		}
		ev := e.events.List()
		if len(ev) != 2 || !strings.HasPrefix(ev[0], "Warning CheckpointRecovered: ") ||
			!strings.HasPrefix(ev[1], "Warning CheckpointRebuilt: adopted 2 claims from their CDI specs into the checkpoint; kept 1 specs") {
			t.Errorf("events %q, want CheckpointRecovered and CheckpointRebuilt (2 adopted, 1 kept)", ev)
		}
		if uids, _ := p.specs.List(); !slices.Equal(uids, []types.UID{"uid-c1", "uid-c2", "uid-old"}) {
			t.Errorf("specs after recovery %v: a spec was deleted", uids)
		}
		if running, _ := e.runner.Running(ctxFor(t)); !slices.Equal(gpusOf(running), []string{publishtest.UUID(1)}) {
			t.Errorf("MPS daemons after recovery %v, want the share's", running)
		}
		// The next start (the checkpoint is valid now) deletes nothing either.
		p = e.start(nil)
		if uids, _ := p.specs.List(); !slices.Equal(uids, []types.UID{"uid-c1", "uid-c2", "uid-old"}) {
			t.Errorf("specs after the next restart %v: a spec was deleted", uids)
		}
		if running, _ := e.runner.Running(ctxFor(t)); !slices.Equal(gpusOf(running), []string{publishtest.UUID(1)}) {
			t.Errorf("MPS daemons after the next restart %v, want the share's", running)
		}
		// The rebuilt entries answer as before and still hold their GPUs.
		if got := mustPrepare(t, p.Plugin, c1); !cmp.Equal(got, want1) {
			t.Errorf("prepare again after rebuild: %v, want %v", got, want1)
		}
		if got := mustPrepare(t, p.Plugin, c2); !cmp.Equal(got, want2) {
			t.Errorf("prepare again after rebuild: %v, want %v", got, want2)
		}
		if r := prepare(t, p.Plugin, newClaim("uid-c3", []result{whole("gpu", "gpu-0")})); r.Err == nil {
			t.Error("gpu-0 given to a second claim after the checkpoint was rebuilt")
		}
		mustUnprepare(t, p.Plugin, "uid-c1")
		mustUnprepare(t, p.Plugin, "uid-c2")
		mustUnprepare(t, p.Plugin, "uid-old")
		e.assertClean(p)
	})
	t.Run("node rebooted", func(t *testing.T) {
		e := newEnv(t)
		p := e.start(nil)
		mustPrepare(t, p.Plugin, newClaim("uid-c2", []result{share("gpu", "gpu-1-shared", "s", "4Gi", "10")}, claimConfig(isolationConfig(configapi.IsolationMPS))))
		e.bootID = "boot-2"
		p = e.start(nil)
		if p.rec.Kind != checkpoint.RecoveryRebooted || len(p.rec.Dropped) != 1 {
			t.Fatalf("recovery %q with %d dropped, want Rebooted with 1", p.rec.Kind, len(p.rec.Dropped))
		}
		if ev := e.events.List(); len(ev) != 1 || !strings.Contains(ev[0], "CheckpointRecovered") {
			t.Errorf("events %q", ev)
		}
		e.assertClean(p) // stale spec removed, orphaned daemon stopped
	})
	t.Run("stray spec and foreign files", func(t *testing.T) {
		// A spec the checkpoint lacks is adopted from its record, or kept
		// when it has none; files that are not ours are never touched.
		e := newEnv(t)
		p := e.start(nil)
		c := newClaim("uid-lost", []result{whole("gpu", "gpu-2")})
		want := mustPrepare(t, p.Plugin, c)
		if err := p.store.Delete(c.UID); err != nil { // as if the entry were lost
			t.Fatal(err)
		}
		if _, err := p.specs.Write("uid-stray", []cdi.Device{{Name: "gpu-0", Edits: cdiEnv("A=1")}}, nil); err != nil {
			t.Fatal(err)
		}
		foreign := e.cdiRoot + "/gpu.tessera.dev_metadata_uid-x_gpu.json"
		if err := os.WriteFile(foreign, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		p = e.start(nil)
		if uids, _ := p.specs.List(); !slices.Equal(uids, []types.UID{"uid-lost", "uid-stray"}) {
			t.Errorf("specs after restart %v, want both kept", uids)
		}
		if got, ok := p.store.Get(c.UID); !ok || got.State != checkpoint.PrepareCompleted {
			t.Errorf("the lost entry was not adopted: %+v %v", got, ok)
		}
		if got := mustPrepare(t, p.Plugin, c); !cmp.Equal(got, want) {
			t.Errorf("prepare after adoption = %v, want %v", got, want)
		}
		if _, err := os.Stat(foreign); err != nil {
			t.Errorf("a file that is not ours was touched: %v", err)
		}
	})
}

// TestRollingUpdateInstancesShareTheCheckpoint runs two instances over the same
// dirs, as the old and new pod of a surge rolling update do. The kubelet plugin
// helper serializes their calls; each sees what the other prepared, so the new
// one refuses to double-grant the old one's GPU and can unprepare its claims.
func TestRollingUpdateInstancesShareTheCheckpoint(t *testing.T) {
	e := newEnv(t)
	old := e.start(nil)
	surge := e.start(nil) // opened before the old pod's last prepare

	x := newClaim("uid-x", []result{whole("gpu", "gpu-0")})
	y := newClaim("uid-y", []result{whole("gpu", "gpu-0")})
	z := newClaim("uid-z", []result{share("gpu", "gpu-1-shared", "s-z", "4Gi", "10")}, claimConfig(isolationConfig(configapi.IsolationMPS)))
	mustPrepare(t, old.Plugin, x)
	mustPrepare(t, old.Plugin, z)

	res := prepare(t, surge.Plugin, y)
	if res.Err == nil || !strings.Contains(res.Err.Error(), "already prepared for claim default/claim-uid-x") {
		t.Fatalf("the new instance gave gpu-0 to uid-y while uid-x holds it: err = %v", res.Err)
	}
	// The kubelet now talks to the new instance only: it unprepares the old
	// instance's claims from the shared checkpoint, MPS daemon included.
	mustUnprepare(t, surge.Plugin, x.UID)
	mustUnprepare(t, surge.Plugin, z.UID)
	if got := old.store.List(); len(got) != 2 {
		t.Fatalf("sanity: the old instance's own view still has %d claims before refreshing, want 2", len(got))
	}
	mustPrepare(t, surge.Plugin, y)
	mustUnprepare(t, surge.Plugin, y.UID)
	e.assertClean(surge)
	if starts, stops := e.runner.Counts(); starts != 1 || stops != 1 {
		t.Errorf("MPS daemon starts/stops = %d/%d, want 1/1", starts, stops)
	}
}
