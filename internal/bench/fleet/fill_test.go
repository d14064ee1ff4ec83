package fleet

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestReadOpenB(t *testing.T) {
	nodes := `sn,cpu_milli,memory_mib,gpu,model
openb-node-0000,64000,262144,2,P100
openb-node-0001,32000,131072,0,nan
openb-node-0002,96000,393216,8,G2
`
	f, err := ReadOpenBNodes(strings.NewReader(nodes))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.String(); got != "p100:1x2/64000m/262144Mi,none:1x0/32000m/131072Mi,G2:1x8/96000m/393216Mi" {
		t.Errorf("fleet %s", got)
	}
	pods := `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p-share,4000,15258,1,220,,BE,Running,30,330,40
p-whole,16000,32768,1,1000,V100M16|V100M32,LS,Running,20,100,20
p-multi,88000,327680,8,1000,nan,Burstable,Succeeded,10,1010,10
p-cpu,2000,4096,0,0,,LS,Running,0,,
`
	jobs, err := ReadOpenBPods(strings.NewReader(pods), OpenBOptions{NVLink: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []Job{
		{ID: 0, Arrival: 0, CPUOnly: true, MilliCPU: 2000, MemoryMiB: 4096},
		{ID: 1, Arrival: 10, Runtime: 1000, Memory: 1, Cores: 1, Demand: 1, GPUs: 8, NVLink: true, MilliCPU: 88000, MemoryMiB: 327680},
		{ID: 2, Arrival: 20, Runtime: 80, Memory: 1, Cores: 1, Demand: 1, GPUs: 1, Models: []string{"v100-16", "v100-32"}, MilliCPU: 16000, MemoryMiB: 32768},
		{ID: 3, Arrival: 30, Runtime: 290, Memory: 0.22, Cores: 0.22, Demand: 0.22, MilliCPU: 4000, MemoryMiB: 15258},
	}
	if diff := cmp.Diff(want, jobs); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}
	for name, bad := range map[string]string{
		"unknown model":  "x,1,1,1,500,A100X,,,0,1,0\n",
		"gpu_milli 1500": "x,1,1,1,1500,,,,0,1,0\n",
		"negative cpu":   "x,-1,1,1,500,,,,0,1,0\n",
	} {
		header := strings.SplitN(pods, "\n", 2)[0] + "\n"
		if _, err := ReadOpenBPods(strings.NewReader(header+bad), OpenBOptions{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ReadOpenBNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nn,1000,1,2,H9000\n")); err == nil {
		t.Error("a node of an unknown model was accepted")
	}
	if _, err := ReadOpenBPods(strings.NewReader("name,cpu_milli\nx,1\n"), OpenBOptions{}); err == nil || !strings.Contains(err.Error(), "num_gpu") {
		t.Errorf("a pod list without num_gpu: %v", err)
	}
}

// syntheticFill is the fill experiment's input from SyntheticOpenB's files.
func syntheticFill(t *testing.T, nodes, pods int) (Fleet, []Job) {
	t.Helper()
	var nb, pb bytes.Buffer
	if err := SyntheticOpenB(&nb, &pb, nodes, pods, 3); err != nil {
		t.Fatal(err)
	}
	f, err := ReadOpenBNodes(&nb)
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := ReadOpenBPods(&pb, OpenBOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return f, jobs
}

// TestFill: on a synthetic openb trace, no model leaves less unallocated
// than the ideal, whole GPUs strand the most, the placements never overfill
// a GPU (fillOne checks every one), and the run is deterministic.
func TestFill(t *testing.T) {
	f, pods := syntheticFill(t, 12, 300)
	cfg := FillConfig{Fleet: f, Pods: pods, Seed: 5, Target: 1.2}
	rep, err := Fill(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	last := map[Kind]float64{}
	for _, res := range rep.Results {
		if len(res.Unallocated) < 5 {
			t.Fatalf("%s: %d points", res.Kind, len(res.Unallocated))
		}
		for i, u := range res.Unallocated {
			if ideal := max(0, 1-res.Arrived[i]); u < ideal-1e-9 {
				t.Errorf("%s at %.2f arrived: %.4f unallocated, below the ideal %.4f", res.Kind, res.Arrived[i], u, ideal)
			}
			if i > 0 && res.Failed[i] < res.Failed[i-1] {
				t.Errorf("%s: dropped pods went down", res.Kind)
			}
		}
		last[res.Kind] = res.Unallocated[len(res.Unallocated)-1]
	}
	if last[Whole] <= last[Tessera] || last[Whole] <= last[Partition] {
		t.Errorf("whole GPUs leave %.3f unallocated, Tessera %.3f, partitions %.3f: whole GPUs should strand the most", last[Whole], last[Tessera], last[Partition])
	}
	again, err := Fill(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for k := range rep.Results {
		rep.Results[k].Wall, again.Results[k].Wall = 0, 0
	}
	if diff := cmp.Diff(rep.Results, again.Results); diff != "" {
		t.Errorf("two fills of one sequence differ:\n%s", diff)
	}
	md := rep.Markdown()
	for _, want := range []string{"(simulation)", "| 100 | 0.0 |", "theirs, not ours", "| FGD | 4.77 | 4.61 |", "(c') best-fit reference"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	var png bytes.Buffer
	if err := rep.WritePNG(&png); err != nil || png.Len() == 0 {
		t.Errorf("plot: %v", err)
	}
}

func TestFillSequence(t *testing.T) {
	pods := []Job{newJob(0, 0, Demand{0.5, 0.5}, 0), {GPUs: 2, Memory: 1, Cores: 1, Demand: 1}, {CPUOnly: true}}
	seq := FillSequence(pods, 10, 1.3, 1)
	var total float64
	for i, j := range seq {
		total += j.gpuRequest()
		if j.ID != i {
			t.Fatalf("pod %d has ID %d", i, j.ID)
		}
	}
	if total > 13+1e-9 || total < 13-2 {
		t.Errorf("sequence asks for %.1f GPUs, want just under 13", total)
	}
	down := FillSequence(seq, 5, 1, 2)
	var t2 float64
	for _, j := range down {
		t2 += j.gpuRequest()
	}
	if t2 > 5+1e-9 {
		t.Errorf("tuned down to %.1f GPUs, want at most 5", t2)
	}
}

// fillPlacer is the placer the fill experiment uses for k on opt.Fleet.
func fillPlacer(t *testing.T, k Kind, opt Options) placer {
	t.Helper()
	if k == TesseraBestFit {
		return newOraclePlacer(opt.Fleet, opt, true)
	}
	m, err := newDeviceModel(k, opt.Fleet)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newAllocatorPlacer(m, opt)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHeterogeneousPlacement: on a fleet of an H100 node and a T4 node, a
// Tessera share without a GPU-type constraint goes to the T4 node
// (DynamicResources scores the firstAvailable subrequest, smallest memory
// first, highest), where the exact requests of (a) and (b) tie and take the
// first node; one restricted to H100s goes to the H100 node; a 2-GPU NVLink
// job cannot use the T4 node's PCIe cards; and a node's pod capacity is a filter.
func TestHeterogeneousPlacement(t *testing.T) {
	f, err := ParseFleet("h100:1x8,t4:1x2")
	if err != nil {
		t.Fatal(err)
	}
	jobs := []Job{
		newJob(0, 0, Demand{0.25, 0.25}, 100),
		newJob(1, 1, Demand{0.25, 0.25}, 100),
		{ID: 2, Arrival: 2, Runtime: 100, Memory: 1, Cores: 1, Demand: 1, GPUs: 2, NVLink: true},
	}
	jobs[1].Models = []string{"h100"}
	for _, k := range []Kind{Tessera, Whole, Partition, TesseraBestFit} {
		p := fillPlacer(t, k, Options{Fleet: f, Check: true})
		wantNode := []int{0, 0, 0}
		switch k {
		case Tessera:
			wantNode[0] = 1
		case TesseraBestFit:
			wantNode[0] = -1 // the tighter fit, by a rounding either way
		}
		for i := range jobs {
			pl, ok, err := p.place(context.Background(), &jobs[i])
			if err != nil || !ok {
				t.Fatalf("%s: job %d: placed %v, %v", k, i, ok, err)
			}
			if wantNode[i] >= 0 && pl.node != wantNode[i] {
				t.Errorf("%s: job %d on node %d, want %d", k, i, pl.node, wantNode[i])
			}
		}
	}
	// A 2-GPU job goes to the first node when it may use any two GPUs, to
	// the NVLink node when it asks for NVLink (the T4s are PCIe cards).
	pair, err := ParseFleet("t4:1x2,v100-16:1x4")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []Kind{Tessera, Whole, Partition, TesseraBestFit} {
		for _, nvlink := range []bool{false, true} {
			p := fillPlacer(t, k, Options{Fleet: pair, Check: true})
			j := Job{Runtime: 1, Memory: 1, Cores: 1, Demand: 1, GPUs: 2, NVLink: nvlink}
			pl, ok, err := p.place(context.Background(), &j)
			want := 0
			if nvlink {
				want = 1
			}
			if err != nil || !ok || pl.node != want || len(pl.gpus) != 2 {
				t.Errorf("%s, NVLink %v: node %d, GPUs %v, placed %v, %v; want node %d", k, nvlink, pl.node, pl.gpus, ok, err, want)
			}
		}
	}

	// Two pods per node: the third job finds no node with room.
	small := PoolFleet(Pool{NodeSpec: NodeSpec{Model: h100, GPUs: 2}, Nodes: 1})
	m, _ := newDeviceModel(Tessera, small)
	p, err := newAllocatorPlacer(m, Options{Fleet: small, Scoring: Scoring{NodeMilliCPU: 1000, NodeMemory: 1 << 30, MaxPods: 2}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		j := newJob(i, 0, Demand{0.1, 0.1}, 1)
		if _, ok, err := p.place(context.Background(), &j); err != nil || ok != (i < 2) {
			t.Errorf("job %d: placed %v, %v; want placed only below the pod capacity", i, ok, err)
		}
	}
}

func TestParseFleet(t *testing.T) {
	f, err := ParseFleet("h100:2, v100-16:3x4 ,T4:1x2")
	if err != nil {
		t.Fatal(err)
	}
	if f.GPUs() != 2*8+3*4+2 || f.String() != "h100:2x8,v100-16:3x4,t4:1x2" {
		t.Errorf("%s: %d GPUs", f, f.GPUs())
	}
	if _, ok := f.Homogeneous(); ok {
		t.Error("three models taken for one")
	}
	for _, bad := range []string{"", "h100", "h200:1", "h100:0", "h100:1x0", "h100:1x99"} {
		if _, err := ParseFleet(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestReadTraceGPUColumns(t *testing.T) {
	jobs, err := ReadTrace(strings.NewReader("arrival,runtime,demand,gpus,nvlink,models\n0,10,1/4,,,\n5,20,1,4,true,h100|a100-80\n"))
	if err != nil {
		t.Fatal(err)
	}
	if jobs[0].GPUs != 0 || jobs[0].Demand != 0.25 || jobs[1].GPUs != 4 || !jobs[1].NVLink || !cmp.Equal(jobs[1].Models, []string{"h100", "a100-80"}) {
		t.Errorf("jobs %+v", jobs)
	}
	if _, err := ReadTrace(strings.NewReader("arrival,runtime,demand,models\n0,10,1/4,h9000\n")); err == nil {
		t.Error("an unknown model was accepted")
	}
}
