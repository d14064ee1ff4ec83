package model

// The tests in this file feed what Resources publishes and what DeviceClasses
// installs into kube-scheduler's own allocator (structured.NewAllocator), the way
// the 1.37 scheduler's DynamicResources plugin does, so they show what users get
// from the published model: where shares land, what excludes what, what NVLink
// constraints and firstAvailable do, and which requests are refused.

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// testNode is one node as the scheduler sees it: its published ResourceSlices and
// the allocated state gathered from the claims allocated on it.
type testNode struct {
	t       testing.TB
	node    *v1.Node
	slices  []*resourceapi.ResourceSlice
	classes ClassLister
	cel     *cel.Cache
	state   structured.AllocatedState
	// claims holds the allocated claims by name, with status.allocation set.
	claims map[string]*resourceapi.ResourceClaim
}

// newTestNode publishes gpus as node "node-1" would (Resources, then the objects
// the resourceslice controller creates, named as the API server would name them).
func newTestNode(t testing.TB, gpus []gpu.GPU, opts ...Option) *testNode {
	t.Helper()
	const nodeName = "node-1"
	res, err := Resources(nodeName, gpus, opts...)
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}
	if err := Validate(res); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	objs, err := ResourceSlices(nodeName, res)
	if err != nil {
		t.Fatalf("ResourceSlices: %v", err)
	}
	n := &testNode{
		t:       t,
		node:    &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-1-uid"}},
		classes: NewClassLister(DeviceClasses()),
		cel:     cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}),
		state:   NewAllocatedState(),
		claims:  map[string]*resourceapi.ResourceClaim{},
	}
	for i := range objs {
		s := &objs[i]
		s.Name = s.GenerateName + "abcde" // the API server's random suffix
		s.UID = types.UID(fmt.Sprintf("slice-%d", i))
		n.slices = append(n.slices, s)
	}
	return n
}

// tryAllocate runs the allocator for one pending claim on this node, as the
// scheduler's Filter does. It returns nil, nil when the claim does not fit.
func (n *testNode) tryAllocate(claim *resourceapi.ResourceClaim) (*resourceapi.AllocationResult, error) {
	alloc, err := structured.NewAllocator(context.Background(), SchedulerFeatures, n.state, n.classes, n.slices, n.cel)
	if err != nil {
		return nil, fmt.Errorf("NewAllocator: %w", err)
	}
	results, err := alloc.Allocate(context.Background(), n.node, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		return nil, err
	}
	if len(results) == 0 {
		return nil, nil
	}
	return &results[0], nil
}

// allocate is tryAllocate that fails the test on an allocator error and, on
// success, records the claim as allocated (Reserve + the claim informer).
func (n *testNode) allocate(claim *resourceapi.ResourceClaim) *resourceapi.AllocationResult {
	n.t.Helper()
	result, err := n.tryAllocate(claim)
	if err != nil {
		n.t.Fatalf("claim %s: Allocate: %v", claim.Name, err)
	}
	if result != nil {
		claim = claim.DeepCopy()
		claim.Status.Allocation = result
		n.add(claim)
	}
	return result
}

// add records an allocated claim in the allocated state exactly as the
// scheduler's allocatedDevices tracker does (foreachAllocatedDevice with
// DRAConsumableCapacity on): results with adminAccess are ignored, results with a
// shareID go to AllocatedSharedDeviceIDs and their consumedCapacity to
// AggregatedCapacity, all others to AllocatedDevices.
func (n *testNode) add(claim *resourceapi.ResourceClaim) {
	if _, dup := n.claims[claim.Name]; dup {
		n.t.Fatalf("claim %s allocated twice", claim.Name)
	}
	n.claims[claim.Name] = claim
	forEachAllocated(claim,
		func(id structured.DeviceID) { n.state.AllocatedDevices.Insert(id) },
		func(id structured.SharedDeviceID) { n.state.AllocatedSharedDeviceIDs.Insert(id) },
		func(c structured.DeviceConsumedCapacity) { n.state.AggregatedCapacity.Insert(c) })
}

// release deallocates a claim (claim deleted or status.allocation cleared).
func (n *testNode) release(name string) {
	n.t.Helper()
	claim, ok := n.claims[name]
	if !ok {
		n.t.Fatalf("release: claim %s is not allocated", name)
	}
	delete(n.claims, name)
	forEachAllocated(claim,
		func(id structured.DeviceID) { n.state.AllocatedDevices.Delete(id) },
		func(id structured.SharedDeviceID) { n.state.AllocatedSharedDeviceIDs.Delete(id) },
		func(c structured.DeviceConsumedCapacity) { n.state.AggregatedCapacity.Remove(c) })
}

