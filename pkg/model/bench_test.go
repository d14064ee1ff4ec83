package model

import (
	"context"
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
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
