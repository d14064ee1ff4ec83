package status

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// Budget is one GPUBudget: what its namespace's claims take against its
// caps (a nil cap is unlimited).
type Budget struct {
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	DeviceClass string `json:"deviceClass,omitempty"`
	MemoryBytes int64  `json:"memoryBytes"`
	Cores       int64  `json:"cores"`
	GPUs        int64  `json:"gpus"`
	// HardMemoryBytes, HardCores and HardGPUs are spec.hard.
	HardMemoryBytes *int64 `json:"hardMemoryBytes,omitempty"`
	HardCores       *int64 `json:"hardCores,omitempty"`
	HardGPUs        *int64 `json:"hardGPUs,omitempty"`
	// Pending counts admitted claims the reconciler has not seen yet.
	Pending int `json:"pending"`
}

// GetBudgets lists the GPUBudgets of every namespace. A cluster without the
// GPUBudget CRD (budgets.enabled off) has none, and so does a user who may
// not list them (the GPU table is still shown).
func GetBudgets(ctx context.Context, client dynamic.Interface) ([]Budget, error) {
	list, err := client.Resource(configapi.GPUBudgetResourceVersion).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list GPUBudgets: %w", err)
	}
	var items []configapi.GPUBudget
	for _, u := range list.Items {
		var b configapi.GPUBudget
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &b); err != nil {
			return nil, fmt.Errorf("GPUBudget %s/%s: %w", u.GetNamespace(), u.GetName(), err)
		}
		items = append(items, b)
	}
	return Budgets(items), nil
}

// Budgets summarises GPUBudgets, by namespace and name.
func Budgets(items []configapi.GPUBudget) []Budget {
	out := make([]Budget, 0, len(items))
	for _, b := range items {
		s := Budget{
			Namespace: b.Namespace, Name: b.Name, DeviceClass: b.Spec.DeviceClassName,
			MemoryBytes: b.Status.Used.Memory.Value(), Cores: b.Status.Used.Cores, GPUs: b.Status.Used.GPUs,
			HardCores: b.Spec.Hard.Cores, HardGPUs: b.Spec.Hard.GPUs, Pending: len(b.Status.Pending),
		}
		if m := b.Spec.Hard.Memory; m != nil {
			v := m.Value()
			s.HardMemoryBytes = &v
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Budget) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}

// writeBudgets writes the budgets table:
//
//	NAMESPACE  BUDGET  CLASS  MEMORY       CORES    GPUS  PENDING
//	team-a     gpu     -      30Gi/40Gi    60/-     1/2   0
func writeBudgets(w io.Writer, budgets []Budget) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tBUDGET\tCLASS\tMEMORY\tCORES\tGPUS\tPENDING")
	capOf := func(p *int64, format func(int64) string) string {
		if p == nil {
			return "-"
		}
		return format(*p)
	}
	plain := func(v int64) string { return fmt.Sprint(v) }
	for _, b := range budgets {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%s\t%d/%s\t%d/%s\t%d\n", b.Namespace, b.Name, orDash(b.DeviceClass),
			Bytes(b.MemoryBytes), capOf(b.HardMemoryBytes, Bytes), b.Cores, capOf(b.HardCores, plain),
			b.GPUs, capOf(b.HardGPUs, plain), b.Pending)
	}
	return tw.Flush()
}
