//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The demo specs other than the quarter shares (specs_test.go), one test each,
// each in its own namespace: what the scheduler allocated (the claim), what
// the plugin recorded (the claim's status.devices data) and what the container
// saw (its env, from its log) must agree, to the byte.

// TestDemoWholeGPU runs demo/specs/20-whole-gpu.yaml: the pod gets one whole
// GPU, sees exactly that GPU (TESSERA_GPU_<minor>=<uuid>), and no share
// limits or isolation backend.
func TestDemoWholeGPU(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-whole")
	p := c.RunSpec(t, ns, framework.SpecPath("20-whole-gpu.yaml"))["whole"]
	dev := framework.ClaimOf(t, c, p, "gpu")
	if dev.Attribute("type") != "gpu" || dev.Result.ShareID != nil || len(dev.Result.ConsumedCapacity) != 0 {
		t.Errorf("device %s: type %q, shareID %v, consumedCapacity %v; want a whole GPU", dev.Result.Device, dev.Attribute("type"), dev.Result.ShareID, dev.Result.ConsumedCapacity)
	}
	uuid := dev.Attribute("uuid")
	if uuid == "" || !strings.HasPrefix(uuid, "GPU-") {
		t.Fatalf("device %s advertises uuid %q", dev.Result.Device, uuid)
	}
	framework.WantGPUs(t, "pod whole", p.Env, framework.WholeGPU(t, dev))
	framework.NoShareEnv(t, "pod whole", p.Env)
	claim, _ := framework.PodClaimName(p.Pod, "gpu")
	framework.CheckStatusData(t, c, ns, claim, []framework.Allocated{dev}, 0, 0, "")
	t.Logf("pod whole: device %s (minor %s), uuid %s", dev.Result.Device, dev.Attribute("minor"), uuid)
}

// TestDemoNVLinkPair runs demo/specs/30-nvlink-pair.yaml. On hgx-h100 all
// GPUs share one NVLink domain, so the first subrequest, gpus/nvlink, is
// satisfied: two distinct whole GPUs of one domain. The container sees both
// GPUs (TESSERA_GPU_<minor>=<uuid> for each) and no other, without limits;
// the plugin records them in the claim's status in its order (NVLink domain,
// then PCI bus, which on hgx-h100 ascends with the minor).
func TestDemoNVLinkPair(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-nvlink")
	p := c.RunSpec(t, ns, framework.SpecPath("30-nvlink-pair.yaml"))["nvlink-pair"]
	devs := framework.DevicesOf(t, c, p, "gpus")
	if len(devs) != 2 {
		t.Fatalf("claim has %d devices, want 2", len(devs))
	}
	if devs[0].Result.Device == devs[1].Result.Device {
		t.Fatalf("both results are device %s", devs[0].Result.Device)
	}
	for _, d := range devs {
		if d.Result.Request != "gpus/nvlink" {
			t.Errorf("device %s allocated for request %q, want subrequest gpus/nvlink", d.Result.Device, d.Result.Request)
		}
		if d.Attribute("type") != "gpu" {
			t.Errorf("device %s has type %q, want gpu (a whole GPU)", d.Result.Device, d.Attribute("type"))
		}
	}
	if a, b := devs[0].Attribute("nvlinkDomain"), devs[1].Attribute("nvlinkDomain"); a == "" || a != b {
		t.Errorf("nvlinkDomain %q and %q, want one domain", a, b)
	}

	// The plugin's order: by NVLink domain, then PCI bus id (= minor here).
	ordered := slices.Clone(devs)
	slices.SortFunc(ordered, func(a, b framework.Allocated) int {
		return cmp.Or(strings.Compare(a.Attribute("nvlinkDomain"), b.Attribute("nvlinkDomain")),
			cmp.Compare(framework.MustInt64(t, a.Attribute("minor")), framework.MustInt64(t, b.Attribute("minor"))))
	})
	want := ordered[0].Attribute("uuid") + "," + ordered[1].Attribute("uuid")
	framework.WantGPUs(t, "pod nvlink-pair", p.Env, framework.WholeGPU(t, devs[0]), framework.WholeGPU(t, devs[1]))
	framework.NoShareEnv(t, "pod nvlink-pair", p.Env)

	claim, _ := framework.PodClaimName(p.Pod, "gpus")
	var statusOrder []string
	for _, d := range framework.CheckStatusData(t, c, ns, claim, devs, 0, 0, "") {
		statusOrder = append(statusOrder, d.UUID)
	}
	if got := strings.Join(statusOrder, ","); got != want {
		t.Errorf("claim status.devices in order %s; want the plugin's order (NVLink domain, minor) %s", got, want)
	}
	t.Logf("pod nvlink-pair: allocated %s and %s (request %s), status order %s",
		devs[0].Result.Device, devs[1].Result.Device, devs[0].Result.Request, want)
}

