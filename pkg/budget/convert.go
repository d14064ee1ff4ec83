package budget

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// The GPUBudget API has no generated clientset: it is read and written as
// unstructured objects (dynamic client, dynamic informers), converted here.

// FromUnstructured converts an object of the dynamic client to a GPUBudget.
func FromUnstructured(obj any) (*configapi.GPUBudget, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("GPUBudget: got %T, want *unstructured.Unstructured", obj)
	}
	var b configapi.GPUBudget
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &b); err != nil {
		return nil, fmt.Errorf("GPUBudget %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &b, nil
}

// ToUnstructured converts a GPUBudget for the dynamic client.
func ToUnstructured(b *configapi.GPUBudget) (*unstructured.Unstructured, error) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(b)
	if err != nil {
		return nil, fmt.Errorf("GPUBudget %s/%s: %w", b.Namespace, b.Name, err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(configapi.SchemeGroupVersion.String())
	u.SetKind(configapi.GPUBudgetKind)
	return u, nil
}

// limits converts spec.hard. A memory beyond int64 saturates to
// math.MaxInt64 bytes (Quantity.Value of such a quantity is not it, 1e30
// reads as 0, which would refuse every claim); negative reads as 0.
func limits(h configapi.BudgetLimits) Limits {
	var l Limits
	if h.Memory != nil {
		v := max(quantityValue(*h.Memory), 0)
		l.Memory = &v
	}
	l.Cores, l.GPUs = h.Cores, h.GPUs
	return l
}

// amount converts a BudgetAmount; memory saturates as in limits.
func amount(a configapi.BudgetAmount) Amount {
	return Amount{Memory: max(quantityValue(a.Memory), 0), Cores: a.Cores, GPUs: a.GPUs}
}

// apiAmount converts an Amount.
func apiAmount(a Amount) configapi.BudgetAmount {
	out := configapi.BudgetAmount{Cores: a.Cores, GPUs: a.GPUs}
	out.Memory = *resourceQuantity(a.Memory)
	return out
}
