package v1alpha1

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestLendWhenIdleMerges(t *testing.T) {
	entry := func(source resourceapi.AllocationConfigSource, body string) resourceapi.DeviceAllocationConfiguration {
		return resourceapi.DeviceAllocationConfiguration{Source: source, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: GroupName, Parameters: runtime.RawExtension{
				Raw: []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig",` + body + `}`)}}}}
	}
	classLends := entry(resourceapi.AllocationConfigSourceClass, `"lending":{"lendWhenIdle":true}`)
	for _, tt := range []struct {
		name    string
		configs []resourceapi.DeviceAllocationConfiguration
		want    bool
	}{
		{"unset", nil, false},
		{"class lends", []resourceapi.DeviceAllocationConfiguration{classLends}, true},
		{"claim keeps the class's consent", []resourceapi.DeviceAllocationConfiguration{classLends, entry(resourceapi.AllocationConfigSourceClaim, `"lending":{}`)}, true},
		{"claim refuses", []resourceapi.DeviceAllocationConfiguration{classLends, entry(resourceapi.AllocationConfigSourceClaim, `"lending":{"lendWhenIdle":false}`)}, false},
		{"claim consents", []resourceapi.DeviceAllocationConfiguration{entry(resourceapi.AllocationConfigSourceClaim, `"lending":{"lendWhenIdle":true}`)}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ConfigForRequest(tt.configs, "gpu")
			if err != nil {
				t.Fatal(err)
			}
			if got := c.LendsWhenIdle(); got != tt.want {
				t.Errorf("LendsWhenIdle = %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := ConfigForRequest([]resourceapi.DeviceAllocationConfiguration{entry(resourceapi.AllocationConfigSourceClaim, `"lending":{"lendWhenIdel":true}`)}, "gpu"); err == nil {
		t.Error("a misspelt lending field decodes")
	}
}
