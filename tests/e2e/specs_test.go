//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// specPath returns the path of a demo spec users copy (demo/specs).
func specPath(name string) string {
	return filepath.Join(repoRoot, "demo", "specs", name)
}

// bytesOf is a quantity's value in bytes, as the driver prints it.
func bytesOf(q string) string {
	v := resource.MustParse(q)
	return fmt.Sprint(v.Value())
}

// claimOf returns the one device allocated to a pod's claim entry podClaim,
// failing the test unless there is exactly one.
func claimOf(t *testing.T, c *Cluster, p SpecPod, podClaim string) Allocated {
	t.Helper()
	devs := devicesOf(t, c, p, podClaim)
	if len(devs) != 1 {
		t.Fatalf("pod %s: claim %q has %d devices allocated, want 1", p.Pod.Name, podClaim, len(devs))
	}
	return devs[0]
}

// devicesOf returns the devices allocated to a pod's claim entry podClaim.
func devicesOf(t *testing.T, c *Cluster, p SpecPod, podClaim string) []Allocated {
	t.Helper()
	name, err := PodClaimName(p.Pod, podClaim)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := c.AllocatedDevices(context.Background(), p.Pod.Namespace, name)
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

// wantEnv checks that the container saw exactly these values (a "" value:
// the variable must be absent).
func wantEnv(t *testing.T, p SpecPod, want map[string]string) {
	t.Helper()
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		got, ok := p.Env[k]
		switch {
		case want[k] == "" && ok:
			t.Errorf("pod %s: %s=%s is set; want it absent", p.Pod.Name, k, got)
		case want[k] != "" && got != want[k]:
			t.Errorf("pod %s: %s = %q, want %q", p.Pod.Name, k, got, want[k])
		}
	}
}

// wantConsumed checks a share's consumedCapacity in the allocation result.
func wantConsumed(t *testing.T, pod string, dev Allocated, want map[string]string) {
	t.Helper()
	for res, w := range want {
		q, ok := dev.Result.ConsumedCapacity[resourceapi.QualifiedName(res)]
		if !ok || q.Cmp(resource.MustParse(w)) != 0 {
			t.Errorf("pod %s: device %s consumedCapacity %s = %v, want %s", pod, dev.Result.Device, res, dev.Result.ConsumedCapacity, w)
		}
	}
}

// noLimitEnv checks that a whole-GPU container got no share limits at all.
func noLimitEnv(t *testing.T, p SpecPod) {
	t.Helper()
	for k, v := range p.Env {
		if strings.HasPrefix(k, "TESSERA_") || strings.HasPrefix(k, "CUDA_MPS_") || k == "TF_FORCE_GPU_ALLOW_GROWTH" {
			t.Errorf("pod %s has a whole GPU but saw %s=%s", p.Pod.Name, k, v)
		}
	}
}

// TestDemoQuarterShares runs demo/specs/10-quarter-gpu-shares.yaml: four pods
// with a quarter of a GPU each share one GPU (first-fit), and each sees that
// GPU's UUID, a 19Gi memory limit and 25% of the cores (Advisory isolation).
func TestDemoQuarterShares(t *testing.T) {
	cluster := needCluster(t)
	cluster.RequireDriver(t, "shared.gpu.tessera.dev")
	ns := cluster.Namespace(t, "e2e-quarter")
	pods := cluster.RunSpec(t, ns, specPath("10-quarter-gpu-shares.yaml"))
	if len(pods) != 4 {
		t.Fatalf("%d pods ran, want 4", len(pods))
	}
	devices := map[string]bool{}
	shareIDs := map[string]bool{}
	for name, p := range pods {
		dev := claimOf(t, cluster, p, "gpu")
		devices[dev.Result.Device] = true
		sid := ""
		if dev.Attribute("type") != "shared" || dev.Result.ShareID == nil {
			t.Errorf("pod %s: device %s (type %q, shareID %v), want a share of a shared device", name, dev.Result.Device, dev.Attribute("type"), dev.Result.ShareID)
		} else {
			sid = string(*dev.Result.ShareID)
			shareIDs[sid] = true
		}
		wantConsumed(t, name, dev, map[string]string{"memory": "19Gi", "cores": "25"})
		uuid := dev.Attribute("uuid")
		if uuid == "" {
			t.Fatalf("device %s advertises no uuid", dev.Result.Device)
		}
		wantEnv(t, p, map[string]string{
			"NVIDIA_VISIBLE_DEVICES":    uuid,
			"CUDA_VISIBLE_DEVICES":      uuid,
			"TESSERA_MEMORY_LIMIT":      bytesOf("19Gi"),
			"TESSERA_CORES_LIMIT":       "25",
			"TESSERA_MEMORY_LIMIT_0":    bytesOf("19Gi"),
			"TESSERA_CORES_LIMIT_0":     "25",
			"TF_FORCE_GPU_ALLOW_GROWTH": "true",
			"CUDA_MPS_PIPE_DIRECTORY":   "",
		})
		t.Logf("pod %s: device %s, share %s, uuid %s", name, dev.Result.Device, sid, uuid)
	}
	if len(devices) != 1 {
		t.Errorf("the four quarters went to devices %v, want all on one shared device", devices)
	}
	if len(shareIDs) != 4 {
		t.Errorf("share IDs %v, want four distinct shares", shareIDs)
	}
}
