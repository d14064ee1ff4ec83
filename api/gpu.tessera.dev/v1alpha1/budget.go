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
	// ClassSizes declares the size of the devices of a DeviceClass, for
	// pricing when none of them is published (a node pool scaled to zero):
	// the webhook charges the largest of what is published, what it has
	// seen (status.classSizes) and what is declared here.
	ClassSizes []ClassSize `json:"classSizes,omitempty"`
}

// ClassSize is the size of the largest device of one type a DeviceClass
// selects.
type ClassSize struct {
	// DeviceClassName is the class.
	DeviceClassName string `json:"deviceClassName"`
	// Type is the device type, as the gpu.tessera.dev/type attribute says:
	// gpu (a whole GPU), shared or lent (a share of one: its GPU's memory is
	// what a share that names no memory is charged), mig.
	Type string `json:"type"`
	// Memory is the device's memory capacity (a share's: its GPU's).
	Memory resource.Quantity `json:"memory"`
	// Cores is a MIG device's compute in percent of its GPU; unset: 100.
	Cores *int64 `json:"cores,omitempty"`
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
	// ClassSizes are the largest devices the webhook has seen each class
	// of this namespace's claims (and spec.deviceClassName) select, kept
	// when they are no longer published and never lowered, so that a
	// restart with a node pool at zero prices claims as before.
	ClassSizes []ClassSize `json:"classSizes,omitempty"`
	// Conditions: Enforced (False with reason NotEnforced when the
	// namespace is not one the budget webhook sees) and AllocationOverran
	// (True when a claim was allocated more than it was charged at
	// admission).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition types and reasons of a GPUBudget.
const (
	// BudgetEnforced is False when the budget webhook does not see the
	// claims of the budget's namespace (its namespaceSelector).
	BudgetEnforced = "Enforced"
	// BudgetNotEnforced is the reason of Enforced False.
	BudgetNotEnforced = "NotEnforced"
	// BudgetAllocationOverran is True while some claim was allocated more
	// than it was charged at admission (used counts the allocation).
	BudgetAllocationOverran = "AllocationOverran"
)

// PendingCharge is one admitted claim that Used counts before the
// reconciler has seen it.
type PendingCharge struct {
	// Claim is the ResourceClaim's name.
	Claim string `json:"claim"`
	// UID is the ResourceClaim's uid (set before validating admission).
	UID     string       `json:"uid"`
	Charge  BudgetAmount `json:"charge"`
	Expires metav1.Time  `json:"expires"`
	// ConfirmBy is when the entry stops counting unless Confirmed: a real
	// CREATE writes its claim within moments of its admission, so an entry
	// whose claim nobody sees by then was most likely never to be created
	// (a forged review). Unset (entries of older versions): confirmed.
	ConfirmBy *metav1.Time `json:"confirmBy,omitempty"`
	// Confirmed: a ResourceClaim of this namespace, name and uid was seen
	// (by an informer or a live read).
	Confirmed bool `json:"confirmed,omitempty"`
}
