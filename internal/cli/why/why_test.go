package why

// The scenarios put what the kubelet plugin publishes (pkg/model) and the
// DeviceClasses Tessera installs into client-go's fake clientset, allocate the
// claims that already hold GPUs with the scheduler's allocator, and check the
// explanation Get gives for a pending pod or claim.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/locality"
	"github.com/tessera-dev/tessera/pkg/model"
)

const gi = int64(1) << 30

// pairs and separate are NVLink domains for gputest.H100s: two GPUs to a
// domain, or one each.
func pairs(minor int) string    { return fmt.Sprintf("nvl-%d", minor/2) }
func separate(minor int) string { return fmt.Sprintf("nvl-solo-%d", minor) }

// cluster is the API's content.
type cluster struct {
	t  *testing.T
	in Input
}

// newCluster publishes the GPUs of each node as its plugin would.
func newCluster(t *testing.T, nodes map[string][]gpu.GPU, opts ...model.Option) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for name, g := range nodes {
		res, err := model.Resources(name, g, opts...)
		if err != nil {
			t.Fatalf("Resources: %v", err)
		}
		objs, err := model.ResourceSlices(name, res)
		if err != nil {
			t.Fatalf("ResourceSlices: %v", err)
		}
		for i := range objs {
			objs[i].Name = fmt.Sprintf("%s%d", objs[i].GenerateName, i)
			objs[i].UID = types.UID(objs[i].Name)
		}
		c.in.Slices = append(c.in.Slices, objs...)
		c.in.Nodes = append(c.in.Nodes, v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	c.in.Classes = model.DeviceClasses()
	return c
}

// allocate places claim with the scheduler's allocator on node, as the
// scheduler would, and records it allocated.
func (c *cluster) allocate(node string, claim *resourceapi.ResourceClaim) {
	c.t.Helper()
	e := newExplainer(c.in)
	a, err := structured.NewAllocator(context.Background(), model.SchedulerFeatures, e.state, e.classes, e.slices, e.cel)
	if err != nil {
		c.t.Fatal(err)
	}
	res, err := a.Allocate(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, []*resourceapi.ResourceClaim{claim})
	if err != nil || len(res) != 1 {
		c.t.Fatalf("claim %s does not fit on %s: %v", claim.Name, node, err)
	}
	claim = claim.DeepCopy()
	claim.Status.Allocation = &res[0]
	c.in.Claims = append(c.in.Claims, *claim)
}

// why runs Get for target through a fake clientset holding the cluster and
// the extra objects.
func (c *cluster) why(target string, objs ...runtime.Object) Report {
	c.t.Helper()
	return c.whyWith(c.client(objs...), target)
}

// client is a fake clientset holding the cluster and the extra objects.
func (c *cluster) client(objs ...runtime.Object) *fake.Clientset {
	for i := range c.in.Slices {
		objs = append(objs, &c.in.Slices[i])
	}
	for i := range c.in.Classes {
		objs = append(objs, &c.in.Classes[i])
	}
	for i := range c.in.Claims {
		objs = append(objs, &c.in.Claims[i])
	}
	for i := range c.in.Nodes {
		objs = append(objs, &c.in.Nodes[i])
	}
	return fake.NewClientset(objs...)
}

// whyWith runs Get for target through client.
func (c *cluster) whyWith(client *fake.Clientset, target string) Report {
	c.t.Helper()
	r, err := Get(context.Background(), client, "default", target)
	if err != nil {
		c.t.Fatalf("Get %s: %v", target, err)
	}
	return r
}

func newClaim(name string, requests []resourceapi.DeviceRequest, constraints ...resourceapi.DeviceConstraint) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid")},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests, Constraints: constraints}},
	}
}

func shareClaim(name, memory, cores string) *resourceapi.ResourceClaim {
	return newClaim(name, []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: model.SharedClassName,
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			model.Memory: resource.MustParse(memory), model.Cores: resource.MustParse(cores)}},
	}}})
}