func forEachAllocated(claim *resourceapi.ResourceClaim, dedicated func(structured.DeviceID),
	shared func(structured.SharedDeviceID), capacity func(structured.DeviceConsumedCapacity)) {
	for _, r := range claim.Status.Allocation.Devices.Results {
		if ptr.Deref(r.AdminAccess, false) {
			continue
		}
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID != nil {
			shared(structured.MakeSharedDeviceID(id, r.ShareID))
			if r.ConsumedCapacity != nil {
				capacity(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			}
			continue
		}
		dedicated(id)
	}
}

// Claims as users write them.

// newClaim builds a claim and applies the API server's defaults (allocationMode
// ExactCount, count 1, for requests and subrequests), since the scheduler only
// ever sees stored, defaulted claims.
func newClaim(name string, requests []resourceapi.DeviceRequest, constraints ...resourceapi.DeviceConstraint) *resourceapi.ResourceClaim {
	for i := range requests {
		if r := requests[i].Exactly; r != nil {
			defaultCount(&r.AllocationMode, &r.Count)
		}
		for j := range requests[i].FirstAvailable {
			sub := &requests[i].FirstAvailable[j]
			defaultCount(&sub.AllocationMode, &sub.Count)
		}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid")},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests:    requests,
			Constraints: constraints,
		}},
	}
}

func defaultCount(mode *resourceapi.DeviceAllocationMode, count *int64) {
	if *mode == "" {
		*mode = resourceapi.DeviceAllocationModeExactCount
	}
	if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
		*count = 1
	}
}

// shareClaim asks for one share: {memory, cores}; empty strings are left out.
func shareClaim(name, memory, cores string, selectors ...string) *resourceapi.ResourceClaim {
	requests := map[resourceapi.QualifiedName]resource.Quantity{}
	if memory != "" {
		requests[Memory] = resource.MustParse(memory)
	}
	if cores != "" {
		requests[Cores] = resource.MustParse(cores)
	}
	return newClaim(name, []resourceapi.DeviceRequest{{
		Name: "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: SharedClassName,
			Selectors:       celSelectors(selectors),
			Capacity:        &resourceapi.CapacityRequirements{Requests: requests},
		},
	}})
}

// wholeClaim asks for count whole GPUs.
func wholeClaim(name string, count int64, selectors ...string) *resourceapi.ResourceClaim {
	return newClaim(name, []resourceapi.DeviceRequest{{
		Name: "gpus",
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: WholeClassName,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           count,
			Selectors:       celSelectors(selectors),
		},
	}})
}

// onMinor is a CEL selector for the GPU with this minor, to steer a claim onto it.
func onMinor(minor int) string {
	return fmt.Sprintf(`device.attributes[%q].minor == %d`, DriverName, minor)
}

func celSelectors(exprs []string) []resourceapi.DeviceSelector {
	var out []resourceapi.DeviceSelector
	for _, e := range exprs {
		out = append(out, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	return out
}

var nvlinkDomain = resourceapi.FullyQualifiedName(DriverName + "/" + string(AttrNVLinkDomain))

// nvlinkPairClaim asks for two whole GPUs in one NVLink domain.
func nvlinkPairClaim(name string) *resourceapi.ResourceClaim {
	c := wholeClaim(name, 2)
	c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: &nvlinkDomain}}
	return c
}

// preferNVLinkClaim asks for two whole GPUs, preferably an NVLink pair: the
// firstAvailable pattern of demo/specs/30-nvlink-pair.yaml.
func preferNVLinkClaim(name string) *resourceapi.ResourceClaim {
	sub := func(name string) resourceapi.DeviceSubRequest {
		return resourceapi.DeviceSubRequest{
			Name: name, DeviceClassName: WholeClassName,
			AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2,
		}
	}
	return newClaim(name,
		[]resourceapi.DeviceRequest{{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{sub("nvlink"), sub("any")}}},
		resourceapi.DeviceConstraint{Requests: []string{"gpus/nvlink"}, MatchAttribute: &nvlinkDomain},
	)
}

// devices are the device names of a result, in result order.
func devices(r *resourceapi.AllocationResult) []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, d := range r.Devices.Results {
		out = append(out, d.Device)
	}
	return out
}
