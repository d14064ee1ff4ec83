package plugin

import (
	"errors"
	"maps"
	"sync/atomic"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

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
	byName := map[string]metrics.Claim{}
	for _, c := range snap.Claims {
		byName[c.Name] = c
	}
	if c := byName["claim-c-mps"]; len(c.Pods) != 1 || c.Pods[0] != "trainer" {
		t.Errorf("MPS claim pods: %v", c.Pods)
	}
	if d := byName["claim-c-mps"].Devices[0]; d.ConsumedMemory != 16<<30 || d.ConsumedCores != 30 || d.CoresLimit != 50 ||
		d.Isolation != "MPS" || !d.Shared || d.AdminAccess || d.Request != "gpu" || d.ShareID != "s1" {
		t.Errorf("MPS share: %+v", d)
	}
	if d := byName["claim-c-whole"].Devices[0]; d.Shared || d.AdminAccess || d.Minor != 3 {
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

// Regression: a claim with two shares of one GPU (two requests, and one
// request with two shares of the device) made duplicate series and failed
// every scrape of the node, and a scrape read claims the plugin had not
// prepared itself from the API. Metrics now come from the checkpoint and
// what prepare remembered only, with a series per allocation result, and
// admin access holds nothing.
func TestMetricsFromOwnState(t *testing.T) {
	e := newEnv(t)
	p := e.start(nil)
	pair := newClaim("pair", []result{
		share("a", "gpu-0-shared", "s1", "8Gi", "10"),
		share("b", "gpu-0-shared", "s2", "4Gi", "5"),
		share("b", "gpu-0-shared", "s3", "2Gi", "5"),
	})
	pair.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer", UID: "pod-uid-1"}}
	mustPrepare(t, p.Plugin, pair)
	mustPrepare(t, p.Plugin, newClaim("whole", []result{whole("gpu", "gpu-2")}))
	watch := newClaim("watch", []result{whole("debug", "gpu-2"), share("debug", "gpu-0-shared", "s4", "1Gi", "1")})
	for i := range watch.Status.Allocation.Devices.Results {
		watch.Status.Allocation.Devices.Results[i].AdminAccess = ptr.To(true)
	}
	mustPrepare(t, p.Plugin, watch)

	check := func(t *testing.T, p *Plugin, pod string) {
		t.Helper()
		m := metrics.New(testNode)
		m.AddState(p, nil)
		families, err := m.Registry.Gather()
		if err != nil {
			t.Fatalf("gather: %v", err)
		}
		// gauges sums the gauges named name by what key makes of their labels.
		gauges := func(name string, key func(labels map[string]string) string) map[string]float64 {
			out := map[string]float64{}
			for _, f := range families {
				if f.GetName() != name {
					continue
				}
				for _, m := range f.GetMetric() {
					labels := map[string]string{}
					for _, l := range m.GetLabel() {
						labels[l.GetName()] = l.GetValue()
					}
					out[key(labels)] += m.GetGauge().GetValue()
				}
			}
			return out
		}
		byGPU := func(l map[string]string) string { return l["gpu"] }
		if got, want := gauges("tessera_gpu_allocated_memory_bytes", byGPU),
			map[string]float64{"gpu-0": 14 << 30, "gpu-1": 0, "gpu-2": 80 << 30, "gpu-3": 0}; !maps.Equal(got, want) {
			t.Errorf("allocated memory %v, want %v", got, want)
		}
		if got, want := gauges("tessera_gpu_allocated_cores", byGPU),
			map[string]float64{"gpu-0": 20, "gpu-1": 0, "gpu-2": 100, "gpu-3": 0}; !maps.Equal(got, want) {
			t.Errorf("allocated cores %v, want %v", got, want)
		}
		if got, want := gauges("tessera_gpu_shares", byGPU),
			map[string]float64{"gpu-0": 3, "gpu-1": 0, "gpu-2": 0, "gpu-3": 0}; !maps.Equal(got, want) {
			t.Errorf("shares %v, want %v", got, want)
		}
		byResult := func(l map[string]string) string {
			return l["claim"] + " " + l["pod"] + " " + l["request"] + " " + l["device"] + " " + l["share"]
		}
		if got, want := gauges("tessera_claim_memory_bytes", byResult), map[string]float64{
			"claim-pair " + pod + " a gpu-0-shared s1": 8 << 30,
			"claim-pair " + pod + " b gpu-0-shared s2": 4 << 30,
			"claim-pair " + pod + " b gpu-0-shared s3": 2 << 30,
			"claim-whole  gpu gpu-2 ":                  80 << 30,
			"claim-watch  debug gpu-2 ":                0,
			"claim-watch  debug gpu-0-shared s4":       0,
		}; !maps.Equal(got, want) {
			t.Errorf("claim memory %v, want %v", got, want)
		}
	}
	check(t, p.Plugin, "trainer")

	// A new process over the same node (a restart): it did not prepare the
	// claims, so it knows no pods, and it must not ask the API at a scrape.
	var scraping atomic.Bool
	client := fake.NewClientset()
	client.PrependReactor("*", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if scraping.Load() {
			t.Errorf("API call while collecting metrics: %s %s", action.GetVerb(), action.GetResource().Resource)
		}
		return true, nil, errors.New("no API in this test")
	})
	restarted := e.start(func(o *Options) { o.Client = client })
	scraping.Store(true)
	check(t, restarted.Plugin, "")
	scraping.Store(false)
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