func wholeClaim(name string, count int64, selectors ...string) *resourceapi.ResourceClaim {
	var sel []resourceapi.DeviceSelector
	for _, s := range selectors {
		sel = append(sel, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return newClaim(name, []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: model.WholeClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount,
		Count: count, Selectors: sel,
	}}})
}

// podFor is a pending pod that uses the claims by name.
func podFor(name string, claims ...string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "busybox"}}}}
	for _, c := range claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: c, ResourceClaimName: ptr.To(c)})
	}
	return p
}

// gpuReasons joins the reasons of one GPU on one node.
func gpuReasons(t *testing.T, r Report, node, gpu string) string {
	t.Helper()
	for _, n := range r.Nodes {
		if n.Name != node {
			continue
		}
		for _, g := range n.GPUs {
			if g.Name == gpu {
				return strings.Join(g.Reasons, "\n")
			}
		}
		return ""
	}
	t.Fatalf("node %s not in report %+v", node, r)
	return ""
}

func nodeOf(t *testing.T, r Report, node string) Node {
	t.Helper()
	for _, n := range r.Nodes {
		if n.Name == node {
			return n
		}
	}
	t.Fatalf("node %s not in report", node)
	return Node{}
}

func wantContains(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s: want %q in\n%s", what, w, got)
		}
	}
}

func table(t *testing.T, r Report) string {
	t.Helper()
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// An oversized share fits no GPU: each GPU says by how much, and the node
// says what would fit.
func TestOversizedShare(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(2, pairs)})
	claim := shareClaim("big", "100Gi", "50")
	c.in.Claims = append(c.in.Claims, *claim)
	r := c.why("big-pod", podFor("big-pod", "big"))
	n := nodeOf(t, r, "node-1")
	if n.Fits {
		t.Fatalf("oversized share fits: %+v", n)
	}
	for _, g := range []string{"gpu-0", "gpu-1"} {
		wantContains(t, g, gpuReasons(t, r, "node-1", g), `request "gpu": `+g+`-shared: memory: asks 100Gi, more than the whole GPU (80Gi)`)
	}
	if s := n.FitsNow.LargestShare; s == nil || s.MemoryBytes != 80*gi || s.Cores != 100 || n.FitsNow.WholeGPUs != 2 {
		t.Errorf("fits now: %+v, want a share of 80Gi and 100 cores and 2 whole GPUs", n.FitsNow)
	}
	out := table(t, r)
	wantContains(t, "table", out, "pod default/big-pod", "claim default/big", "gpu: 1 of shared.gpu.tessera.dev, cores 50, memory 100Gi",
		"NODE", "fits now: a share of up to 80Gi and 100 cores (gpu-0); 2 whole GPU(s)")
	t.Logf("\n%s", out)
}

// A share that is short on a GPU others hold part of: by how much, and who
// holds it.
func TestShareShortNamesHolders(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(1, pairs)})
	c.allocate("node-1", shareClaim("a", "60Gi", "50"))
	c.allocate("node-1", shareClaim("b", "10Gi", "40"))
	c.in.Claims = append(c.in.Claims, *shareClaim("late", "20Gi", "20"))
	r := c.why("claim/late")
	if r.Target != "claim default/late" {
		t.Errorf("target %q", r.Target)
	}
	got := gpuReasons(t, r, "node-1", "gpu-0")
	wantContains(t, "gpu-0", got,
		"memory short by 10Gi: asks 20Gi, 10Gi free of 80Gi; held by default/a (60Gi, 50 cores), default/b (10Gi, 40 cores)",
		"cores short by 10: asks 20, 10 free of 100")
	if s := nodeOf(t, r, "node-1").FitsNow.LargestShare; s == nil || s.MemoryBytes != 10*gi || s.Cores != 10 {
		t.Errorf("largest share %+v, want 10Gi and 10 cores", s)
	}
}

