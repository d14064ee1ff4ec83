package model

import configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

// The binding conditions of shared devices published WithLocalityVerdicts
// (defined in the API package, which the locality controller imports
// without this package's NVML dependency).
const (
	LocalityAcceptedCondition = configapi.LocalityAcceptedCondition
	LocalityRejectedCondition = configapi.LocalityRejectedCondition
)

// WithLocalityVerdicts puts LocalityAcceptedCondition (binding condition)
// and LocalityRejectedCondition (binding failure condition) on every
// gpu-N-shared device. Every share of such a device then waits, between
// allocation and binding, for the locality controller's verdict; without a
// controller it waits until the scheduler's binding timeout (10 minutes by
// default) and is allocated again. Whole and lending devices get no
// conditions: a whole GPU is shared with nobody, and borrowers are outside
// the locality rules.
func WithLocalityVerdicts() Option {
	return func(o *options) { o.localityVerdicts = true }
}
