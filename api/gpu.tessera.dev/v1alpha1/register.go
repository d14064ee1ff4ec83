package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
)

var (
	// SchemeBuilder registers the types of this API version with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds GpuConfig under gpu.tessera.dev/v1alpha1 to a scheme. It
	// registers no defaulting or conversion functions: callers default with
	// (*GpuConfig).Default explicitly.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &GpuConfig{})
	return nil
}