// A whole GPU is blocked by the shares on it (the counters), and a GPU held
// whole says by whom.
func TestWholeGPUBlockedByShares(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(2, pairs)})
	c.allocate("node-1", shareClaim("small", "1Gi", "5")) // lands on gpu-0
	c.allocate("node-1", wholeClaim("train", 1))          // gpu-1
	c.in.Claims = append(c.in.Claims, *wholeClaim("whole", 1))
	r := c.why("whole-pod", podFor("whole-pod", "whole"))
	wantContains(t, "gpu-0", gpuReasons(t, r, "node-1", "gpu-0"),
		`request "gpus": gpu-0: whole GPU blocked by shares: default/small (1Gi, 5 cores) (counter set gpu-0: cores, memory)`)
	wantContains(t, "gpu-1", gpuReasons(t, r, "node-1", "gpu-1"), `request "gpus": gpu-1: held by default/train (whole GPU)`)
	f := nodeOf(t, r, "node-1").FitsNow
	if f.WholeGPUs != 0 || f.LargestShare == nil || f.LargestShare.GPU != "gpu-0" || f.LargestShare.MemoryBytes != 79*gi {
		t.Errorf("fits now %+v, want no whole GPU and 79Gi on gpu-0", f)
	}
}

// A tainted (unhealthy) GPU is named with its taint, and neither a share nor
// the whole GPU counts as fitting now.
func TestTaintedGPU(t *testing.T) {
	g := gputest.H100s(1, pairs)
	taint := resourceapi.DeviceTaint{Key: "gpu.tessera.dev/unhealthy", Value: "XID79", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	c := newCluster(t, map[string][]gpu.GPU{"node-1": g}, model.WithTaints(map[string][]resourceapi.DeviceTaint{g[0].UUID: {taint}}))
	c.in.Claims = append(c.in.Claims, *shareClaim("s", "1Gi", "1"))
	r := c.why("claim/s")
	wantContains(t, "gpu-0", gpuReasons(t, r, "node-1", "gpu-0"),
		"gpu-0-shared: tainted gpu.tessera.dev/unhealthy=XID79:NoSchedule (the GPU is unhealthy)")
	if f := nodeOf(t, r, "node-1").FitsNow; f.LargestShare != nil || f.WholeGPUs != 0 {
		t.Errorf("fits now %+v on a tainted node", f)
	}
}

// A CEL selector that is false on every GPU is quoted.
func TestSelectorFalse(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(2, pairs)})
	sel := `device.attributes["gpu.tessera.dev"].productName == "NVIDIA A100-SXM4-80GB"`
	c.in.Claims = append(c.in.Claims, *wholeClaim("a100", 1, sel))
	r := c.why("claim/a100")
	for _, g := range []string{"gpu-0", "gpu-1"} {
		wantContains(t, g, gpuReasons(t, r, "node-1", g), "selector "+sel+" is false")
	}
}

// Two GPUs in different NVLink domains cannot serve an NVLink pair: the node
// says the largest domain is too small.
func TestNVLinkPairImpossible(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(2, separate)})
	pair := wholeClaim("pair", 2)
	attr := resourceapi.FullyQualifiedName(model.DriverName + "/" + string(model.AttrNVLinkDomain))
	pair.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: &attr}}
	c.in.Claims = append(c.in.Claims, *pair)
	r := c.why("claim/pair")
	n := nodeOf(t, r, "node-1")
	wantContains(t, "node reasons", strings.Join(n.Reasons, "\n"),
		`request "gpus": matchAttribute gpu.tessera.dev/nvlinkDomain: needs 2 devices with one value, the largest group of fitting devices is 1 (gpu.tessera.dev/nvlinkDomain=nvl-solo-0: gpu-0)`)
	if n.FitsNow.WholeGPUs != 2 {
		t.Errorf("whole GPUs free %d, want 2", n.FitsNow.WholeGPUs)
	}
	// The same pair fits where the GPUs share a domain.
	c = newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(2, pairs)})
	c.in.Claims = append(c.in.Claims, *pair)
	if n := nodeOf(t, c.why("claim/pair"), "node-1"); !n.Fits || len(n.Allocation) != 2 {
		t.Errorf("pair on one domain: %+v, want it to fit on gpu-0 and gpu-1", n)
	}
}

