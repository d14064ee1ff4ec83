package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/metrics"
	"github.com/tessera-dev/tessera/pkg/mig"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/publish"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

// The hgx-h100-mig mock node: GPU 0 in MIG mode with a 4g.40gb at memory
// slices 0-3 (GPU instance 1) and a 3g.40gb at 4-7 (GPU instance 2), each
// with compute instance 0; GPU 1 in MIG mode without instances (dynamic in
// these tests); GPUs 2-7 not in MIG mode. Minors are NVML indexes.

// migNode is a fresh hgx-h100-mig mock node.
func migNode(t testing.TB) *gpu.MockNode {
	t.Helper()
	return gputest.MockNode(t, "hgx-h100-mig")
}

// dynamicGPU1 publishes GPU 1 (index 1) with dynamic MIG.
var dynamicGPU1 = publish.DynamicMIG{Names: []string{"1"}}

// startMIG starts a plugin over e on node: its GPUs as discovery sees them
// now, MIG instances managed through the node's NVML, GPU 1 dynamic.
func (e *env) startMIG(node *gpu.MockNode, mutate func(*Options)) *instance {
	e.t.Helper()
	d, err := gpu.DiscoverNode(node)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.start(func(o *Options) {
		o.GPUs, o.MIG, o.DynamicMIG = d.GPUs, &mig.NVML{Lib: node}, dynamicGPU1
		if mutate != nil {
			mutate(o)
		}
	})
}

// startMIGNode starts a plugin (startMIG) over a fresh env and a fresh
// hgx-h100-mig mock node.
func startMIGNode(t testing.TB, mutate func(*Options)) (*env, *gpu.MockNode, *instance) {
	t.Helper()
	e := newEnv(t)
	node := migNode(t)
	return e, node, e.startMIG(node, mutate)
}

// instances lists GPU i's GPU instances as NVML has them now.
func instances(t testing.TB, node *gpu.MockNode, i int) []gpu.MIGInstance {
	t.Helper()
	uuid, _ := node.Devices[i].GetUUID()
	g, err := (&mig.NVML{Lib: node}).Read(uuid)
	if err != nil {
		t.Fatal(err)
	}
	return g.MIG.Instances
}

func gpuUUID(node *gpu.MockNode, i int) string {
	u, _ := node.Devices[i].GetUUID()
	return u
}

// envOf is the environment of a container that references ids, by name.
func envOf(t testing.TB, e *env, ids ...string) map[string]string {
	t.Helper()
	spec := inject(t, ids, e.cdiRoot)
	out := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

func migRecord(t testing.TB, i *instance, uid types.UID) *checkpoint.MIGDevice {
	t.Helper()
	c, ok := i.store.Get(uid)
	if !ok || len(c.Devices) != 1 || c.Devices[0].MIG == nil {
		t.Fatalf("checkpoint record of %s: %+v (present %v)", uid, c, ok)
	}
	return c.Devices[0].MIG
}

// A static MIG device: prepare takes the admin's GPU instance as NVML has
// it now; the container gets its MIG UUID, profile and capability nodes,
// not the GPU; unprepare leaves the instance.
func TestMIGStaticPrepare(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	claim := newClaim("uid-static", []result{whole("mig", "gpu-0-mig-2")})
	devs := mustPrepare(t, i.Plugin, claim)
	in := instances(t, node, 0)
	if len(in) != 2 || in[1].ID != 2 || in[1].ProfileName != "3g.40gb" {
		t.Fatalf("instances %+v", in)
	}
	ci := in[1].ComputeInstances[0]
	env := envOf(t, e, cdiIDs(devs)...)
	want := map[string]string{
		"TESSERA_MIG_0_2_0":         ci.UUID,
		"TESSERA_MIG_0_2_0_PROFILE": "3g.40gb",
		"TESSERA_MIG_0_2_0_CAPS":    fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d,/dev/nvidia-caps/nvidia-cap%d", in[1].AccessMinor, ci.AccessMinor),
		"CUDA_VISIBLE_DEVICES":      ci.UUID,
		"NVIDIA_VISIBLE_DEVICES":    "void",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q (env %v)", k, env[k], v, env)
		}
	}
	if _, ok := env["TESSERA_GPU_0"]; ok {
		t.Errorf("the container gets the GPU: %v", env)
	}
	if m := migRecord(t, i, claim.UID); m.Dynamic || m.UUID != ci.UUID || m.GPUInstance != 2 || m.Start != 4 || m.Size != 4 {
		t.Errorf("record %+v", m)
	}
	mustUnprepare(t, i.Plugin, claim.UID)
	if in := instances(t, node, 0); len(in) != 2 {
		t.Errorf("unprepare of a static MIG device changed the instances: %+v", in)
	}
	e.assertClean(i)
}

