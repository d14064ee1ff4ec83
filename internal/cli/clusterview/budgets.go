package clusterview

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
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
	// Note, when set, is not a budget but a line saying why budgets are
	// not shown (the user may not list them); the other fields are empty.
	Note string `json:"note,omitempty"`
}

// forbiddenNote is the one entry GetBudgets returns when listing is
// forbidden.
const forbiddenNote = "GPU budgets not shown: you may not list gpubudgets.gpu.tessera.dev"

// GetBudgets lists the GPUBudgets of every namespace. A cluster without the
// GPUBudget CRD (budgets.enabled off) has none. For a user who may not list
// them it returns one entry with a Note saying so (the GPU table is still
// shown).
func GetBudgets(ctx context.Context, client dynamic.Interface) ([]Budget, error) {
	list, err := client.Resource(configapi.GPUBudgetResourceVersion).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if apierrors.IsForbidden(err) {
		return []Budget{{Note: forbiddenNote}}, nil
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
			MemoryBytes: saturated(b.Status.Used.Memory), Cores: b.Status.Used.Cores, GPUs: b.Status.Used.GPUs,
			HardCores: b.Spec.Hard.Cores, HardGPUs: b.Spec.Hard.GPUs, Pending: len(b.Status.Pending),
		}
		if m := b.Spec.Hard.Memory; m != nil {
			v := saturated(*m)
			s.HardMemoryBytes = &v
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Budget) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}

// saturated is q in whole units, math.MaxInt64 beyond (Quantity.Value
// reads 1e30 as 0).
func saturated(q resource.Quantity) int64 {
	if q.CmpInt64(math.MaxInt64) > 0 {
		return math.MaxInt64
	}
	return q.Value()
}

// writeBudgets writes the budgets table, or the note of an entry that has
// one instead of a row:
//
//	NAMESPACE  BUDGET  CLASS  MEMORY       CORES    GPUS  PENDING
//	team-a     gpu     -      30Gi/40Gi    60/-     1/2   0
func writeBudgets(w io.Writer, budgets []Budget) error {
	var rows []Budget
	for _, b := range budgets {
		if b.Note != "" {
			if _, err := fmt.Fprintln(w, b.Note); err != nil {
				return err
			}
			continue
		}
		rows = append(rows, b)
	}
	if len(rows) == 0 {
		return nil
	}
	budgets = rows
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