// With every GPU held whole, nothing fits now, and each GPU names its holder.
func TestEverythingFull(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(2, pairs), "node-2": gputest.H100s(1, pairs)})
	c.allocate("node-1", wholeClaim("w1", 2))
	c.allocate("node-2", wholeClaim("w2", 1))
	c.in.Claims = append(c.in.Claims, *shareClaim("s", "1Gi", "1"))
	r := c.why("claim/s")
	if len(r.Nodes) != 2 {
		t.Fatalf("nodes %+v, want node-1 and node-2", r.Nodes)
	}
	wantContains(t, "node-2 gpu-0", gpuReasons(t, r, "node-2", "gpu-0"),
		"gpu-0-shared: held whole by default/w2 (whole GPU) (counter set gpu-0: cores, memory)")
	for _, n := range r.Nodes {
		if n.Fits || n.FitsNow.LargestShare != nil || n.FitsNow.WholeGPUs != 0 {
			t.Errorf("node %s: %+v, want nothing to fit", n.Name, n)
		}
	}
	wantContains(t, "table", table(t, r), "node-1  -      fits now: no share; 0 whole GPU(s)")
}

// A borrower's claim is kept off GPUs that are not lent.
func TestNotLent(t *testing.T) {
	g := gputest.H100s(1, pairs)
	c := newCluster(t, map[string][]gpu.GPU{"node-1": g}, model.WithLending(map[string]model.Lent{g[0].UUID: {Reason: "Busy"}}))
	borrow := newClaim("borrow", []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: model.LentClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}})
	c.in.Claims = append(c.in.Claims, *borrow)
	wantContains(t, "gpu-0", gpuReasons(t, c.why("claim/borrow"), "node-1", "gpu-0"),
		"gpu-0-lent: tainted gpu.tessera.dev/not-lent=Busy:NoSchedule (the GPU is not lent now)")
}

// A claim that fits is reported as fitting, with the devices the allocator
// picked; a pod with allocated claims does not wait for devices.
func TestFitsAndAllocated(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(1, pairs)})
	c.in.Claims = append(c.in.Claims, *shareClaim("ok", "1Gi", "1"))
	n := nodeOf(t, c.why("claim/ok"), "node-1")
	if !n.Fits || len(n.Allocation) != 1 || n.Allocation[0] != "ok/gpu: gpu-0-shared" || len(n.GPUs) != 0 {
		t.Errorf("fitting claim: %+v", n)
	}
	c = newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(1, pairs)})
	c.allocate("node-1", shareClaim("done", "1Gi", "1"))
	r := c.why("p", podFor("p", "done"))
	if len(r.Nodes) != 0 || !strings.Contains(strings.Join(r.Notes, "\n"), "every claim is allocated") ||
		r.Claims[0].AllocatedOn != "node-1" {
		t.Errorf("allocated claim: %+v", r)
	}
}

// A pod's template claim that does not exist yet is a note; tessera.dev/gpu
// extended resources become the claim the scheduler would create.
func TestPodClaimsFromTemplateAndExtendedResource(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(1, pairs)})
	c.allocate("node-1", wholeClaim("held", 1))
	pod := podFor("p")
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("tmpl")}}
	pod.Spec.Containers[0].Resources.Limits = v1.ResourceList{"tessera.dev/gpu": resource.MustParse("1")}
	r := c.why("pod/p", pod)
	wantContains(t, "notes", strings.Join(r.Notes, "\n"), "spec.resourceClaims[gpu]: the claim from template tmpl is not created yet")
	if len(r.Claims) != 1 || !r.Claims[0].Generated || r.Claims[0].Requests[0] != "main-tessera-dev-gpu: 1 of gpu.tessera.dev" {
		t.Fatalf("claims %+v, want the extended-resource claim", r.Claims)
	}
	wantContains(t, "gpu-0", gpuReasons(t, r, "node-1", "gpu-0"), "gpu-0: held by default/held (whole GPU)")
}

