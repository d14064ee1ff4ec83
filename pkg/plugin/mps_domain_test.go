package plugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

// gpusOf are the GPUs of running daemons, in order, without repeats.
func gpusOf(keys []isolation.DaemonKey) []string {
	var out []string
	for _, k := range keys {
		if !slices.Contains(out, k.GPU) {
			out = append(out, k.GPU)
		}
	}
	return out
}

// mountOf returns the host path the container gets at containerPath.
func mountOf(t *testing.T, e *env, ids []string, containerPath string) string {
	t.Helper()
	spec := inject(t, ids, e.cdiRoot)
	for _, m := range spec.Mounts {
		if m.Destination == containerPath {
			return m.Source
		}
	}
	t.Fatalf("no mount at %s in %v", containerPath, spec.Mounts)
	return ""
}

// TestMPSNamespacesNeverShare: MPS shares of one GPU in two namespaces run
// with two daemons, and the containers get different pipe and shared-memory
// directories; the checkpoint records each share's domain, a restarted
// plugin keeps both daemons, and unpreparing one namespace's last claim
// stops only its daemon. Before per-domain daemons both containers got the
// GPU's one root/<uuid>/shm as /dev/shm.
func TestMPSNamespacesNeverShare(t *testing.T) {
	e := newEnv(t)
	a := e.start(nil)
	mps := claimConfig(isolationConfig(configapi.IsolationMPS))
	one := newClaim("uid-a", []result{share("gpu", "gpu-1-shared", "s-1", "8Gi", "20")}, mps)
	one.Namespace = "team-a"
	two := newClaim("uid-b", []result{share("gpu", "gpu-1-shared", "s-2", "8Gi", "20")}, mps)
	two.Namespace = "team-b"
	idsA := cdiIDs(mustPrepare(t, a.Plugin, one))
	idsB := cdiIDs(mustPrepare(t, a.Plugin, two))

	for _, path := range []string{isolation.MPSShmContainerDir, isolation.MPSPipeContainerDir} {
		if ha, hb := mountOf(t, e, idsA, path), mountOf(t, e, idsB, path); ha == hb {
			t.Errorf("both namespaces' containers get %s at %s", ha, path)
		}
	}
	want := []isolation.DaemonKey{{GPU: publishtest.UUID(1), Domain: "team-a"}, {GPU: publishtest.UUID(1), Domain: "team-b"}}
	if running, _ := e.runner.Running(ctxFor(t)); !cmp.Equal(running, want) {
		t.Errorf("running daemons %v, want %v", running, want)
	}
	rec, _ := a.store.Get("uid-b")
	if rec.Devices[0].MPSDomain != "team-b" {
		t.Errorf("checkpoint records domain %q, want team-b", rec.Devices[0].MPSDomain)
	}

	b := e.start(nil)
	if got := b.opts.MPS.DaemonHolders(); !cmp.Equal(got, map[isolation.DaemonKey][]types.UID{want[0]: {"uid-a"}, want[1]: {"uid-b"}}) {
		t.Errorf("holders after a restart: %v", got)
	}
	mustUnprepare(t, b.Plugin, "uid-a")
	if running, _ := e.runner.Running(ctxFor(t)); !cmp.Equal(running, want[1:]) {
		t.Errorf("running after team-a's last claim: %v, want only team-b's", running)
	}
	mustUnprepare(t, b.Plugin, "uid-b")
	e.assertClean(b)
}

