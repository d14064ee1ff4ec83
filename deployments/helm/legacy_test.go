package helm

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/legacy"
)

// TestNvidiaGPUClass: the class serving nvidia.com/gpu is opt-in (one
// class serves the name cluster-wide), and when on it is
// pkg/legacy.DeviceClass(), which pkg/legacy's translation relies on.
func TestNvidiaGPUClass(t *testing.T) {
	for _, tc := range cases {
		for _, o := range objects(t, render(t, valueArgs(tc.values)...)) {
			if o.GetKind() == "DeviceClass" && o.GetName() == legacy.DeviceClassName {
				t.Errorf("%s: %s rendered without deviceClasses.nvidiaGPU.create", tc.name, legacy.DeviceClassName)
			}
		}
	}
	want := legacy.DeviceClass()
	got := find[resourceapi.DeviceClass](t, objects(t, render(t, "--set", "deviceClasses.nvidiaGPU.create=true")), "DeviceClass", want.Name)
	if diff := cmp.Diff(want.Spec, got.Spec); diff != "" {
		t.Errorf("DeviceClass %s (-pkg/legacy +chart):\n%s", want.Name, diff)
	}
}
