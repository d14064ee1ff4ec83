package gpucheck

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
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

// samplerInterval is how often the check samples on a GPU. A mock run
// samples faster when its probes compute for less than four intervals
// (the mock NVML answers with the state of the moment, the driver with the
// samples it took since the last call).
const samplerInterval = 500 * time.Millisecond

// lendSample is one sample of the checked GPU.
type lendSample struct {
	at    time.Time
	phase string
	// observed: NVML listed the processes; unknown: it gave no
	// per-process utilization (the sampler's fallback counted every
	// process busy); ret: its answer.
	observed, unknown, busy bool
	ret                     nvml.Return
	maxSM                   uint32
	pids                    map[uint32]uint32 // pid → highest SM utilization
}

// computeWindow is when one probe computed: from its result's time less
// the seconds it reports, to its result.
type computeWindow struct {
	phase      string
	pid        int
	start, end time.Time
}

// phaseStats is what the sampler saw of another GPU during one step.
type phaseStats struct {
	samples, observed, busy int
}

// samplerWatch samples in the background.
type samplerWatch struct {
	gpus     []gpu.GPU
	check    string // the checked GPU's UUID
	interval time.Duration
	now      func() time.Time

	mu      sync.Mutex
	phase   string
	phases  []string
	samples []lendSample                      // the checked GPU's
	stats   map[string]map[string]*phaseStats // phase → other GPU's uuid → stats
	probes  map[uint32]bool
	windows []computeWindow

	stop chan struct{}
	done chan struct{}
}

