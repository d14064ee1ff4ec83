package webhook

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
)

// DefaultClassTimeout bounds a DeviceClass GET of DeviceClasses: well within
// the API server's webhook timeout (the chart's is 5s).
const DefaultClassTimeout = 2 * time.Second

// DeviceClasses reads DeviceClasses for the Handler (a DeviceClassReader).
// Once its informer has synced it answers from the cache; before that, and
// for a class the cache does not hold (yet: created a moment before the claim
// that names it), it asks the API server with a GET bounded by Timeout. It
// needs get, list and watch on deviceclasses.resource.k8s.io.
type DeviceClasses struct {
	client  kubernetes.Interface
	factory informers.SharedInformerFactory
	lister  resourcelisters.DeviceClassLister
	synced  cache.InformerSynced
	// Timeout bounds each GET; zero means DefaultClassTimeout.
	Timeout time.Duration
}

var _ DeviceClassReader = (*DeviceClasses)(nil)

// NewDeviceClasses returns a reader over client's DeviceClasses. It reads
// with GETs until Start has run and the cache has synced.
func NewDeviceClasses(client kubernetes.Interface) *DeviceClasses {
	factory := informers.NewSharedInformerFactory(client, 0)
	informer := factory.Resource().V1().DeviceClasses()
	return &DeviceClasses{
		client:  client,
		factory: factory,
		lister:  informer.Lister(),
		synced:  informer.Informer().HasSynced,
	}
}

// Client is the clientset the reader uses.
func (d *DeviceClasses) Client() kubernetes.Interface { return d.client }

// Start starts the informer; it runs until ctx is done. It does not wait for
// the cache to sync: Get reads with a GET meanwhile.
func (d *DeviceClasses) Start(ctx context.Context) {
	d.factory.Start(ctx.Done())
}

// Get returns the DeviceClass called name, from the cache or the API server.
// The result is shared: the caller must not modify it.
func (d *DeviceClasses) Get(ctx context.Context, name string) (*resourceapi.DeviceClass, error) {
	if d.synced() {
		class, err := d.lister.Get(name)
		if err == nil {
			return class, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultClassTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return d.client.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{})
}
