package budget

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// The fixtures mirror what pkg/model publishes for a mock node (device
// names, type attribute, memory and cores capacity); the sizes are test
// values, not measurements.
func device(name, typ string, memory string, cores int64) resourceapi.Device {
	d := resourceapi.Device{
		Name:       name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{modelnames.AttrType: {StringValue: ptr.To(typ)}},
		Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{},
	}
	if memory != "" {
		d.Capacity[modelnames.Memory] = resourceapi.DeviceCapacity{Value: resource.MustParse(memory)}
	}
	if cores >= 0 {
		d.Capacity[modelnames.Cores] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(cores, resource.DecimalSI)}
	}
	if typ == modelnames.TypeShared || typ == modelnames.TypeLent {
		d.AllowMultipleAllocations = ptr.To(true)
	}
	return d
}

// withPolicy gives d's capacity name a requestPolicy validRange of min and
// step, as pkg/model publishes for the shared device.
func withPolicy(d resourceapi.Device, name resourceapi.QualifiedName, min, step string) resourceapi.Device {
	c := d.Capacity[name]
	c.RequestPolicy = &resourceapi.CapacityRequestPolicy{ValidRange: &resourceapi.CapacityRequestPolicyRange{
		Min: ptr.To(resource.MustParse(min)), Step: ptr.To(resource.MustParse(step))}}
	d.Capacity[name] = c
	return d
}

// twoModels: an 80Gi GPU and a 40Gi GPU, each whole and shared, and a MIG
// device of 10Gi and 14 cores.
func twoModels() []resourceapi.Device {
	return []resourceapi.Device{
		device("gpu-0", modelnames.TypeWhole, "80Gi", 100),
		device("gpu-0-shared", modelnames.TypeShared, "80Gi", 100),
		device("gpu-1", modelnames.TypeWhole, "40Gi", 100),
		device("gpu-1-shared", modelnames.TypeShared, "40Gi", 100),
		device("gpu-2-mig-1g-10gb-6", modelnames.TypeMIG, "10Gi", 14),
	}
}

func typeClass(name, typ string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == %q`, typ)}}}},
	}
}

func classes() map[string]*resourceapi.DeviceClass {
	m := map[string]*resourceapi.DeviceClass{
		modelnames.WholeClassName:     typeClass(modelnames.WholeClassName, modelnames.TypeWhole),
		modelnames.SharedClassName:    typeClass(modelnames.SharedClassName, modelnames.TypeShared),
		modelnames.LentClassName:      typeClass(modelnames.LentClassName, modelnames.TypeLent),
		modelnames.MIGClassName:       typeClass(modelnames.MIGClassName, modelnames.TypeMIG),
		modelnames.NVIDIAGPUClassName: typeClass(modelnames.NVIDIAGPUClassName, modelnames.TypeWhole),
		"other.example.com": {ObjectMeta: metav1.ObjectMeta{Name: "other.example.com"},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.driver == "other.example.com"`}}}}},
		"big.gpu.tessera.dev": {ObjectMeta: metav1.ObjectMeta{Name: "big.gpu.tessera.dev"},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "gpu" && device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("60Gi")) >= 0`}}}}},
	}
	return m
}

func pricer(devices []resourceapi.Device) *Pricer {
	cs := classes()
	return NewPricer(
		func(context.Context) ([]resourceapi.Device, uint64, error) { return devices, 1, nil },
		func(_ context.Context, name string) (*resourceapi.DeviceClass, error) {
			if c, ok := cs[name]; ok {
				return c, nil
			}
			return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}, name)
		})
}

func exact(name, class string, count int64, capacity map[string]string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
	if capacity != nil {
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range capacity {
			r.Exactly.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
		}
	}
	return r
}

func claim(name string, requests ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", UID: types.UID("uid-" + name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests}},
	}
}

func gi(n int64) int64 { return n << 30 }

// fakeBudgets is a dynamic fake client whose GPUBudget status updates are
// compare-and-swap on resourceVersion, as the API server's are, with
// conflicts injectable.
type fakeBudgets struct {
	client *dynamicfake.FakeDynamicClient
	mu     sync.Mutex
	rv     int
	// inject makes the next so many status updates fail with a conflict.
	inject  int
	updates int
}

func newFakeBudgets(t *testing.T, budgets ...*configapi.GPUBudget) *fakeBudgets {
	t.Helper()
	scheme := runtime.NewScheme()
	f := &fakeBudgets{}
	var objs []runtime.Object
	for _, b := range budgets {
		f.rv++
		b.ResourceVersion = strconv.Itoa(f.rv)
		u, err := ToUnstructured(b)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, u)
	}
	f.client = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{configapi.GPUBudgetResourceVersion: "GPUBudgetList"}, objs...)
	f.client.PrependReactor("update", configapi.GPUBudgetResource, func(action k8stesting.Action) (bool, runtime.Object, error) {
		ua := action.(k8stesting.UpdateAction)
		obj := ua.GetObject().(*unstructured.Unstructured).DeepCopy()
		f.mu.Lock()
		defer f.mu.Unlock()
		gr := configapi.GPUBudgetResourceVersion.GroupResource()
		if f.inject > 0 {
			f.inject--
			return true, nil, apierrors.NewConflict(gr, obj.GetName(), fmt.Errorf("injected"))
		}
		cur, err := f.client.Tracker().Get(configapi.GPUBudgetResourceVersion, obj.GetNamespace(), obj.GetName())
		if err != nil {
			return true, nil, err
		}
		if cur.(*unstructured.Unstructured).GetResourceVersion() != obj.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(gr, obj.GetName(), fmt.Errorf("the object has been modified"))
		}
		f.rv++
		f.updates++
		obj.SetResourceVersion(strconv.Itoa(f.rv))
		if err := f.client.Tracker().Update(configapi.GPUBudgetResourceVersion, obj, obj.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, obj.DeepCopy(), nil
	})
	return f
}

func (f *fakeBudgets) get(t *testing.T, name string) *configapi.GPUBudget {
	t.Helper()
	obj, err := f.client.Tracker().Get(configapi.GPUBudgetResourceVersion, "team-a", name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := FromUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func budget(name, class string, memory string, cores, gpus *int64) *configapi.GPUBudget {
	b := &configapi.GPUBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: configapi.SchemeGroupVersion.String(), Kind: configapi.GPUBudgetKind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", UID: types.UID("budget-" + name), Generation: 1},
		Spec:       configapi.GPUBudgetSpec{DeviceClassName: class, Hard: configapi.BudgetLimits{Cores: cores, GPUs: gpus}},
		// Counted by the reconciler for its generation.
		Status: configapi.GPUBudgetStatus{ObservedGeneration: 1},
	}
	if memory != "" {
		b.Spec.Hard.Memory = ptr.To(resource.MustParse(memory))
	}
	return b
}

// confirmAll marks every pending entry of every budget confirmed, as a
// reconciler pass that saw their claims does.
func confirmAll(t *testing.T, f *fakeBudgets) {
	t.Helper()
	list, err := f.client.Tracker().List(configapi.GPUBudgetResourceVersion,
		schema.GroupVersionKind{Group: configapi.GroupName, Version: configapi.Version, Kind: configapi.GPUBudgetKind}, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, item := range list.(*unstructured.UnstructuredList).Items {
		b := f.get(t, item.GetName())
		for i := range b.Status.Pending {
			b.Status.Pending[i].Confirmed = true
		}
		if _, err := NewDynamicStore(f.client, 0).UpdateStatus(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
}
