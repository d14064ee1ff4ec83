package lending

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
)

func TestSamplerAndObserve(t *testing.T) {
	node, gpus := gputest.Node(t, "hgx-h100")
	uuid, memory := gpus[0].UUID, int64(gpus[0].MemoryBytes)
	s := &Sampler{Lib: node, PodOf: node.PodOfProcess}
	owners := []Owner{{Claim: "owner", Lend: true}}
	borrowerPods := map[types.UID]bool{"borrower-pod": true}

	o := Observe(s.Sample(uuid), memory, owners, nil, nil, borrowerPods, 5)
	if !o.Observed || o.Busy || o.OwnerMemory != 0 || len(o.OwnerProcesses) != 0 {
		t.Fatalf("idle GPU: %+v", o)
	}
	// What NVML calls free on an idle GPU; how it accounts the driver's
	// reserved memory is discovery's concern (pkg/gpu), not the sampler's.
	idleFree := o.FreeMemory
	// The owner's notebook holds memory and idles; a borrower computes.
	must(t, node.SetProcessActivity(0, 100, "owner-pod", 0, 10<<30, false))
	must(t, node.SetProcessActivity(0, 200, "borrower-pod", 90, 20<<30, false))
	o = Observe(s.Sample(uuid), memory, owners, []types.UID{"b"}, nil, borrowerPods, 5)
	if o.Busy || o.OwnerMemory != 10<<30 || len(o.OwnerProcesses) != 1 || o.OwnerProcesses[0] != 100 || o.BorrowerMemory != 20<<30 {
		t.Fatalf("idle owner, busy borrower: %+v", o)
	}
	if o.FreeMemory != idleFree-30<<30 || idleFree <= 0 || idleFree > memory+1<<30 {
		t.Errorf("free memory %d, want the idle GPU's %d less the 30 GiB in use", o.FreeMemory, idleFree)
	}
	// An unknown pod's process is the owners'.
	must(t, node.SetProcessActivity(0, 300, "", 1, 1<<20, false))
	if o = Observe(s.Sample(uuid), memory, owners, nil, nil, borrowerPods, 5); o.Busy || len(o.OwnerProcesses) != 2 {
		t.Fatalf("an unknown process below the threshold: %+v", o)
	}
	must(t, node.SetProcessActivity(0, 300, "", 0, 0, true))
	// The owner computes again.
	must(t, node.SetProcessActivity(0, 100, "owner-pod", 40, 10<<30, false))
	if o = Observe(s.Sample(uuid), memory, owners, nil, nil, borrowerPods, 5); !o.Busy {
		t.Fatalf("busy owner: %+v", o)
	}
	// A lost GPU cannot be observed.
	must(t, node.SetLost(0, true))
	if o = Observe(s.Sample(uuid), memory, owners, nil, nil, borrowerPods, 5); o.Observed {
		t.Fatalf("lost GPU observed: %+v", o)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A process that computed since the last sample and exited before it was
// read is attributed to the pod it had when seen running; one never seen
// counts as the owners' only if it computed at least the threshold.
func TestSamplerExitedProcesses(t *testing.T) {
	running := []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 1 << 30}}
	var util []nvml.ProcessUtilizationSample
	dev := &mock.Device{
		GetComputeRunningProcessesFunc:    func() ([]nvml.ProcessInfo, nvml.Return) { return running, nvml.SUCCESS },
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
		GetMemoryInfoFunc:                 func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 80 << 30, Free: 70 << 30}, nvml.SUCCESS },
		GetProcessUtilizationFunc: func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			if len(util) == 0 {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return util, nvml.SUCCESS
		},
	}
	lib := &mock.Interface{DeviceGetHandleByUUIDFunc: func(string) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS }}
	pods := map[uint32]types.UID{10: "borrower-pod"}
	s := &Sampler{Lib: lib, Threshold: 5, PodOf: func(pid uint32) (types.UID, bool) { p, ok := pods[pid]; return p, ok }}
	borrowers := map[types.UID]bool{"borrower-pod": true}
	if o := Observe(s.Sample("GPU"), 80<<30, nil, nil, nil, borrowers, 5); o.Busy || o.BorrowerMemory != 1<<30 || o.FreeMemory != 70<<30 {
		t.Fatalf("a running borrower process: %+v", o)
	}
	// The borrower's process computed and exited: /proc no longer knows it.
	running, pods = nil, map[uint32]types.UID{}
	util = []nvml.ProcessUtilizationSample{{Pid: 10, SmUtil: 90, TimeStamp: 1}}
	if o := Observe(s.Sample("GPU"), 80<<30, nil, nil, nil, borrowers, 5); o.Busy {
		t.Fatalf("an exited borrower process counted as the owners': %+v", o)
	}
	// A process never seen running that computed a little: nobody's.
	util = []nvml.ProcessUtilizationSample{{Pid: 11, SmUtil: 2, TimeStamp: 2}}
	if o := Observe(s.Sample("GPU"), 80<<30, nil, nil, nil, borrowers, 5); o.Busy {
		t.Fatalf("a short idle unknown process made the owners busy: %+v", o)
	}
	// One that computed at the threshold: the owners' (it can only end a loan).
	util = []nvml.ProcessUtilizationSample{{Pid: 12, SmUtil: 50, TimeStamp: 3}}
	if o := Observe(s.Sample("GPU"), 80<<30, nil, nil, nil, borrowers, 5); !o.Busy {
		t.Fatalf("an unknown process computing did not make the owners busy: %+v", o)
	}
}

