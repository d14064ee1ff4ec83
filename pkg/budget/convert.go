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

// limits converts spec.hard.
func limits(h configapi.BudgetLimits) Limits {
	var l Limits
	if h.Memory != nil {
		v, ok := h.Memory.AsInt64()
		if !ok {
			v = h.Memory.Value()
		}
		l.Memory = &v
	}
	l.Cores, l.GPUs = h.Cores, h.GPUs
	return l
}

// amount converts a BudgetAmount.
func amount(a configapi.BudgetAmount) Amount {
	m, ok := a.Memory.AsInt64()
	if !ok {
		m = a.Memory.Value()
	}
	return Amount{Memory: m, Cores: a.Cores, GPUs: a.GPUs}
}

// apiAmount converts an Amount.
func apiAmount(a Amount) configapi.BudgetAmount {
	out := configapi.BudgetAmount{Cores: a.Cores, GPUs: a.GPUs}
	out.Memory = *resourceQuantity(a.Memory)
	return out
}