// TestDemoSharedClaimTwoPods runs demo/specs/40-shared-claim-two-pods.yaml:
// one ResourceClaim, one allocation (one share of 10Gi and 10 cores), reserved
// for both pods; both containers see the same GPU and the same limits.
func TestDemoSharedClaimTwoPods(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-team")
	pods := c.RunSpec(t, ns, framework.SpecPath("40-shared-claim-two-pods.yaml"))
	a, b := pods["team-a"], pods["team-b"]
	if a.Pod == nil || b.Pod == nil {
		t.Fatalf("pods %v, want team-a and team-b", pods)
	}
	claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "team-share", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim team-share allocation %+v, want one device", claim.Status.Allocation)
	}
	var reserved []string
	for _, r := range claim.Status.ReservedFor {
		reserved = append(reserved, r.Name)
	}
	slices.Sort(reserved)
	if !slices.Equal(reserved, []string{"team-a", "team-b"}) {
		t.Errorf("claim team-share reservedFor %v, want [team-a team-b]", reserved)
	}
	dev := framework.ClaimOf(t, c, a, "gpu")
	if other := framework.ClaimOf(t, c, b, "gpu"); other.Result.Device != dev.Result.Device || *other.Result.ShareID != *dev.Result.ShareID {
		t.Errorf("team-b's claim resolves to %s, team-a's to %s", other.Result.Device, dev.Result.Device)
	}
	framework.WantConsumed(t, "team-a", dev, map[string]string{"memory": "10Gi", "cores": "10"})
	uuid := dev.Attribute("uuid")
	for _, p := range []framework.SpecPod{a, b} {
		framework.WantGPUs(t, "pod "+p.Pod.Name, p.Env, framework.ShareGPU(t, dev, "10Gi", 10))
		framework.WantEnv(t, p, map[string]string{"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
	}
	framework.CheckStatusData(t, c, ns, "team-share", []framework.Allocated{dev}, framework.MustInt64(t, framework.BytesOf("10Gi")), 10, "Advisory")
	t.Logf("claim team-share: one share %s of %s (uuid %s) reserved for %v", *dev.Result.ShareID, dev.Result.Device, uuid, reserved)
}

// TestDemoMPSShare runs demo/specs/50-mps-share.yaml: a 16Gi/30-core share
// with isolation MPS and computeLimit 50. The scheduler accounts the
// guarantee (30 cores); the container's limit is the computeLimit (50), both
// as TESSERA_GPU_<minor>_CORES_LIMIT and as MPS's active thread percentage,
// and its memory limit is MPS's pinned device memory limit in MiB.
func TestDemoMPSShare(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	ns := c.Namespace(t, "e2e-mps")
	p := c.RunSpec(t, ns, framework.SpecPath("50-mps-share.yaml"))["mps"]
	dev := framework.ClaimOf(t, c, p, "gpu")
	framework.WantConsumed(t, "mps", dev, map[string]string{"memory": "16Gi", "cores": "30"})
	uuid := dev.Attribute("uuid")
	framework.WantGPUs(t, "pod mps", p.Env, framework.EnforcedShareGPU(t, dev, "16Gi", 50))
	framework.WantEnv(t, p, map[string]string{
		"CUDA_MPS_PIPE_DIRECTORY":           "/tmp/nvidia-mps",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=16384M",
		"TF_FORCE_GPU_ALLOW_GROWTH":         "",
	})
	claim, _ := framework.PodClaimName(p.Pod, "gpu")
	framework.CheckStatusData(t, c, ns, claim, []framework.Allocated{dev}, framework.MustInt64(t, framework.BytesOf("16Gi")), 50, "MPS")
	t.Logf("pod mps: share %s of %s (uuid %s): 30 cores accounted, limit 50", *dev.Result.ShareID, dev.Result.Device, uuid)
}

// TestDemoExtendedResource runs demo/specs/60-extended-resource.yaml: a pod
// that asks for tessera.dev/gpu: 1 and no claim. The scheduler (DRA extended
// resources, GA in 1.37) creates a claim for it from the DeviceClass
// gpu.tessera.dev, which names that extended resource; the pod gets one whole
// GPU and sees exactly that GPU.
func TestDemoExtendedResource(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev")
	ctx := context.Background()
	dc, err := c.Client.ResourceV1().DeviceClasses().Get(ctx, "gpu.tessera.dev", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dc.Spec.ExtendedResourceName == nil || *dc.Spec.ExtendedResourceName != "tessera.dev/gpu" {
		t.Fatalf("DeviceClass gpu.tessera.dev extendedResourceName %v, want tessera.dev/gpu", dc.Spec.ExtendedResourceName)
	}
	ns := c.Namespace(t, "e2e-extended")
	p := c.RunSpec(t, ns, framework.SpecPath("60-extended-resource.yaml"))["extended"]
	ers := p.Pod.Status.ExtendedResourceClaimStatus
	if ers == nil || ers.ResourceClaimName == "" {
		t.Fatalf("pod extended has no status.extendedResourceClaimStatus: %+v", p.Pod.Status)
	}
	mapped := false
	for _, m := range ers.RequestMappings {
		if m.ContainerName == "ctr" && m.ResourceName == "tessera.dev/gpu" {
			mapped = true
		}
	}
	if !mapped {
		t.Errorf("extendedResourceClaimStatus.requestMappings %+v: no mapping for container ctr, tessera.dev/gpu", ers.RequestMappings)
	}
	devs, err := c.AllocatedDevices(ctx, ns, ers.ResourceClaimName)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0].Attribute("type") != "gpu" {
		t.Fatalf("claim %s: devices %+v, want one whole GPU", ers.ResourceClaimName, devs)
	}
	uuid := devs[0].Attribute("uuid")
	framework.WantGPUs(t, "pod extended", p.Env, framework.WholeGPU(t, devs[0]))
	framework.NoShareEnv(t, "pod extended", p.Env)
	if q := p.Pod.Spec.Containers[0].Resources.Limits[corev1.ResourceName("tessera.dev/gpu")]; q.Value() != 1 {
		t.Errorf("pod limits %v", p.Pod.Spec.Containers[0].Resources.Limits)
	}
	t.Logf("pod extended: tessera.dev/gpu: 1 became claim %s, device %s, uuid %s", ers.ResourceClaimName, devs[0].Result.Device, uuid)
}
