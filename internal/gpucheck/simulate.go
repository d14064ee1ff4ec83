package gpucheck

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tessera-dev/tessera/internal/gpucheck/cuda"
	"github.com/tessera-dev/tessera/pkg/gpu"
)

// The probe's mock mode ("tessera-gpu-probe probe --simulate-gpu-mib N …",
// what the check runs against a mock profile, and so what the bundle's dry
// run exercises): a probe process that speaks the real probe's protocol but
// loads no driver. Its figures follow only the environment the check built
// from the prepared CDI spec, as the backends would on a GPU:
//
//   - memory: MPS's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M, or
//     HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_0=<MiB>m when a library is
//     preloaded (LD_PRELOAD, or /etc/ld.so.preload in a container; without
//     one nothing would read the variable), caps what the process gets; without either it gets the whole GPU. A simulated
//     context of SimulatedContextMiB is charged inside the cap.
//   - compute: the share's part is CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, or
//     HAMi-core's CUDA_DEVICE_SM_LIMIT_0 / CUDA_DEVICE_SM_LIMIT (with a
//     preloaded library); without them an even time slice (50).
//
// A spec that lost a variable, a probe that could not start, a pipe the
// protocol does not survive: each shows in the report as it would on a GPU.
// Every figure is labelled simulated (the device name and the report's
// Mock flag); none is what a GPU does.

// SimulatedDeviceName is the device name simulated probes report.
const SimulatedDeviceName = "simulated (mock profile, no GPU)"

// SimulatedContextMiB is the context charge a simulated probe reports.
const SimulatedContextMiB = 500

// SimulatedServerMiB is the memory the mock NVML shows for a simulated MPS
// server (a mock figure, below the 512 MiB isolation.DefaultMPSServerReserve
// assumes; no GPU was asked).
const SimulatedServerMiB = 300

// Faults a simulated probe can be given (probe --simulate-fault), so that
// the tests see each check fail the way a broken driver would make it fail.
const (
	// SimFaultMPSNoWait: an MPS client of another uid does not wait for
	// the running server to lose its clients (after a slow start of
	// simFaultSlowStart, which a check that judged the wait from the
	// process's start would take for the wait).
	SimFaultMPSNoWait = "mps-no-wait"
	// SimFaultMPSNoServer: MPS clients do not go through a server (each a
	// context of its own, as when the daemon is not reached).
	SimFaultMPSNoServer = "mps-no-server"
	// SimFaultHAMiLow: HAMi-core refuses at half the limit.
	SimFaultHAMiLow = "hami-low"
	// SimFaultMIGSeesAll: a process in a MIG instance sees every MIG device
	// of its GPU.
	SimFaultMIGSeesAll = "mig-sees-all"
)

// SimFaults are every SimFault* value.
var SimFaults = []string{SimFaultMPSNoWait, SimFaultMPSNoServer, SimFaultHAMiLow, SimFaultMIGSeesAll}

// simFaultSlowStart is how long SimFaultMPSNoWait's client takes to start.
const simFaultSlowStart = 4 * time.Second

// simPreloaded reports whether a library is preloaded into the process, as
// HAMi-core must be for its variables to mean anything: LD_PRELOAD (a host
// process) or the loader's /etc/ld.so.preload (a container, where the spec
// mounts one).
func simPreloaded(env []string) bool {
	if lib, _ := simEnv(env, "LD_PRELOAD"); lib != "" {
		return true
	}
	data, err := os.ReadFile(preloadFile)
	return err == nil && strings.TrimSpace(string(data)) != ""
}