// JSON output carries the same verdicts.
func TestReportJSON(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(1, pairs)})
	c.in.Claims = append(c.in.Claims, *shareClaim("big", "100Gi", "1"))
	b, err := json.Marshal(c.why("claim/big"))
	if err != nil {
		t.Fatal(err)
	}
	wantContains(t, "json", string(b), `"target":"claim default/big"`, `"fits":false`, `"largestShare":{"gpu":"gpu-0","memoryBytes":85899345920,"cores":100}`)
}

func TestGetBadTarget(t *testing.T) {
	client := fake.NewClientset()
	for target, want := range map[string]string{
		"deploy/x":  `unknown kind "deploy" (want pod or claim)`,
		"claim/":    "want POD, pod/NAME or claim/NAME",
		"pod/nope":  "pod default/nope",
		"claim/nop": "claim default/nop",
	} {
		_, err := Get(context.Background(), client, "default", target)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", target, err, want)
		}
	}
}

// TestWhyForeignDriverPCIeRoot: a claim for a GPU share and another
// driver's NIC under one PCIe root. The NIC is looked at on its own driver's
// devices (not reported missing); with the NIC whose root has no GPU the
// explanation names the constraint and the roots each request could have.
func TestWhyForeignDriverPCIeRoot(t *testing.T) {
	g := gputest.H100s(4, pairs)
	for i := range g {
		g[i].PCIeRoot = fmt.Sprintf("pci0000:%02x", 0x10*(i/2+1)) // 0-1 under 10, 2-3 under 20
	}
	c := newCluster(t, map[string][]gpu.GPU{"node-a": g})
	const nicDriver = "nic.example.com"
	nic := func(name, root string) resourceapi.Device {
		return resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"name":                            {StringValue: ptr.To(name)},
			"resource.kubernetes.io/pcieRoot": {StringValue: ptr.To(root)},
		}}
	}
	c.in.Slices = append(c.in.Slices, resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "nics", UID: "nics"},
		Spec: resourceapi.ResourceSliceSpec{Driver: nicDriver, NodeName: ptr.To("node-a"),
			Pool:    resourceapi.ResourcePool{Name: "node-a", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{nic("nic-0", "pci0000:20"), nic("nic-9", "pci0000:e5")}},
	})
	c.in.Classes = append(c.in.Classes, resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: nicDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}}}})
	claimFor := func(name, nicName string) *resourceapi.ResourceClaim {
		cl := shareClaim(name, "10Gi", "10")
		cl.Spec.Devices.Requests = append(cl.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: nicDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf(`device.attributes["%s"].name == "%s"`, nicDriver, nicName)}}},
		}})
		cl.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"gpu", "nic"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("resource.kubernetes.io/pcieRoot"))}}
		return cl
	}

	aligned := claimFor("aligned", "nic-0")
	r := c.why("claim/aligned", aligned)
	n := nodeOf(t, r, "node-a")
	if !n.Fits {
		t.Fatalf("aligned: does not fit: %v", n.Reasons)
	}
	wantContains(t, "aligned allocation", strings.Join(n.Allocation, ", "), "aligned/nic: nic-0")

	orphan := claimFor("orphan", "nic-9")
	r = c.why("claim/orphan", orphan)
	n = nodeOf(t, r, "node-a")
	reasons := strings.Join(n.Reasons, "\n")
	if n.Fits {
		t.Fatalf("orphan fits: %v", n.Allocation)
	}
	wantContains(t, "orphan", reasons,
		`request "nic": devices of driver nic.example.com`, "1 of 2 fit (nic-9)",
		"matchAttribute resource.kubernetes.io/pcieRoot across gpu, nic: no value is shared by fitting devices of every request (gpu: pci0000:10, pci0000:20; nic: pci0000:e5)")
	if strings.Contains(reasons, "no device of class") {
		t.Errorf("orphan: the NIC driver's devices reported missing:\n%s", reasons)
	}

	// Once a claim holds nic-0, a second claim for it is told who holds it.
	c.allocate("node-a", aligned)
	r = c.why("claim/second", claimFor("second", "nic-0"))
	wantContains(t, "second", strings.Join(nodeOf(t, r, "node-a").Reasons, "\n"), "nic-0: held by default/aligned")

	// A NIC no device of which passes the selector says so, device by device.
	none := claimFor("none", "nic-7")
	r = c.why("claim/none", none)
	wantContains(t, "none", strings.Join(nodeOf(t, r, "node-a").Reasons, "\n"),
		"none of 2 fits: nic-0: selector", "; nic-9: selector")
}

