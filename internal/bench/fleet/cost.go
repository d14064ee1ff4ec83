package fleet

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/model"
)

// CostKind is one (model, claim) pair whose scheduling cost is measured.
type CostKind string

const (
	CostWhole         CostKind = "whole"          // (a): whole-GPU claim, whole-only slices
	CostPartition     CostKind = "partition"      // (b): 1/8 partition claim
	CostTesseraWhole  CostKind = "tessera-whole"  // (c): gpu.tessera.dev claim on Tessera's slices
	CostTesseraShared CostKind = "tessera-shared" // (c): 1/8 share {memory: 10194Mi, cores: 12}
)

// AllCostKinds is the report order.
var AllCostKinds = []CostKind{CostWhole, CostPartition, CostTesseraWhole, CostTesseraShared}

// CostScenario is one scheduling decision: a cluster of identical hgx-h100 nodes,
// each already holding Shares allocations of 1/8 GPU, and one new claim evaluated
// on one node, the way kube-scheduler's Filter calls Allocate per node.
//
// Existing allocations per node: for the share and partition kinds, Shares eighths
// packed from GPU 0 up (at most 64); for CostWhole, Shares/8 whole GPUs (at most 7,
// so one stays free). The state is cluster-wide, as the scheduler's is.
type CostScenario struct {
	Kind          CostKind
	Nodes, Shares int

	slices  []*resourceapi.ResourceSlice
	classes model.ClassLister
	cel     *cel.Cache
	state   structured.AllocatedState
	node    *v1.Node
	claim   *resourceapi.ResourceClaim
}

// NewCostScenario builds the cluster.
func NewCostScenario(kind CostKind, nodes, shares int) (*CostScenario, error) {
	if nodes < 1 || shares < 0 || shares > 64 {
		return nil, fmt.Errorf("cost scenario: want nodes >= 1 and 0 <= shares <= 64, got %d, %d", nodes, shares)
	}
	var m deviceModel
	var claimJob = &Job{ID: 0, Memory: 0.125, Cores: 0.125, Demand: 0.125}
	switch kind {
	case CostWhole:
		m = wholeModel{}
	case CostPartition:
		m = partitionModel{}
	case CostTesseraWhole, CostTesseraShared:
		m = tesseraModel{}
	default:
		return nil, fmt.Errorf("cost scenario: unknown kind %q", kind)
	}
	s := &CostScenario{Kind: kind, Nodes: nodes, Shares: shares, classes: newClassLister(m.classes()), cel: newCELCache(), state: model.NewAllocatedState()}
	// An eighth of the GPU in whole MiB (81089Mi/8 rounded down) and 12 cores, so
	// that eight fit on one GPU.
	eighth := map[resourceapi.QualifiedName]resource.Quantity{
		"memory": *resource.NewQuantity(gpuMemory.Value()/8>>20<<20, resource.BinarySI),
		"cores":  resource.MustParse("12"),
	}
	for i := range nodes {
		name := fmt.Sprintf("node-%03d", i)
		sl, err := m.slices(name, HGXFleet(1).Nodes[0])
		if err != nil {
			return nil, err
		}
		s.slices = append(s.slices, sl...)
		var results []resourceapi.DeviceRequestAllocationResult
		for k := range shares {
			g := k / GPUsPerNode
			switch kind {
			case CostWhole:
				if k%GPUsPerNode == 0 && g < GPUsPerNode-1 && k+GPUsPerNode <= shares {
					results = append(results, resourceapi.DeviceRequestAllocationResult{Driver: Driver, Pool: name, Device: model.WholeDeviceName(g)})
				}
			case CostPartition:
				results = append(results, resourceapi.DeviceRequestAllocationResult{Driver: Driver, Pool: name, Device: partitionDeviceName(g, 1, k%8)})
			default:
				id := types.UID(fmt.Sprintf("share-%s-%d", name, k))
				results = append(results, resourceapi.DeviceRequestAllocationResult{
					Driver: Driver, Pool: name, Device: model.SharedDeviceName(g), ShareID: &id, ConsumedCapacity: eighth,
				})
			}
		}
		commit(s.state, results)
		s.node = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	switch kind {
	case CostWhole, CostTesseraWhole:
		s.claim = claimFor(claimJob, WholeClass, 1, nil)
	case CostPartition:
		c, err := m.claim(claimJob)
		if err != nil {
			return nil, err
		}
		s.claim = c
	case CostTesseraShared:
		s.claim = claimFor(claimJob, SharedClass, 1, eighth)
	}
	return s, nil
}

// NewAllocator is the per-pod part of the scheduler's work (PreFilter).
func (s *CostScenario) NewAllocator(ctx context.Context) (structured.Allocator, error) {
	return structured.NewAllocator(ctx, model.SchedulerFeatures, s.state, s.classes, s.slices, s.cel)
}

// AllocateOnce is the per-node part (Filter) on the last node with a fresh allocator.
// It reports whether the claim fits.
func (s *CostScenario) AllocateOnce(ctx context.Context, a structured.Allocator) (bool, error) {
	res, err := a.Allocate(ctx, s.node, []*resourceapi.ResourceClaim{s.claim})
	return len(res) == 1, err
}

// Cost is one measured scenario.
type Cost struct {
	Kind          CostKind
	Nodes, Shares int
	// Allocate is the time of one Allocate call on one node (fresh allocator).
	Allocate time.Duration
	// NewAllocator is the time to build the allocator over the whole cluster.
	NewAllocator time.Duration
	// Fits says whether the claim fits on the node.
	Fits bool
}

// MeasureCost times the scenario until at least minTime has passed (wall clock:
// this is the one place the package measures real time).
func MeasureCost(ctx context.Context, kind CostKind, nodes, shares int, minTime time.Duration) (Cost, error) {
	s, err := NewCostScenario(kind, nodes, shares)
	if err != nil {
		return Cost{}, err
	}
	c := Cost{Kind: kind, Nodes: nodes, Shares: shares}
	var n int
	var tNew, tAlloc time.Duration
	for n == 0 || tNew+tAlloc < minTime {
		t0 := time.Now()
		a, err := s.NewAllocator(ctx)
		if err != nil {
			return c, err
		}
		t1 := time.Now()
		fits, err := s.AllocateOnce(ctx, a)
		if err != nil {
			return c, err
		}
		t2 := time.Now()
		tNew += t1.Sub(t0)
		tAlloc += t2.Sub(t1)
		c.Fits = fits
		n++
	}
	c.NewAllocator, c.Allocate = tNew/time.Duration(n), tAlloc/time.Duration(n)
	return c, nil
}
