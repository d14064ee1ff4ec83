package legacypods

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/legacy"
	"github.com/tessera-dev/tessera/pkg/webhook"
)

// Options are a Controller's settings; the zero value is usable.
type Options struct {
	// Grace is how long a template no pod uses is kept after it was made
	// (0: DefaultGrace; below MinGrace: MinGrace).
	Grace time.Duration
	// Models and GPUShareUnit are the Translator's: a template is rebuilt
	// from a pod with the same settings the pod was admitted with.
	Models       webhook.GPUModelReader
	GPUShareUnit legacy.MemoryUnit
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Events records, on a pod, why its template cannot be created (nil:
	// Run records them through the API server, as component
	// tessera-webhook).
	Events record.EventRecorder
}

// Controller keeps the ResourceClaimTemplates of translated pods, in
// namespaces that opted in (NamespaceLabel):
//
//   - it creates each template a translated pod names (spec.resourceClaims)
//     that does not exist, rebuilt from the pod's own
//     legacy.AnnotationSource, never from anything an admission request
//     said: only a pod the API server stored leads to a template, and only to
//     one of the shapes its own annotation translates to, under the name the
//     pod names. The API server's resourceclaim controller, which retries a
//     pod whose template is missing and is woken when the template appears,
//     then creates the pod's claims;
//   - it deletes the templates it made (legacy.LabelTranslated and
//     LabelAdmission) that no pod of their namespace references once they
//     are older than Grace (Sweep).
//
// Templates that `tessera convert` wrote lack LabelAdmission and are never
// deleted, nor is anything made or deleted in a namespace without the
// opt-in label. It caches only translated pods (the label
// legacy.LabelTranslated, which the Translator sets), each reduced to what
// it reads, the opted-in namespaces and its own templates. It needs list
// and watch on pods, namespaces and resourceclaimtemplates, get on
// namespaces, create and delete on resourceclaimtemplates, and create and
// patch on events (why a pod's template cannot be created). Several
// replicas may run one each: a create of an existing template is
// AlreadyExists, a delete is conditional on the version read.
type Controller struct {
	client     kubernetes.Interface
	grace      time.Duration
	now        func() time.Time
	models     webhook.GPUModelReader
	unit       legacy.MemoryUnit
	factories  []informers.SharedInformerFactory
	pods       cache.Indexer
	templates  resourcelisters.ResourceClaimTemplateLister
	namespaces corelisters.NamespaceLister
	synced     []cache.InformerSynced
	queue      workqueue.TypedRateLimitingInterface[string]
	events     record.EventRecorder
}

// translatedPods selects the pods the Translator rewrote.
var translatedPods = labels.SelectorFromSet(labels.Set{legacy.LabelTranslated: "true"})

// optedIn selects the namespaces that opted in.
var optedIn = labels.SelectorFromSet(labels.Set{NamespaceLabel: "true"})

// NewController returns a Controller of client's translated pods and
// Tessera's translated templates.
func NewController(client kubernetes.Interface, opts Options) (*Controller, error) {
	grace := opts.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	grace = max(grace, MinGrace)
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	c := &Controller{
		client: client, grace: grace, now: now, models: opts.Models, unit: opts.GPUShareUnit, events: opts.Events,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "legacy_templates"}),
	}
	selected := func(selector labels.Selector) informers.SharedInformerFactory {
		s := selector.String()
		return informers.NewSharedInformerFactoryWithOptions(client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s }))
	}
	pods := selected(translatedPods)
	podInformer := pods.Core().V1().Pods().Informer()
	if err := podInformer.SetTransform(slimPod); err != nil {
		return nil, err
	}
	if err := podInformer.AddIndexers(cache.Indexers{byTemplate: templateKeys}); err != nil {
		return nil, err
	}
	templates := selected(webhookMade)
	templateInformer := templates.Resource().V1().ResourceClaimTemplates()
	// Only the namespaces that opted in: one that drops the label leaves the
	// cache, and nothing more is made or deleted there.
	namespaces := selected(optedIn)
	namespaceInformer := namespaces.Core().V1().Namespaces()
	c.factories = []informers.SharedInformerFactory{pods, templates, namespaces}
	c.pods = podInformer.GetIndexer()
	c.templates = templateInformer.Lister()
	c.namespaces = namespaceInformer.Lister()
	c.synced = []cache.InformerSynced{podInformer.HasSynced, templateInformer.Informer().HasSynced, namespaceInformer.Informer().HasSynced}

	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, err
	}
	// A template deleted while pods still name it (by hand, or by a sweep
	// racing a pod's creation) is made again for them.
	if _, err := templateInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if m, err := meta(obj); err == nil {
				c.enqueueIndexed(byTemplate, m.GetNamespace()+"/"+m.GetName())
			}
		},
	}); err != nil {
		return nil, err
	}
	// A namespace that opts in gets the templates of its translated pods.
	if _, err := namespaceInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueNamespace(obj) },
		UpdateFunc: func(_, obj any) { c.enqueueNamespace(obj) },
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func meta(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", obj)
	}
	return m, nil
}

