package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GPUBudget is a namespaced object (a CustomResourceDefinition the chart
// installs with budgets.enabled) that caps the GPU memory, compute and whole
// GPUs the ResourceClaims of its namespace may ask for. tessera-webhook
// charges each claim against it at CREATE (pkg/budget) and refuses a claim
// that would take it over spec.hard; a reconciler keeps status.used equal to
// the claims that exist.
//
// It is not part of the opaque GpuConfig scheme (AddToScheme): clients read
// it as unstructured objects through the dynamic client.
type GPUBudget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GPUBudgetSpec   `json:"spec"`
	Status GPUBudgetStatus `json:"status,omitempty"`
}

// GPUBudgetList is a list of GPUBudgets.
type GPUBudgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []GPUBudget `json:"items"`
}

// Names of the GPUBudget resource.
const (
	GPUBudgetKind     = "GPUBudget"
	GPUBudgetResource = "gpubudgets"
	// GPUBudgetResyncAnnotation on a GPUBudget makes every tessera-webhook
	// replica recompute its status at once (whatever the value; change it
	// to ask again).
	GPUBudgetResyncAnnotation = GroupName + "/resync"
)

// GPUBudgetResourceVersion is the GroupVersionResource of GPUBudgets.
var GPUBudgetResourceVersion = schema.GroupVersionResource{Group: GroupName, Version: Version, Resource: GPUBudgetResource}

// GPUBudgetSpec is what an admin sets.
type GPUBudgetSpec struct {
	// Hard is the cap in each dimension; an unset dimension is unlimited.
	Hard BudgetLimits `json:"hard"`
	// DeviceClassName, when set, makes the budget count only requests of
	// that DeviceClass. Unset: every request whose class can select devices
	// of gpu.tessera.dev.
	DeviceClassName string `json:"deviceClassName,omitempty"`
}

// BudgetLimits are optional caps.
type BudgetLimits struct {
	// Memory is GPU memory in bytes: a share counts what it requests, a
	// whole GPU or a MIG device its full memory.
	Memory *resource.Quantity `json:"memory,omitempty"`
	// Cores is compute in percent of one GPU (100 = one whole GPU).
	Cores *int64 `json:"cores,omitempty"`
	// GPUs counts whole GPUs (shares and MIG devices count none).
	GPUs *int64 `json:"gpus,omitempty"`
}

// BudgetAmount is an amount in each dimension.
type BudgetAmount struct {
	Memory resource.Quantity `json:"memory"`
	Cores  int64             `json:"cores"`
	GPUs   int64             `json:"gpus"`
}

// GPUBudgetStatus is what tessera-webhook writes.
type GPUBudgetStatus struct {
	// Used is what the namespace's claims and the charges in flight add up
	// to. It may be above the claims that exist until the reconciler has
	// seen them (never below).
	Used BudgetAmount `json:"used"`
	// Pending are charges the webhook admitted. Each counts in Used while
	// the writing replica's informer does not hold its claim, and is
	// dropped only once it has expired and its claim is either held by the
	// informer or not found by a live read (pkg/budget.Reconciler).
	Pending []PendingCharge `json:"pending,omitempty"`
	// ObservedGeneration is the generation the reconciler last computed
	// Used for.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// LastReconciled is when the reconciler last wrote the status.
	LastReconciled *metav1.Time `json:"lastReconciled,omitempty"`
}

// PendingCharge is one admitted claim that Used counts before the
// reconciler has seen it.
type PendingCharge struct {
	// Claim is the ResourceClaim's name.
	Claim string `json:"claim"`
	// UID is the ResourceClaim's uid (set before validating admission).
	UID     string       `json:"uid"`
	Charge  BudgetAmount `json:"charge"`
	Expires metav1.Time  `json:"expires"`
}
