package plugin

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

const testNode = "node-a"

// env is one node's state that survives a plugin restart: the directories
// and the (fake) MPS daemons, which are processes outside the plugin.
type env struct {
	t          testing.TB
	cdiRoot    string
	checkpoint string
	mpsRoot    string
	hamiLib    string
	preload    string
	runner     *isolation.FakeRunner
	events     *publishtest.Events
	bootID     string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{
		t:          t,
		cdiRoot:    filepath.Join(dir, "cdi"),
		checkpoint: filepath.Join(dir, "plugin", "checkpoint.json"),
		mpsRoot:    filepath.Join(dir, "mps"),
		hamiLib:    filepath.Join(dir, "hami", "libvgpu.so"),
		runner:     isolation.NewFakeRunner(),
		events:     &publishtest.Events{},
		bootID:     "boot-1",
	}
	if err := os.MkdirAll(filepath.Dir(e.hamiLib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.hamiLib, []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	preload, err := isolation.WritePreloadFile(filepath.Join(dir, "plugin", "hami"))
	if err != nil {
		t.Fatal(err)
	}
	e.preload = preload
	return e
}

// instance is one plugin process over env.
type instance struct {
	*Plugin
	store *checkpoint.File
	specs *cdi.Dir
	rec   checkpoint.Recovery
}

// ctxFor logs through t in tests; benchmarks discard logs, as production runs
// at a verbosity where the per-write lines cost nothing.
func ctxFor(t testing.TB) context.Context {
	if _, ok := t.(*testing.B); ok {
		return klog.NewContext(context.Background(), logr.Discard())
	}
	_, ctx := ktesting.NewTestContext(t)
	return ctx
}

// start builds a plugin instance over e in mock mode; mutate may change the
// options before New (store wrappers, real mode).
func (e *env) start(mutate func(*Options)) *instance {
	e.t.Helper()
	ctx := ctxFor(e.t)
	store, rec, err := checkpoint.Open(ctx, e.checkpoint, e.bootID)
	if err != nil {
		e.t.Fatalf("open checkpoint: %v", err)
	}
	specs, err := cdi.NewDir(e.cdiRoot)
	if err != nil {
		e.t.Fatal(err)
	}
	opts := Options{
		NodeName: testNode,
		GPUs:     publishtest.GPUs(),
		Store:    store,
		Recovery: rec,
		Specs:    specs,
		Mock:     true,
		MPS:      isolation.NewMPS(e.mpsRoot, e.runner),
		HAMiCore: isolation.HAMiCore{Library: e.hamiLib, PreloadFile: e.preload, ClaimRoot: e.hamiClaims()},
		Events:   e.events,
	}
	if mutate != nil {
		mutate(&opts)
	}
	p, err := New(ctx, opts)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	return &instance{Plugin: p, store: store, specs: specs, rec: rec}
}

// assertClean fails unless nothing of any claim is left: no spec files, no
// checkpoint entries, no MPS daemons, no grants.
func (e *env) assertClean(i *instance) {
	e.t.Helper()
	entries, err := os.ReadDir(e.cdiRoot)
	if err != nil {
		e.t.Fatal(err)
	}
	var files []string
	for _, en := range entries {
		files = append(files, en.Name())
	}
	if len(files) != 0 {
		e.t.Errorf("CDI root not empty: %v", files)
	}
	if claims := i.store.List(); len(claims) != 0 {
		e.t.Errorf("checkpoint not empty: %v", claims)
	}
	if running, _ := e.runner.Running(context.Background()); len(running) != 0 {
		e.t.Errorf("MPS daemons still running: %v", running)
	}
	if holders := i.opts.MPS.Holders(); len(holders) != 0 {
		e.t.Errorf("MPS holders left: %v", holders)
	}
	if n := i.grants.count(); n != 0 {
		e.t.Errorf("%d claims still hold GPUs", n)
	}
	if dirs, err := os.ReadDir(e.hamiClaims()); err == nil && len(dirs) != 0 {
		e.t.Errorf("HAMi-core claim directories left: %v", dirs)
	}
}

// hamiClaims is the HAMi-core claim root of the env's plugins.
func (e *env) hamiClaims() string { return filepath.Join(filepath.Dir(e.preload), "claims") }

// result is one device result as the allocator writes it.
type result struct {
	request string
	device  string
	pool    string // default testNode
	shareID string
	memory  string // consumedCapacity memory, "" for none
	cores   string // consumedCapacity cores, "" for none
}

func whole(request, device string) result { return result{request: request, device: device} }

func share(request, device, shareID, memory, cores string) result {
	return result{request: request, device: device, shareID: shareID, memory: memory, cores: cores}
}

// config is one opaque config entry as the allocation carries it.
type config struct {
	source   resourceapi.AllocationConfigSource
	requests []string
	raw      string
}

func claimConfig(raw string, requests ...string) config {
	return config{source: resourceapi.AllocationConfigSourceClaim, requests: requests, raw: raw}
}

func newClaim(uid string, results []result, configs ...config) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "claim-" + uid, UID: types.UID(uid)},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for _, r := range results {
		pool := r.pool
		if pool == "" {
			pool = testNode
		}
		res := resourceapi.DeviceRequestAllocationResult{Request: r.request, Driver: model.DriverName, Pool: pool, Device: r.device}
		if r.shareID != "" {
			id := types.UID(r.shareID)
			res.ShareID = &id
		}
		if r.memory != "" || r.cores != "" {
			res.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
			if r.memory != "" {
				res.ConsumedCapacity["memory"] = resource.MustParse(r.memory)
			}
			if r.cores != "" {
				res.ConsumedCapacity["cores"] = resource.MustParse(r.cores)
			}
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, res)
	}
	for _, cfg := range configs {
		c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source:   cfg.source,
			Requests: cfg.requests,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: model.DriverName, Parameters: runtime.RawExtension{Raw: []byte(cfg.raw)},
			}},
		})
	}
	return c
}