// TestMPSRecordWithoutDomain: a claim prepared by a release that ran one MPS
// daemon per GPU (its checkpoint record has no mpsDomain) keeps that
// GPU-wide daemon and its directories after an upgrade, until it is
// unprepared.
func TestMPSRecordWithoutDomain(t *testing.T) {
	e := newEnv(t)
	a := e.start(nil)
	c := newClaim("uid-old", []result{share("gpu", "gpu-1-shared", "s-1", "8Gi", "20")}, claimConfig(isolationConfig(configapi.IsolationMPS)))
	ids := cdiIDs(mustPrepare(t, a.Plugin, c))
	// Make the record and the spec what the earlier release wrote.
	rec, _ := a.store.Get("uid-old")
	rec.Devices[0].MPSDomain = ""
	if err := a.store.Put(rec); err != nil {
		t.Fatal(err)
	}
	mustUnprepareKeepingRecord := func() {
		if err := a.opts.MPS.Release(context.Background(), publishtest.UUID(1), "default", "uid-old"); err != nil {
			t.Fatal(err)
		}
	}
	mustUnprepareKeepingRecord()
	if err := os.RemoveAll(e.cdiRoot); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(e.cdiRoot, 0o755); err != nil {
		t.Fatal(err)
	}

	b := e.start(nil)
	legacy := isolation.DaemonKey{GPU: publishtest.UUID(1)}
	if running, _ := e.runner.Running(ctxFor(t)); !cmp.Equal(running, []isolation.DaemonKey{legacy}) {
		t.Errorf("running after the upgrade: %v, want the GPU-wide daemon %v", running, legacy)
	}
	// The spec the plugin writes again for the record uses that daemon's
	// directories.
	got, _ := b.store.Get("uid-old")
	if got.State != checkpoint.PrepareCompleted {
		t.Fatalf("record state %s", got.State)
	}
	if err := b.ensureSpec(ctxFor(t), got); err != nil {
		t.Fatal(err)
	}
	if src := mountOf(t, e, ids, isolation.MPSShmContainerDir); src != filepath.Join(e.mpsRoot, publishtest.UUID(1), "shm") {
		t.Errorf("/dev/shm of the old claim is %s, want the GPU-wide daemon's", src)
	}
	mustUnprepare(t, b.Plugin, "uid-old")
	e.assertClean(b)
}

// TestMPSNamespaceSharesOfOneSize: the MPS daemon of a (GPU, namespace)
// holds every client to its first share's memory limit (its default, which
// a client's environment cannot lift), so a share of another memory in the
// same namespace on the GPU fails to prepare, naming both, and leaves
// nothing behind; the same memory joins whatever its cores, another size in
// another namespace or on another GPU is prepared, and a restarted plugin
// refuses the same.
func TestMPSNamespaceSharesOfOneSize(t *testing.T) {
	e := newEnv(t)
	a := e.start(nil)
	mps := claimConfig(isolationConfig(configapi.IsolationMPS))
	claim := func(uid, ns, device, counter, memory, cores string) *resourceapi.ResourceClaim {
		c := newClaim(uid, []result{share("gpu", device, counter, memory, cores)}, mps)
		c.Namespace = ns
		return c
	}
	mustPrepare(t, a.Plugin, claim("uid-a", "team-a", "gpu-1-shared", "s-1", "8Gi", "20"))
	mustPrepare(t, a.Plugin, claim("uid-b", "team-a", "gpu-1-shared", "s-2", "8Gi", "30"))
	r := prepare(t, a.Plugin, claim("uid-c", "team-a", "gpu-1-shared", "s-3", "16Gi", "20"))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "MPS shares of one namespace on one GPU must have the same memory limit") ||
		!strings.Contains(r.Err.Error(), "pinned device memory 16") || !strings.Contains(r.Err.Error(), "holds its clients to 8192 MiB") {
		t.Fatalf("a 16Gi share beside 8Gi ones of its namespace on gpu-1: %v, want the refusal naming both", r.Err)
	}
	if _, ok := a.store.Get("uid-c"); ok {
		t.Error("the refused claim is in the checkpoint")
	}
	mustPrepare(t, a.Plugin, claim("uid-d", "team-b", "gpu-1-shared", "s-4", "16Gi", "40"))
	mustPrepare(t, a.Plugin, claim("uid-e", "team-a", "gpu-2-shared", "s-5", "16Gi", "40"))

	b := e.start(nil)
	if r := prepare(t, b.Plugin, claim("uid-c", "team-a", "gpu-1-shared", "s-3", "16Gi", "40")); r.Err == nil {
		t.Error("after a restart the 16Gi share beside the 8Gi ones is prepared")
	}
}
