//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// specPath returns the path of a demo spec users copy (demo/specs).
func specPath(name string) string {
	return filepath.Join(repoRoot, "demo", "specs", name)
}

// TestDemoQuarterShares runs demo/specs/10-quarter-gpu-shares.yaml: four pods
// with a quarter of a GPU each share one GPU (first-fit), and each sees that
// GPU's UUID and a 19Gi memory limit.
func TestDemoQuarterShares(t *testing.T) {
	cluster := needCluster(t)
	cluster.RequireDriver(t, "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := cluster.Namespace(t, "e2e-quarter")
	pods := cluster.RunSpec(t, ns, specPath("10-quarter-gpu-shares.yaml"))
	if len(pods) != 4 {
		t.Fatalf("%d pods ran, want 4", len(pods))
	}
	q := resource.MustParse("19Gi")
	wantMemory := fmt.Sprint(q.Value())
	devices := map[string]bool{}
	for name, p := range pods {
		claim, err := PodClaimName(p.Pod, "gpu")
		if err != nil {
			t.Fatal(err)
		}
		alloc, err := cluster.AllocatedDevices(ctx, ns, claim)
		if err != nil {
			t.Fatal(err)
		}
		if len(alloc) != 1 {
			t.Fatalf("pod %s: %d devices, want 1", name, len(alloc))
		}
		devices[alloc[0].Result.Device] = true
		if got, want := p.Env["NVIDIA_VISIBLE_DEVICES"], alloc[0].Attribute("uuid"); got != want || want == "" {
			t.Errorf("pod %s: NVIDIA_VISIBLE_DEVICES = %q, want %q (device %s)", name, got, want, alloc[0].Result.Device)
		}
		if got := p.Env["TESSERA_MEMORY_LIMIT"]; got != wantMemory {
			t.Errorf("pod %s: TESSERA_MEMORY_LIMIT = %q, want %q", name, got, wantMemory)
		}
	}
	if len(devices) != 1 {
		t.Errorf("the four quarters went to devices %v, want all on one shared device", devices)
	}
}
