package scale

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/internal/bench/chart/charttest"
)

func TestAggregate(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name    string
		samples []Sample
		want    Result
	}{
		{name: "none", want: Result{}},
		{
			name:    "never bound",
			samples: []Sample{{Created: at(0)}, {Created: at(500)}},
			want:    Result{Pods: 2, CreateWindow: 500 * time.Millisecond},
		},
		{
			// Four pods created over 300 ms, the last bound at 2 s: 4 pods / 2 s.
			name: "all bound",
			samples: []Sample{
				{Created: at(0), Bound: at(100)},
				{Created: at(100), Bound: at(1100)},
				{Created: at(200), Bound: at(600)},
				{Created: at(300), Bound: at(2000)},
			},
			want: Result{
				Pods: 4, Bound: 4, PodsPerSecond: 2, Window: 2 * time.Second, CreateWindow: 300 * time.Millisecond,
				P50: 400 * time.Millisecond, P99: 1700 * time.Millisecond, Max: 1700 * time.Millisecond,
			},
		},
		{
			// One pod unbound; one seen bound before its create call returned (0).
			name: "partly bound",
			samples: []Sample{
				{Created: at(200), Bound: at(150)},
				{Created: at(0), Bound: at(1000)},
				{Created: at(100)},
			},
			want: Result{
				Pods: 3, Bound: 2, PodsPerSecond: 2, Window: time.Second, CreateWindow: 200 * time.Millisecond,
				P50: 0, P99: time.Second, Max: time.Second,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Aggregate(tt.samples)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Aggregate =\n %+v\nwant\n %+v", got, tt.want)
			}
		})
	}
}

func TestPercentileNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 200; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(d, 50); p != 100*time.Millisecond {
		t.Errorf("p50 = %s", p)
	}
	if p := percentile(d, 99); p != 198*time.Millisecond {
		t.Errorf("p99 = %s", p)
	}
	if p := percentile(d[:1], 99); p != time.Millisecond {
		t.Errorf("p99 of one = %s", p)
	}
}

func TestPodsForNodesFitsEveryWorkload(t *testing.T) {
	for _, n := range []int{1, 10, 100, 333, 500, 1000, 5000} {
		pods := PodsForNodes(n)
		for _, w := range Workloads("") {
			if gpus := float64(pods) * w.GPUs; gpus > float64(8*n) {
				t.Errorf("%d nodes: %d %s pods need %.0f GPUs, the cluster has %d", n, pods, w.Name, gpus, 8*n)
			}
		}
	}
	if math.IsNaN(Ratio(1, 0)) == false {
		t.Error("Ratio(1, 0) is not NaN")
	}
}

func sampleReport() *Report {
	r := &Report{
		Started: time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC), Finished: time.Date(2026, 1, 1, 9, 20, 0, 0, time.UTC),
		Host:    Host{CPU: "Test CPU", Cores: 2, Memory: "24.0 GiB", LoadStart: "1.00 1.00 1.00", LoadEnd: "2.00 2.00 2.00"},
		Cluster: map[string]string{"scheduler_qps": "5000"},
		Command: "tessera-scale -nodes 100,500",
	}
	for _, n := range []int{100, 500} {
		for _, w := range []struct {
			name string
			rate float64
		}{{"plain", 150}, {"whole-claim", 50}, {"share", 45}, {"share-cel", 30}} {
			r.Results = append(r.Results, Result{Workload: w.name, Nodes: n, Pods: 300, Bound: 300, PodsPerSecond: w.rate * 100 / float64(n),
				P50: time.Second, P99: 2 * time.Second, Max: 3 * time.Second, CPU: map[string]time.Duration{SchedulerProcess: 3 * time.Second}})
		}
	}
	return r
}

func TestTargets(t *testing.T) {
	got := sampleReport().Targets()
	// At 500 nodes: whole-claim 10, share 9 (0.9×), share-cel 6 (0.6×); both below 64.
	// Every result's scheduler CPU is 3 s over 300 pods: equal cost, ratio 1.
	want := []struct {
		met   bool
		value string
	}{{true, "0.90×"}, {true, "1.00× (10.0 vs 10.0 ms/pod)"}, {false, "9.0 pods/s"}, {false, "0.60×"}, {true, "1.00×"}, {false, "6.0 pods/s"}}
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if !got[i].Known || got[i].Met != w.met || !strings.HasPrefix(got[i].Value, w.value) {
			t.Errorf("target %q = %+v, want met=%v value %s…", got[i].Name, got[i], w.met, w.value)
		}
	}
	empty := (&Report{}).Targets()
	for _, tg := range empty {
		if tg.Known {
			t.Errorf("target %q known without results", tg.Name)
		}
	}
}

func TestMarkdownAndPNG(t *testing.T) {
	r := sampleReport()
	r.Results[1].Err = "10 of 300 pods not bound"
	md := r.Markdown()
	for _, want := range []string{
		"## 100 nodes × 8 GPUs", "## 500 nodes × 8 GPUs",
		"| share | 300/300 | 9.0 | 0.90× | 1000 ms | 2000 ms | 3000 ms | 0.0 s | 10.0 ms | – | 10.0 ms | 200 pods/s |",
		"Test CPU, 2 cores", "scheduler_qps=5000", "- whole-claim: 10 of 300 pods not bound",
		"| share ≥ 0.8× whole-claim at 500 nodes | 0.90× (9.0 vs 10.0 pods/s) | yes |",
		"SchedulingWithResourceClaimTemplate",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "NaN") {
		t.Errorf("Markdown has NaN:\n%s", md)
	}
	if b := charttest.PNG(t, r).Bounds(); b.Dx() != 900 || b.Dy() != 560 {
		t.Errorf("PNG is %v", b)
	}
}
