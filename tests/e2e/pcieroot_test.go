//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/internal/cli/why"
	"github.com/tessera-dev/tessera/tests/e2e/fakenic"
)

// TestGPUAndNICOnOnePCIeRoot: Tessera's GPUs carry the standard
// resource.kubernetes.io/pcieRoot, so one claim can ask the real scheduler
// for a GPU share and another driver's NIC under the same root. A fake NIC
// driver (tests/e2e/fakenic) runs in this process as a kubelet plugin and
// publishes three NICs: two under GPU roots, one under a root without GPU.
//   - demo/specs/90-gpu-nic-same-pcie-root.yaml (its NIC class swapped for
//     the fake one): the pod runs, the kubelet prepared the NIC through the
//     fake plugin, and the GPU and the NIC have one root;
//   - the same claim with a selector for the NIC without GPU: the pod stays
//     Pending, its claim unallocated, the scheduler says it cannot allocate
//     the claims, and tessera why names the constraint and the roots.
func TestGPUAndNICOnOnePCIeRoot(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	framework.RequireNodeFiles(t) // the fake plugin must run beside the kubelet
	ctx := context.Background()

	node, gpuRoots := tesseraPCIeRoots(t, c)
	if len(gpuRoots) < 2 {
		t.Fatalf("node %s: GPU PCIe roots %v, want at least 2 (the hgx-h100 profile has 4)", node, gpuRoots)
	}
	const orphanRoot = "pci0000:e5"
	if slices.Contains(gpuRoots, orphanRoot) {
		t.Fatalf("GPU roots %v include %s, the root meant to have no GPU", gpuRoots, orphanRoot)
	}
	nics := []fakenic.NIC{
		{Name: "nic-0", PCIeRoot: gpuRoots[0]},
		{Name: "nic-1", PCIeRoot: gpuRoots[len(gpuRoots)-1]},
		{Name: "nic-2", PCIeRoot: orphanRoot},
	}

	// Cleanups run last first: the namespace (its pods, so the kubelet
	// unprepares their NICs through the plugin), then the class, then the
	// plugin with its slice and sockets.
	nic, err := fakenic.Start(ctx, fakenic.Options{Client: c.Client, NodeName: node, NICs: nics})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nic.Stop(context.Background()); err != nil {
			t.Errorf("stop the fake NIC plugin: %v", err)
		}
		if errs := nic.Errors(); len(errs) > 0 {
			t.Errorf("fake NIC plugin: %v", errs)
		}
	})
	driver := nic.Driver()
	class := fakenic.DeviceClass(driver, driver)
	if _, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass %s: %v", class.Name, err)
	}
	t.Cleanup(func() {
		err := c.Client.ResourceV1().DeviceClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete DeviceClass %s: %v", class.Name, err)
		}
	})
	ns := c.Namespace(t, "e2e-pcieroot")

	err = framework.Poll(ctx, "the kubelet to register "+driver+" and its slice", time.Minute, func(ctx context.Context) (bool, error) {
		if !nic.Registered() {
			return false, framework.Retry("not registered by the kubelet")
		}
		list, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
		if err != nil || len(list.Items) == 0 {
			return false, framework.Retry("no ResourceSlice of %s (%v)", driver, err)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The demo spec with the fake NIC class.
	spec := demoSpecWithNICClass(t, driver)
	c.Apply(t, ns, spec...)
	c.Apply(t, ns, framework.EnvPodWith("aligned", []framework.PodClaim{{Name: "gpu-nic", Template: spec[0].GetName()}}, framework.EnvContainer{Name: "ctr", Claims: []string{"gpu-nic"}}))
	pod, err := c.WaitForPodRunning(ctx, ns, "aligned")
	if err != nil {
		t.Fatal(err)
	}
	claimName, err := framework.PodClaimName(pod, "gpu-nic")
	if err != nil {
		t.Fatal(err)
	}
	devices, err := c.AllocatedDevices(ctx, ns, claimName)
	if err != nil {
		t.Fatal(err)
	}
	var gpuDev, nicDev *framework.Allocated
	for i := range devices {
		switch devices[i].Result.Driver {
		case framework.Driver:
			gpuDev = &devices[i]
		case driver:
			nicDev = &devices[i]
		}
	}
	if gpuDev == nil || nicDev == nil {
		t.Fatalf("claim %s: allocated %+v, want one device of %s and one of %s", claimName, devices, framework.Driver, driver)
	}
	root := string(deviceattribute.StandardDeviceAttributePCIeRoot)
	gpuRoot, nicGot := gpuDev.Attribute(root), nicDev.Attribute(root)
	t.Logf("claim %s: %s (%s=%s) and %s (%s=%s)", claimName, gpuDev.Result.Device, root, gpuRoot, nicDev.Result.Device, root, nicGot)
	if gpuRoot == "" || gpuRoot != nicGot {
		t.Errorf("GPU %s under %q, NIC %s under %q: want one root", gpuDev.Result.Device, gpuRoot, nicDev.Result.Device, nicGot)
	}
	if nicDev.Result.Device == "nic-2" {
		t.Errorf("got nic-2, whose root has no GPU")
	}
	if gpuDev.Attribute("type") != "shared" {
		t.Errorf("GPU device %s is of type %q, want a share", gpuDev.Result.Device, gpuDev.Attribute("type"))
	}
	claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := nic.Prepared(claim.UID); !slices.Equal(got, []string{nicDev.Result.Device}) {
		t.Errorf("the kubelet had the fake plugin prepare %v for claim %s, want [%s]", got, claimName, nicDev.Result.Device)
	}

	// The NIC whose root has no GPU, by selector: no pair exists.
	orphan := orphanNICClaim(t, spec[0], driver, "nic-2")
	c.Apply(t, ns, orphan)
	c.Apply(t, ns, framework.EnvPod("orphan", orphan.GetName(), false))
	cond, err := c.WaitForUnschedulable(ctx, ns, "orphan")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod orphan: PodScheduled=False %s: %s", cond.Reason, cond.Message)
	if !strings.Contains(cond.Message, unschedulableClaims) {
		t.Errorf("PodScheduled message %q, want %q", cond.Message, unschedulableClaims)
	}
	events, err := c.PodEvents(ctx, ns, "orphan", "FailedScheduling")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod orphan: FailedScheduling events: %q", events)
	if oc, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, orphan.GetName(), metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if oc.Status.Allocation != nil {
		t.Errorf("claim %s allocated (%+v), want none", oc.Name, oc.Status.Allocation.Devices.Results)
	}
	if p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "orphan", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		t.Errorf("pod orphan on node %q in phase %s, want Pending and unbound", p.Spec.NodeName, p.Status.Phase)
	}

	kubeconfig := framework.Kubeconfig(t)
	table := framework.RunCLI(t, "why", "orphan", "-n", ns, "--kubeconfig", kubeconfig)
	t.Logf("tessera why orphan -n %s:\n%s", ns, table)
	var r why.Report
	if err := json.Unmarshal([]byte(framework.RunCLI(t, "why", "orphan", "-n", ns, "--kubeconfig", kubeconfig, "-o", "json")), &r); err != nil {
		t.Fatalf("tessera why -o json: %v", err)
	}
	var reasons []string
	for _, n := range r.Nodes {
		if n.Fits {
			t.Errorf("tessera why: node %s fits (%v), but the pod is pending", n.Name, n.Allocation)
		}
		reasons = append(reasons, n.Reasons...)
	}
	all := strings.Join(reasons, "\n")
	for _, want := range []string{"matchAttribute " + root, orphanRoot, gpuRoots[0]} {
		if !strings.Contains(all, want) {
			t.Errorf("tessera why: want %q in the node's reasons:\n%s", want, all)
		}
	}
	if strings.Contains(all, "no device of class "+driver) {
		t.Errorf("tessera why says the node has no %s device, but the fake driver publishes three:\n%s", driver, all)
	}
}

// tesseraPCIeRoots returns the node Tessera publishes GPUs on and the
// distinct pcieRoot values of its GPUs, sorted.
func tesseraPCIeRoots(t *testing.T, c *framework.Cluster) (string, []string) {
	t.Helper()
	list, err := c.DriverSlices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	node := ""
	var roots []string
	for _, s := range list {
		n := ptr.Deref(s.Spec.NodeName, "")
		if n == "" {
			continue
		}
		if node != "" && n != node {
			t.Fatalf("Tessera publishes on nodes %s and %s; the fake NIC plugin runs on one", node, n)
		}
		node = n
		for _, d := range s.Spec.Devices {
			if v := d.Attributes[deviceattribute.StandardDeviceAttributePCIeRoot].StringValue; v != nil && !slices.Contains(roots, *v) {
				roots = append(roots, *v)
			}
		}
	}
	if node == "" {
		t.Fatal("no node-local ResourceSlice of " + framework.Driver)
	}
	slices.Sort(roots)
	return node, roots
}

// demoSpecWithNICClass is demo/specs/90-gpu-nic-same-pcie-root.yaml with
// its placeholder NIC class replaced by class.
func demoSpecWithNICClass(t *testing.T, class string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(framework.SpecPath("90-gpu-nic-same-pcie-root.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const placeholder = "deviceClassName: nic.example.com"
	if !strings.Contains(string(data), placeholder) {
		t.Fatalf("90-gpu-nic-same-pcie-root.yaml: no %q to replace", placeholder)
	}
	objs := framework.MustDecodeYAML(t, strings.Replace(string(data), placeholder, "deviceClassName: "+class, 1))
	if len(objs) != 1 || objs[0].GetKind() != "ResourceClaimTemplate" {
		t.Fatalf("90-gpu-nic-same-pcie-root.yaml: want one ResourceClaimTemplate, got %d objects", len(objs))
	}
	return objs
}

// orphanNICClaim is a ResourceClaim with the template's spec whose NIC
// request selects the NIC named nicName.
func orphanNICClaim(t *testing.T, template *unstructured.Unstructured, driver, nicName string) *unstructured.Unstructured {
	t.Helper()
	var tmpl resourceapi.ResourceClaimTemplate
	data, err := template.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &tmpl); err != nil {
		t.Fatal(err)
	}
	spec := tmpl.Spec.Spec.DeepCopy()
	found := false
	for i := range spec.Devices.Requests {
		if r := &spec.Devices.Requests[i]; r.Exactly != nil && r.Exactly.DeviceClassName == driver {
			r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf("device.attributes[%q].name == %q", driver, nicName),
			}})
			found = true
		}
	}
	if !found {
		t.Fatalf("template %s has no request of class %s", tmpl.Name, driver)
	}
	claim := &resourceapi.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: "orphan-nic"},
		Spec:       *spec,
	}
	data, err = json.Marshal(claim)
	if err != nil {
		t.Fatal(err)
	}
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	return &u
}
