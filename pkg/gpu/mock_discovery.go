package gpu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Test knob of MockNode: GPUs that fail discovery. Nothing on a real node
// uses it.

// MockDiscoveryCalls are the NVML calls FailDiscovery can make fail, in the
// order discovery makes them. Failing nvmlDeviceGetUUID leaves nothing known
// about the GPU but its index; nvmlDeviceGetMemoryInfo leaves its UUID and
// minor number known but not enough to publish it; nvmlDeviceGetPciInfo and
// nvmlDeviceGetComputeMode leave enough to publish it (see Failure.Partial).
// The NVLink and fabric calls (nvmlDeviceGetNvLinkState,
// nvmlDeviceGetGpuFabricInfo) do not fail the GPU: it is described in an
// NVLink domain of its own (GPU.NVLinkError). Nor does
// nvmlDeviceGetGpuInstances on a GPU in MIG mode: it is described without
// its GPU instances, with the error in GPU.MIGError.
var MockDiscoveryCalls = []string{"nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo",
	"nvmlDeviceGetComputeMode", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuInstances"}

// DefaultMockDiscoveryCall is the call FailDiscoverySpec fails when the spec
// names none: what a GPU in a bad state typically answers.
const DefaultMockDiscoveryCall = "nvmlDeviceGetMemoryInfo"

// mockFailure is a call that fails on one mock GPU.
type mockFailure struct {
	call string
	ret  nvml.Return
}

// FailDiscovery makes GPU i answer ret to call (one of MockDiscoveryCalls),
// so that discovery reports the GPU in Discovery.Failed (or, for the NVLink
// and fabric calls, with an NVLinkError); ret SUCCESS makes it answer
// normally again. Only one call fails per GPU: a second
// FailDiscovery replaces the first. Other users of the call (the health
// watcher reads the UUID, metrics the memory) see the same failure, as they
// would on a real node.
func (n *MockNode) FailDiscovery(i int, call string, ret nvml.Return) error {
	if i < 0 || i >= len(n.Devices) {
		return fmt.Errorf("mock node %s: no GPU with index %d (it has %d)", n.Profile, i, len(n.Devices))
	}
	if !slices.Contains(MockDiscoveryCalls, call) {
		return fmt.Errorf("mock node %s: discovery call %q cannot be made to fail (want one of %s)", n.Profile, call, strings.Join(MockDiscoveryCalls, ", "))
	}
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	if ret == nvml.SUCCESS {
		delete(n.state.failures, i)
	} else {
		n.state.failures[i] = mockFailure{call: call, ret: ret}
	}
	return nil
}

// FailDiscoverySpec applies "INDEX[:CALL]" (CALL defaults to
// DefaultMockDiscoveryCall): GPU INDEX answers ERROR_UNKNOWN to CALL. It is
// the form of the kubelet plugin's --mock-fail-discovery flag.
func (n *MockNode) FailDiscoverySpec(spec string) error {
	index, call, _ := strings.Cut(spec, ":")
	i, err := strconv.Atoi(index)
	if err != nil {
		return fmt.Errorf("mock discovery failure %q: want INDEX[:CALL]", spec)
	}
	if call == "" {
		call = DefaultMockDiscoveryCall
	}
	return n.FailDiscovery(i, call, nvml.ERROR_UNKNOWN)
}

// failing returns what call on GPU i answers instead of its result, if it fails.
func (n *MockNode) failing(i int, call string) (nvml.Return, bool) {
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	f, ok := n.state.failures[i]
	if !ok || f.call != call {
		return nvml.SUCCESS, false
	}
	return f.ret, true
}

// installDiscoveryFailures wraps the calls of MockDiscoveryCalls; call it
// after installEvents, which wraps GetMemoryInfo itself, installMIG and
// installConditions, so that a failure wins over a knob.
func (n *MockNode) installDiscoveryFailures() {
	n.state.failures = map[int]mockFailure{}
	for i, d := range n.Devices {
		d.GetUUIDFunc = failable(n, i, "nvmlDeviceGetUUID", d.GetUUIDFunc)
		d.GetMemoryInfoFunc = failable(n, i, "nvmlDeviceGetMemoryInfo", d.GetMemoryInfoFunc)
		d.GetPciInfoFunc = failable(n, i, "nvmlDeviceGetPciInfo", d.GetPciInfoFunc)
		d.GetComputeModeFunc = failable(n, i, "nvmlDeviceGetComputeMode", d.GetComputeModeFunc)
		d.GetNvLinkStateFunc = failableWith(n, i, "nvmlDeviceGetNvLinkState", d.GetNvLinkStateFunc)
		d.GetGpuFabricInfoFunc = failable(n, i, "nvmlDeviceGetGpuFabricInfo", d.GetGpuFabricInfoFunc)
		d.GetGpuInstancesFunc = failableWith(n, i, "nvmlDeviceGetGpuInstances", d.GetGpuInstancesFunc)
	}
}

// failable wraps GPU i's mock of call so that a failure FailDiscovery
// injected answers instead, with the zero value (nvml.FEATURE_DISABLED for
// an EnableState).
func failable[T any](n *MockNode, i int, call string, f func() (T, nvml.Return)) func() (T, nvml.Return) {
	return func() (T, nvml.Return) {
		if ret, failed := n.failing(i, call); failed {
			var zero T
			return zero, ret
		}
		return f()
	}
}

// failableWith is failable for a call with an argument.
func failableWith[A, T any](n *MockNode, i int, call string, f func(A) (T, nvml.Return)) func(A) (T, nvml.Return) {
	return func(a A) (T, nvml.Return) {
		if ret, failed := n.failing(i, call); failed {
			var zero T
			return zero, ret
		}
		return f(a)
	}
}
