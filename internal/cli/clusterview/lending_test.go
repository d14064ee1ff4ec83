package clusterview

import (
	"bytes"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/internal/cli/clitest"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/model"
)

// A lent GPU shows what it lends and to whom, beside its owner; the lending
// devices' taints are not health.
func TestStatusLending(t *testing.T) {
	gpus := gputest.GPUs(t, "hgx-h100")
	rs := clitest.Slices(t, "node-a", gpus, model.WithLending(map[string]model.Lent{
		gpus[7].UUID: {Open: true, Memory: 68 << 30},
		gpus[6].UUID: {Reason: "OwnerBusy"},
	}))
	claims := []resourceapi.ResourceClaim{
		*allocated("demo", "notebook", []string{"notebook"}, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: model.DriverName, Pool: "node-a", Device: "gpu-7"}),
		*allocated("demo", "batch-gpu", []string{"batch"}, shareResult("node-a", "gpu-7-lent", "b1", "20Gi", "0")),
		*allocated("demo", "evicting-gpu", []string{"evicting"}, shareResult("node-a", "gpu-6-lent", "b2", "8Gi", "0")),
	}
	r := Build(rs, claims)
	g7, g6, g0 := r.Nodes[0].GPUs[7], r.Nodes[0].GPUs[6], r.Nodes[0].GPUs[0]
	if g7.Lending == nil || g7.Lending.Phase != "Lent" || g7.Lending.LendableBytes != 68<<30 || len(g7.Lending.Borrowers) != 1 ||
		g7.Lending.Borrowers[0].Claim != "batch-gpu" || g7.Lending.Borrowers[0].MemoryBytes != 20<<30 {
		t.Errorf("gpu-7 lending: %+v", g7.Lending)
	}
	if g7.Mode != ModeWhole || g7.AllocatedMemoryBytes != g7.MemoryBytes || len(g7.Holders) != 1 {
		t.Errorf("gpu-7: a borrower changed the owner's accounting: %+v", g7)
	}
	if g6.Lending.Phase != "OwnerBusy" || len(g6.Lending.Borrowers) != 1 || !g6.Healthy || len(g6.Taints) != 0 {
		t.Errorf("gpu-6 (taking back): %+v, lending %+v", g6, g6.Lending)
	}
	if g0.Lending.Phase != "NotLent" || len(g0.Lending.Borrowers) != 0 {
		t.Errorf("gpu-0: lending %+v", g0.Lending)
	}
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"lent 68Gi to: demo/batch (claim batch-gpu: 20Gi, 0 cores; not attested)", "not lent (OwnerBusy) to: demo/evicting"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "NotLent") != 0 {
		t.Errorf("GPUs that lend nothing to nobody show lending rows:\n%s", out)
	}
}
