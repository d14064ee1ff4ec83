package lending

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

func TestSamplerAndObserve(t *testing.T) {
	node, err := gpu.NewMockNode("hgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := gpu.Discover(node)
	if err != nil {
		t.Fatal(err)
	}
	uuid, memory := gpus[0].UUID, int64(gpus[0].MemoryBytes)
	s := &Sampler{Lib: node, PodOf: node.PodOfProcess}
	owners := []Owner{{Claim: "owner", Lend: true}}
	borrowerPods := map[types.UID]bool{"borrower-pod": true}

	o := Observe(s.Sample(uuid), memory, owners, nil, nil, borrowerPods, 5)
	if !o.Observed || o.Busy || o.OwnerMemory != 0 || len(o.OwnerProcesses) != 0 {
		t.Fatalf("idle GPU: %+v", o)
	}
	// The owner's notebook holds memory and idles; a borrower computes.
	must(t, node.SetProcessActivity(0, 100, "owner-pod", 0, 10<<30, false))
	must(t, node.SetProcessActivity(0, 200, "borrower-pod", 90, 20<<30, false))
	o = Observe(s.Sample(uuid), memory, owners, []types.UID{"b"}, nil, borrowerPods, 5)
	if o.Busy || o.OwnerMemory != 10<<30 || len(o.OwnerProcesses) != 1 || o.OwnerProcesses[0] != 100 || o.BorrowerMemory != 20<<30 {
		t.Fatalf("idle owner, busy borrower: %+v", o)
	}
	if o.FreeMemory != memory-30<<30 {
		t.Errorf("free memory %d, want the GPU's less 30 GiB in use", o.FreeMemory)
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
