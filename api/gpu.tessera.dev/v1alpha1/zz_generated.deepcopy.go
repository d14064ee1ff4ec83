// Code written by hand in the style of deepcopy-gen. Keep it in step with types.go:
// TestDeepCopyDoesNotAlias fails when a pointer or slice field is shared between copies.

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtime "k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *GpuConfig) DeepCopyInto(out *GpuConfig) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	if in.Sharing != nil {
		in, out := &in.Sharing, &out.Sharing
		*out = new(SharingConfig)
		(*in).DeepCopyInto(*out)
	}
	if in.Topology != nil {
		in, out := &in.Topology, &out.Topology
		*out = new(TopologyConfig)
		**out = **in
	}
	if in.Lending != nil {
		in, out := &in.Lending, &out.Lending
		*out = new(LendingConfig)
		if (*in).LendWhenIdle != nil {
			lend := *(*in).LendWhenIdle
			(*out).LendWhenIdle = &lend
		}
	}
	if in.Locality != nil {
		in, out := &in.Locality, &out.Locality
		*out = new(LocalityConfig)
		**out = **in
	}
}

// DeepCopy returns a copy of the receiver that shares no memory with it, or nil
// for a nil receiver.
func (in *GpuConfig) DeepCopy() *GpuConfig {
	if in == nil {
		return nil
	}
	out := new(GpuConfig)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *GpuConfig) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *SharingConfig) DeepCopyInto(out *SharingConfig) {
	*out = *in
	if in.ComputeLimit != nil {
		in, out := &in.ComputeLimit, &out.ComputeLimit
		*out = new(int32)
		**out = **in
	}
	if in.MemoryLimit != nil {
		in, out := &in.MemoryLimit, &out.MemoryLimit
		x := (*in).DeepCopy()
		*out = &x
	}
	if in.AllowedIsolations != nil {
		in, out := &in.AllowedIsolations, &out.AllowedIsolations
		*out = make([]Isolation, len(*in))
		copy(*out, *in)
	}
}

// DeepCopy returns a copy of the receiver that shares no memory with it, or nil
// for a nil receiver.
func (in *SharingConfig) DeepCopy() *SharingConfig {
	if in == nil {
		return nil
	}
	out := new(SharingConfig)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *TopologyConfig) DeepCopyInto(out *TopologyConfig) {
	*out = *in
}

// DeepCopy returns a copy of the receiver, or nil for a nil receiver.
func (in *TopologyConfig) DeepCopy() *TopologyConfig {
	if in == nil {
		return nil
	}
	out := new(TopologyConfig)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *GPUBudget) DeepCopyInto(out *GPUBudget) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

// DeepCopy returns a copy of the receiver that shares no memory with it, or nil
// for a nil receiver.
func (in *GPUBudget) DeepCopy() *GPUBudget {
	if in == nil {
		return nil
	}
	out := new(GPUBudget)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *GPUBudget) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *GPUBudgetList) DeepCopyInto(out *GPUBudgetList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		in, out := &in.Items, &out.Items
		*out = make([]GPUBudget, len(*in))
		for i := range *in {
			(*in)[i].DeepCopyInto(&(*out)[i])
		}
	}
}

// DeepCopy returns a copy of the receiver, or nil for a nil receiver.
func (in *GPUBudgetList) DeepCopy() *GPUBudgetList {
	if in == nil {
		return nil
	}
	out := new(GPUBudgetList)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *GPUBudgetList) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *GPUBudgetSpec) DeepCopyInto(out *GPUBudgetSpec) {
	*out = *in
	in.Hard.DeepCopyInto(&out.Hard)
	if in.ClassSizes != nil {
		in, out := &in.ClassSizes, &out.ClassSizes
		*out = make([]ClassSize, len(*in))
		for i := range *in {
			(*in)[i].DeepCopyInto(&(*out)[i])
		}
	}
}

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *ClassSize) DeepCopyInto(out *ClassSize) {
	*out = *in
	out.Memory = in.Memory.DeepCopy()
	if in.Cores != nil {
		v := *in.Cores
		out.Cores = &v
	}
}

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *BudgetLimits) DeepCopyInto(out *BudgetLimits) {
	*out = *in
	if in.Memory != nil {
		q := in.Memory.DeepCopy()
		out.Memory = &q
	}
	if in.Cores != nil {
		v := *in.Cores
		out.Cores = &v
	}
	if in.GPUs != nil {
		v := *in.GPUs
		out.GPUs = &v
	}
}

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *BudgetAmount) DeepCopyInto(out *BudgetAmount) {
	*out = *in
	out.Memory = in.Memory.DeepCopy()
}

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *GPUBudgetStatus) DeepCopyInto(out *GPUBudgetStatus) {
	*out = *in
	in.Used.DeepCopyInto(&out.Used)
	if in.Pending != nil {
		in, out := &in.Pending, &out.Pending
		*out = make([]PendingCharge, len(*in))
		for i := range *in {
			(*in)[i].DeepCopyInto(&(*out)[i])
		}
	}
	if in.LastReconciled != nil {
		out.LastReconciled = in.LastReconciled.DeepCopy()
	}
	if in.ClassSizes != nil {
		in, out := &in.ClassSizes, &out.ClassSizes
		*out = make([]ClassSize, len(*in))
		for i := range *in {
			(*in)[i].DeepCopyInto(&(*out)[i])
		}
	}
	if in.Conditions != nil {
		in, out := &in.Conditions, &out.Conditions
		*out = make([]metav1.Condition, len(*in))
		for i := range *in {
			(*in)[i].DeepCopyInto(&(*out)[i])
		}
	}
}

// DeepCopyInto copies the receiver into out. in must be non-nil.
func (in *PendingCharge) DeepCopyInto(out *PendingCharge) {
	*out = *in
	in.Charge.DeepCopyInto(&out.Charge)
	in.Expires.DeepCopyInto(&out.Expires)
	if in.ConfirmBy != nil {
		out.ConfirmBy = in.ConfirmBy.DeepCopy()
	}
}
