package plugin

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/metrics"
)

// The snapshot behind /metrics reports what the scheduler allocated to each
// share (not its limit), whole GPUs in full, and forgets unprepared claims;
// the pods a claim is reserved for resolve by UID.
func TestMetricsSnapshot(t *testing.T) {
	p := newEnv(t).start(nil)
	mps := newClaim("c-mps", []result{share("gpu", "gpu-0-shared", "s1", "16Gi", "30")},
		claimConfig(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS","computeLimit":50}}`))
	mps.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer", UID: "pod-uid-1"}}
	mustPrepare(t, p.Plugin, mps)
	mustPrepare(t, p.Plugin, newClaim("c-adv", []result{share("gpu", "gpu-0-shared", "s2", "19Gi", "25")}))
	mustPrepare(t, p.Plugin, newClaim("c-whole", []result{whole("gpu", "gpu-3")}))

	snap := p.MetricsSnapshot()
	if len(snap.GPUs) != 4 || len(snap.Claims) != 3 {
		t.Fatalf("snapshot: %d GPUs, %d claims", len(snap.GPUs), len(snap.Claims))
	}
	byName := map[string]metrics.Device{}
	for _, c := range snap.Claims {
		byName[c.Name] = c.Devices[0]
	}
	if d := byName["claim-c-mps"]; d.MemoryBytes != 16<<30 || d.Cores != 30 || d.CoresLimit != 50 || d.Isolation != "MPS" || !d.Shared {
		t.Errorf("MPS share: %+v", d)
	}
	if d := byName["claim-c-whole"]; d.MemoryBytes != 80<<30 || d.Cores != 100 || d.Shared {
		t.Errorf("whole GPU: %+v", d)
	}
	if ref, ok := p.Pod("pod-uid-1"); !ok || ref.Namespace != "default" || ref.Name != "trainer" {
		t.Errorf("Pod(pod-uid-1) = %+v, %v", ref, ok)
	}

	m := metrics.New(testNode)
	m.AddState(p.Plugin, nil)
	if _, err := m.Registry.Gather(); err != nil {
		t.Errorf("gather: %v", err)
	}
	mustUnprepare(t, p.Plugin, types.UID("c-mps"))
	if snap := p.MetricsSnapshot(); len(snap.Claims) != 2 {
		t.Errorf("after unprepare: %d claims", len(snap.Claims))
	}
	if _, ok := p.Pod("pod-uid-1"); ok {
		t.Error("pod of an unprepared claim still resolves")
	}
}

// Prepare and unprepare feed the latency histograms and error counters.
func TestPrepareMetrics(t *testing.T) {
	var m *metrics.Metrics
	p := newEnv(t).start(func(o *Options) {
		m = metrics.New(testNode)
		o.Metrics = m
	})
	mustPrepare(t, p.Plugin, newClaim("ok", []result{whole("gpu", "gpu-1")}))
	if r := prepare(t, p.Plugin, newClaim("bad", []result{whole("gpu", "gpu-9")})); r.Err == nil {
		t.Fatal("prepare of an unknown device succeeded")
	}
	mustUnprepare(t, p.Plugin, "ok")
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			switch {
			case metric.GetHistogram() != nil:
				got[f.GetName()] = float64(metric.GetHistogram().GetSampleCount())
			case metric.GetCounter() != nil:
				got[f.GetName()] = metric.GetCounter().GetValue()
			}
		}
	}
	want := map[string]float64{
		"tessera_prepare_duration_seconds": 2, "tessera_prepare_errors_total": 1,
		"tessera_unprepare_duration_seconds": 1, "tessera_unprepare_errors_total": 0,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
}
