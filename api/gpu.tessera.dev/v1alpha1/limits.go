package v1alpha1

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// MaxCores is the compute of one whole GPU in the cores capacity (percent).
const MaxCores = 100

// ShareLimits returns the limits the isolation backend enforces for a share,
// given the capacity the scheduler allocated to it (the device result's
// consumedCapacity: memory in bytes, cores in percent of the GPU). It is pure.
//
// It follows KubeShare's request/limit model: what the share was allocated is
// its guarantee, the config's limits may allow more compute but never more memory.
//
//   - coresLimit is sharing.computeLimit when set; it must be at least
//     consumedCores, since a limit below the guarantee would starve the share of
//     what the scheduler set aside for it. Unset, it is consumedCores, or 100 when
//     the share was allocated no cores (a best-effort share may use the idle GPU).
//   - memoryLimit is sharing.memoryLimit when set; it must be at most
//     consumedMemory, since memory is not overcommitted. Unset, it is
//     consumedMemory.
//
// consumedMemory must not be negative and consumedCores must be between 0 and
// 100. The config is validated first (see Validate); it need not be defaulted. A
// nil receiver or a nil Sharing means no limits were configured. Errors name the
// field, for example "sharing.computeLimit 20 is below the 25 cores the share was
// allocated".
func (c *GpuConfig) ShareLimits(consumedMemory int64, consumedCores int64) (memoryLimit int64, coresLimit int64, err error) {
	if consumedMemory < 0 {
		return 0, 0, fmt.Errorf("the share was allocated %d bytes of memory; that cannot be negative", consumedMemory)
	}
	if consumedCores < 0 || consumedCores > MaxCores {
		return 0, 0, fmt.Errorf("the share was allocated %d cores; that must be between 0 and %d", consumedCores, MaxCores)
	}
	if errs := c.Validate(); len(errs) > 0 {
		return 0, 0, errors.New(joinErrors(errs))
	}
	var sharing SharingConfig
	if c != nil && c.Sharing != nil {
		sharing = *c.Sharing
	}

	coresLimit = consumedCores
	if consumedCores == 0 {
		coresLimit = MaxCores
	}
	if sharing.ComputeLimit != nil {
		limit := int64(*sharing.ComputeLimit)
		if limit < consumedCores {
			return 0, 0, fmt.Errorf("sharing.computeLimit %d is below the %d cores the share was allocated; "+
				"the limit must be at least the guarantee", limit, consumedCores)
		}
		coresLimit = limit
	}

	memoryLimit = consumedMemory
	if sharing.MemoryLimit != nil {
		limit := sharing.MemoryLimit.Value()
		if limit > consumedMemory {
			return 0, 0, fmt.Errorf("sharing.memoryLimit %s is above the %s of memory the share was allocated; "+
				"memory cannot be overcommitted", sharing.MemoryLimit, formatBytes(consumedMemory))
		}
		memoryLimit = limit
	}
	return memoryLimit, coresLimit, nil
}

// formatBytes renders a byte count the way users write it (16Gi), or as plain
// bytes when no binary suffix fits exactly.
func formatBytes(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}
