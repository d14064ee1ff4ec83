package fleet

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// The openb format is the pod and node lists of Alibaba's
// cluster-trace-gpu-v2023 (github.com/alibaba/clusterdata, directory
// cluster-trace-gpu-v2023/csv), the workload of "Beware of Fragmentation"
// (USENIX ATC '23). The trace is not part of this repository: its
// repository grants no licence to redistribute it. How its columns become
// jobs and nodes, and what is assumed where the trace is silent:
//
//   - Pods (openb_pod_list_*.csv): name, cpu_milli, memory_mib, num_gpu,
//     gpu_milli, gpu_spec, qos, pod_phase, creation_time, deletion_time,
//     scheduled_time. memory_mib is host memory, not GPU memory: it is the
//     pod's memory request, and cpu_milli its CPU request. The trace has no
//     GPU memory at all: a pod with num_gpu 1 and gpu_milli below 1000 is
//     assumed to need gpu_milli/1000 of a GPU's memory and of its cores
//     alike (a Tessera share of that fraction of whichever model it lands
//     on). gpu_milli applies only when num_gpu is 1 (the trace's README);
//     num_gpu 1 with gpu_milli 1000, or num_gpu above 1, asks for that many
//     whole GPUs on one node, without an NVLink constraint unless the
//     reader is told to add one (the trace does not say). num_gpu 0 is a
//     CPU-only pod. gpu_spec ("V100M16|V100M32", empty or "nan" for none)
//     restricts the GPU models. creation_time is the arrival and
//     deletion_time − scheduled_time the run time (0 when not known);
//     qos and pod_phase are not used.
//   - Nodes (openb_node_list_*.csv): sn, cpu_milli, memory_mib, gpu, model.
//     model names a catalogue entry (Models): V100M16, V100M32, T4, P100,
//     A10, and G1–G3, undisclosed models whose memory is assumed. A node
//     without GPUs has model "nan" or empty.

// OpenBOptions are what the openb reader assumes where the trace is silent.
type OpenBOptions struct {
	// NVLink asks every multi-GPU pod for an NVLink constraint.
	NVLink bool
}

// csvColumns reads a header and maps the wanted column names to indexes.
func csvColumns(cr *csv.Reader, what string, want []string) (map[string]int, error) {
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: header: %w", what, err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.ToLower(strings.TrimSpace(h))] = i
	}
	for _, w := range want {
		if _, ok := col[w]; !ok {
			return nil, fmt.Errorf("%s: no %q column (header %q; want %s)", what, w, header, strings.Join(want, ","))
		}
	}
	return col, nil
}

// eachRecord calls f with every record left in cr and its line number (the
// header is line 1), up to the first error; what names the file in a read
// error.
func eachRecord(cr *csv.Reader, what string, f func(line int, rec []string) error) error {
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err := f(line, rec); err != nil {
			return err
		}
	}
}

func newCSV(r io.Reader) *csv.Reader {
	cr := csv.NewReader(r)
	cr.TrimLeadingSpace = true
	cr.FieldsPerRecord = -1
	return cr
}

