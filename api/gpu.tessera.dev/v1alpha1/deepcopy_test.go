package v1alpha1

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

func fullConfig() *GpuConfig {
	return &GpuConfig{
		TypeMeta: metav1.TypeMeta{APIVersion: "gpu.tessera.dev/v1alpha1", Kind: "GpuConfig"},
		Sharing: &SharingConfig{
			Isolation:         IsolationMPS,
			ComputeLimit:      ptr.To[int32](50),
			MemoryLimit:       ptr.To(resource.MustParse("16Gi")),
			AllowedIsolations: []Isolation{IsolationMPS, IsolationHAMiCore},
		},
		Topology: &TopologyConfig{NVLink: NVLinkRequired},
		Locality: &LocalityConfig{Affinity: "a", AntiAffinity: "b", Exclusion: "c"},
	}
}

func TestDeepCopyDoesNotAlias(t *testing.T) {
	original := fullConfig()
	copied := original.DeepCopy()
	if diff := cmp.Diff(original, copied); diff != "" {
		t.Fatalf("copy differs (-original +copy):\n%s", diff)
	}
	if copied.Sharing == original.Sharing || copied.Topology == original.Topology ||
		copied.Sharing.ComputeLimit == original.Sharing.ComputeLimit ||
		copied.Sharing.MemoryLimit == original.Sharing.MemoryLimit {
		t.Fatal("copy shares a pointer with the original")
	}

	// Change every field of the copy; the original must not move.
	copied.Kind = "Other"
	copied.Sharing.Isolation = IsolationHAMiCore
	*copied.Sharing.ComputeLimit = 99
	copied.Sharing.MemoryLimit.Add(resource.MustParse("1Gi"))
	copied.Topology.NVLink = NVLinkIgnore
	copied.Locality.Exclusion = "z"
	copied.Sharing.AllowedIsolations[0] = IsolationAdvisory
	if diff := cmp.Diff(fullConfig(), original); diff != "" {
		t.Errorf("changing the copy changed the original (-want +got):\n%s", diff)
	}

	obj := original.DeepCopyObject()
	if diff := cmp.Diff(runtime.Object(fullConfig()), obj); diff != "" {
		t.Errorf("DeepCopyObject (-want +got):\n%s", diff)
	}
}

func TestDeepCopyNil(t *testing.T) {
	var c *GpuConfig
	if c.DeepCopy() != nil || c.DeepCopyObject() != nil {
		t.Error("copy of nil GpuConfig is not nil")
	}
	var s *SharingConfig
	var tc *TopologyConfig
	if s.DeepCopy() != nil || tc.DeepCopy() != nil {
		t.Error("copy of nil section is not nil")
	}
	partial := &GpuConfig{Sharing: &SharingConfig{Isolation: IsolationMPS}}
	if diff := cmp.Diff(partial, partial.DeepCopy()); diff != "" {
		t.Errorf("copy of a partial config (-want +got):\n%s", diff)
	}
}

func TestAddToScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	gvks, _, err := s.ObjectKinds(&GpuConfig{})
	if err != nil {
		t.Fatal(err)
	}
	want := SchemeGroupVersion.WithKind(GpuConfigKind)
	if len(gvks) != 1 || gvks[0] != want {
		t.Errorf("GpuConfig registered as %v, want %v", gvks, want)
	}
	obj, err := s.New(want)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := obj.(*GpuConfig); !ok {
		t.Errorf("scheme creates %T for %v", obj, want)
	}
}

func fullBudget() *GPUBudget {
	now := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	return &GPUBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "gpu.tessera.dev/v1alpha1", Kind: GPUBudgetKind},
		ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: "team-a", Labels: map[string]string{"a": "b"}},
		Spec: GPUBudgetSpec{
			Hard:            BudgetLimits{Memory: ptr.To(resource.MustParse("40Gi")), Cores: ptr.To[int64](200), GPUs: ptr.To[int64](2)},
			DeviceClassName: "shared.gpu.tessera.dev",
			ClassSizes:      []ClassSize{{DeviceClassName: "mig.gpu.tessera.dev", Type: "mig", Memory: resource.MustParse("10Gi"), Cores: ptr.To[int64](14)}},
		},
		Status: GPUBudgetStatus{
			Used: BudgetAmount{Memory: resource.MustParse("20Gi"), Cores: 50, GPUs: 1},
			Pending: []PendingCharge{{Claim: "c", UID: "u", Expires: now, ConfirmBy: &now,
				Charge: BudgetAmount{Memory: resource.MustParse("1Gi"), Cores: 10}}},
			ObservedGeneration: 3,
			LastReconciled:     &now,
			ClassSizes:         []ClassSize{{DeviceClassName: "gpu.tessera.dev", Type: "gpu", Memory: resource.MustParse("80Gi")}},
			Conditions:         []metav1.Condition{{Type: BudgetEnforced, Status: metav1.ConditionTrue, Reason: "Selected", LastTransitionTime: now}},
		},
	}
}

func TestGPUBudgetDeepCopyDoesNotAlias(t *testing.T) {
	original := fullBudget()
	copied := original.DeepCopy()
	if diff := cmp.Diff(original, copied); diff != "" {
		t.Fatalf("copy differs (-original +copy):\n%s", diff)
	}
	copied.Labels["a"] = "z"
	copied.Spec.Hard.Memory.Add(resource.MustParse("1Gi"))
	*copied.Spec.Hard.Cores = 1
	*copied.Spec.Hard.GPUs = 9
	copied.Status.Used.Memory.Add(resource.MustParse("1Gi"))
	copied.Status.Pending[0].Charge.Memory.Add(resource.MustParse("1Gi"))
	copied.Status.Pending[0].Claim = "other"
	copied.Status.LastReconciled.Time = time.Time{}
	copied.Status.Pending[0].ConfirmBy.Time = time.Time{}
	copied.Spec.ClassSizes[0].Memory.Add(resource.MustParse("1Gi"))
	*copied.Spec.ClassSizes[0].Cores = 1
	copied.Status.ClassSizes[0].Memory.Add(resource.MustParse("1Gi"))
	copied.Status.Conditions[0].LastTransitionTime.Time = time.Time{}
	copied.Status.Conditions[0].Reason = "x"
	if diff := cmp.Diff(fullBudget(), original); diff != "" {
		t.Errorf("changing the copy changed the original (-want +got):\n%s", diff)
	}

	list := &GPUBudgetList{Items: []GPUBudget{*fullBudget()}}
	copiedList := list.DeepCopyObject().(*GPUBudgetList)
	copiedList.Items[0].Status.Pending[0].UID = "x"
	if list.Items[0].Status.Pending[0].UID != "u" {
		t.Error("changing the list's copy changed the original")
	}
	var nilBudget *GPUBudget
	if nilBudget.DeepCopy() != nil || nilBudget.DeepCopyObject() != nil {
		t.Error("copy of nil GPUBudget is not nil")
	}
}