// A static device whose instance an admin destroyed after it was published
// fails with the reason, read from NVML rather than the inventory.
func TestMIGStaticGone(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	if err := node.DestroyMIGInstance(0, 2); err != nil {
		t.Fatal(err)
	}
	r := prepare(t, i.Plugin, newClaim("uid-gone", []result{whole("mig", "gpu-0-mig-2")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "has no GPU instance 2 now") {
		t.Fatalf("prepare: %v", r.Err)
	}
	// MIG mode turned off (and the GPU reset) since discovery.
	if err := node.SetMIG(0, false); err != nil {
		t.Fatal(err)
	}
	r = prepare(t, i.Plugin, newClaim("uid-mode", []result{whole("mig", "gpu-0-mig-1")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "is not in MIG mode now") {
		t.Fatalf("prepare after MIG mode went off: %v", r.Err)
	}
	e.assertClean(i)
}

// A dynamic MIG device: prepare creates the GPU instance at exactly the
// allocated placement and its compute instance, records them, and the
// container gets that MIG device; a repeated prepare answers the same
// without a second instance; unprepare destroys it.
func TestMIGDynamicPrepare(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	claim := newClaim("uid-dyn", []result{whole("mig", "gpu-1-mig-3g-40gb-4")})
	devs := mustPrepare(t, i.Plugin, claim)
	in := instances(t, node, 1)
	if len(in) != 1 || in[0].Placement != (gpu.MIGPlacement{Start: 4, Size: 4}) || in[0].ProfileName != "3g.40gb" || len(in[0].ComputeInstances) != 1 {
		t.Fatalf("instances after prepare: %+v", in)
	}
	ci := in[0].ComputeInstances[0]
	m := migRecord(t, i, claim.UID)
	if !m.Dynamic || m.UUID != ci.UUID || m.GPUInstance != in[0].ID || m.ComputeInstance != ci.ID || m.GPUInstanceMinor != in[0].AccessMinor || m.ComputeInstanceMinor != ci.AccessMinor {
		t.Errorf("record %+v, instance %+v", m, in[0])
	}
	prefix := isolation.MIGVariable(1, in[0].ID, ci.ID)
	env := envOf(t, e, cdiIDs(devs)...)
	if env[prefix] != ci.UUID || env[prefix+"_PROFILE"] != "3g.40gb" || env["CUDA_VISIBLE_DEVICES"] != ci.UUID {
		t.Errorf("env %v", env)
	}
	if held := i.MIGHeld(); !slices.Equal(held[gpuUUID(node, 1)], []model.MIGHold{{ProfileID: in[0].ProfileID, Placement: gpu.MIGPlacement{Start: 4, Size: 4}}}) || len(held) != 1 {
		t.Errorf("held %v", held)
	}
	again := mustPrepare(t, i.Plugin, claim)
	if !slices.Equal(cdiIDs(again), cdiIDs(devs)) || len(instances(t, node, 1)) != 1 {
		t.Errorf("second prepare: %v (first %v), instances %+v", cdiIDs(again), cdiIDs(devs), instances(t, node, 1))
	}
	mustUnprepare(t, i.Plugin, claim.UID)
	if in := instances(t, node, 1); len(in) != 0 {
		t.Errorf("instances after unprepare: %+v", in)
	}
	if held := i.MIGHeld(); len(held) != 0 {
		t.Errorf("held after unprepare %v", held)
	}
	e.assertClean(i)
}

// On a real node a MIG device's spec carries the parent's device nodes and
// both capability nodes, and the driver's libraries from the toolkit spec's
// common edits (the toolkit has no device for it); without a toolkit spec it
// uses the legacy runtime's device list, or fails closed before any
// instance is made.
func TestMIGRealNodeCDI(t *testing.T) {
	for name, tc := range map[string]struct {
		toolkit cdi.StaticToolkit
		legacy  bool
		err     string
	}{
		"toolkit spec":            {toolkit: cdi.StaticToolkit{"GPU-other": true}},
		"legacy NVIDIA runtime":   {legacy: true},
		"neither: refused, clean": {err: "no NVIDIA container toolkit CDI spec"},
	} {
		t.Run(name, func(t *testing.T) {
			e, node, i := startMIGNode(t, func(o *Options) {
				o.Mock, o.DevNodes, o.Toolkit, o.LegacyRuntime = false, isolation.StaticDevNodes{UVMMajor: 508, CapsMajor: 509}, tc.toolkit, tc.legacy
			})
			claim := newClaim("uid-real", []result{whole("mig", "gpu-1-mig-1g-10gb-6")})
			r := prepare(t, i.Plugin, claim)
			if tc.err != "" {
				if r.Err == nil || !strings.Contains(r.Err.Error(), tc.err) {
					t.Fatalf("prepare: %v, want %q", r.Err, tc.err)
				}
				if in := instances(t, node, 1); len(in) != 0 {
					t.Errorf("an instance was made: %+v", in)
				}
				e.assertClean(i)
				return
			}
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			in := instances(t, node, 1)
			if len(in) != 1 {
				t.Fatalf("instances %+v", in)
			}
			ci := in[0].ComputeInstances[0]
			spec := inject(t, cdiIDs(r.Devices), e.cdiRoot)
			wantNodes := []oci.LinuxDevice{
				{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1},
				{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
				{Path: "/dev/nvidia-uvm", Type: "c", Major: 508, Minor: 0},
				{Path: "/dev/nvidia-uvm-tools", Type: "c", Major: 508, Minor: 1},
				{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", in[0].AccessMinor), Type: "c", Major: 509, Minor: int64(in[0].AccessMinor)},
				{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", ci.AccessMinor), Type: "c", Major: 509, Minor: int64(ci.AccessMinor)},
			}
			var got []oci.LinuxDevice
			for _, d := range spec.Linux.Devices {
				got = append(got, oci.LinuxDevice{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor})
			}
			if !slices.Equal(got, wantNodes) {
				t.Errorf("device nodes\n got %+v\nwant %+v", got, wantNodes)
			}
			var mounts []string
			for _, m := range spec.Mounts {
				mounts = append(mounts, m.Source+":"+m.Destination)
			}
			want := "/usr/lib/x86_64-linux-gnu/libcuda.so.1:/usr/lib/x86_64-linux-gnu/libcuda.so.1"
			if tc.legacy {
				want = "/dev/null:/var/run/nvidia-container-devices/" + ci.UUID
			}
			if !slices.Equal(mounts, []string{want}) {
				t.Errorf("mounts %v, want %s", mounts, want)
			}
			mustUnprepare(t, i.Plugin, claim.UID)
			e.assertClean(i)
		})
	}
}

// Two MIG devices of one GPU in one container, from one claim or from two:
// each has its own variables, none overwrites the other's, and within one
// claim CUDA_VISIBLE_DEVICES names both. That is what the container is
// given, not what one process can use: a CUDA process enumerates a single
// MIG device (NVIDIA MIG user guide, "CUDA Device Enumeration"), so a
// container uses two by running a process per device, each with
// CUDA_VISIBLE_DEVICES set from that device's TESSERA_MIG_… variable. This
// test checks the environment only (mock mode: no CUDA runs).
func TestMIGTwoDevicesOneContainer(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	both := newClaim("uid-two", []result{whole("a", "gpu-1-mig-1g-10gb-6"), whole("b", "gpu-1-mig-1g-10gb-5")})
	devs := mustPrepare(t, i.Plugin, both)
	in := instances(t, node, 1)
	if len(in) != 2 {
		t.Fatalf("instances %+v", in)
	}
	env := envOf(t, e, cdiIDs(devs)...)
	var uuids []string
	for _, gi := range in {
		ci := gi.ComputeInstances[0]
		prefix := isolation.MIGVariable(1, gi.ID, ci.ID)
		if env[prefix] != ci.UUID || env[prefix+"_PROFILE"] != "1g.10gb" {
			t.Errorf("GPU instance %d: %s=%q %s_PROFILE=%q", gi.ID, prefix, env[prefix], prefix, env[prefix+"_PROFILE"])
		}
		uuids = append(uuids, ci.UUID)
	}
	got := strings.Split(env["CUDA_VISIBLE_DEVICES"], ",")
	slices.Sort(got)
	slices.Sort(uuids)
	if !slices.Equal(got, uuids) {
		t.Errorf("CUDA_VISIBLE_DEVICES=%q, want both of %v", env["CUDA_VISIBLE_DEVICES"], uuids)
	}

	// Two claims, one container.
	c1 := newClaim("uid-c1", []result{whole("mig", "gpu-1-mig-1g-10gb-4")})
	c2 := newClaim("uid-c2", []result{whole("mig", "gpu-1-mig-1g-10gb-3")})
	ids := append(cdiIDs(mustPrepare(t, i.Plugin, c1)), cdiIDs(mustPrepare(t, i.Plugin, c2))...)
	env = envOf(t, e, ids...)
	n := 0
	for k, v := range env {
		if strings.HasPrefix(k, "TESSERA_MIG_1_") && !strings.Contains(k[len("TESSERA_MIG_1_"):], "_P") && !strings.HasSuffix(k, "_CAPS") {
			n++
			if !strings.HasPrefix(v, "MIG-") {
				t.Errorf("%s=%s", k, v)
			}
		}
	}
	if n != 2 {
		t.Errorf("two claims in one container: %d MIG variables, want 2 (env %v)", n, env)
	}
	for _, uid := range []types.UID{both.UID, c1.UID, c2.UID} {
		mustUnprepare(t, i.Plugin, uid)
	}
	if in := instances(t, node, 1); len(in) != 0 {
		t.Errorf("instances left %+v", in)
	}
	e.assertClean(i)
}

// A pod whose claims mix a claim of MIG devices only (which sets
// CUDA_VISIBLE_DEVICES to its MIG UUIDs) with a claim of a whole GPU gets a
// Warning on its claims: a container that references both would see no
// GPU of the other claim. Two MIG-only claims of one pod get one too; claims
// of different pods, or a single claim, get none.
func TestMIGVisibleDevicesWarning(t *testing.T) {
	e, _, i := startMIGNode(t, nil)
	forPod := func(c *resourceapi.ResourceClaim, pod string) *resourceapi.ResourceClaim {
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID("uid-" + pod)}}
		return c
	}
	migClaim := forPod(newClaim("uid-m", []result{whole("mig", "gpu-1-mig-1g-10gb-6")}), "mixed")
	gpuClaim := forPod(newClaim("uid-g", []result{whole("gpu", "gpu-2")}), "mixed")
	res, err := i.PrepareResourceClaims(ctxFor(t), []*resourceapi.ResourceClaim{migClaim, gpuClaim})
	if err != nil || res[migClaim.UID].Err != nil || res[gpuClaim.UID].Err != nil {
		t.Fatalf("prepare: %v %+v", err, res)
	}
	events := e.events.List()
	for _, c := range []string{"claim-uid-m", "claim-uid-g"} {
		if !publishtest.HasEvent(events, "claim default/"+c+": Warning MIGVisibleDevices", "pod default/mixed", "default/claim-uid-m", "default/claim-uid-g", "sees only the MIG devices") {
			t.Errorf("no warning on %s: %q", c, events)
		}
	}
	// Prepared again (the kubelet's retry): not reported twice.
	n := len(e.events.List())
	if _, err := i.PrepareResourceClaims(ctxFor(t), []*resourceapi.ResourceClaim{migClaim, gpuClaim}); err != nil {
		t.Fatal(err)
	}
	if got := e.events.List(); len(got) != n {
		t.Errorf("reported again: %q", got[n:])
	}
	// Two MIG-only claims of one pod.
	a := forPod(newClaim("uid-a", []result{whole("mig", "gpu-1-mig-1g-10gb-5")}), "two-mig")
	b := forPod(newClaim("uid-b", []result{whole("mig", "gpu-1-mig-1g-10gb-4")}), "two-mig")
	if _, err := i.PrepareResourceClaims(ctxFor(t), []*resourceapi.ResourceClaim{a, b}); err != nil {
		t.Fatal(err)
	}
	if !publishtest.HasEvent(e.events.List(), "claim default/claim-uid-a: Warning MIGVisibleDevices", "pod default/two-mig", "one claim's CUDA_VISIBLE_DEVICES") {
		t.Errorf("two MIG claims of one pod: %q", e.events.List())
	}
	// Other pods: nothing.
	n = len(e.events.List())
	alone := forPod(newClaim("uid-alone", []result{whole("mig", "gpu-1-mig-1g-10gb-3")}), "alone")
	other := forPod(newClaim("uid-other", []result{whole("gpu", "gpu-3")}), "other")
	if _, err := i.PrepareResourceClaims(ctxFor(t), []*resourceapi.ResourceClaim{alone, other}); err != nil {
		t.Fatal(err)
	}
	if got := e.events.List(); len(got) != n {
		t.Errorf("claims of different pods: %q", got[n:])
	}
}

// HAMiCore and DriverMemory asked for on a MIG device are refused at
// prepare with the reason, before any instance is made; the node's default
// isolation (for shares) does not apply to MIG devices.
func TestMIGIsolationRefused(t *testing.T) {
	for _, iso := range []configapi.Isolation{configapi.IsolationHAMiCore, configapi.IsolationDriverMemory} {
		t.Run(string(iso), func(t *testing.T) {
			e, node, i := startMIGNode(t, nil)
			claim := newClaim("uid-"+strings.ToLower(string(iso)), []result{whole("mig", "gpu-1-mig-2g-20gb-4")}, claimConfig(isolationConfig(iso)))
			r := prepare(t, i.Plugin, claim)
			if r.Err == nil || !strings.Contains(r.Err.Error(), "isolation "+string(iso)+" (set by the claim's config) is refused on a MIG device") {
				t.Fatalf("prepare: %v", r.Err)
			}
			if in := instances(t, node, 1); len(in) != 0 {
				t.Errorf("instance made: %+v", in)
			}
			e.assertClean(i)
		})
	}
	e, _, i := startMIGNode(t, func(o *Options) { o.DefaultIsolation = configapi.IsolationHAMiCore })
	claim := newClaim("uid-default", []result{whole("mig", "gpu-1-mig-2g-20gb-4")})
	mustPrepare(t, i.Plugin, claim)
	mustUnprepare(t, i.Plugin, claim.UID)
	// MIG devices are never lent.
	lend := newClaim("uid-lend", []result{whole("mig", "gpu-1-mig-2g-20gb-4")},
		claimConfig(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","lending":{"lendWhenIdle":true}}`))
	if r := prepare(t, i.Plugin, lend); r.Err == nil || !strings.Contains(r.Err.Error(), "MIG devices are never lent") {
		t.Errorf("lendWhenIdle on a MIG device: %v", r.Err)
	}
	e.assertClean(i)
}

// MPS inside one MIG device: its own daemon, keyed by the MIG UUID and the
// claim's namespace, and CUDA_VISIBLE_DEVICES names the MIG device.
func TestMIGMPS(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	claim := newClaim("uid-mig-mps", []result{whole("mig", "gpu-1-mig-3g-40gb-0")}, claimConfig(isolationConfig(configapi.IsolationMPS)))
	devs := mustPrepare(t, i.Plugin, claim)
	m := migRecord(t, i, claim.UID)
	running, _ := e.runner.Running(ctxFor(t))
	if !slices.Equal(running, []isolation.DaemonKey{{GPU: m.UUID, Domain: "default"}}) {
		t.Errorf("MPS daemons %v, want one for %s/default", running, m.UUID)
	}
	env := envOf(t, e, cdiIDs(devs)...)
	if env["CUDA_VISIBLE_DEVICES"] != m.UUID || env["CUDA_MPS_PIPE_DIRECTORY"] != isolation.MPSPipeContainerDir || env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "100" {
		t.Errorf("env %v", env)
	}
	mustUnprepare(t, i.Plugin, claim.UID)
	if in := instances(t, node, 1); len(in) != 0 {
		t.Errorf("instances %+v", in)
	}
	e.assertClean(i)
}

// The plugin is the last line of defence: a static instance, or an
// overlapping placement, another claim holds is refused before anything is
// made, naming that claim.
func TestMIGDoubleGrant(t *testing.T) {
	_, node, i := startMIGNode(t, nil)
	mustPrepare(t, i.Plugin, newClaim("uid-a", []result{whole("mig", "gpu-0-mig-1")}))
	r := prepare(t, i.Plugin, newClaim("uid-b", []result{whole("mig", "gpu-0-mig-1")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "already prepared for claim default/claim-uid-a") {
		t.Errorf("same static instance: %v", r.Err)
	}
	// Allocated under the name of a release that published one device per
	// compute instance: the same GPU instance, refused too.
	r = prepare(t, i.Plugin, newClaim("uid-b-old", []result{whole("mig", "gpu-0-mig-1-0")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "already prepared for claim default/claim-uid-a") {
		t.Errorf("same GPU instance under its older name: %v", r.Err)
	}
	mustPrepare(t, i.Plugin, newClaim("uid-c", []result{whole("mig", "gpu-1-mig-3g-40gb-4")}))
	r = prepare(t, i.Plugin, newClaim("uid-d", []result{whole("mig", "gpu-1-mig-1g-10gb-5")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "already prepared for claim default/claim-uid-c") {
		t.Errorf("overlapping placement: %v", r.Err)
	}
	if in := instances(t, node, 1); len(in) != 1 {
		t.Errorf("instances %+v", in)
	}
}

// Devices that do not fit the GPU's mode now are refused: a placement on a
// static GPU, a whole GPU in MIG mode, a MIG device of a GPU not in MIG mode.
func TestMIGWrongMode(t *testing.T) {
	e, _, i := startMIGNode(t, nil)
	for device, want := range map[string]string{
		"gpu-0-mig-1g-10gb-6": "is not published with dynamic MIG",
		"gpu-1":               "is in MIG mode now",
		"gpu-2-mig-1":         "is not in MIG mode now",
	} {
		r := prepare(t, i.Plugin, newClaim("uid-"+device, []result{whole("r", device)}))
		if r.Err == nil || !strings.Contains(r.Err.Error(), want) {
			t.Errorf("%s: %v, want %q", device, r.Err, want)
		}
	}
	e.assertClean(i)
}

// A crash between the create and the checkpoint write of the IDs (the
// failpoint): the intent is recorded, the instance exists; the next start
// finds it by placement, destroys it and drops the record.
func TestMIGCrashAfterCreate(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	claim := newClaim("uid-crash", []result{whole("mig", "gpu-1-mig-4g-40gb-0")})
	var atFailpoint []checkpoint.Claim
	var made []gpu.MIGInstance
	i.failpoint = func(_ context.Context, name string) {
		if name != FailpointMIGAfterCreate {
			return
		}
		atFailpoint, made = i.store.List(), instances(t, node, 1)
		runtime.Goexit() // the process dies here: nothing after runs
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = i.PrepareResourceClaims(ctxFor(t), []*resourceapi.ResourceClaim{claim})
	}()
	wg.Wait()
	if len(atFailpoint) != 1 || atFailpoint[0].State != checkpoint.PrepareStarted || atFailpoint[0].Devices[0].MIG == nil ||
		atFailpoint[0].Devices[0].MIG.Created() || atFailpoint[0].Devices[0].MIG.Start != 0 || !atFailpoint[0].Devices[0].MIG.Dynamic {
		t.Fatalf("checkpoint at the failpoint: %+v", atFailpoint)
	}
	if len(made) != 1 || made[0].ProfileName != "4g.40gb" {
		t.Fatalf("instances at the failpoint: %+v", made)
	}

	restarted := e.startMIG(node, nil)
	if in := instances(t, node, 1); len(in) != 0 {
		t.Errorf("orphan left after restart: %+v", in)
	}
	e.assertClean(restarted)
	// The kubelet's retry prepares from scratch.
	mustPrepare(t, restarted.Plugin, claim)
	mustUnprepare(t, restarted.Plugin, claim.UID)
	e.assertClean(restarted)
}

// A crash after the IDs were recorded but before the CDI spec: the record
// (PrepareStarted, IDs) is rolled back at start, which destroys the
// instance found by placement.
func TestMIGCrashAfterRecord(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	gi, ci, err := node.CreateMIGInstance(1, "2g.20gb", 2)
	if err != nil {
		t.Fatal(err)
	}
	in := instances(t, node, 1)
	rec := checkpoint.Claim{UID: "uid-half", Namespace: "default", Name: "claim-uid-half", State: checkpoint.PrepareStarted,
		Devices: []checkpoint.Device{{Request: "mig", Pool: testNode, Device: "gpu-1-mig-2g-20gb-2", UUID: gpuUUID(node, 1), Minor: 1,
			MIG: &checkpoint.MIGDevice{Dynamic: true, Profile: "2g.20gb", ProfileID: in[0].ProfileID, Start: 2, Size: 2,
				UUID: in[0].ComputeInstances[0].UUID, GPUInstance: gi, ComputeInstance: ci}}}}
	if err := i.store.Put(rec); err != nil {
		t.Fatal(err)
	}
	restarted := e.startMIG(node, nil)
	if in := instances(t, node, 1); len(in) != 0 {
		t.Errorf("instance left: %+v", in)
	}
	e.assertClean(restarted)
}

// Instances on a dynamic-MIG GPU that no record holds are foreign, idle
// or busy: kept, each reported once, and their slices published as taken.
// Start used to destroy the idle ones, which took an admin's whole layout
// the first time a GPU was named in --dynamic-mig. Instances of static GPUs
// are the admin's and never touched either.
func TestMIGForeignAtStart(t *testing.T) {
	e := newEnv(t)
	node := migNode(t)
	idleGI, _, err := node.CreateMIGInstance(1, "1g.10gb", 6)
	if err != nil {
		t.Fatal(err)
	}
	busyGI, busyCI, err := node.CreateMIGInstance(1, "2g.20gb", 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.SetMIGProcesses(1, busyGI, busyCI, []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 1 << 30}}); err != nil {
		t.Fatal(err)
	}
	before := instances(t, node, 1)
	i := e.startMIG(node, nil)
	if in := instances(t, node, 1); !reflect.DeepEqual(in, before) {
		t.Fatalf("after start: %+v, want both instances as they were %+v", in, before)
	}
	if len(instances(t, node, 0)) != 2 {
		t.Errorf("the static GPU's instances were touched")
	}
	events := e.events.List()
	if !publishtest.HasEvent(events, "Warning MIGInstanceForeign", fmt.Sprintf("GPU instance %d (1g.10gb at memory slices 6-6", idleGI), "kept") ||
		!publishtest.HasEvent(events, "Warning MIGInstanceForeign", fmt.Sprintf("GPU instance %d (2g.20gb at memory slices 2-3", busyGI), "with 1 processes") {
		t.Errorf("events %q", events)
	}
	for _, ev := range events {
		if strings.Contains(ev, "Destroyed") || strings.Contains(ev, "MIGOrphan") {
			t.Errorf("event %q: nothing is destroyed at start", ev)
		}
	}
	// Once per instance: reconciling again reports nothing new.
	n := len(e.events.List())
	i.reconcileMIG(ctxFor(t))
	if got := e.events.List(); len(got) != n {
		t.Errorf("second reconcile reported again: %q", got[n:])
	}

	// The model publishes the kept instances' slices as taken.
	pub := &publishtest.Publisher{}
	inv := &publish.Inventory{NodeName: testNode, DiscoverNode: publish.NVMLDiscovery(node, nil), Publisher: pub, DynamicMIG: dynamicGPU1, MIGHeld: i.MIGHeld}
	if _, err := inv.Sync(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	counters := pub.Counters(t, model.MIGCounterSetName(1))
	for slice, want := range map[int]int64{0: 1, 1: 1, 2: 0, 3: 0, 4: 1, 5: 1, 6: 0, 7: 1} {
		if got := counters[model.MemorySliceCounter(slice)]; got != want {
			t.Errorf("memory-slice-%d = %d, want %d", slice, got, want)
		}
	}
}

// The first start with GPU 0, which holds an admin's layout (4g.40gb and
// 3g.40gb), named in --dynamic-mig keeps that layout and publishes its
// slices as taken; no placement over it is prepared.
func TestMIGDynamicOverAdminLayout(t *testing.T) {
	e := newEnv(t)
	node := migNode(t)
	before := instances(t, node, 0)
	i := e.startMIG(node, func(o *Options) { o.DynamicMIG = publish.DynamicMIG{All: true} })
	if in := instances(t, node, 0); !reflect.DeepEqual(in, before) {
		t.Fatalf("GPU 0's layout after the first dynamic start: %+v, want %+v", in, before)
	}
	if n := strings.Count(strings.Join(e.events.List(), "\n"), "Warning MIGInstanceForeign"); n != 2 {
		t.Errorf("%d foreign reports, want GPU 0's 2 instances: %q", n, e.events.List())
	}
	r := prepare(t, i.Plugin, newClaim("uid-over", []result{whole("mig", "gpu-0-mig-1g-10gb-6")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "taken by GPU "+gpuUUID(node, 0)) || !strings.Contains(r.Err.Error(), "3g.40gb at memory slices 4-7") {
		t.Errorf("prepare over the admin's 3g.40gb: %v", r.Err)
	}
	if in := instances(t, node, 0); !reflect.DeepEqual(in, before) {
		t.Errorf("GPU 0's layout after the refused prepare: %+v", in)
	}
	e.assertClean(i)
}

// Prepare never takes over an instance it did not make. An admin's
// instance at exactly the allocated placement and profile (made after the
// slices were published) is refused before the intent is recorded, naming
// it; one made between that check and the create is refused by the create,
// and the rollback leaves it.
func TestMIGPrepareRefusesForeignInstance(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	gi, ci, err := node.CreateMIGInstance(1, "1g.10gb", 6)
	if err != nil {
		t.Fatal(err)
	}
	admins := instances(t, node, 1)
	r := prepare(t, i.Plugin, newClaim("uid-take", []result{whole("mig", "gpu-1-mig-1g-10gb-6")}))
	want := fmt.Sprintf("taken by GPU %s (index 1): GPU instance %d (1g.10gb at memory slices 6-6; compute instance %d %s)", gpuUUID(node, 1), gi, ci, admins[0].ComputeInstances[0].UUID)
	if r.Err == nil || !strings.Contains(r.Err.Error(), want) {
		t.Fatalf("prepare over the admin's instance: %v, want %q", r.Err, want)
	}
	if in := instances(t, node, 1); !reflect.DeepEqual(in, admins) {
		t.Fatalf("the admin's instance changed: %+v", in)
	}
	e.assertClean(i)

	// Between the check and the create: the create refuses, the rollback
	// destroys nothing.
	racer := &raceMIG{MIGInstances: i.opts.MIG, before: func() {
		if _, _, err := node.CreateMIGInstance(1, "2g.20gb", 2); err != nil {
			t.Error(err)
		}
	}}
	i.opts.MIG = racer
	r = prepare(t, i.Plugin, newClaim("uid-race", []result{whole("mig", "gpu-1-mig-2g-20gb-2")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "which this claim did not make") {
		t.Fatalf("prepare racing an admin's create: %v", r.Err)
	}
	if in := instances(t, node, 1); len(in) != 2 {
		t.Errorf("after the refused create: %+v, want the admin's two instances", in)
	}
	e.assertClean(i)
}

// raceMIG runs before ahead of the first Create (an admin's create racing
// the plugin's).
type raceMIG struct {
	MIGInstances
	before func()
}

func (r *raceMIG) Create(uuid string, profileID int, pl gpu.MIGPlacement, own string) (mig.Created, error) {
	if r.before != nil {
		r.before()
		r.before = nil
	}
	return r.MIGInstances.Create(uuid, profileID, pl, own)
}

// Unprepare destroys only the instance the record names by its MIG UUID:
// one an admin destroyed and re-made at the placement (same IDs, fresh UUID)
// is left, reported, and the record goes.
func TestMIGUnprepareChangedInstance(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	claim := newClaim("uid-changed", []result{whole("mig", "gpu-1-mig-2g-20gb-4")})
	mustPrepare(t, i.Plugin, claim)
	m := migRecord(t, i, claim.UID)
	if err := node.DestroyMIGInstance(1, m.GPUInstance); err != nil {
		t.Fatal(err)
	}
	gi, ci, err := node.CreateMIGInstance(1, "2g.20gb", 4)
	if err != nil || gi != m.GPUInstance || ci != m.ComputeInstance {
		t.Fatalf("re-made: %d/%d, %v; want the recorded IDs %d/%d", gi, ci, err, m.GPUInstance, m.ComputeInstance)
	}
	remade := instances(t, node, 1)
	if remade[0].ComputeInstances[0].UUID == m.UUID {
		t.Fatalf("the mock gave the re-made instance the recorded UUID %s", m.UUID)
	}
	mustUnprepare(t, i.Plugin, claim.UID)
	if in := instances(t, node, 1); !reflect.DeepEqual(in, remade) {
		t.Errorf("after unprepare: %+v, want the re-made instance kept %+v", in, remade)
	}
	if !publishtest.HasEvent(e.events.List(), "Warning MIGInstanceChanged", "is not MIG device "+m.UUID, "was not destroyed") {
		t.Errorf("events %q", e.events.List())
	}
	e.assertClean(i)
}

// At start, a prepared claim whose instance was destroyed and re-made at its
// placement is reported (MIGInstanceChanged, testable now that the mock
// gives every created instance a fresh UUID); the re-made instance is
// foreign: kept, its slices taken.
func TestMIGChangedAtStart(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	claim := newClaim("uid-moved", []result{whole("mig", "gpu-1-mig-1g-10gb-6")})
	mustPrepare(t, i.Plugin, claim)
	m := migRecord(t, i, claim.UID)
	if err := node.DestroyMIGInstance(1, m.GPUInstance); err != nil {
		t.Fatal(err)
	}
	if _, _, err := node.CreateMIGInstance(1, "1g.10gb", 6); err != nil {
		t.Fatal(err)
	}
	e.startMIG(node, nil)
	events := e.events.List()
	if !publishtest.HasEvent(events, "Warning MIGInstanceChanged", "is no longer MIG device "+m.UUID) || !publishtest.HasEvent(events, "Warning MIGInstanceForeign", "1g.10gb at memory slices 6-6") {
		t.Errorf("events %q", events)
	}
	if in := instances(t, node, 1); len(in) != 1 {
		t.Errorf("instances %+v, want the re-made one kept", in)
	}
}

// Static device names are GPU instance IDs, which the driver reuses:
// prepare checks the instance read now against what the plugin published
// under the name (profile, placement, MIG UUIDs) and refuses one made since.
func TestMIGStaticChangedSincePublished(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	// GPU instance 1 was a 4g.40gb at 0-3; an admin makes a 3g.40gb there,
	// which gets ID 1 again.
	if err := node.DestroyMIGInstance(0, 1); err != nil {
		t.Fatal(err)
	}
	if gi, _, err := node.CreateMIGInstance(0, "3g.40gb", 0); err != nil || gi != 1 {
		t.Fatalf("re-made: GPU instance %d, %v", gi, err)
	}
	r := prepare(t, i.Plugin, newClaim("uid-profile", []result{whole("mig", "gpu-0-mig-1")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "published as 4g.40gb at memory slices 0-3, now 3g.40gb at 0-3") {
		t.Errorf("prepare of a re-made GPU instance of another profile: %v", r.Err)
	}
	// GPU instance 2 re-made as it was (3g.40gb at 4): a fresh MIG UUID.
	if err := node.DestroyMIGInstance(0, 2); err != nil {
		t.Fatal(err)
	}
	if gi, _, err := node.CreateMIGInstance(0, "3g.40gb", 4); err != nil || gi != 2 {
		t.Fatalf("re-made: GPU instance %d, %v", gi, err)
	}
	r = prepare(t, i.Plugin, newClaim("uid-uuid", []result{whole("mig", "gpu-0-mig-2")}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "published with MIG devices") {
		t.Errorf("prepare of a GPU instance re-made with the same profile and placement: %v", r.Err)
	}
	// An instance the plugin never published.
	if err := node.DestroyMIGInstance(0, 2); err != nil {
		t.Fatal(err)
	}
	gi, _, err := node.CreateMIGInstance(0, "1g.10gb", 4)
	if err != nil {
		t.Fatal(err)
	}
	r = prepare(t, i.Plugin, newClaim("uid-new", []result{whole("mig", model.MIGStaticDeviceName(0, gi))}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "is not one this plugin published") {
		t.Errorf("prepare of an instance made after the inventory: %v", r.Err)
	}
	e.assertClean(i)
}

// A GPU instance an admin split into two compute instances is one static
// device: the claim gets both compute instances (variables, capability
// nodes, CUDA_VISIBLE_DEVICES), a claim for the older per-compute-instance
// name of the other one is refused while it holds them, and MPS (one
// daemon per MIG device) is refused on it.
func TestMIGStaticSplitGPUInstance(t *testing.T) {
	e := newEnv(t)
	node := migNode(t)
	if err := node.DestroyMIGInstance(0, 2); err != nil {
		t.Fatal(err)
	}
	gi, err := node.CreateMIGGPUInstance(0, "3g.40gb", 4)
	if err != nil {
		t.Fatal(err)
	}
	two, err := node.CreateMIGComputeInstance(0, gi, 2)
	if err != nil {
		t.Fatal(err)
	}
	one, err := node.CreateMIGComputeInstance(0, gi, 1)
	if err != nil {
		t.Fatal(err)
	}
	i := e.startMIG(node, nil)
	mps := newClaim("uid-split-mps", []result{whole("mig", model.MIGStaticDeviceName(0, gi))}, claimConfig(isolationConfig(configapi.IsolationMPS)))
	if r := prepare(t, i.Plugin, mps); r.Err == nil || !strings.Contains(r.Err.Error(), "an MPS daemon serves one MIG device") {
		t.Errorf("MPS on a split GPU instance: %v", r.Err)
	}
	claim := newClaim("uid-split", []result{whole("mig", model.MIGStaticDeviceName(0, gi))})
	devs := mustPrepare(t, i.Plugin, claim)
	var in gpu.MIGInstance
	for _, x := range instances(t, node, 0) {
		if x.ID == gi {
			in = x
		}
	}
	env := envOf(t, e, cdiIDs(devs)...)
	var uuids []string
	for _, ci := range in.ComputeInstances {
		prefix := isolation.MIGVariable(0, gi, ci.ID)
		if env[prefix] != ci.UUID || env[prefix+"_CAPS"] != fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d,/dev/nvidia-caps/nvidia-cap%d", in.AccessMinor, ci.AccessMinor) {
			t.Errorf("compute instance %d: %s=%q %s_CAPS=%q", ci.ID, prefix, env[prefix], prefix, env[prefix+"_CAPS"])
		}
		uuids = append(uuids, ci.UUID)
	}
	if len(uuids) != 2 || env["CUDA_VISIBLE_DEVICES"] != strings.Join(uuids, ",") {
		t.Errorf("CUDA_VISIBLE_DEVICES=%q, want both of %v", env["CUDA_VISIBLE_DEVICES"], uuids)
	}
	if m := migRecord(t, i, claim.UID); m.ComputeInstance != two || len(m.OtherComputeInstances) != 1 || m.OtherComputeInstances[0].ID != one || m.OtherComputeInstances[0].UUID != uuids[1] {
		t.Errorf("record %+v", m)
	}
	old := newClaim("uid-split-old", []result{whole("mig", fmt.Sprintf("gpu-0-mig-%d-%d", gi, one))})
	if r := prepare(t, i.Plugin, old); r.Err == nil || !strings.Contains(r.Err.Error(), "already prepared for claim default/claim-uid-split") {
		t.Errorf("the other compute instance under the older name: %v", r.Err)
	}
	mustUnprepare(t, i.Plugin, claim.UID)
	// The older name alone gets the whole GPU instance too.
	devs = mustPrepare(t, i.Plugin, old)
	if env := envOf(t, e, cdiIDs(devs)...); env["CUDA_VISIBLE_DEVICES"] != strings.Join(uuids, ",") {
		t.Errorf("older name: CUDA_VISIBLE_DEVICES=%q, want %v", env["CUDA_VISIBLE_DEVICES"], uuids)
	}
	mustUnprepare(t, i.Plugin, old.UID)
	e.assertClean(i)
}

// A static GPU instance that runs processes no claim accounts for (another
// device plugin's pod, after an upgrade that starts publishing MIG-mode
// GPUs) is published tainted until it is idle; one a claim holds is not.
func TestMIGStaticInUseTaint(t *testing.T) {
	e := newEnv(t)
	node := migNode(t)
	if err := node.SetMIGProcesses(0, 2, 0, []nvml.ProcessInfo{{Pid: 31}}); err != nil {
		t.Fatal(err)
	}
	i := e.startMIG(node, nil)
	pub := &publishtest.Publisher{}
	inv := &publish.Inventory{NodeName: testNode, DiscoverNode: publish.NVMLDiscovery(node, nil), Publisher: pub, DynamicMIG: dynamicGPU1, MIGHeld: i.MIGHeld}
	sync := func() map[string][]resourceapi.DeviceTaint {
		t.Helper()
		if _, err := inv.Sync(ctxFor(t)); err != nil {
			t.Fatal(err)
		}
		devs, _ := pub.Devices(t)
		return devs
	}
	devs := sync()
	if tn := devs["gpu-0-mig-2"]; len(tn) != 1 || tn[0].Key != model.MIGInUseTaintKey || tn[0].Value != model.MIGInUseOutsideTessera || tn[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("busy instance: taints %v", tn)
	}
	if tn := devs["gpu-0-mig-1"]; len(tn) != 0 {
		t.Errorf("idle instance: taints %v", tn)
	}
	// Held by a claim (its own pod's processes): no taint.
	claim := newClaim("uid-holds", []result{whole("mig", "gpu-0-mig-2")})
	mustPrepare(t, i.Plugin, claim)
	if tn := sync()["gpu-0-mig-2"]; len(tn) != 0 {
		t.Errorf("held: taints %v", tn)
	}
	mustUnprepare(t, i.Plugin, claim.UID)
	if tn := sync()["gpu-0-mig-2"]; len(tn) != 1 {
		t.Errorf("released while still busy: taints %v, want the in-use taint again", tn)
	}
	if err := node.SetMIGProcesses(0, 2, 0, nil); err != nil {
		t.Fatal(err)
	}
	if tn := sync()["gpu-0-mig-2"]; len(tn) != 0 {
		t.Errorf("idle: taints %v", tn)
	}
}

// Instances of checkpointed claims are adopted at start and destroyed by
// the unprepare that follows; the published slices of a held instance stay
// free (its claim consumes them).
func TestMIGAdoptedAtStart(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	claim := newClaim("uid-adopt", []result{whole("mig", "gpu-1-mig-2g-20gb-0")})
	devs := mustPrepare(t, i.Plugin, claim)

	restarted := e.startMIG(node, nil)
	if in := instances(t, node, 1); len(in) != 1 {
		t.Fatalf("instances after restart: %+v", in)
	}
	if again := mustPrepare(t, restarted.Plugin, claim); !slices.Equal(cdiIDs(again), cdiIDs(devs)) {
		t.Errorf("prepare after restart: %v, want %v", cdiIDs(again), cdiIDs(devs))
	}
	pub := &publishtest.Publisher{}
	inv := &publish.Inventory{NodeName: testNode, DiscoverNode: publish.NVMLDiscovery(node, nil), Publisher: pub, DynamicMIG: dynamicGPU1, MIGHeld: restarted.MIGHeld}
	if _, err := inv.Sync(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if c := pub.Counters(t, model.MIGCounterSetName(1)); c[model.MemorySliceCounter(0)] != 1 || c[model.MemorySliceCounter(1)] != 1 {
		t.Errorf("held instance's slices published as taken: %v", c)
	}
	mustUnprepare(t, restarted.Plugin, claim.UID)
	if in := instances(t, node, 1); len(in) != 0 {
		t.Errorf("instances after unprepare: %+v", in)
	}
	e.assertClean(restarted)
}

// Unprepare refuses to destroy an instance a process still runs on: the
// claim stays recorded, and the kubelet's retry finishes once it is idle.
func TestMIGUnprepareInUse(t *testing.T) {
	e, node, i := startMIGNode(t, nil)
	claim := newClaim("uid-busy", []result{whole("mig", "gpu-1-mig-1g-20gb-6")})
	mustPrepare(t, i.Plugin, claim)
	m := migRecord(t, i, claim.UID)
	if err := node.SetMIGProcesses(1, m.GPUInstance, m.ComputeInstance, []nvml.ProcessInfo{{Pid: 7}}); err != nil {
		t.Fatal(err)
	}
	res, _ := i.UnprepareResourceClaims(ctxFor(t), []kubeletplugin.NamespacedObject{{UID: claim.UID}})
	if res[claim.UID] == nil || !errors.Is(res[claim.UID], mig.ErrInUse) {
		t.Fatalf("unprepare while in use: %v", res[claim.UID])
	}
	if _, ok := i.store.Get(claim.UID); !ok {
		t.Fatal("record dropped although the instance stays")
	}
	if err := node.SetMIGProcesses(1, m.GPUInstance, m.ComputeInstance, nil); err != nil {
		t.Fatal(err)
	}
	mustUnprepare(t, i.Plugin, claim.UID)
	e.assertClean(i)
}

// The inventory publishes the named GPUs in MIG mode with dynamic MIG and
// reports a named GPU that is not in MIG mode, and a name of no GPU.
func TestInventoryDynamicMIG(t *testing.T) {
	node := migNode(t)
	pub, events := &publishtest.Publisher{}, &publishtest.Events{}
	inv := &publish.Inventory{NodeName: testNode, DiscoverNode: publish.NVMLDiscovery(node, nil), Publisher: pub, Events: events,
		DynamicMIG: publish.DynamicMIG{Names: []string{"1", gpuUUID(node, 3), "GPU-nope"}}}
	if _, err := inv.Sync(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	devs, _ := pub.Devices(t)
	for _, name := range []string{"gpu-0-mig-1", "gpu-0-mig-2", "gpu-1-mig-1g-10gb-0", "gpu-1-mig-7g-80gb-0", "gpu-3", "gpu-3-shared"} {
		if _, ok := devs[name]; !ok {
			t.Errorf("%s not published", name)
		}
	}
	if _, ok := devs["gpu-0-mig-1g-10gb-6"]; ok {
		t.Errorf("static GPU 0 published with placements")
	}
	if !publishtest.HasEvent(events.List(), "Warning DynamicMIGNotApplied", "GPU index 3", "not in MIG mode", `"GPU-nope"`) {
		t.Errorf("events %q", events.List())
	}
	n := len(events.List())
	if _, err := inv.Sync(ctxFor(t)); err != nil || len(events.List()) != n {
		t.Errorf("second sync: %v, events again %q", err, events.List()[n:])
	}
}

// Health is reported for the MIG devices a GPU in MIG mode publishes.
func TestMIGHealthReportNames(t *testing.T) {
	_, _, i := startMIGNode(t, nil)
	var names []string
	for minor := 0; minor < 3; minor++ {
		g, _ := i.gpuByMinor(minor)
		names = append(names, i.deviceNames(g)...)
	}
	if len(names) != 2+25+2 || names[0] != "gpu-0-mig-1" || names[1] != "gpu-0-mig-2" || !slices.Contains(names, "gpu-1-mig-1g-10gb-me-6") ||
		names[len(names)-2] != "gpu-2" {
		t.Errorf("device names %v", names)
	}
}

// TestEnvFailpoint runs a child test process that reaches the failpoint:
// armed, it dies of SIGKILL; with TESSERA_FAILPOINT_ONCE it dies the first
// time only; unarmed, it runs on.
func TestEnvFailpoint(t *testing.T) {
	if os.Getenv("TESSERA_FAILPOINT_CHILD") == "1" {
		envFailpoint(context.Background(), FailpointMIGAfterCreate)
		return
	}
	once := filepath.Join(t.TempDir(), "fired")
	run := func(env ...string) error {
		cmd := exec.Command(os.Args[0], "-test.run=^TestEnvFailpoint$")
		cmd.Env = append(os.Environ(), append(env, "TESSERA_FAILPOINT_CHILD=1")...)
		return cmd.Run()
	}
	killed := func(err error) bool {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return false
		}
		ws, ok := exit.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	}
	if err := run(); err != nil {
		t.Errorf("unarmed: %v", err)
	}
	if err := run(FailpointEnv + "=other"); err != nil {
		t.Errorf("another failpoint armed: %v", err)
	}
	if err := run(FailpointEnv + "=" + FailpointMIGAfterCreate); !killed(err) {
		t.Errorf("armed: %v, want SIGKILL", err)
	}
	if err := run(FailpointEnv+"="+FailpointMIGAfterCreate, FailpointOnceEnv+"="+once); !killed(err) {
		t.Errorf("armed once, first time: %v, want SIGKILL", err)
	}
	if err := run(FailpointEnv+"="+FailpointMIGAfterCreate, FailpointOnceEnv+"="+once); err != nil {
		t.Errorf("armed once, second time: %v, want it to run on", err)
	}
}

// An XID that names one MIG device taints that device only, in the
// published slices and in the health reported to the kubelet; the GPU's
// other MIG devices stay healthy.
func TestMIGDeviceHealth(t *testing.T) {
	node := migNode(t)
	tracker := health.NewTracker(health.DefaultPolicy(), nil)
	tracker.Observe(health.Event{UUID: gpuUUID(node, 0), Kind: health.KindXID, XID: 94,
		MIG: &health.MIGScope{GPUInstance: 2, ComputeInstance: 0, ProfileID: -1}})
	pub := &publishtest.Publisher{}
	inv := &publish.Inventory{NodeName: testNode, DiscoverNode: publish.NVMLDiscovery(node, nil), Publisher: pub, DynamicMIG: dynamicGPU1,
		Taints: publish.HealthTaints(tracker), DeviceTaints: tracker.MIGTaints}
	if _, err := inv.Sync(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	devs, _ := pub.Devices(t)
	if len(devs["gpu-0-mig-2"]) != 1 || devs["gpu-0-mig-2"][0].Key != health.TaintKey || len(devs["gpu-0-mig-1"]) != 0 || len(devs["gpu-2"]) != 0 {
		t.Errorf("taints: gpu-0-mig-2 %v, gpu-0-mig-1 %v, gpu-2 %v", devs["gpu-0-mig-2"], devs["gpu-0-mig-1"], devs["gpu-2"])
	}

	e := newEnv(t)
	i := e.startMIG(node, func(o *Options) { o.Health = tracker })
	byName := map[string]kubeletplugin.HealthStatus{}
	for _, d := range i.HealthReport().Devices {
		byName[d.DeviceName] = d.Health
	}
	if byName["gpu-0-mig-2"] != kubeletplugin.HealthStatusUnhealthy || byName["gpu-0-mig-1"] != kubeletplugin.HealthStatusHealthy ||
		byName["gpu-1-mig-1g-10gb-6"] != kubeletplugin.HealthStatusHealthy {
		t.Errorf("health %v", byName)
	}
}

// The metrics snapshot lists the MIG devices: the static instances of GPU 0
// and the placement a claim holds on dynamic GPU 1, with its holder.
func TestMIGMetricsSnapshot(t *testing.T) {
	_, _, i := startMIGNode(t, nil)
	claim := newClaim("uid-dyn", []result{whole("mig", "gpu-1-mig-3g-40gb-4")})
	mustPrepare(t, i.Plugin, claim)
	byDevice := map[string]metrics.MIGDevice{}
	for _, d := range i.MetricsSnapshot().MIG {
		byDevice[d.Device] = d
	}
	held, ok := byDevice["gpu-1-mig-3g-40gb-4"]
	if !ok || !held.Dynamic || held.UUID == "" || len(held.Holders) != 1 || held.Holders[0].UID != claim.UID {
		t.Errorf("held placement %+v (found %v), want it dynamic with its UUID and the claim as holder", held, ok)
	}
	static := 0
	for name, d := range byDevice {
		if d.Minor == 0 && !d.Dynamic {
			static++
		} else if name != "gpu-1-mig-3g-40gb-4" {
			t.Errorf("unexpected MIG device %s: %+v", name, d)
		}
	}
	if static != 2 {
		t.Errorf("%d static devices of GPU 0, want its 2 instances: %v", static, byDevice)
	}
}
