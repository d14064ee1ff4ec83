package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/plugin"
	"github.com/tessera-dev/tessera/pkg/publish"
)

func procs() int { return runtime.GOMAXPROCS(0) }

// Timing of the publication checks: the controller's follow-up syncs are
// shortened to syncDelay/cacheTTL, and a publication counts as finished once
// no write happened for publishQuiet (several follow-up syncs).
const (
	syncDelay      = 20 * time.Millisecond
	cacheTTL       = 100 * time.Millisecond
	publishQuiet   = 400 * time.Millisecond
	publishTimeout = 20 * time.Second
)

// startNode wires the plugin the way cmd/tessera-kubelet-plugin does in mock
// mode, over files in dir and the per-boot ones (CDI specs, HAMiCore claim
// directories) in runDir.
func startNode(ctx context.Context, profile, dir, runDir string) (*node, error) {
	lib, err := gpu.NewMock(profile)
	if err != nil {
		return nil, err
	}
	if err := gpu.Open(lib); err != nil {
		return nil, err
	}
	discover := func() ([]gpu.GPU, error) { return gpu.Discover(lib) }
	gpus, err := discover()
	if err != nil {
		return nil, fmt.Errorf("discover mock profile %s: %w", profile, err)
	}

	store, rec, err := checkpoint.Open(ctx, filepath.Join(dir, "plugin", "checkpoint.json"), "nodebench-boot")
	if err != nil {
		return nil, err
	}
	specs, err := cdi.NewDir(filepath.Join(runDir, "cdi"))
	if err != nil {
		return nil, err
	}
	// HAMi-core is checked for presence only; in mock mode nothing loads it.
	hamiLib := filepath.Join(dir, "hami", "libvgpu.so")
	if err := os.MkdirAll(filepath.Dir(hamiLib), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(hamiLib, []byte("not a library: mock mode never loads it\n"), 0o644); err != nil {
		return nil, err
	}
	preload, err := isolation.WritePreloadFile(filepath.Join(dir, "plugin", "hami"))
	if err != nil {
		return nil, err
	}

	p, err := plugin.New(ctx, plugin.Options{
		NodeName: nodeName,
		GPUs:     gpus,
		Store:    store,
		Recovery: rec,
		Specs:    specs,
		Mock:     true,
		MPS:      isolation.NewMPS(filepath.Join(dir, "mps"), isolation.NewFakeRunner()),
		HAMiCore: isolation.HAMiCore{Library: hamiLib, PreloadFile: preload, ClaimRoot: filepath.Join(runDir, "hami-claims")},
		// The spec carries the hook; in mock mode no runtime runs it.
		DriverMemory: isolation.DriverMemory{Capable: true, HookPath: "/usr/bin/nvidia-cdi-hook", DriverRoot: "/"},
	})
	if err != nil {
		return nil, err
	}
	api := newAPIServer(nodeName)
	n := &node{
		plugin: p, store: store, specs: specs, gpus: gpus, api: api,
		pub: &slicePublisher{ctx: ctx, nodeName: nodeName, client: api.client, syncDelay: syncDelay, cacheTTL: cacheTTL},
	}
	n.inv = &publish.Inventory{NodeName: nodeName, DiscoverNode: publish.NVMLDiscovery(lib, nil), Publisher: n.pub, OnChange: p.SetGPUs, Taints: n.currentTaints}
	return n, nil
}

func (n *node) currentTaints() map[string][]resourceapi.DeviceTaint {
	n.taintsMu.Lock()
	defer n.taintsMu.Unlock()
	out := make(map[string][]resourceapi.DeviceTaint, len(n.taints))
	for k, v := range n.taints {
		out[k] = slices.Clone(v)
	}
	return out
}

// publishFirst publishes through the inventory and waits for the slices.
func (n *node) publishFirst(ctx context.Context, w *APIWrites) error {
	res, err := model.Resources(nodeName, n.gpus)
	if err != nil {
		return err
	}
	want := len(res.Pools[nodeName].Slices)
	w.Slices = want
	if _, err := n.inv.Sync(ctx); err != nil {
		return fmt.Errorf("first publish: %w", err)
	}
	devices := 0
	for _, s := range res.Pools[nodeName].Slices {
		devices += len(s.Devices)
	}
	w.Publish, err = n.api.settle(ctx, func(got []resourceapi.ResourceSlice) bool {
		d := 0
		for _, s := range got {
			d += len(s.Spec.Devices)
		}
		return len(got) == want && d == devices
	}, publishQuiet, publishTimeout)
	if err != nil {
		return fmt.Errorf("first publish: %w (controller errors: %v)", err, n.pub.err())
	}
	return n.pub.err()
}

// republish publishes the unchanged node twice: through the inventory (which
// should skip it) and by calling PublishResources directly.
func (n *node) republish(ctx context.Context, w *APIWrites) error {
	before := n.api.writes()
	changed, err := n.inv.Sync(ctx)
	if err != nil {
		return fmt.Errorf("republish: %w", err)
	}
	w.InventorySkipsUnchanged = !changed
	res, err := model.Resources(nodeName, n.gpus)
	if err != nil {
		return err
	}
	if err := n.pub.PublishResources(ctx, res); err != nil {
		return err
	}
	after, err := n.api.settle(ctx, func([]resourceapi.ResourceSlice) bool { return true }, publishQuiet, publishTimeout)
	if err != nil {
		return fmt.Errorf("republish: %w", err)
	}
	w.Republish = after.sub(before)
	return n.pub.err()
}

// healthChange taints one GPU the way the health tracker does and publishes
// through the inventory.
func (n *node) healthChange(ctx context.Context, w *APIWrites) error {
	sick := n.gpus[len(n.gpus)/2]
	taint := health.Status{Effect: resourceapi.DeviceTaintEffectNoSchedule, Reason: "XID 63 (row remapping pending)"}.Taint()
	if taint == nil {
		return errors.New("health change: the tracker's status gave no taint")
	}
	n.taintsMu.Lock()
	n.taints = map[string][]resourceapi.DeviceTaint{sick.UUID: {*taint}}
	n.taintsMu.Unlock()

	before := n.api.writes()
	if changed, err := n.inv.Sync(ctx); err != nil || !changed {
		return fmt.Errorf("health change: published %v, error %v", changed, err)
	}
	names := []string{model.WholeDeviceName(sick.Minor), model.SharedDeviceName(sick.Minor)}
	after, err := n.api.settle(ctx, func(got []resourceapi.ResourceSlice) bool {
		tainted := 0
		for _, s := range got {
			for _, d := range s.Spec.Devices {
				if slices.Contains(names, d.Name) && slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == health.TaintKey }) {
					tainted++
				}
			}
		}
		return tainted == len(names)
	}, publishQuiet, publishTimeout)
	if err != nil {
		return fmt.Errorf("health change: %w (controller errors: %v)", err, n.pub.err())
	}
	w.HealthChange = after.sub(before)
	return n.pub.err()
}

