package model

import (
	"fmt"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// minIndexWidth is the least number of hex digits of the index that starts the
// name of every ResourceSlice the resourceslice controller creates.
const minIndexWidth = 5

// ResourceSlices returns the ResourceSlice objects that the resourceslice
// controller of k8s.io/dynamic-resource-allocation creates, on its first sync, for
// res when the kubelet plugin of node nodeName publishes it (owner: that Node):
//
//   - apiVersion resource.k8s.io/v1, kind ResourceSlice;
//   - metadata.generateName "<index>-gpu.tessera.dev-<node>-", the index in hex,
//     zero-padded to at least 5 digits; the API server appends a random suffix, so
//     metadata.name is empty, and sorting the created slices by name keeps the order
//     of res (the allocator's preference). Owner references are left out: they need
//     the Node's UID;
//   - spec.driver, spec.nodeName = nodeName for every slice (counter slices too),
//     spec.pool {name, generation, resourceSliceCount}, devices / sharedCounters as
//     in res; generation is the pool's Generation, or 1 where that is 0 (what the
//     controller starts a new pool with).
//
// Pools come in name order, slices in their order within the pool. The objects
// share no memory with res. It returns an error, naming the pool, if the pool
// sets NodeSelector or AllNodes, which a node-owned publisher cannot have.
func ResourceSlices(nodeName string, res resourceslice.DriverResources) ([]resourceapi.ResourceSlice, error) {
	poolNames := make([]string, 0, len(res.Pools))
	for name := range res.Pools {
		poolNames = append(poolNames, name)
	}
	slices.Sort(poolNames)

	var out []resourceapi.ResourceSlice
	for _, poolName := range poolNames {
		pool := res.Pools[poolName]
		if pool.NodeSelector != nil || pool.AllNodes {
			return nil, fmt.Errorf("pool %q: node %s publishes node-local pools only, not a pool with nodeSelector or allNodes", poolName, nodeName)
		}
		generation := pool.Generation
		if generation == 0 {
			generation = 1
		}
		width := max(minIndexWidth, len(strconv.FormatInt(int64(len(pool.Slices)-1), 16)))
		for i, s := range pool.Slices {
			s := s.DeepCopy()
			out = append(out, resourceapi.ResourceSlice{
				TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
				ObjectMeta: metav1.ObjectMeta{
					GenerateName: fmt.Sprintf("%0*x-%s-%s-", width, i, DriverName, nodeName),
				},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:   DriverName,
					NodeName: ptr.To(nodeName),
					Pool: resourceapi.ResourcePool{
						Name:               poolName,
						Generation:         generation,
						ResourceSliceCount: int64(len(pool.Slices)),
					},
					Devices:                s.Devices,
					SharedCounters:         s.SharedCounters,
					PerDeviceNodeSelection: s.PerDeviceNodeSelection,
					PartitionTypeAttribute: s.PartitionTypeAttribute,
					SkipNodeOperations:     s.SkipNodeOperations,
				},
			})
		}
	}
	return out, nil
}