// ReadOpenBNodes reads an openb node list into a fleet, nodes in file order.
func ReadOpenBNodes(r io.Reader) (Fleet, error) {
	cr := newCSV(r)
	col, err := csvColumns(cr, "openb nodes", []string{"sn", "cpu_milli", "memory_mib", "gpu", "model"})
	if err != nil {
		return Fleet{}, err
	}
	var f Fleet
	err = eachRecord(cr, "openb nodes", func(line int, rec []string) error {
		field := func(name string) string {
			if i := col[name]; i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		num := func(name string) (int64, error) {
			v, err := strconv.ParseInt(field(name), 10, 64)
			if err != nil || v < 0 {
				return 0, fmt.Errorf("openb nodes line %d (%s): %s %q: want a non-negative integer", line, field("sn"), name, field(name))
			}
			return v, nil
		}
		cpu, err := num("cpu_milli")
		if err != nil {
			return err
		}
		mem, err := num("memory_mib")
		if err != nil {
			return err
		}
		gpus, err := num("gpu")
		if err != nil {
			return err
		}
		s := NodeSpec{GPUs: int(gpus), MilliCPU: cpu, MemoryMiB: mem}
		if name := field("model"); gpus > 0 {
			m, ok := LookupModel(name)
			if !ok {
				return fmt.Errorf("openb nodes line %d (%s): GPU model %q is not in the catalogue", line, field("sn"), name)
			}
			s.Model = m
		}
		if s.MilliCPU == 0 {
			return fmt.Errorf("openb nodes line %d (%s): no CPU", line, field("sn"))
		}
		f.Nodes = append(f.Nodes, s)
		return nil
	})
	if err != nil {
		return Fleet{}, err
	}
	if f.GPUs() == 0 {
		return Fleet{}, errors.New("openb nodes: no node with GPUs")
	}
	return f, nil
}

// ReadOpenBPods reads an openb pod list into jobs, sorted by creation time
// and numbered in that order.
func ReadOpenBPods(r io.Reader, opt OpenBOptions) ([]Job, error) {
	cr := newCSV(r)
	col, err := csvColumns(cr, "openb pods", []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "creation_time", "deletion_time", "scheduled_time"})
	if err != nil {
		return nil, err
	}
	var jobs []Job
	err = eachRecord(cr, "openb pods", func(line int, rec []string) error {
		field := func(name string) string {
			if i := col[name]; i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		num := func(name string, optional bool) (int64, error) {
			s := field(name)
			if optional && (s == "" || s == "nan") {
				return 0, nil
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || v < 0 || v != float64(int64(v)) {
				return 0, fmt.Errorf("openb pods line %d (%s): %s %q: want a non-negative integer", line, field("name"), name, s)
			}
			return int64(v), nil
		}
		var v [8]int64
		for i, c := range []struct {
			name     string
			optional bool
		}{{"cpu_milli", false}, {"memory_mib", false}, {"num_gpu", false}, {"gpu_milli", true}, {"creation_time", false}, {"deletion_time", true}, {"scheduled_time", true}} {
			if v[i], err = num(c.name, c.optional); err != nil {
				return err
			}
		}
		cpu, mem, numGPU, milli, created, deleted, scheduled := v[0], v[1], v[2], v[3], v[4], v[5], v[6]
		j := Job{Arrival: float64(created), MilliCPU: cpu, MemoryMiB: mem}
		if deleted > scheduled && scheduled > 0 {
			j.Runtime = float64(deleted - scheduled)
		}
		switch {
		case numGPU == 0:
			j.CPUOnly = true
		case numGPU == 1 && milli > 0 && milli < 1000:
			d := float64(milli) / 1000
			j.Memory, j.Cores, j.Demand = d, d, d
		case numGPU == 1 && milli != 1000 && milli != 0:
			return fmt.Errorf("openb pods line %d (%s): gpu_milli %d with num_gpu 1: want 1..1000", line, field("name"), milli)
		default:
			j.GPUs, j.Memory, j.Cores, j.Demand = int(numGPU), 1, 1, 1
			j.NVLink = opt.NVLink && numGPU > 1
		}
		if spec := field("gpu_spec"); spec != "" && spec != "nan" {
			for _, n := range strings.Split(spec, "|") {
				m, ok := LookupModel(strings.TrimSpace(n))
				if !ok {
					return fmt.Errorf("openb pods line %d (%s): gpu_spec model %q is not in the catalogue", line, field("name"), n)
				}
				if !slices.Contains(j.Models, m.Name) {
					j.Models = append(j.Models, m.Name)
				}
			}
		}
		if j.CPUOnly {
			j.Models = nil
		}
		jobs = append(jobs, j)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return nil, errors.New("openb pods: no pods")
	}
	slices.SortStableFunc(jobs, func(a, b Job) int { return cmpFloat(a.Arrival, b.Arrival) })
	for i := range jobs {
		jobs[i].ID = i
	}
	return jobs, nil
}

// SyntheticOpenB writes a small cluster and pod list in the openb format,
// shaped like the trace (assumed, not measured: about a sixth of the GPUs
// small PCIe cards, the rest 8-GPU nodes; pods a seventh CPU-only, the
// others shares of 0.1–0.8 or one whole GPU in about equal numbers, a few
// with 2, 4 or 8 GPUs, a tenth of the GPU pods restricted to a model), for
// tests and for `make bench-fill` without the trace.
func SyntheticOpenB(nodesOut, podsOut io.Writer, nodes, pods int, seed int64) error {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x09e4b))
	nw, pw := csv.NewWriter(nodesOut), csv.NewWriter(podsOut)
	if err := nw.Write([]string{"sn", "cpu_milli", "memory_mib", "gpu", "model"}); err != nil {
		return err
	}
	shapes := []struct {
		model    string
		gpus     int
		cpu, mem int64
		weight   int
	}{
		{"G2", 8, 96000, 393216, 6}, {"T4", 2, 104000, 524288, 3}, {"V100M16", 4, 32000, 131072, 1},
		{"V100M32", 8, 96000, 786432, 1}, {"P100", 2, 64000, 262144, 1}, {"G3", 8, 128000, 786432, 1},
	}
	total := 0
	for _, s := range shapes {
		total += s.weight
	}
	for i := range nodes {
		x := rng.IntN(total)
		k := 0
		for ; x >= shapes[k].weight; k++ {
			x -= shapes[k].weight
		}
		s := shapes[k]
		if err := nw.Write([]string{fmt.Sprintf("synth-node-%04d", i), strconv.FormatInt(s.cpu, 10), strconv.FormatInt(s.mem, 10), strconv.Itoa(s.gpus), s.model}); err != nil {
			return err
		}
	}
	nw.Flush()
	if err := nw.Error(); err != nil {
		return err
	}
	if err := pw.Write([]string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"}); err != nil {
		return err
	}
	milli := []int{100, 160, 220, 250, 320, 460, 500, 650, 810}
	specs := []string{"T4", "G2", "V100M16|V100M32", "P100|T4"}
	t := int64(0)
	for i := range pods {
		t += int64(rng.IntN(600))
		numGPU, gm := 1, 1000
		switch x := rng.Float64(); {
		case x < 0.14:
			numGPU, gm = 0, 0
		case x < 0.56:
			gm = milli[rng.IntN(len(milli))]
		case x < 0.985:
		default:
			numGPU = []int{2, 4, 8}[rng.IntN(3)]
		}
		spec := ""
		if numGPU > 0 && rng.IntN(10) == 0 {
			spec = specs[rng.IntN(len(specs))]
		}
		cpu := int64(1000 * (1 + rng.IntN(16)))
		mem := int64(1024 * (2 + rng.IntN(62)))
		if numGPU > 1 {
			cpu, mem = cpu*int64(numGPU), mem*int64(numGPU)
		}
		run := int64(60 + rng.IntN(36000))
		if err := pw.Write([]string{fmt.Sprintf("synth-pod-%05d", i), strconv.FormatInt(cpu, 10), strconv.FormatInt(mem, 10), strconv.Itoa(numGPU),
			strconv.Itoa(gm), spec, "LS", "Succeeded", strconv.FormatInt(t, 10), strconv.FormatInt(t+run, 10), strconv.FormatInt(t, 10)}); err != nil {
			return err
		}
	}
	pw.Flush()
	return pw.Error()
}
