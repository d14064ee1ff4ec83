package legacy

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// DeviceClassName is the DeviceClass that serves plain nvidia.com/gpu.
const DeviceClassName = modelnames.NVIDIAGPUClassName

// DeviceClass is Tessera's class of whole GPUs under the extended resource
// nvidia.com/gpu: with it, the scheduler turns a container's
// nvidia.com/gpu: N into a claim for N whole Tessera GPUs (DRA extended
// resources), and ResourceQuotas on requests.nvidia.com/gpu count them. It
// selects what the class gpu.tessera.dev selects. Only one DeviceClass may
// serve nvidia.com/gpu (NVIDIA's DRA driver makes another); nodes whose
// allocatable has nvidia.com/gpu (a device plugin) are served by it instead
// (deployments/deviceclass-nvidia-gpu.yaml is this object, and the chart
// renders it with deviceClasses.nvidiaGPU.create; docs/migration.md).
func DeviceClass() resourceapi.DeviceClass {
	return resourceapi.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: DeviceClassName},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf("device.driver == %q && device.attributes[%q].type == %q", modelnames.DriverName, modelnames.DriverName, "gpu"),
			}}},
			ExtendedResourceName: ptrTo(NvidiaGPU),
		},
	}
}