func simEnv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// simulatedMemoryLimit is the memory cap env gives a process, in bytes.
func simulatedMemoryLimit(env []string) (uint64, bool, error) {
	if v, ok := simEnv(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"); ok {
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(v, "0="), "M"), 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q: want 0=<MiB>M", v)
		}
		return n << 20, true, nil
	}
	if v, ok := simEnv(env, "CUDA_DEVICE_MEMORY_LIMIT_0"); ok {
		n, err := strconv.ParseUint(strings.TrimSuffix(v, "m"), 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("CUDA_DEVICE_MEMORY_LIMIT_0=%q: want <MiB>m", v)
		}
		if !simPreloaded(env) {
			return 0, false, nil
		}
		return n << 20, true, nil
	}
	return 0, false, nil
}

// simulatedCores is the compute share env gives a process, in percent.
func simulatedCores(env []string) (float64, error) {
	keys := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}
	if simPreloaded(env) {
		keys = append(keys, "CUDA_DEVICE_SM_LIMIT_0", "CUDA_DEVICE_SM_LIMIT")
	}
	for _, k := range keys {
		if v, ok := simEnv(env, k); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 || f > 100 {
				return 0, fmt.Errorf("%s=%q: want a percentage", k, v)
			}
			return f, nil
		}
	}
	return 50, nil
}

// SimMIGFile is the mock run's table of MIG devices (in the simulated
// clients' registry): what a simulated probe whose CUDA_VISIBLE_DEVICES
// names a MIG device sees.
const SimMIGFile = "mig-devices.json"

// SimMIGDevice is one MIG device of the table.
type SimMIGDevice struct {
	UUID        string `json:"uuid"`
	Parent      string `json:"parent"`
	MemoryBytes uint64 `json:"memoryBytes"`
}

// simulatedDevice is the simulated GPU a probe sees. A probe must see one
// GPU: CUDA_VISIBLE_DEVICES names it, or (in a container, where the
// runtime gives only the GPU's own device node) exactly one /dev/nvidia<N>
// exists. A MIG device (CUDA_VISIBLE_DEVICES=MIG-…) must be one the mock
// NVML lists (reg's SimMIGFile, written by the check); the probe sees it,
// with its memory as the total, and (with SimFaultMIGSeesAll) every MIG
// device of its GPU.
func simulatedDevice(env []string, gpuBytes uint64, reg SimRegistry, faults []string) (cuda.DeviceInfo, error) {
	info := cuda.DeviceInfo{Name: SimulatedDeviceName, TotalBytes: gpuBytes, FreeBytes: gpuBytes}
	v, _ := simEnv(env, "CUDA_VISIBLE_DEVICES")
	if v == "" {
		nodes, _ := filepath.Glob("/dev/nvidia[0-9]*")
		if len(nodes) != 1 {
			return cuda.DeviceInfo{}, fmt.Errorf("CUDA_VISIBLE_DEVICES is not set and %d GPU device nodes exist: the probe would see every GPU", len(nodes))
		}
		return info, nil
	}
	names := strings.Split(v, ",")
	if !strings.HasPrefix(names[0], "MIG-") {
		for _, n := range names {
			info.VisibleUUIDs = append(info.VisibleUUIDs, cuda.BareUUID(n))
		}
		info.DeviceCount = len(names)
		return info, nil
	}
	var table []SimMIGDevice
	data, err := os.ReadFile(filepath.Join(reg.Dir, SimMIGFile))
	if err == nil {
		err = json.Unmarshal(data, &table)
	}
	if err != nil {
		return cuda.DeviceInfo{}, fmt.Errorf("CUDA_VISIBLE_DEVICES=%s names a MIG device, and the mock's MIG devices cannot be read: %w", v, err)
	}
	i := slices.IndexFunc(table, func(d SimMIGDevice) bool { return d.UUID == names[0] })
	if i < 0 {
		return cuda.DeviceInfo{}, fmt.Errorf("cuInit: CUDA_ERROR_NO_DEVICE (100) [simulated]: CUDA_VISIBLE_DEVICES=%s names no MIG device the mock NVML lists", v)
	}
	dev := table[i]
	info.TotalBytes, info.FreeBytes = dev.MemoryBytes, dev.MemoryBytes
	info.VisibleUUIDs = []string{cuda.BareUUID(dev.UUID)}
	if slices.Contains(faults, SimFaultMIGSeesAll) {
		for _, d := range table {
			if d.Parent == dev.Parent && d.UUID != dev.UUID {
				info.VisibleUUIDs = append(info.VisibleUUIDs, cuda.BareUUID(d.UUID))
			}
		}
	}
	info.DeviceCount = len(info.VisibleUUIDs)
	return info, nil
}

