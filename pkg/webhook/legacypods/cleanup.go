package legacypods

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/legacy"
)

// webhookMade selects the templates the Translator made.
var webhookMade = labels.SelectorFromSet(labels.Set{legacy.LabelTranslated: "true", LabelAdmission: "true"})

// byTemplate indexes pods by "namespace/template" for each
// ResourceClaimTemplate their spec.resourceClaims name.
const byTemplate = "template"

// Cleaner deletes the ResourceClaimTemplates the Translator made (both
// legacy.LabelTranslated and LabelAdmission), in namespaces that opted in
// (NamespaceLabel), once no pod of their namespace references them and they
// were neither made nor used by an admission (AnnotationAdmitted) within
// Grace: a pod being admitted right now, or just created and not yet in the
// pod cache, keeps its template. Templates that `tessera convert` wrote lack
// LabelAdmission and are never deleted, nor is anything in a namespace
// without the opt-in label. It needs list and watch on pods, namespaces and
// resourceclaimtemplates, and delete on the latter. Several replicas may run
// one each: a delete is conditional on the version the sweep read, and
// NotFound or Conflict means another replica or an admission came first.
type Cleaner struct {
	client     kubernetes.Interface
	grace      time.Duration
	now        func() time.Time
	factories  []informers.SharedInformerFactory
	pods       cache.Indexer
	templates  resourcelisters.ResourceClaimTemplateLister
	namespaces corelisters.NamespaceLister
	synced     []cache.InformerSynced
}

// NewCleaner returns a Cleaner over client's pods and Tessera's translated
// templates. grace below MinGrace is raised to it; now nil is time.Now.
func NewCleaner(client kubernetes.Interface, grace time.Duration, now func() time.Time) (*Cleaner, error) {
	if grace <= 0 {
		grace = DefaultGrace
	}
	grace = max(grace, MinGrace)
	if now == nil {
		now = time.Now
	}
	pods := informers.NewSharedInformerFactory(client, 0)
	podInformer := pods.Core().V1().Pods().Informer()
	// The cache holds every pod of the cluster: keep only what the index
	// reads.
	if err := podInformer.SetTransform(slimPod); err != nil {
		return nil, err
	}
	if err := podInformer.AddIndexers(cache.Indexers{byTemplate: templateKeys}); err != nil {
		return nil, err
	}
	selector := webhookMade.String()
	templates := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	templateInformer := templates.Resource().V1().ResourceClaimTemplates()
	// Only the namespaces that opted in: one that drops the label leaves the
	// cache, and its templates stay.
	optedIn := labels.SelectorFromSet(labels.Set{NamespaceLabel: "true"}).String()
	namespaces := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = optedIn }))
	namespaceInformer := namespaces.Core().V1().Namespaces()
	return &Cleaner{
		client: client, grace: grace, now: now,
		factories:  []informers.SharedInformerFactory{pods, templates, namespaces},
		pods:       podInformer.GetIndexer(),
		templates:  templateInformer.Lister(),
		namespaces: namespaceInformer.Lister(),
		synced: []cache.InformerSynced{podInformer.HasSynced, templateInformer.Informer().HasSynced,
			namespaceInformer.Informer().HasSynced},
	}, nil
}

// slimPod keeps of a pod its identity and spec.resourceClaims.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Spec:       corev1.PodSpec{ResourceClaims: pod.Spec.ResourceClaims},
	}, nil
}

func templateKeys(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	var keys []string
	for _, c := range pod.Spec.ResourceClaims {
		if c.ResourceClaimTemplateName != nil {
			keys = append(keys, pod.Namespace+"/"+*c.ResourceClaimTemplateName)
		}
	}
	return keys, nil
}

// SyncTimeout bounds how long Run waits for its caches: a webhook whose
// RBAC lacks pods or namespaces never syncs, and Run then fails instead of
// waiting silently.
const SyncTimeout = 2 * time.Minute

// Run starts the informers and sweeps every Grace/5 until ctx ends. It
// returns an error when the caches do not sync within SyncTimeout.
func (c *Cleaner) Run(ctx context.Context) error {
	return c.run(ctx, SyncTimeout)
}

