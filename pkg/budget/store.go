package budget

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

func resourceQuantity(v int64) *resource.Quantity { return resource.NewQuantity(v, resource.BinarySI) }

// Store reads and writes GPUBudgets.
type Store interface {
	// List returns the budgets of namespace as a cache holds them (a budget
	// created a moment ago may be missing). The objects are copies.
	List(ctx context.Context, namespace string) ([]*configapi.GPUBudget, error)
	// Get reads a budget from the API server.
	Get(ctx context.Context, namespace, name string) (*configapi.GPUBudget, error)
	// UpdateStatus writes b's status if b's resourceVersion is still the
	// object's (a Conflict error otherwise) and returns the object written.
	UpdateStatus(ctx context.Context, b *configapi.GPUBudget) (*configapi.GPUBudget, error)
}

// DynamicStore is the Store over the dynamic client, with an informer for
// List. It needs get, list, watch on gpubudgets and update on
// gpubudgets/status.
type DynamicStore struct {
	client   dynamic.Interface
	factory  dynamicinformer.DynamicSharedInformerFactory
	informer cache.SharedIndexInformer
}

var _ Store = (*DynamicStore)(nil)

// NewDynamicStore returns a Store over client. resync is the informer's
// resync period (0: none).
func NewDynamicStore(client dynamic.Interface, resync time.Duration) *DynamicStore {
	factory := dynamicinformer.NewDynamicSharedInformerFactory(client, resync)
	informer := factory.ForResource(configapi.GPUBudgetResourceVersion).Informer()
	return &DynamicStore{client: client, factory: factory, informer: informer}
}

// Informer is the informer List reads (the reconciler adds its handlers).
func (s *DynamicStore) Informer() cache.SharedIndexInformer { return s.informer }

// Start starts the informer; it runs until ctx ends.
func (s *DynamicStore) Start(ctx context.Context) { s.factory.Start(ctx.Done()) }

// List reads the informer's cache once it has synced, the API server before.
func (s *DynamicStore) List(ctx context.Context, namespace string) ([]*configapi.GPUBudget, error) {
	var objs []any
	if s.informer.HasSynced() {
		var err error
		if objs, err = s.informer.GetIndexer().ByIndex(cache.NamespaceIndex, namespace); err != nil {
			return nil, err
		}
	} else {
		list, err := s.client.Resource(configapi.GPUBudgetResourceVersion).Namespace(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list GPUBudgets in %s: %w", namespace, err)
		}
		for i := range list.Items {
			objs = append(objs, &list.Items[i])
		}
	}
	out := make([]*configapi.GPUBudget, 0, len(objs))
	for _, o := range objs {
		b, err := FromUnstructured(o)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// Get reads the budget from the API server.
func (s *DynamicStore) Get(ctx context.Context, namespace, name string) (*configapi.GPUBudget, error) {
	u, err := s.client.Resource(configapi.GPUBudgetResourceVersion).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return FromUnstructured(u)
}

// UpdateStatus writes the status subresource under b's resourceVersion.
func (s *DynamicStore) UpdateStatus(ctx context.Context, b *configapi.GPUBudget) (*configapi.GPUBudget, error) {
	u, err := ToUnstructured(b)
	if err != nil {
		return nil, err
	}
	if b.ResourceVersion == "" {
		return nil, apierrors.NewBadRequest("GPUBudget status update without a resourceVersion")
	}
	out, err := s.client.Resource(configapi.GPUBudgetResourceVersion).Namespace(b.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	return FromUnstructured(out)
}
