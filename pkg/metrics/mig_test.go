package metrics

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
)

// MIG devices are listed with their holders: every static instance of GPU
// 0 of the hgx-h100-mig mock (the 3g.40gb free and unhealthy, the 4g.40gb
// held), the placement of dynamic GPU 1 a claim holds (not the free
// ones); claim series name the holders, and the GPUs' allocated memory and
// cores are those of the held MIG devices (admin access holds nothing).
func TestMIGMetrics(t *testing.T) {
	gpus := gputest.GPUs(t, "hgx-h100-mig")
	g0, g1 := gpus[0], gpus[1]
	dynamic := func(g gpu.GPU) bool { return g.UUID == g1.UUID }
	claims := []checkpoint.Claim{
		{UID: "u-big", Namespace: "lab", Name: "big", State: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{
			{Request: "mig", Device: "gpu-0-mig-1", UUID: g0.UUID, Minor: 0}}},
		{UID: "u-dyn", Namespace: "lab", Name: "dyn", State: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{
			{Request: "mig", Device: "gpu-1-mig-3g-40gb-4", UUID: g1.UUID, Minor: 1, Isolation: "MPS",
				MIG: &checkpoint.MIGDevice{Dynamic: true, Profile: "3g.40gb", ProfileID: 9, Start: 4, Size: 4, UUID: "MIG-dyn", GPUInstance: 1, MemoryBytes: 40448 << 20}}}},
		{UID: "u-dbg", Namespace: "ops", Name: "dbg", State: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{
			// Prepared by a release that named static devices per compute
			// instance: it holds the GPU instance's device.
			{Request: "mig", Device: "gpu-0-mig-2-0", UUID: g0.UUID, Minor: 0, AdminAccess: true}}},
		{UID: "u-new", Namespace: "lab", Name: "new", State: checkpoint.PrepareStarted, Devices: []checkpoint.Device{
			{Request: "mig", Device: "gpu-1-mig-1g-10gb-6", UUID: g1.UUID, Minor: 1, MIG: &checkpoint.MIGDevice{Dynamic: true, Profile: "1g.10gb", ProfileID: 19, Start: 6, Size: 1}}}},
	}
	migs := MIGDevices(gpus, dynamic, claims, map[types.UID][]string{"u-big": {"trainer"}}, map[string]string{"gpu-0-mig-2": "NoSchedule"})
	if len(migs) != 3 || migs[0].Device != "gpu-0-mig-1" || migs[1].Device != "gpu-0-mig-2" || migs[2].Device != "gpu-1-mig-3g-40gb-4" {
		t.Fatalf("MIG devices %+v: want GPU 0's two instances and GPU 1's held 3g.40gb (not the placement still being prepared)", migs)
	}
	if h := migs[1].Holders; len(h) != 1 || h[0].UID != "u-dbg" {
		t.Errorf("holders of gpu-0-mig-2: %+v, want the claim recorded as gpu-0-mig-2-0", h)
	}
	if m := migs[2]; !m.Dynamic || m.Cores != 42 || m.MemoryBytes != 40448<<20 || m.UUID != "MIG-dyn" || len(m.Holders) != 1 {
		t.Errorf("dynamic device %+v", m)
	}

	var metricsGPUs []GPU
	for _, g := range gpus[:3] {
		metricsGPUs = append(metricsGPUs, GPU{UUID: g.UUID, Minor: g.Minor, ProductName: g.ProductName, MemoryBytes: int64(g.MemoryBytes), Healthy: true})
	}
	m := New("node-m")
	m.AddState(fixedSource{GPUs: metricsGPUs, MIG: migs}, nil)
	text := scrape(t, m)
	d := func(gpuName, uuid, device string) string {
		return `device="` + device + `",gpu="` + gpuName + `",node="node-m",uuid="` + uuid + `"`
	}
	three, four, dyn := d("gpu-0", g0.UUID, "gpu-0-mig-2"), d("gpu-0", g0.UUID, "gpu-0-mig-1"), d("gpu-1", g1.UUID, "gpu-1-mig-3g-40gb-4")
	fourMiB := migs[0].MemoryBytes
	mustContain(t, text,
		`tessera_mig_device_info{device="gpu-0-mig-2",gpu="gpu-0",mig_uuid="`+migs[1].UUID+`",mode="static",node="node-m",placement_size="4",placement_start="4",profile="3g.40gb",uuid="`+g0.UUID+`"} 1`,
		`tessera_mig_device_info{device="gpu-1-mig-3g-40gb-4",gpu="gpu-1",mig_uuid="MIG-dyn",mode="dynamic",node="node-m",placement_size="4",placement_start="4",profile="3g.40gb",uuid="`+g1.UUID+`"} 1`,
		`tessera_mig_device_healthy{device="gpu-0-mig-2",effect="NoSchedule",gpu="gpu-0",node="node-m",uuid="`+g0.UUID+`"} 0`,
		`tessera_mig_device_healthy{device="gpu-0-mig-1",effect="",gpu="gpu-0",node="node-m",uuid="`+g0.UUID+`"} 1`,
		`tessera_mig_device_allocated{`+three+`} 0`,
		`tessera_mig_device_allocated{`+four+`} 1`,
		`tessera_mig_device_allocated{`+dyn+`} 1`,
		`tessera_mig_device_cores{`+four+`} 57`,
		`tessera_claim_cores{claim="big",device="gpu-0-mig-1",gpu="gpu-0",isolation="",namespace="lab",node="node-m",pod="trainer",request="mig",share="",uid="u-big",uuid="`+g0.UUID+`"} 57`,
		`tessera_claim_cores{claim="dbg",device="gpu-0-mig-2",gpu="gpu-0",isolation="",namespace="ops",node="node-m",pod="",request="mig",share="",uid="u-dbg",uuid="`+g0.UUID+`"} 0`,
		`tessera_claim_cores{claim="dyn",device="gpu-1-mig-3g-40gb-4",gpu="gpu-1",isolation="MPS",namespace="lab",node="node-m",pod="",request="mig",share="",uid="u-dyn",uuid="`+g1.UUID+`"} 42`,
		`tessera_gpu_allocated_cores{gpu="gpu-0",node="node-m",uuid="`+g0.UUID+`"} 57`,
		`tessera_gpu_allocated_cores{gpu="gpu-1",node="node-m",uuid="`+g1.UUID+`"} 42`,
		`tessera_gpu_allocated_cores{gpu="gpu-2",node="node-m",uuid="`+gpus[2].UUID+`"} 0`,
	)
	if fourMiB != 40448<<20 {
		t.Errorf("4g.40gb memory %d, want the mock's 40448 MiB", fourMiB)
	}
	if t.Failed() {
		t.Log(text)
	}
}