func newSamplerWatch(gpus []gpu.GPU, check string, interval time.Duration) *samplerWatch {
	w := &samplerWatch{gpus: gpus, check: check, interval: interval, now: time.Now, stats: map[string]map[string]*phaseStats{},
		probes: map[uint32]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	w.setPhase("start")
	return w
}

// observe is an ExecProber observer: it remembers the probes' PIDs and,
// from each compute or work probe's result, when it computed.
func (w *samplerWatch) observe(pid int, m probeMessage, gone bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.probes[uint32(pid)] = true
	if !gone && m.Event == "result" && m.Compute != nil && m.Compute.Seconds > 0 {
		end := w.now()
		w.windows = append(w.windows, computeWindow{phase: w.phase, pid: pid, start: end.Add(-time.Duration(m.Compute.Seconds * float64(time.Second))), end: end})
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
	interval := samplerInterval
	if n.cfg.Mock && n.cfg.ComputeTime > 0 {
		interval = min(samplerInterval, max(n.cfg.ComputeTime/4, 50*time.Millisecond))
	}
	w := newSamplerWatch(gpus, n.gpu.UUID, interval)
	s := &lending.Sampler{Lib: n.cfg.NVML, PodOf: func(uint32) (types.UID, bool) { return "", false }, Threshold: lendingBusyThreshold}
	go func() {
		defer close(w.done)
		t := time.NewTicker(interval)
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
	if uuid == w.check {
		ls := lendSample{at: w.now(), phase: w.phase, observed: smp.Observed, unknown: smp.UtilizationUnknown, busy: busy && smp.Observed, ret: smp.Utilization, pids: map[uint32]uint32{}}
		for _, a := range smp.Pods {
			ls.maxSM = max(ls.maxSM, a.SM)
			for _, pid := range a.PIDs {
				ls.pids[pid] = max(ls.pids[pid], a.SM)
			}
		}
		w.samples = append(w.samples, ls)
		return
	}
	byGPU := w.stats[w.phase]
	if byGPU == nil {
		byGPU = map[string]*phaseStats{}
		w.stats[w.phase] = byGPU
	}
	st := byGPU[uuid]
	if st == nil {
		st = &phaseStats{}
		byGPU[uuid] = st
	}
	st.samples++
	if smp.Observed {
		st.observed++
		if busy {
			st.busy++
		}
	}
}

// inWindow reports whether a sample was taken while a probe of its phase
// computed.
func (w *samplerWatch) inWindow(s lendSample) bool {
	return slices.ContainsFunc(w.windows, func(cw computeWindow) bool {
		return cw.phase == s.phase && !s.at.Before(cw.start) && !s.at.After(cw.end)
	})
}

// finish stops the sampler and reports. Per step in which probes computed,
// only the samples taken inside a probe's compute window are judged: at
// least two readable ones (else ERROR: too few to judge), none in which
// NVML gave no per-process utilization (else ERROR: the sampler's fallback
// counts every process busy, which proves nothing), and most of them busy
// (else MISMATCH: lending would lend a GPU that computes).
func (w *samplerWatch) finish(n *node) Check {
	c := Check{Name: "lending sampler readings during the probes"}
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var lines, bad, errs []string
	observed, fellBack := 0, 0
	rets := map[string]int{}
	for _, ph := range w.phases {
		var all, obs, busy, judged, judgedBusy, windowFallback int
		var maxSM uint32
		pids := map[uint32]uint32{}
		for _, s := range w.samples {
			if s.phase != ph {
				continue
			}
			all++
			if !s.observed {
				continue
			}
			obs++
			if s.unknown {
				fellBack++
				rets[s.ret.Error()]++
			} else if s.busy {
				busy++
			}
			maxSM = max(maxSM, s.maxSM)
			for pid, sm := range s.pids {
				pids[pid] = max(pids[pid], sm)
			}
			if w.inWindow(s) {
				if s.unknown {
					windowFallback++
					continue
				}
				judged++
				if s.busy {
					judgedBusy++
				}
			}
		}
		if all == 0 {
			continue
		}
		observed += obs
		var probes, others []string
		for _, pid := range slices.Sorted(maps.Keys(pids)) {
			e := fmt.Sprintf("%d (SM ≤%d%%)", pid, pids[pid])
			if w.probes[pid] {
				probes = append(probes, e)
			} else {
				others = append(others, e)
			}
		}
		line := fmt.Sprintf("%s: busy in %d of %d samples (%d observed), SM up to %d%%, probe processes [%s], other processes [%s]",
			ph, busy, all, obs, maxSM, strings.Join(probes, " "), strings.Join(others, " "))
		if strings.Contains(ph, "MPS") && len(others) > 0 && len(probes) == 0 {
			line += " (the MPS clients do not show as processes: NVML lists only other processes, the MPS server among them)"
		} else if strings.Contains(ph, "MPS") && len(probes) > 0 {
			line += " (the MPS clients show as processes of their own)"
		}
		computed := slices.ContainsFunc(w.windows, func(cw computeWindow) bool { return cw.phase == ph })
		if computed {
			line += fmt.Sprintf("; inside the probes' compute windows busy in %d of %d readable samples", judgedBusy, judged)
			switch {
			case windowFallback > 0:
				errs = append(errs, fmt.Sprintf("%s: NVML gave no per-process utilization in %d samples inside the probes' compute windows: the sampler counted every process busy (its fallback), which proves nothing", ph, windowFallback))
			case judged < 2:
				errs = append(errs, fmt.Sprintf("%s: only %d readable samples inside the probes' compute windows, too few to judge (longer --compute-time)", ph, judged))
			case judgedBusy*2 <= judged:
				bad = append(bad, fmt.Sprintf("%s: probes computed, yet the sampler saw the GPU busy (SM ≥ %d%%) in only %d of %d samples inside their compute windows: lending would lend it", ph, lendingBusyThreshold, judgedBusy, judged))
			}
		}
		lines = append(lines, line)
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
	detail := fmt.Sprintf("every %s, busy threshold %d%% (the plugin's default): checked gpu-%d — %s", w.interval, lendingBusyThreshold, n.gpu.Minor, strings.Join(lines, "; "))
	if fellBack > 0 {
		var why []string
		for _, r := range slices.Sorted(maps.Keys(rets)) {
			why = append(why, fmt.Sprintf("%s ×%d", r, rets[r]))
		}
		detail += fmt.Sprintf("; per-process utilization unreadable in %d samples (%s): those count every process busy, as the plugin's fallback does, and are not judged", fellBack, strings.Join(why, ", "))
	}
	if len(idle) > 0 {
		detail += "; other GPUs: " + strings.Join(idle, ", ")
	}
	if n.cfg.Mock {
		detail += "; mock: the mock NVML lists each simulated probe as a process (100 % SM while it computes), as the check tells it"
	}
	switch {
	case observed == 0:
		c.Status, c.Detail = StatusError, "NVML never listed the checked GPU's processes: "+detail
	case len(errs) > 0:
		c.Status, c.Detail = StatusError, strings.Join(append(errs, bad...), "; ")+" — "+detail
	case len(bad) > 0:
		c.Status, c.Detail = StatusMismatch, strings.Join(bad, "; ")+" — "+detail
	default:
		c.Status, c.Detail = n.measured(), detail
	}
	return c
}
