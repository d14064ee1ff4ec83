package budget

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// The slice informer keeps what pricing reads and drops the rest.
func TestSlimSliceKeepsWhatPricingReads(t *testing.T) {
	d := device("gpu-0", modelnames.TypeWhole, "80Gi", 100)
	d.Taints = []resourceapi.DeviceTaint{{Key: "k", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0"}}
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "s", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: resourceapi.ResourceSliceSpec{Driver: modelnames.DriverName, Pool: resourceapi.ResourcePool{Name: "node-a"},
			SharedCounters: []resourceapi.CounterSet{{Name: "gpu-0"}}, Devices: []resourceapi.Device{d}},
	}
	out, err := slimSlice(s)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*resourceapi.ResourceSlice)
	if got.ManagedFields != nil || got.Spec.SharedCounters != nil || got.Spec.Devices[0].Taints != nil || got.Spec.Devices[0].ConsumesCounters != nil {
		t.Errorf("kept what pricing does not read: %+v", got)
	}
	dev := got.Spec.Devices[0]
	if got.Spec.Pool.Name != "node-a" || dev.Name != "gpu-0" || len(dev.Attributes) != 1 || len(dev.Capacity) != 2 {
		t.Errorf("dropped what pricing reads: %+v", got)
	}
}
