package v1alpha1

// Default fills what can be defaulted without knowing the allocation, in place:
// apiVersion and kind, sharing.isolation (Advisory) and topology.nvlink (Ignore).
// Lending stays nil when unset: LendsWhenIdle reads it as false.
// It allocates Sharing and Topology when they are nil, so that a defaulted config
// has both sections and readers need no nil checks on them.
//
// sharing.computeLimit and sharing.memoryLimit stay nil when unset: their
// defaults depend on the capacity the share was allocated (see ShareLimits).
// Default never overwrites a set field, is idempotent, and does nothing on a nil
// receiver.
func (c *GpuConfig) Default() {
	if c == nil {
		return
	}
	if c.APIVersion == "" {
		c.APIVersion = SchemeGroupVersion.String()
	}
	if c.Kind == "" {
		c.Kind = GpuConfigKind
	}
	if c.Sharing == nil {
		c.Sharing = &SharingConfig{}
	}
	if c.Sharing.Isolation == "" {
		c.Sharing.Isolation = IsolationAdvisory
	}
	if c.Topology == nil {
		c.Topology = &TopologyConfig{}
	}
	if c.Topology.NVLink == "" {
		c.Topology.NVLink = NVLinkIgnore
	}
}

// LendsWhenIdle reports whether the config lends its GPUs while idle.
func (c *GpuConfig) LendsWhenIdle() bool {
	return c != nil && c.Lending != nil && c.Lending.LendWhenIdle != nil && *c.Lending.LendWhenIdle
}
