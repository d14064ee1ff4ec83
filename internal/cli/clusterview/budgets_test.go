package clusterview

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// A user who may not list GPUBudgets sees a one-line note, not silence.
func TestBudgetsForbiddenNote(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configapi.GPUBudgetResourceVersion: "GPUBudgetList"})
	client.PrependReactor("list", configapi.GPUBudgetResource, func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(configapi.GPUBudgetResourceVersion.GroupResource(), "", nil)
	})
	budgets, err := GetBudgets(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := (Report{Budgets: budgets}).WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "GPU budgets not shown: you may not list gpubudgets.gpu.tessera.dev\n") ||
		strings.Contains(out.String(), "NAMESPACE") {
		t.Errorf("forbidden: table\n%s\nwant the note and no budgets header", out.String())
	}
}
