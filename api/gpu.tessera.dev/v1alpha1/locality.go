package v1alpha1

// The conditions of locality verdicts (GpuConfig locality, docs/locality.md).
// Shared devices published with the locality binding conditions
// (pkg/model.WithLocalityVerdicts) make the scheduler wait, before a pod
// binds, until the claim's status.devices entry of each such share has
// LocalityAcceptedCondition True; LocalityRejectedCondition True instead
// fails the binding, and the scheduler deallocates the claim and allocates it
// again. The locality controller (pkg/locality) writes both.
const (
	// LocalityAcceptedCondition is True once the locality controller has
	// checked the share against every share it accepted before on the GPU.
	LocalityAcceptedCondition = GroupName + "/LocalityAccepted"
	// LocalityRejectedCondition is True when the share would break a
	// locality rule on its GPU; its reason names the rule (Affinity,
	// AntiAffinity, Exclusion, or InvalidConfig for a GpuConfig that does
	// not decode) and its message the share in the way.
	LocalityRejectedCondition = GroupName + "/LocalityRejected"
)