// poolOf is the pool of node's gpu.tessera.dev slices.
func poolOf(t *testing.T, c *cluster, node string) string {
	t.Helper()
	for _, s := range c.in.Slices {
		if s.Spec.Driver == model.DriverName && ptr.Deref(s.Spec.NodeName, "") == node {
			return s.Spec.Pool.Name
		}
	}
	t.Fatalf("no slice of node %s", node)
	return ""
}

// fenceRule is the DeviceTaintRule the locality controller's fence writes for
// device of pool (pkg/locality APIFences.Fence on a fake clientset).
func fenceRule(t *testing.T, pool, device string) *resourceapi.DeviceTaintRule {
	t.Helper()
	client := fake.NewClientset()
	ctx := context.Background()
	gpu := locality.GPU{Pool: pool, Device: device}
	if err := (locality.APIFences{Client: client}).Fence(ctx, gpu); err != nil {
		t.Fatalf("fence %s: %v", gpu, err)
	}
	rule, err := client.ResourceV1().DeviceTaintRules().Get(ctx, locality.FenceRuleName(gpu), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return rule
}

// A locality fence (a DeviceTaintRule, not a taint in the slice) keeps a
// share off the GPU: the explanation names the rule, its taint and effect,
// the share does not fit and does not count as fitting now.
func TestDeviceTaintRuleFence(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(1, pairs)})
	rule := fenceRule(t, poolOf(t, c, "node-1"), "gpu-0-shared")
	c.in.Claims = append(c.in.Claims, *shareClaim("s", "1Gi", "1"))
	r := c.why("claim/s", rule)
	n := nodeOf(t, r, "node-1")
	if n.Fits {
		t.Fatalf("share fits on a fenced GPU: %+v", n)
	}
	wantContains(t, "gpu-0", gpuReasons(t, r, "node-1", "gpu-0"),
		`request "gpu": gpu-0-shared: tainted by DeviceTaintRule `+rule.Name+": gpu.tessera.dev/locality-fence:NoSchedule (a locality fence")
	if f := n.FitsNow; f.LargestShare != nil || f.WholeGPUs != 1 {
		t.Errorf("fits now %+v, want no share (fenced) and the whole GPU (not fenced)", f)
	}
	out := table(t, r)
	if strings.Contains(out, "fits:") {
		t.Errorf("table says the share fits:\n%s", out)
	}
	t.Logf("\n%s", out)

	// The same rule with a value: the value is named too.
	rule.Spec.Taint.Value = "maintenance"
	wantContains(t, "gpu-0", gpuReasons(t, c.why("claim/s", rule), "node-1", "gpu-0"),
		"tainted by DeviceTaintRule "+rule.Name+": gpu.tessera.dev/locality-fence=maintenance:NoSchedule")
}

