package v1alpha1

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

func TestShareLimits(t *testing.T) {
	const gi = int64(1) << 30
	sharing := func(computeLimit *int32, memoryLimit string) *GpuConfig {
		c := &GpuConfig{Sharing: &SharingConfig{ComputeLimit: computeLimit}}
		if memoryLimit != "" {
			c.Sharing.MemoryLimit = ptr.To(resource.MustParse(memoryLimit))
		}
		return c
	}
	tests := []struct {
		name                          string
		config                        *GpuConfig
		consumedMemory, consumedCores int64
		wantMemory, wantCores         int64
		wantErr                       string
	}{
		{
			name:   "no limits: the allocation is the limit",
			config: sharing(nil, ""), consumedMemory: 20 * gi, consumedCores: 25,
			wantMemory: 20 * gi, wantCores: 25,
		},
		{
			name:   "no cores allocated: may use the whole GPU",
			config: sharing(nil, ""), consumedMemory: 20 * gi, consumedCores: 0,
			wantMemory: 20 * gi, wantCores: 100,
		},
		{
			name:   "computeLimit above the guarantee: burst up to it",
			config: sharing(ptr.To[int32](60), ""), consumedMemory: 20 * gi, consumedCores: 30,
			wantMemory: 20 * gi, wantCores: 60,
		},
		{
			name:   "computeLimit equal to the guarantee",
			config: sharing(ptr.To[int32](25), ""), consumedMemory: 20 * gi, consumedCores: 25,
			wantMemory: 20 * gi, wantCores: 25,
		},
		{
			name:   "computeLimit with no cores allocated",
			config: sharing(ptr.To[int32](10), ""), consumedMemory: gi, consumedCores: 0,
			wantMemory: gi, wantCores: 10,
		},
		{
			name:   "computeLimit below the guarantee",
			config: sharing(ptr.To[int32](20), ""), consumedMemory: 20 * gi, consumedCores: 25,
			wantErr: "sharing.computeLimit 20 is below the 25 cores the share was allocated; the limit must be at least the guarantee",
		},
		{
			name:   "memoryLimit below the allocation",
			config: sharing(nil, "16Gi"), consumedMemory: 20 * gi, consumedCores: 25,
			wantMemory: 16 * gi, wantCores: 25,
		},
		{
			name:   "memoryLimit equal to the allocation",
			config: sharing(nil, "20Gi"), consumedMemory: 20 * gi, consumedCores: 25,
			wantMemory: 20 * gi, wantCores: 25,
		},
		{
			name:   "memoryLimit above the allocation",
			config: sharing(nil, "32Gi"), consumedMemory: 16 * gi, consumedCores: 25,
			wantErr: "sharing.memoryLimit 32Gi is above the 16Gi of memory the share was allocated; memory cannot be overcommitted",
		},
		{
			name:   "memoryLimit above an allocation that is not a round number",
			config: sharing(nil, "2G"), consumedMemory: 1_500_000_000, consumedCores: 0,
			wantErr: "sharing.memoryLimit 2G is above the 1500000000 of memory the share was allocated; memory cannot be overcommitted",
		},
		{
			name:   "nil config",
			config: nil, consumedMemory: gi, consumedCores: 5,
			wantMemory: gi, wantCores: 5,
		},
		{
			name:   "defaulted config without limits",
			config: func() *GpuConfig { c := &GpuConfig{}; c.Default(); return c }(), consumedMemory: gi, consumedCores: 0,
			wantMemory: gi, wantCores: 100,
		},
		{
			name:   "invalid config",
			config: sharing(ptr.To[int32](0), ""), consumedMemory: gi, consumedCores: 0,
			wantErr: "sharing.computeLimit: Invalid value: 0: must be between 1 and 100",
		},
		{
			name:   "negative memory",
			config: sharing(nil, ""), consumedMemory: -1, consumedCores: 0,
			wantErr: "the share was allocated -1 bytes of memory; that cannot be negative",
		},
		{
			name:   "more cores than a GPU has",
			config: sharing(nil, ""), consumedMemory: gi, consumedCores: 101,
			wantErr: "the share was allocated 101 cores; that must be between 0 and 100",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			memory, cores, err := tc.config.ShareLimits(tc.consumedMemory, tc.consumedCores)
			if checkError(t, err, tc.wantErr, fmt.Sprintf("limits of %d bytes, %d cores", memory, cores)) {
				return
			}
			if memory != tc.wantMemory || cores != tc.wantCores {
				t.Errorf("got %d bytes, %d cores; want %d bytes, %d cores", memory, cores, tc.wantMemory, tc.wantCores)
			}
		})
	}
}
