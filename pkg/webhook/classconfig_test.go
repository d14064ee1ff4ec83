package webhook

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// TestValidateDeviceClaimClassSettings: what a DeviceClass config sets
// applies at prepare to a claim whose own config leaves it unset, so the
// claim is checked with it, also when the claim has no config at all: the
// class's computeLimit and memoryLimit against the share's request, its
// isolation against the one-device rule, its topology.nvlink against the
// claim's constraints. A claim config that sets the field wins over the
// class's. Errors sit at the request's deviceClassName and name the class.
func TestValidateDeviceClaimClassSettings(t *testing.T) {
	classes := DeviceClassMap(map[string]*resourceapi.DeviceClass{
		"mig-mps":    testClass(modelnames.MIGClassName, gpuConfigJSON(`"sharing":{"isolation":"MPS"}`)),
		"shared-mps": testClass(modelnames.SharedClassName, gpuConfigJSON(`"sharing":{"isolation":"MPS"}`)),
	})
	// The classes by the names requests use.
	lookup := func(name string) (*resourceapi.DeviceClass, error) {
		switch name {
		case modelnames.MIGClassName:
			return classes("mig-mps")
		case modelnames.SharedClassName:
			return classes("shared-mps")
		}
		return classes(name)
	}
	tests := []struct {
		name       string
		devices    string
		wantErrors []string
	}{
		{
			name: "class MPS on a claim for two shares, no claim config",
			devices: `
requests:
- name: a
  exactly: {deviceClassName: shared.gpu.tessera.dev, count: 2, capacity: {requests: {memory: 2Gi}}}`,
			wantErrors: []string{`spec.devices.requests[0].exactly.count: Invalid value: 2: request "a" has isolation MPS (sharing.isolation of DeviceClass shared.gpu.tessera.dev's config) ` +
				`and may get 2 GPUs; an MPS claim must be exactly one share (a client talks to one MPS daemon, which serves one GPU), so prepare would refuse the claim`},
		},
		{
			name: "the claim's isolation wins over the class's",
			devices: `
requests:
- name: a
  exactly: {deviceClassName: shared.gpu.tessera.dev, count: 2, capacity: {requests: {memory: 2Gi}}}
config:
- opaque: {driver: gpu.tessera.dev, parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, sharing: {isolation: Advisory}}}`,
		},
		{
			name: "class MPS inside a MIG device beside a whole GPU",
			devices: `
requests:
- name: mig
  exactly: {deviceClassName: mig.gpu.tessera.dev}
- name: whole
  exactly: {deviceClassName: gpu.tessera.dev}`,
			wantErrors: []string{`spec.devices.requests[1]: request "whole" adds a second gpu.tessera.dev device to a claim whose request "mig" has isolation MPS ` +
				`(sharing.isolation of DeviceClass mig.gpu.tessera.dev's config); an MPS claim must be exactly one share, so prepare would refuse the claim ` +
				`(two shares are one GPU only when a matchAttribute gpu.tessera.dev/uuid constraint covers both requests)`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := ValidateDeviceClaimWithClasses(decodeDevices(t, tc.devices), field.NewPath("spec", "devices"), lookup)
			checkErrors(t, errs, tc.wantErrors)
		})
	}
}

// TestValidateDeviceClaimClassLimits: a share class's computeLimit below
// the share's cores, or memoryLimit above its memory, and a whole-GPU
// class's topology.nvlink Required on a claim for two GPUs without a
// constraint, are refused at the request's deviceClassName.
func TestValidateDeviceClaimClassLimits(t *testing.T) {
	classes := DeviceClassMap(map[string]*resourceapi.DeviceClass{
		modelnames.SharedClassName: testClass(modelnames.SharedClassName, gpuConfigJSON(`"sharing":{"computeLimit":20,"memoryLimit":"4Gi"}`)),
		modelnames.WholeClassName:  testClass(modelnames.WholeClassName, gpuConfigJSON(`"topology":{"nvlink":"Required"}`)),
	})
	devices := decodeDevices(t, `
requests:
- name: a
  exactly: {deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 2Gi, cores: "25"}}}
- name: b
  exactly: {deviceClassName: gpu.tessera.dev, count: 2}
config:
- requests: [b]
  opaque: {driver: gpu.tessera.dev, parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, lending: {lendWhenIdle: false}}}`)
	errs, _ := ValidateDeviceClaimWithClasses(devices, field.NewPath("spec", "devices"), classes)
	checkErrors(t, errs, []string{
		`spec.devices.requests[0].exactly.deviceClassName: Invalid value: 20: sharing.computeLimit of DeviceClass shared.gpu.tessera.dev's config is 20, which is below the 25 cores ` +
			`request "a" is allocated (spec.devices.requests[0].exactly.capacity.requests[cores]: 25); the limit must be at least the guarantee, so prepare would refuse the claim`,
		`spec.devices.requests[0].exactly.deviceClassName: Invalid value: "4Gi": sharing.memoryLimit of DeviceClass shared.gpu.tessera.dev's config is 4Gi, which is above the 2Gi of memory ` +
			`request "a" is allocated (spec.devices.requests[0].exactly.capacity.requests[memory]: 2Gi); memory cannot be overcommitted, so prepare would refuse the claim`,
		`spec.devices.requests[1].exactly.deviceClassName: Invalid value: "Required": topology.nvlink of DeviceClass gpu.tessera.dev's config is Required: ` +
			`request "b" (spec.devices.requests[1].exactly) may get 2 GPUs, and no matchAttribute gpu.tessera.dev/nvlinkDomain constraint in spec.devices.constraints covers it; ` +
			`requests "b" and "a" may get different GPUs, and no matchAttribute gpu.tessera.dev/nvlinkDomain constraint in spec.devices.constraints covers both: ` +
			`the scheduler may pick GPUs of different NVLink domains, and prepare then refuses the claim`,
	})
}

// TestValidateDeviceClaimOtherDriver: a claim of another driver's class,
// without configs of this driver, gets neither errors nor warnings, also
// when its class cannot be found.
func TestValidateDeviceClaimOtherDriver(t *testing.T) {
	devices := decodeDevices(t, `
requests:
- name: nic
  exactly: {deviceClassName: nic.example.com}`)
	errs, warnings := ValidateDeviceClaimWithClasses(devices, field.NewPath("spec", "devices"), DeviceClassMap(nil))
	if len(errs) != 0 || len(warnings) != 0 {
		t.Errorf("errors %v, warnings %v; want none", errs, warnings)
	}
}