// Rules whose selector picks no device of the node, or that have no
// selector, or whose effect is None, change nothing: the share fits.
func TestDeviceTaintRuleNotMatching(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(1, pairs)})
	c.in.Claims = append(c.in.Claims, *shareClaim("s", "1Gi", "1"))
	taint := resourceapi.DeviceTaint{Key: "example.com/maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	rule := func(name string, sel *resourceapi.DeviceTaintSelector) *resourceapi.DeviceTaintRule {
		return &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceTaintRuleSpec{DeviceSelector: sel, Taint: taint}}
	}
	otherPool := fenceRule(t, poolOf(t, c, "node-1")+"-elsewhere", "gpu-0-shared")
	none := rule("no-effect", &resourceapi.DeviceTaintSelector{Driver: ptr.To(model.DriverName)})
	none.Spec.Taint.Effect = resourceapi.DeviceTaintEffectNone
	r := c.why("claim/s",
		otherPool,
		rule("other-driver", &resourceapi.DeviceTaintSelector{Driver: ptr.To("nic.example.com")}),
		rule("other-device", &resourceapi.DeviceTaintSelector{Driver: ptr.To(model.DriverName), Device: ptr.To("gpu-7-shared")}),
		rule("no-selector", nil),
		none,
	)
	n := nodeOf(t, r, "node-1")
	if !n.Fits || len(n.Allocation) != 1 || n.Allocation[0] != "s/gpu: gpu-0-shared" || len(n.GPUs) != 0 {
		t.Errorf("share with non-matching rules: %+v", n)
	}
	if f := n.FitsNow; f.LargestShare == nil || f.WholeGPUs != 1 {
		t.Errorf("fits now %+v, want a share and a whole GPU", f)
	}
}

// A rule with an empty selector taints every device; a claim that tolerates
// its taint fits anyway, one that does not is told which rule.
func TestDeviceTaintRuleTolerated(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(2, pairs)})
	all := &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "drain-everything"},
		Spec: resourceapi.DeviceTaintRuleSpec{DeviceSelector: &resourceapi.DeviceTaintSelector{},
			Taint: resourceapi.DeviceTaint{Key: "example.com/drain", Value: "now", Effect: resourceapi.DeviceTaintEffectNoExecute}}}
	tolerant := shareClaim("tolerant", "1Gi", "1")
	tolerant.Spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{
		{Key: "example.com/drain", Operator: resourceapi.DeviceTolerationOpExists}}
	c.in.Claims = append(c.in.Claims, *tolerant, *shareClaim("plain", "1Gi", "1"))
	if n := nodeOf(t, c.why("claim/tolerant", all), "node-1"); !n.Fits || len(n.GPUs) != 0 {
		t.Errorf("tolerating claim: %+v", n)
	}
	r := c.why("claim/plain", all)
	if n := nodeOf(t, r, "node-1"); n.Fits {
		t.Errorf("claim without toleration fits: %+v", n)
	}
	for _, g := range []string{"gpu-0", "gpu-1"} {
		wantContains(t, g, gpuReasons(t, r, "node-1", g), g+"-shared: tainted by DeviceTaintRule drain-everything: example.com/drain=now:NoExecute")
	}
}

// Without permission to list DeviceTaintRules the report says so and
// explains with the slices' own taints.
func TestDeviceTaintRulesForbidden(t *testing.T) {
	c := newCluster(t, map[string][]gpu.GPU{"node-1": gputest.H100s(1, pairs)})
	c.in.Claims = append(c.in.Claims, *shareClaim("s", "1Gi", "1"))
	client := c.client()
	client.PrependReactor("list", "devicetaintrules", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "devicetaintrules"}, "", fmt.Errorf("no"))
	})
	r := c.whyWith(client, "claim/s")
	wantContains(t, "notes", strings.Join(r.Notes, "\n"), "DeviceTaintRules are not readable (forbidden)")
	if n := nodeOf(t, r, "node-1"); !n.Fits {
		t.Errorf("share: %+v", n)
	}
}
