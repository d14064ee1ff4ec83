package clusterview

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/internal/cli/clitest"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/model"
)

// migPublished is what node publishes for the hgx-h100-mig mock node (GPU 0
// static MIG with a 4g.40gb, instance 1, and a 3g.40gb, instance 2; GPU 1
// dynamic MIG; GPUs 2-7 not in MIG mode), with the static 3g.40gb tainted
// unhealthy as pkg/health marks one MIG device.
func migPublishedSlices(t *testing.T, node string) []runtime.Object {
	t.Helper()
	gpus := gputest.GPUs(t, "hgx-h100-mig")
	slices := clitest.Slices(t, node, gpus, model.WithDynamicMIG(gpus[1].UUID))
	var out []runtime.Object
	for i := range slices {
		slices[i].Name = slices[i].GenerateName + "x"
		for j := range slices[i].Spec.Devices {
			if d := &slices[i].Spec.Devices[j]; d.Name == "gpu-0-mig-2" {
				d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: unhealthyTaint, Value: "XID-43", Effect: resourceapi.DeviceTaintEffectNoSchedule})
			}
		}
		out = append(out, &slices[i])
	}
	return out
}

func migResult(node, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "mig", Driver: model.DriverName, Pool: node, Device: device}
}

// TestStatusMIG: GPUs in MIG mode are listed with their MIG devices and
// holders: every static instance (held or free, with its health), the held
// placements of a dynamic GPU; memory and cores held are the MIG devices'.
func TestStatusMIG(t *testing.T) {
	objs := migPublishedSlices(t, "node-m")
	admin := migResult("node-m", "gpu-1-mig-1g-10gb-6")
	admin.AdminAccess = ptr.To(true)
	objs = append(objs,
		allocated("lab", "big", []string{"trainer"}, migResult("node-m", "gpu-0-mig-1")),
		allocated("lab", "small", []string{"notebook"}, migResult("node-m", "gpu-1-mig-3g-40gb-4")),
		allocated("ops", "watch", []string{"dcgm"}, admin),
	)
	r, err := Get(context.Background(), fake.NewClientset(objs...), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Nodes) != 1 || len(r.Nodes[0].GPUs) != 8 {
		t.Fatalf("nodes %+v: want node-m with 8 GPUs", r.Nodes)
	}
	g0, g1, g2 := r.Nodes[0].GPUs[0], r.Nodes[0].GPUs[1], r.Nodes[0].GPUs[2]
	if g0.Mode != ModeMIG || g0.MIG == nil || g0.MIG.Dynamic || g0.ProductName != "NVIDIA H100 80GB HBM3" || !strings.HasPrefix(g0.UUID, "GPU-") {
		t.Fatalf("gpu-0: %+v, want a static MIG GPU", g0)
	}
	if len(g0.MIG.Devices) != 2 || g0.MIG.Devices[0].Device != "gpu-0-mig-2" || g0.MIG.Devices[1].Device != "gpu-0-mig-1" {
		t.Fatalf("gpu-0 MIG devices %+v, want the 3g.40gb then the 4g.40gb (published small first)", g0.MIG.Devices)
	}
	three, four := g0.MIG.Devices[0], g0.MIG.Devices[1]
	if three.Profile != "3g.40gb" || three.Unhealthy != "XID-43" || len(three.Holders) != 0 || !strings.HasPrefix(three.UUID, "MIG-") || three.PlacementStart != 4 {
		t.Errorf("3g.40gb: %+v, want free, unhealthy XID-43, at 4, with its MIG UUID", three)
	}
	if len(four.Holders) != 1 || four.Holders[0].Claim != "big" || four.Holders[0].MIGProfile != "4g.40gb" {
		t.Errorf("4g.40gb: %+v, want held by lab/big", four)
	}
	if g0.Healthy || g0.MemoryBytes != three.MemoryBytes+four.MemoryBytes || g0.Cores != 42+57 ||
		g0.AllocatedMemoryBytes != four.MemoryBytes || g0.AllocatedCores != 57 || len(g0.Holders) != 1 {
		t.Errorf("gpu-0 totals: %+v", g0)
	}
	if g1.Mode != ModeMIG || g1.MIG == nil || !g1.MIG.Dynamic || len(g1.MIG.Devices) != 2 || g1.Cores != 100 || g1.AllocatedCores != 42 {
		t.Fatalf("gpu-1: %+v, want dynamic MIG, the two held placements, 42 of 100 cores held", g1)
	}
	if d := g1.MIG.Devices; d[0].Device != "gpu-1-mig-1g-10gb-6" || !d[0].Holders[0].AdminAccess || d[1].Device != "gpu-1-mig-3g-40gb-4" || d[1].Holders[0].Claim != "small" {
		t.Errorf("gpu-1 MIG devices %+v", d)
	}
	if g2.Mode != ModeFree || g2.MIG != nil {
		t.Errorf("gpu-2: %+v, want a free GPU not in MIG mode", g2)
	}

	tableHas(t, r,
		"node-m gpu-0 NVIDIA H100 80GB HBM3 39.5Gi/79Gi 57/99 Unhealthy(XID-43:NoSchedule) MIG gpu-0-mig-2 (3g.40gb, unhealthy XID-43): free",
		"MIG gpu-0-mig-1: lab/trainer (claim big: MIG 4g.40gb)",
		"node-m gpu-1 NVIDIA H100 80GB HBM3 39.5Gi/79.2Gi 42/100 Healthy MIG gpu-1-mig-1g-10gb-6: ops/dcgm (claim watch: admin access)",
		"MIG gpu-1-mig-3g-40gb-4: lab/notebook (claim small: MIG 3g.40gb)",
		"node-m gpu-2 NVIDIA H100 80GB HBM3 0/79.2Gi 0/100 Healthy -")
}