// RunSimulatedMemoryProbe is the memory probe of the mock mode: env is its
// environment (os.Environ()), gpuBytes the mock GPU's memory, faults
// SimFault* values. It behaves as
// a GPU under the spec's variables would for every allocator alike
// (HAMi-core hooks all four; MPS pins device memory, whatever allocates it).
// With opts.WaitStart it reports "ready" once its (simulated) context exists and
// allocates only after a line on in, as the N-process check needs.
//
// Processes of one HAMi-core claim share one limit, as HAMi-core's shared
// region (CUDA_DEVICE_MEMORY_SHARED_CACHE) makes them: the simulation keeps
// a ledger next to that file (flock'd), charges each process's context when
// it starts and lets it allocate only what the claim has left.
func RunSimulatedMemoryProbe(in io.Reader, out io.Writer, env []string, gpuBytes uint64, opts MemoryOptions, reg SimRegistry, faults ...string) error {
	enc := json.NewEncoder(out)
	fail := probeFail(enc, "simulated probe: ")
	info, err := simulatedDevice(env, gpuBytes, reg, faults)
	if err != nil {
		return fail(err)
	}
	gpuBytes = info.TotalBytes // a MIG device's
	a := opts.Allocator
	if a == "" {
		a = cuda.AllocPlain
	}
	total := gpuBytes
	limit, capped, err := simulatedMemoryLimit(env)
	if err != nil {
		return fail(err)
	}
	if capped {
		total = min(limit, gpuBytes)
	}
	const ctx = SimulatedContextMiB << 20
	if total <= ctx {
		return fail(fmt.Errorf("a %d MiB cap leaves nothing after the %d MiB context", total>>20, SimulatedContextMiB))
	}
	// What the claim may use: its cap, or half of it for a HAMi-core that
	// refuses at half the limit (and still shows the whole limit as the
	// total).
	claimLimit := total
	if _, mps := simEnv(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"); capped && !mps && slices.Contains(faults, SimFaultHAMiLow) {
		claimLimit = total / 2
	}
	var ledger *simLedger
	if cache, ok := simEnv(env, "CUDA_DEVICE_MEMORY_SHARED_CACHE"); ok && capped {
		if simPreloaded(env) {
			ledger = &simLedger{path: cache + ".tessera-sim", limit: claimLimit}
			defer ledger.release()
		}
	}
	free := total - ctx
	if ledger != nil {
		// HAMi-core shows the claim's limit as the total and what the
		// claim's processes have not used as free.
		_, used, err := ledger.charge(ctx, false)
		if err != nil {
			return fail(err)
		}
		free = total - min(used, total)
	}
	p := MemoryProbe{PID: os.Getpid(), Device: info, Allocator: a, TotalBytes: total, FreeBeforeBytes: free}
	rd := bufio.NewReader(in)
	if opts.WaitStart {
		if err := awaitStart(enc, rd, probeMessage{Event: "ready", Memory: &p}, fail); err != nil {
			return err
		}
	}
	want := claimLimit - min(ctx, claimLimit)
	if ledger != nil {
		if want, _, err = ledger.charge(want, true); err != nil {
			return fail(err)
		}
	}
	p.AllocatedBytes, p.Allocations = want, 1
	p.LastError = string(a) + ": CUDA_ERROR_OUT_OF_MEMORY (2) [simulated]"
	if !capped && opts.StopAfterBytes > 0 && opts.StopAfterBytes < want {
		p.AllocatedBytes, p.Stopped, p.LastError = opts.StopAfterBytes, true, ""
	}
	if err := awaitCheck(enc, rd, probeMessage{Event: "holding", Memory: &p}, fail); err != nil {
		return err
	}
	return enc.Encode(probeMessage{Event: "result", Memory: &p})
}

