package v1alpha1_test

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

func ExampleDecodeStrict() {
	_, err := v1alpha1.DecodeStrict([]byte(`
apiVersion: gpu.tessera.dev/v1alpha1
kind: GpuConfig
sharing:
  isolaton: MPS
`))
	fmt.Println(err)

	config, err := v1alpha1.DecodeStrict([]byte(`
apiVersion: gpu.tessera.dev/v1alpha1
kind: GpuConfig
sharing:
  computeLimit: 0
`))
	if err != nil {
		panic(err)
	}
	fmt.Println(config.Validate().ToAggregate())
	// Output:
	// invalid GpuConfig: sharing.isolaton: unknown field
	// sharing.computeLimit: Invalid value: 0: must be between 1 and 100
}

func ExampleConfigForRequest() {
	param := func(s string) *resourceapi.OpaqueDeviceConfiguration {
		return &resourceapi.OpaqueDeviceConfiguration{Driver: "gpu.tessera.dev", Parameters: runtime.RawExtension{Raw: []byte(s)}}
	}
	// What the scheduler copied into status.allocation.devices.config: the
	// class asks for MPS, the claim raises the compute limit of request "gpus".
	configs := []resourceapi.DeviceAllocationConfiguration{
		{
			Source:              resourceapi.AllocationConfigSourceClass,
			Requests:            []string{"gpus"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: param(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS"}}`)},
		},
		{
			Source:              resourceapi.AllocationConfigSourceClaim,
			Requests:            []string{"gpus"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: param(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"computeLimit":60}}`)},
		},
	}
	config, err := v1alpha1.ConfigForRequest(configs, "gpus")
	if err != nil {
		panic(err)
	}
	// The share was allocated 20Gi and 25 cores: it may burst to 60%.
	memory, cores, err := config.ShareLimits(20<<30, 25)
	if err != nil {
		panic(err)
	}
	fmt.Println(config.Sharing.Isolation, memory>>30, cores, config.Topology.NVLink)
	// Output: MPS 20 60 Ignore
}