func isolationConfig(iso configapi.Isolation) string {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig",
		"sharing": map[string]any{"isolation": iso},
	})
	return string(b)
}

// prepare prepares one claim and returns its result; t fails on an overall error.
func prepare(t testing.TB, p *Plugin, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	t.Helper()
	res, err := p.PrepareResourceClaims(ctxFor(t), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatalf("PrepareResourceClaims: overall error %v", err)
	}
	r, ok := res[c.UID]
	if !ok || len(res) != 1 {
		t.Fatalf("PrepareResourceClaims: want exactly one result for %s, got %v", c.UID, res)
	}
	return r
}

func mustPrepare(t testing.TB, p *Plugin, c *resourceapi.ResourceClaim) []kubeletplugin.Device {
	t.Helper()
	r := prepare(t, p, c)
	if r.Err != nil {
		t.Fatalf("prepare %s: %v", c.Name, r.Err)
	}
	return r.Devices
}

func mustUnprepare(t testing.TB, p *Plugin, uid types.UID) {
	t.Helper()
	res, err := p.UnprepareResourceClaims(ctxFor(t), []kubeletplugin.NamespacedObject{{
		NamespacedName: types.NamespacedName{Namespace: "default", Name: "claim-" + string(uid)}, UID: uid,
	}})
	if err != nil {
		t.Fatalf("UnprepareResourceClaims: %v", err)
	}
	if e, ok := res[uid]; !ok || e != nil {
		t.Fatalf("unprepare %s: %v (present %v)", uid, e, ok)
	}
}

func cdiIDs(devs []kubeletplugin.Device) []string {
	var ids []string
	for _, d := range devs {
		ids = append(ids, d.CDIDeviceIDs...)
	}
	return ids
}

// inject does what the runtime does: load the CDI specs from dirs with the CDI
// library and apply the devices to a fresh OCI spec.
func inject(t testing.TB, ids []string, dirs ...string) *oci.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dirs...), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI library could not load the specs: %v", errs)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/usr/bin"}}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("inject %v: %v (unresolved %v)", ids, err, unresolved)
	}
	return spec
}

func cdiEnv(env ...string) cdispec.ContainerEdits { return cdispec.ContainerEdits{Env: env} }
