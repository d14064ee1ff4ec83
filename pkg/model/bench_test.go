package model

import (
	"context"
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// BenchmarkAllocate measures what the scheduler's Filter pays per node for one
// claim on an hgx-h100 node (8 GPUs, 16 devices, 2 slices): one Allocate call
// of an allocator built once per scheduling cycle (PreFilter), with 0, 8 and 32
// shares of {10Gi, 12} already allocated (7 per GPU, so 8 shares span 2 GPUs and
// 32 span 5).
func BenchmarkAllocate(b *testing.B) {
	gpus := discover(b, "hgx-h100")
	for _, existing := range []int{0, 8, 32} {
		n := newTestNode(b, gpus)
		for i := range existing {
			if n.allocate(shareClaim(fmt.Sprintf("existing-%d", i), "10Gi", "12")) == nil {
				b.Fatalf("existing share %d unallocatable", i)
			}
		}
		for _, claim := range []struct {
			kind  string
			claim *resourceapi.ResourceClaim
		}{
			{"shared", shareClaim("new", "20Gi", "25")},
			{"whole", wholeClaim("new", 1)},
		} {
			b.Run(fmt.Sprintf("%s/existing-shares=%d", claim.kind, existing), func(b *testing.B) {
				alloc, err := structured.NewAllocator(context.Background(), SchedulerFeatures, n.state, n.classes, n.slices, n.cel)
				if err != nil {
					b.Fatalf("NewAllocator: %v", err)
				}
				claims := []*resourceapi.ResourceClaim{claim.claim}
				b.ReportAllocs()
				for b.Loop() {
					results, err := alloc.Allocate(context.Background(), n.node, claims)
					if err != nil || len(results) != 1 {
						b.Fatalf("Allocate: %v, %d results", err, len(results))
					}
				}
			})
		}
	}
}

// BenchmarkAllocateMIG is BenchmarkAllocate for one 1g.10gb claim on an
// hgx-h100 node with every GPU published with dynamic MIG (about 25
// placement devices per GPU), beside a whole-GPU claim on the same GPUs
// published as usual, with 0 and 4 GPUs already taken (by their largest
// placement, or whole). mig-1g's taken GPUs publish every placement, as
// before their instances exist; mig-1g-made's publish what the plugin
// republishes once prepare has made them (only the held placement).
func BenchmarkAllocateMIG(b *testing.B) {
	mig := discover(b, "hgx-h100-dynamic-mig")
	var uuids []string
	for _, g := range mig {
		uuids = append(uuids, g.UUID)
	}
	plain := discover(b, "hgx-h100")
	for _, taken := range []int{0, 4} {
		made := discover(b, "hgx-h100-dynamic-mig")
		held := map[string][]MIGHold{}
		for i := range taken {
			full, _ := fullProfile(made[i].MIG)
			pl := full.Placements[0]
			made[i].MIG.Instances = []gpu.MIGInstance{{ID: 1, ProfileID: full.ID, ProfileName: full.Name, Placement: pl}}
			held[made[i].UUID] = []MIGHold{{ProfileID: full.ID, Placement: pl}}
		}
		for _, c := range []struct {
			kind  string
			node  *testNode
			take  func(i int) *resourceapi.ResourceClaim
			claim *resourceapi.ResourceClaim
		}{
			{"mig-1g", newTestNode(b, mig, WithDynamicMIG(uuids...)),
				func(i int) *resourceapi.ResourceClaim { return migClaim(fmt.Sprintf("taken-%d", i), "7g.80gb") },
				migClaim("new", "1g.10gb")},
			{"mig-1g-made", newTestNode(b, made, WithDynamicMIG(uuids...), WithMIGHeld(held)),
				func(i int) *resourceapi.ResourceClaim { return migClaim(fmt.Sprintf("taken-%d", i), "7g.80gb") },
				migClaim("new", "1g.10gb")},
			{"whole", newTestNode(b, plain),
				func(i int) *resourceapi.ResourceClaim { return wholeClaim(fmt.Sprintf("taken-%d", i), 1) },
				wholeClaim("new", 1)},
		} {
			for i := range taken {
				if c.node.allocate(c.take(i)) == nil {
					b.Fatalf("%s: taking GPU %d failed", c.kind, i)
				}
			}
			b.Run(fmt.Sprintf("%s/taken=%d", c.kind, taken), func(b *testing.B) {
				alloc, err := structured.NewAllocator(context.Background(), SchedulerFeatures, c.node.state, c.node.classes, c.node.slices, c.node.cel)
				if err != nil {
					b.Fatalf("NewAllocator: %v", err)
				}
				claims := []*resourceapi.ResourceClaim{c.claim}
				b.ReportAllocs()
				for b.Loop() {
					results, err := alloc.Allocate(context.Background(), c.node.node, claims)
					if err != nil || len(results) != 1 {
						b.Fatalf("Allocate: %v, %d results", err, len(results))
					}
				}
			})
		}
	}
}