func (c *Cleaner) run(ctx context.Context, syncTimeout time.Duration) error {
	syncCtx, cancel := context.WithTimeout(ctx, syncTimeout)
	err := c.start(syncCtx, ctx.Done())
	cancel()
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithName("legacy-template-cleaner")
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if _, err := c.Sweep(ctx); err != nil {
			logger.Error(err, "Sweeping translated ResourceClaimTemplates")
		}
	}, c.grace/5)
	return nil
}

// Sweep deletes, once, every template the Translator made in a namespace
// that opted in that no pod references (neither a cached pod nor one the
// API server lists for that namespace right before) and that was last made
// or used more than Grace ago, and
// returns the deleted ones' "namespace/name".
func (c *Cleaner) Sweep(ctx context.Context) ([]string, error) {
	all, err := c.templates.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	now := c.now()
	var deleted []string
	var errs []error
	live := map[string]map[string]bool{} // namespace: templates its pods reference, listed now
	for _, tmpl := range all {
		key := tmpl.Namespace + "/" + tmpl.Name
		if !c.unused(tmpl, now) {
			continue
		}
		// The cache may not hold a pod created just now (a watch gap): ask
		// the API server for the namespace's pods before deleting.
		refs, ok := live[tmpl.Namespace]
		if !ok {
			var err error
			if refs, err = c.referenced(ctx, tmpl.Namespace); err != nil {
				errs = append(errs, err)
				live[tmpl.Namespace] = nil // no deletion in this namespace this sweep
				continue
			}
			live[tmpl.Namespace] = refs
		}
		if refs == nil || refs[tmpl.Name] {
			continue
		}
		err := c.client.ResourceV1().ResourceClaimTemplates(tmpl.Namespace).Delete(ctx, tmpl.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &tmpl.UID, ResourceVersion: &tmpl.ResourceVersion},
		})
		switch {
		case err == nil:
			deleted = append(deleted, key)
			klog.FromContext(ctx).V(2).Info("Deleted an unused translated ResourceClaimTemplate", "template", key)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone already, or marked by an admission since it was read.
		default:
			errs = append(errs, fmt.Errorf("delete ResourceClaimTemplate %s: %w", key, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// referenced lists namespace's pods from the API server (not the cache)
// and returns the templates their spec.resourceClaims name.
func (c *Cleaner) referenced(ctx context.Context, namespace string) (map[string]bool, error) {
	refs := map[string]bool{}
	opts := metav1.ListOptions{Limit: 500}
	for {
		pods, err := c.client.CoreV1().Pods(namespace).List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list the pods of namespace %s before deleting its unused templates: %w", namespace, err)
		}
		for i := range pods.Items {
			for _, claim := range pods.Items[i].Spec.ResourceClaims {
				if claim.ResourceClaimTemplateName != nil {
					refs[*claim.ResourceClaimTemplateName] = true
				}
			}
		}
		if pods.Continue == "" {
			return refs, nil
		}
		opts.Continue = pods.Continue
	}
}

// unused reports whether tmpl is a template the Translator made, in a
// namespace that opted in, referenced by no cached pod, and last made or
// used Grace or more before now.
func (c *Cleaner) unused(tmpl *resourceapi.ResourceClaimTemplate, now time.Time) bool {
	if !webhookMade.Matches(labels.Set(tmpl.Labels)) || tmpl.DeletionTimestamp != nil {
		return false
	}
	if ns, err := c.namespaces.Get(tmpl.Namespace); err != nil || ns.Labels[NamespaceLabel] != "true" {
		return false
	}
	if now.Sub(lastUsed(tmpl)) < c.grace {
		return false
	}
	refs, err := c.pods.ByIndex(byTemplate, tmpl.Namespace+"/"+tmpl.Name)
	return err == nil && len(refs) == 0
}

// start starts the informers until stop and waits for their caches until
// ctx ends.
func (c *Cleaner) start(ctx context.Context, stop <-chan struct{}) error {
	for _, f := range c.factories {
		f.Start(stop)
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("the caches of pods, translated templates and opted-in namespaces did not sync "+
			"(does the webhook's ClusterRole allow list and watch on them?): %w", context.Cause(ctx))
	}
	return nil
}