// gpuConfig is the opaque claim config that picks the isolation backend.
func gpuConfig(iso configapi.Isolation) ([]byte, error) {
	return json.Marshal(configapi.GpuConfig{
		TypeMeta: metav1.TypeMeta{APIVersion: configapi.SchemeGroupVersion.String(), Kind: configapi.GpuConfigKind},
		Sharing:  &configapi.SharingConfig{Isolation: iso},
	})
}

// shareClaim is a claim for one share of gpu-<minor>-shared as the allocator
// writes it: 4Gi and 5 cores, so that 13 shares fit on one 80 GB GPU.
func shareClaim(name string, minor int, config []byte) *resourceapi.ResourceClaim {
	shareID := uuid.NewUUID()
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: uuid.NewUUID()},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: model.DriverName, Pool: nodeName, Device: model.SharedDeviceName(minor),
				ShareID: &shareID,
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
					"memory": resource.MustParse("4Gi"),
					"cores":  resource.MustParse("5"),
				},
			}},
			Config: []resourceapi.DeviceAllocationConfiguration{{
				Source:   resourceapi.AllocationConfigSourceClaim,
				Requests: []string{"gpu"},
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver: model.DriverName, Parameters: k8sruntime.RawExtension{Raw: config},
				}},
			}},
		}}},
	}
}