func (c *Controller) enqueueNamespace(obj any) {
	if m, err := meta(obj); err == nil {
		c.enqueueIndexed(cache.NamespaceIndex, m.GetName())
	}
}

// enqueueIndexed queues the cached pods under key of index.
func (c *Controller) enqueueIndexed(index, key string) {
	pods, err := c.pods.ByIndex(index, key)
	if err != nil {
		return
	}
	for _, obj := range pods {
		if k, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(k)
		}
	}
}

// slimPod keeps of a pod its identity, phase, legacy.AnnotationSource and
// spec.resourceClaims: what the Controller reads.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			DeletionTimestamp: pod.DeletionTimestamp},
		Spec:   corev1.PodSpec{ResourceClaims: pod.Spec.ResourceClaims},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	if v, ok := pod.Annotations[legacy.AnnotationSource]; ok {
		slim.Annotations = map[string]string{legacy.AnnotationSource: v}
	}
	return slim, nil
}

// OptedIn reports whether namespace carries NamespaceLabel=true: from the
// cache, else (a namespace labelled a moment ago) from the API server.
func (c *Controller) OptedIn(ctx context.Context, namespace string) (bool, error) {
	if ns, err := c.namespaces.Get(namespace); err == nil && ns.Labels[NamespaceLabel] == "true" {
		return true, nil
	}
	ns, err := c.client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return ns.Labels[NamespaceLabel] == "true", nil
}

// SyncTimeout bounds how long Run waits for its caches: a webhook whose
// RBAC lacks pods or namespaces never syncs, and Run then fails instead of
// waiting silently.
const SyncTimeout = 2 * time.Minute

// workers is how many pods are synced at once.
const workers = 2

// Run starts the informers, creates missing templates as pods need them
// and sweeps unused ones every Grace/5, until ctx ends. It returns an error
// when the caches do not sync within SyncTimeout.
func (c *Controller) Run(ctx context.Context) error {
	return c.run(ctx, SyncTimeout)
}

func (c *Controller) run(ctx context.Context, syncTimeout time.Duration) error {
	defer c.queue.ShutDown()
	syncCtx, cancel := context.WithTimeout(ctx, syncTimeout)
	err := c.start(syncCtx, ctx.Done())
	cancel()
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithName("legacy-templates")
	ctx = klog.NewContext(ctx, logger)
	if c.events == nil {
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
		defer b.Shutdown()
		c.events = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "tessera-webhook"})
	}
	for range workers {
		go wait.UntilWithContext(ctx, c.work, time.Second)
	}
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if _, err := c.Sweep(ctx); err != nil {
			logger.Error(err, "Sweeping translated ResourceClaimTemplates")
		}
	}, c.grace/5)
	return nil
}

// start starts the informers until stop and waits for their caches until
// ctx ends.
func (c *Controller) start(ctx context.Context, stop <-chan struct{}) error {
	for _, f := range c.factories {
		f.Start(stop)
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("the caches of translated pods, translated templates and opted-in namespaces did not sync "+
			"(does the webhook's ClusterRole allow list and watch on them?): %w", context.Cause(ctx))
	}
	return nil
}