// simLedger is the simulation's stand-in for HAMi-core's shared region: a
// JSON file of bytes charged per live process, changed under flock.
type simLedger struct {
	path  string
	limit uint64
}

// charge adds up to want bytes for this process (all of want when partial
// is false: a context is charged whole, even past the limit, as the driver
// creates it regardless) and returns what it charged and what the claim's
// processes use with it.
func (l *simLedger) charge(want uint64, partial bool) (got, used uint64, err error) {
	got = want
	err = l.update(func(m map[int]uint64) {
		for _, b := range m {
			used += b
		}
		if partial {
			got = min(want, l.limit-min(used, l.limit))
		}
		m[os.Getpid()] += got
		used += got
	})
	return got, used, err
}

// release takes this process off the ledger.
func (l *simLedger) release() {
	_ = l.update(func(m map[int]uint64) { delete(m, os.Getpid()) })
}

func (l *simLedger) update(change func(map[int]uint64)) error {
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return fmt.Errorf("HAMi-core's shared region (simulated): %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }()
	m := map[int]uint64{}
	if data, err := io.ReadAll(f); err == nil && len(data) > 0 {
		_ = json.Unmarshal(data, &m)
	}
	for pid := range m {
		if !processAlive(pid) {
			delete(m, pid)
		}
	}
	change(m)
	data, _ := json.Marshal(m)
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err = f.WriteAt(data, 0)
	return err
}

// processAlive reports whether pid runs (as any user).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// SimRegistry is the mock mode's view of which simulated CUDA clients run:
// one JSON file per live probe in a directory the check gives every
// simulated probe (--simulate-registry). It stands in for what only a GPU
// shows: which MPS server (pipe directory and uid) a client went through,
// and which contexts compute at the same time.
type SimRegistry struct{ Dir string }

// SimClient is one registered probe.
type SimClient struct {
	PID  int    `json:"pid"`
	UID  int    `json:"uid"`
	Kind string `json:"kind"` // "hold" or "work"
	// Pipe is the client's CUDA_MPS_PIPE_DIRECTORY ("": not an MPS client,
	// a context of its own).
	Pipe string `json:"pipe,omitempty"`
}

// context names the GPU context a client's work runs in: its MPS server's
// (pipe directory and uid) or its own.
func (c SimClient) context() string {
	if c.Pipe == "" {
		return fmt.Sprintf("pid %d", c.PID)
	}
	return fmt.Sprintf("%s uid %d", c.Pipe, c.UID)
}

func (r SimRegistry) register(c SimClient) (func(), error) {
	if err := os.MkdirAll(r.Dir, 0o1777); err != nil {
		return nil, err
	}
	data, _ := json.Marshal(c)
	path := filepath.Join(r.Dir, strconv.Itoa(c.PID)+".json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return nil, err
	}
	return func() { _ = os.Remove(path) }, nil
}

// Clients lists the registered probes that still run.
func (r SimRegistry) Clients() []SimClient {
	files, _ := filepath.Glob(filepath.Join(r.Dir, "*.json"))
	var out []SimClient
	for _, f := range files {
		var c SimClient
		data, err := os.ReadFile(f)
		if err != nil || json.Unmarshal(data, &c) != nil || !processAlive(c.PID) {
			continue
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b SimClient) int { return a.PID - b.PID })
	return out
}

// simWaitForServer is legacy MPS's rule for a client of another uid: the
// control daemon starts its server only once the running server (of
// another uid) has no clients left. It waits while a live client of the
// same pipe directory has another uid, at most limit.
func (r SimRegistry) waitForServer(pipe string, uid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		busy := slices.ContainsFunc(r.Clients(), func(c SimClient) bool { return c.Pipe == pipe && c.UID != uid })
		if !busy {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the MPS server of another uid still had clients after %s", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RunSimulatedHoldProbe is the hold probe of the mock mode. It reports
// "loading" as the real probe does before cuInit; then an MPS client
// (CUDA_MPS_PIPE_DIRECTORY set) of a uid other than the running server's
// waits as legacy MPS makes it wait; then it registers and holds. faults
// are SimFault* values.
func RunSimulatedHoldProbe(in io.Reader, out io.Writer, env []string, gpuBytes uint64, reg SimRegistry, faults ...string) error {
	enc := json.NewEncoder(out)
	fail := probeFail(enc, "simulated probe: ")
	info, err := simulatedDevice(env, gpuBytes, reg, faults)
	if err != nil {
		return fail(err)
	}
	gpuBytes = info.TotalBytes
	noWait := slices.Contains(faults, SimFaultMPSNoWait)
	if noWait {
		time.Sleep(simFaultSlowStart)
	}
	if err := enc.Encode(probeMessage{Event: "loading", Time: time.Now().UnixNano()}); err != nil {
		return err
	}
	pipe, _ := simEnv(env, "CUDA_MPS_PIPE_DIRECTORY")
	if slices.Contains(faults, SimFaultMPSNoServer) {
		pipe = ""
	}
	if reg.Dir != "" {
		if pipe != "" && !noWait {
			if err := reg.waitForServer(pipe, os.Getuid(), time.Minute); err != nil {
				return fail(err)
			}
		}
		done, err := reg.register(SimClient{PID: os.Getpid(), UID: os.Getuid(), Kind: "hold", Pipe: pipe})
		if err != nil {
			return fail(err)
		}
		defer done()
	}
	const ctx = SimulatedContextMiB << 20
	p := MemoryProbe{PID: os.Getpid(), Device: info, TotalBytes: gpuBytes, FreeBeforeBytes: gpuBytes - ctx}
	if err := awaitCheck(enc, bufio.NewReader(in), probeMessage{Event: "holding", Time: time.Now().UnixNano(), Memory: &p}, fail); err != nil {
		return err
	}
	return enc.Encode(probeMessage{Event: "result", Memory: &p})
}

// RunSimulatedWorkProbe is the fixed-work probe of the mock mode. It follows
// the model NVIDIA's documentation gives (docs/gpu-check.md, "MPS: two trust
// domains"): clients of one MPS server run side by side, distinct contexts
// (MPS servers, plain contexts) time-slice. Its rate is full divided by the
// number of distinct contexts computing when it starts.
func RunSimulatedWorkProbe(in io.Reader, out io.Writer, env []string, d time.Duration, reg SimRegistry) error {
	enc := json.NewEncoder(out)
	fail := probeFail(enc, "simulated probe: ")
	info, err := simulatedDevice(env, 0, reg, nil)
	if err != nil {
		return fail(err)
	}
	pipe, _ := simEnv(env, "CUDA_MPS_PIPE_DIRECTORY")
	me := SimClient{PID: os.Getpid(), UID: os.Getuid(), Kind: "work", Pipe: pipe}
	if reg.Dir != "" {
		done, err := reg.register(me)
		if err != nil {
			return fail(err)
		}
		defer done()
	}
	p := ComputeProbe{PID: os.Getpid(), Device: info, Grid: 33, Block: spinBlock, Kernel: WorkEntry, Iterations: 1 << 20}
	if err := awaitStart(enc, bufio.NewReader(in), probeMessage{Event: "ready", Compute: &p}, fail); err != nil {
		return err
	}
	contexts := map[string]bool{me.context(): true}
	for _, c := range reg.Clients() {
		if c.Kind == "work" {
			contexts[c.context()] = true
		}
	}
	start := time.Now()
	time.Sleep(d)
	p.Seconds = time.Since(start).Seconds()
	p.Kernels = int(math.Round(p.Seconds * 1000 / float64(len(contexts))))
	p.CountedBlocks = uint64(p.Kernels) * uint64(p.Grid)
	return enc.Encode(probeMessage{Event: "result", Compute: &p})
}

// RunSimulatedComputeProbe is the compute probe of the mock mode: it waits
// for the start line as the real one does, then for d, and reports work in
// proportion to the share env gives it.
func RunSimulatedComputeProbe(in io.Reader, out io.Writer, env []string, d time.Duration) error {
	enc := json.NewEncoder(out)
	fail := probeFail(enc, "simulated probe: ")
	info, err := simulatedDevice(env, 0, SimRegistry{}, nil)
	if err != nil {
		return fail(err)
	}
	share, err := simulatedCores(env)
	if err != nil {
		return fail(err)
	}
	p := ComputeProbe{PID: os.Getpid(), Device: info, Grid: 1000, Block: spinBlock, CyclesPerBlock: defaultClockKHz * spinKernelMillis}
	if err := awaitStart(enc, bufio.NewReader(in), probeMessage{Event: "ready", Compute: &p}, fail); err != nil {
		return err
	}
	start := time.Now()
	time.Sleep(d)
	p.Seconds = time.Since(start).Seconds()
	p.Kernels = int(share * 10)
	p.CountedBlocks = uint64(p.Kernels) * uint64(p.Grid)
	return enc.Encode(probeMessage{Event: "result", Compute: &p})
}

// SimRegistryDir is the registry's directory under the check's work
// directory (mock runs).
const SimRegistryDir = "sim"

// mockDriverObserver plays the driver for a mock run: while a simulated
// probe runs, the mock NVML lists it as a compute process on GPU index with
// the memory its figures say (its context, plus what it holds) and, while it
// computes, 100 % SM utilization; it goes when the probe exits. While a
// (pipe directory, uid) has simulated MPS clients in the registry at dir,
// the mock NVML also lists a simulated MPS server for it, a process of
// SimulatedServerMiB with a PID above Linux's PID limit (2^22), so that it
// is no real process. (A real legacy MPS server outlives its clients until
// its daemon quits; the simulated one goes with its last client.)
func mockDriverObserver(node *gpu.MockNode, index int, dir string) func(pid int, m probeMessage, gone bool) {
	var mu sync.Mutex
	servers := map[string]uint32{}
	next := uint32(1 << 22)
	syncServers := func() {
		mu.Lock()
		defer mu.Unlock()
		live := map[string]bool{}
		for _, c := range (SimRegistry{Dir: dir}).Clients() {
			if c.Pipe != "" {
				live[c.context()] = true
			}
		}
		for key := range live {
			if _, ok := servers[key]; !ok {
				next++
				servers[key] = next
				_ = node.SetProcessActivity(index, next, "", 0, SimulatedServerMiB<<20, false)
			}
		}
		for key, pid := range servers {
			if !live[key] {
				_ = node.SetProcessActivity(index, pid, "", 0, 0, true)
				delete(servers, key)
			}
		}
	}
	return func(pid int, m probeMessage, gone bool) {
		const ctx = SimulatedContextMiB << 20
		switch {
		case gone:
			_ = node.SetProcessActivity(index, uint32(pid), "", 0, 0, true)
		case m.Event == "holding" && m.Memory != nil:
			_ = node.SetProcessActivity(index, uint32(pid), "", 0, ctx+m.Memory.AllocatedBytes, false)
		case m.Event == "ready" && m.Compute != nil:
			_ = node.SetProcessActivity(index, uint32(pid), "", 100, ctx, false)
		case m.Event == "ready" || m.Event == "inside":
			_ = node.SetProcessActivity(index, uint32(pid), "", 0, ctx, false)
		}
		if dir != "" {
			syncServers()
		}
	}
}
