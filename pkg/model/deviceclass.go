package model

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// DeviceClass names and the extended resource of whole GPUs.
const (
	// WholeClassName selects whole GPUs (devices gpu-N).
	WholeClassName = modelnames.WholeClassName
	// SharedClassName selects the shared devices (gpu-N-shared); claims from it
	// ask for capacity.requests {memory, cores}.
	SharedClassName = modelnames.SharedClassName
	// LentClassName selects the lending devices (gpu-N-lent): borrowers of
	// idle GPUs, evicted when the GPU's owner needs it.
	LentClassName = modelnames.LentClassName
	// MIGClassName selects MIG devices (type "mig"), static and dynamic;
	// claims from it select a profile with
	// device.attributes["gpu.tessera.dev"].profile.
	MIGClassName = modelnames.MIGClassName
	// ExtendedResourceName lets pods ask for whole GPUs as
	// resources.limits["tessera.dev/gpu"]; the scheduler turns that into a claim of
	// WholeClassName.
	ExtendedResourceName = "tessera.dev/gpu"
)

// typeSelector is the CEL selector of the devices of this driver with this type.
func typeSelector(typ string) string {
	return fmt.Sprintf("device.driver == %q && device.attributes[%q].%s == %q", DriverName, DriverName, AttrType, typ)
}

// DeviceClasses returns the DeviceClasses Tessera installs, in a fixed order
// (whole, shared, lent, mig), with apiVersion and kind set so they marshal into
// manifests as they are. deployments/deviceclasses.yaml is these objects, and a
// test keeps it so. Each call returns new objects the caller may modify.
func DeviceClasses() []resourceapi.DeviceClass {
	typeMeta := metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"}
	return []resourceapi.DeviceClass{
		{
			TypeMeta:   typeMeta,
			ObjectMeta: metav1.ObjectMeta{Name: WholeClassName},
			Spec: resourceapi.DeviceClassSpec{
				Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: typeSelector(TypeWhole)}}},
				ExtendedResourceName: ptr.To(ExtendedResourceName),
			},
		},
		{
			TypeMeta:   typeMeta,
			ObjectMeta: metav1.ObjectMeta{Name: SharedClassName},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: typeSelector(TypeShared)}}},
			},
		},
		{
			TypeMeta:   typeMeta,
			ObjectMeta: metav1.ObjectMeta{Name: LentClassName},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: typeSelector(TypeLent)}}},
			},
		},
		{
			TypeMeta:   typeMeta,
			ObjectMeta: metav1.ObjectMeta{Name: MIGClassName},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: typeSelector(TypeMIG)}}},
			},
		},
	}
}