// cycle prepares and unprepares one claim and returns how long both took.
func (n *node) cycle(ctx context.Context, claim *resourceapi.ResourceClaim) (time.Duration, error) {
	start := time.Now()
	res, err := n.plugin.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		return 0, fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	if r, ok := res[claim.UID]; !ok || r.Err != nil || len(r.Devices) == 0 {
		return 0, fmt.Errorf("prepare claim %s/%s: result %+v", claim.Namespace, claim.Name, r)
	}
	un, err := n.plugin.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{
		NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, UID: claim.UID,
	}})
	if err != nil {
		return 0, fmt.Errorf("unprepare claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	if err, ok := un[claim.UID]; !ok || err != nil {
		return 0, fmt.Errorf("unprepare claim %s/%s: %v (result present: %v)", claim.Namespace, claim.Name, err, ok)
	}
	return time.Since(start), nil
}

func (n *node) sequential(ctx context.Context, iso configapi.Isolation, claims int) (Latency, error) {
	config, err := gpuConfig(iso)
	if err != nil {
		return Latency{}, err
	}
	times := make([]time.Duration, 0, claims)
	start := time.Now()
	for i := range claims {
		d, err := n.cycle(ctx, shareClaim(fmt.Sprintf("seq-%s-%d", iso, i), i%len(n.gpus), config))
		if err != nil {
			return Latency{}, fmt.Errorf("%s, sequential: %w", iso, err)
		}
		times = append(times, d)
	}
	return summarize(times, time.Since(start), 0), nil
}

func (n *node) concurrent(ctx context.Context, iso configapi.Isolation, claims, rounds int) (Latency, error) {
	config, err := gpuConfig(iso)
	if err != nil {
		return Latency{}, err
	}
	times := make([]time.Duration, 0, claims*rounds)
	var wall time.Duration
	for r := range rounds {
		batch := make([]*resourceapi.ResourceClaim, claims)
		for i := range batch {
			batch[i] = shareClaim(fmt.Sprintf("conc-%s-%d-%d", iso, r, i), i%len(n.gpus), config)
		}
		got := make([]time.Duration, claims)
		errs := make([]error, claims)
		var ready, done sync.WaitGroup
		startGun := make(chan struct{})
		ready.Add(claims)
		done.Add(claims)
		for i, c := range batch {
			go func() {
				defer done.Done()
				ready.Done()
				<-startGun
				got[i], errs[i] = n.cycle(ctx, c)
			}()
		}
		ready.Wait()
		start := time.Now()
		close(startGun)
		done.Wait()
		wall += time.Since(start)
		if err := errors.Join(errs...); err != nil {
			return Latency{}, fmt.Errorf("%s, concurrent round %d: %w", iso, r, err)
		}
		if err := n.assertClean(); err != nil {
			return Latency{}, fmt.Errorf("%s, after concurrent round %d: %w", iso, r, err)
		}
		times = append(times, got...)
	}
	return summarize(times, wall, claims), nil
}

// assertClean fails unless every claim was unprepared completely.
func (n *node) assertClean() error {
	if claims := n.store.List(); len(claims) != 0 {
		return fmt.Errorf("%d claims left in the checkpoint", len(claims))
	}
	specs, err := n.specs.List()
	if err != nil {
		return err
	}
	if len(specs) != 0 {
		return fmt.Errorf("%d CDI specs left in %s", len(specs), n.specs.Root())
	}
	return nil
}

// summarize takes nearest-rank percentiles.
func summarize(times []time.Duration, wall time.Duration, perRound int) Latency {
	slices.Sort(times)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(times)))) - 1
		return times[max(i, 0)]
	}
	return Latency{Claims: len(times), P50: rank(0.50), P99: rank(0.99), Max: times[len(times)-1], Wall: wall, ClaimsPerRound: perRound}
}
