package gpucheck

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/lending"
)

// The lending check runs the kubelet plugin's lending sampler
// (pkg/lending's Sampler: NVML's compute and MPS-client processes, their SM
// utilization since the last sample) on every GPU while the check's probes
// run, and reports what it saw per step of the check: whether the checked
// GPU looked busy (a process at or above the plugin's default busy
// threshold) while probes computed, how busy, and which processes NVML
// listed — the probes themselves, or (under MPS) other processes such as
// the MPS server.

// lendingBusyThreshold is the kubelet plugin's default
// --lending-busy-threshold (percent SM utilization).
const lendingBusyThreshold = 5

// samplerInterval is how often the check samples.
const samplerInterval = 500 * time.Millisecond

// phaseStats is what the sampler saw of one GPU during one step.
type phaseStats struct {
	samples, observed, busy int
	maxSM                   uint32
	pids                    map[uint32]uint32 // pid → highest SM utilization
}

// samplerWatch samples in the background.
type samplerWatch struct {
	gpus  []gpu.GPU
	check string // the checked GPU's UUID

	mu      sync.Mutex
	phase   string
	phases  []string
	stats   map[string]map[string]*phaseStats // phase → uuid → stats
	probes  map[uint32]bool
	compute map[string]bool // phases in which probes computed

	stop chan struct{}
	done chan struct{}
}

// observe is an ExecProber observer: it remembers the probes' PIDs and the
// steps in which a probe computed.
func (w *samplerWatch) observe(pid int, m probeMessage, gone bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.probes[uint32(pid)] = true
	if !gone && m.Event == "ready" && m.Compute != nil {
		w.compute[w.phase] = true
	}
}

// setPhase names the step the following samples belong to.
func (w *samplerWatch) setPhase(name string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.phase = name
	if !slices.Contains(w.phases, name) {
		w.phases = append(w.phases, name)
	}
}

func (n *node) startSampler(ctx context.Context, gpus []gpu.GPU) *samplerWatch {
	w := &samplerWatch{gpus: gpus, check: n.gpu.UUID, stats: map[string]map[string]*phaseStats{},
		probes: map[uint32]bool{}, compute: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	w.setPhase("start")
	s := &lending.Sampler{Lib: n.cfg.NVML, PodOf: func(uint32) (types.UID, bool) { return "", false }, Threshold: lendingBusyThreshold}
	go func() {
		defer close(w.done)
		t := time.NewTicker(samplerInterval)
		defer t.Stop()
		for {
			for _, g := range w.gpus {
				smp := s.Sample(g.UUID)
				o := lending.Observe(smp, int64(g.MemoryBytes), nil, nil, nil, nil, lendingBusyThreshold)
				w.add(g.UUID, smp, o.Busy)
			}
			select {
			case <-ctx.Done():
				return
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *samplerWatch) add(uuid string, smp lending.Sample, busy bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	byGPU := w.stats[w.phase]
	if byGPU == nil {
		byGPU = map[string]*phaseStats{}
		w.stats[w.phase] = byGPU
	}
	st := byGPU[uuid]
	if st == nil {
		st = &phaseStats{pids: map[uint32]uint32{}}
		byGPU[uuid] = st
	}
	st.samples++
	if !smp.Observed {
		return
	}
	st.observed++
	if busy {
		st.busy++
	}
	for _, a := range smp.Pods {
		st.maxSM = max(st.maxSM, a.SM)
		for _, pid := range a.PIDs {
			st.pids[pid] = max(st.pids[pid], a.SM)
		}
	}
}

// finish stops the sampler and reports.
func (w *samplerWatch) finish(n *node) Check {
	c := Check{Name: "lending sampler readings during the probes"}
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var lines, bad []string
	observed := 0
	for _, ph := range w.phases {
		st := w.stats[ph][w.check]
		if st == nil || st.samples == 0 {
			continue
		}
		observed += st.observed
		var probes, others []string
		for _, pid := range slices.Sorted(maps.Keys(st.pids)) {
			e := fmt.Sprintf("%d (SM ≤%d%%)", pid, st.pids[pid])
			if w.probes[pid] {
				probes = append(probes, e)
			} else {
				others = append(others, e)
			}
		}
		line := fmt.Sprintf("%s: busy in %d of %d samples (%d observed), SM up to %d%%, probe processes [%s], other processes [%s]",
			ph, st.busy, st.samples, st.observed, st.maxSM, strings.Join(probes, " "), strings.Join(others, " "))
		if strings.Contains(ph, "MPS") && len(others) > 0 && len(probes) == 0 {
			line += " (the MPS clients do not show as processes: NVML lists only other processes, the MPS server among them)"
		} else if strings.Contains(ph, "MPS") && len(probes) > 0 {
			line += " (the MPS clients show as processes of their own)"
		}
		lines = append(lines, line)
		if w.compute[ph] && st.observed >= 2 && st.busy == 0 {
			bad = append(bad, fmt.Sprintf("%s: probes computed, yet the sampler never saw the GPU busy (SM ≥ %d%%): lending would lend it", ph, lendingBusyThreshold))
		}
	}
	var idle []string
	for _, g := range w.gpus {
		if g.UUID == w.check {
			continue
		}
		samples, busy := 0, 0
		for _, byGPU := range w.stats {
			if st := byGPU[g.UUID]; st != nil {
				samples, busy = samples+st.samples, busy+st.busy
			}
		}
		idle = append(idle, fmt.Sprintf("gpu-%d busy in %d of %d", g.Minor, busy, samples))
	}
	detail := fmt.Sprintf("every %s, busy threshold %d%% (the plugin's default): checked gpu-%d — %s", samplerInterval, lendingBusyThreshold, n.gpu.Minor, strings.Join(lines, "; "))
	if len(idle) > 0 {
		detail += "; other GPUs: " + strings.Join(idle, ", ")
	}
	if n.cfg.Mock {
		detail += "; mock: the mock NVML lists each simulated probe as a process (100 % SM while it computes), as the check tells it"
	}
	switch {
	case observed == 0:
		c.Status, c.Detail = StatusError, "NVML never listed the checked GPU's processes: "+detail
	case len(bad) > 0:
		c.Status, c.Detail = StatusMismatch, strings.Join(bad, "; ")+" — "+detail
	default:
		c.Status, c.Detail = n.measured(), detail
	}
	return c
}