// go-nvml's GetProcessUtilization (v0.13.0-1, unchanged in v0.13.4-1) sizes
// its buffer with a first call; when no process computed since lastSeen
// that call answers ERROR_INSUFFICIENT_SIZE with a count of 0, and go-nvml
// returns an empty list with that answer. The driver may also answer
// ERROR_NOT_FOUND. Both mean "no samples": an owner that holds memory and
// computes nothing is idle. Any other answer leaves utilization unknown,
// and every process then counts as computing.
func TestSamplerNoSamplesIsIdle(t *testing.T) {
	for _, tc := range []struct {
		name     string
		samples  []nvml.ProcessUtilizationSample
		ret      nvml.Return
		wantBusy bool
	}{
		{"go-nvml's empty answer", []nvml.ProcessUtilizationSample{}, nvml.ERROR_INSUFFICIENT_SIZE, false},
		{"not found", nil, nvml.ERROR_NOT_FOUND, false},
		{"success without samples", nil, nvml.SUCCESS, false},
		{"insufficient size with samples", []nvml.ProcessUtilizationSample{{Pid: 10, TimeStamp: 1}}, nvml.ERROR_INSUFFICIENT_SIZE, true},
		{"not supported", nil, nvml.ERROR_NOT_SUPPORTED, true},
		{"unknown error", nil, nvml.ERROR_UNKNOWN, true},
		// go-nvml slices its second answer to a count larger than its
		// buffer when a process started between its two calls.
		{"go-nvml's out-of-range panic", nil, nvml.ERROR_GPU_IS_LOST, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := &mock.Device{
				GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
					return []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 4 << 30}}, nvml.SUCCESS
				},
				GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
				GetMemoryInfoFunc:                 func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 80 << 30, Free: 76 << 30}, nvml.SUCCESS },
				GetProcessUtilizationFunc: func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
					if tc.ret == nvml.ERROR_GPU_IS_LOST {
						return make([]nvml.ProcessUtilizationSample, 1)[:2], nvml.ERROR_INSUFFICIENT_SIZE
					}
					return tc.samples, tc.ret
				},
			}
			lib := &mock.Interface{DeviceGetHandleByUUIDFunc: func(string) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS }}
			s := &Sampler{Lib: lib, Threshold: 5, PodOf: func(uint32) (types.UID, bool) { return "owner-pod", true }}
			owners := []Owner{{Claim: "owner", Lend: true}}
			smp := s.Sample("GPU")
			o := Observe(smp, 80<<30, owners, nil, nil, nil, 5)
			if !o.Observed || o.Busy != tc.wantBusy || o.OwnerMemory != 4<<30 {
				t.Errorf("utilization %v: %+v, want busy=%v with the owner's 4 GiB", tc.ret, o, tc.wantBusy)
			}
			// Busy here comes from real samples only where utilization
			// was read; the sample says which (the GPU check needs it).
			wantUnknown := tc.wantBusy && tc.samples == nil || tc.name == "insufficient size with samples"
			wantRet := tc.ret
			if tc.ret == nvml.ERROR_GPU_IS_LOST {
				wantRet = nvml.ERROR_UNKNOWN
			}
			if smp.UtilizationUnknown != wantUnknown || smp.Utilization != wantRet {
				t.Errorf("utilization %v: Utilization %v, UtilizationUnknown %v; want %v, %v", tc.ret, smp.Utilization, smp.UtilizationUnknown, wantRet, wantUnknown)
			}
		})
	}
}

// The mock node answers like go-nvml over a real driver: an idle owner on a
// mock GPU is seen idle.
func TestSamplerIdleOwnerOnMockNode(t *testing.T) {
	node, gpus := gputest.Node(t, "l4x4")
	if _, ret := node.Devices[0].GetProcessUtilization(0); ret != nvml.ERROR_INSUFFICIENT_SIZE {
		t.Fatalf("mock GetProcessUtilization without samples answers %v, want go-nvml's ERROR_INSUFFICIENT_SIZE", ret)
	}
	must(t, node.SetProcessActivity(0, 100, "owner-pod", 0, 10<<30, false))
	s := &Sampler{Lib: node, PodOf: node.PodOfProcess, Threshold: 5}
	o := Observe(s.Sample(gpus[0].UUID), int64(gpus[0].MemoryBytes), []Owner{{Claim: "owner", Lend: true}}, nil, nil, nil, 5)
	if !o.Observed || o.Busy || o.OwnerMemory != 10<<30 {
		t.Fatalf("idle owner holding 10 GiB: %+v, want observed, not busy", o)
	}
}
