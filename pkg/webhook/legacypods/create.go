package legacypods

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/legacy"
)

// work syncs queued pods until the queue shuts down. A pod whose sync
// failed for a reason that may pass (the API server, the GPU models) is
// retried with the queue's backoff; one that can never succeed as it is
// (its annotation does not translate to what it names) is logged,
// recorded as a warning event on the pod, and dropped until it changes.
func (c *Controller) work(ctx context.Context) {
	for {
		key, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		err := c.sync(ctx, key)
		var permanent permanentError
		switch {
		case err == nil:
			c.queue.Forget(key)
		case errors.As(err, &permanent):
			klog.FromContext(ctx).Error(err, "Cannot create the translated pod's ResourceClaimTemplates", "pod", key)
			c.recordFailure(key, err)
			c.queue.Forget(key)
		default:
			klog.FromContext(ctx).V(2).Info("Creating the translated pod's ResourceClaimTemplates failed, retrying", "pod", key, "err", err)
			c.queue.AddRateLimited(key)
		}
		c.queue.Done(key)
	}
}

// ReasonTemplateNotCreated is the reason of the warning event on a pod
// whose template the Controller cannot create.
const ReasonTemplateNotCreated = "TranslatedTemplateNotCreated"

// recordFailure records err as a warning event on the cached pod key.
func (c *Controller) recordFailure(key string, err error) {
	if c.events == nil {
		return
	}
	if obj, exists, _ := c.pods.GetByKey(key); exists {
		if pod, ok := obj.(*corev1.Pod); ok {
			c.events.Event(pod, corev1.EventTypeWarning, ReasonTemplateNotCreated, err.Error())
		}
	}
}

// permanentError is a sync failure that retrying does not cure.
type permanentError struct{ error }

// sync creates the templates the cached pod key ("namespace/name") names
// that do not exist, when the pod is translated, alive and in a namespace
// that opted in. Each is rebuilt from the pod's legacy.AnnotationSource and
// created only when the rebuilt template has the name the pod's entry
// names.
func (c *Controller) sync(ctx context.Context, key string) error {
	obj, exists, err := c.pods.GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	value, ok := pod.Annotations[legacy.AnnotationSource]
	if !ok {
		return nil
	}
	if ns, err := c.namespaces.Get(pod.Namespace); err != nil || ns.Labels[NamespaceLabel] != "true" {
		return nil
	}
	var missing []corev1.PodResourceClaim
	for _, entry := range pod.Spec.ResourceClaims {
		name := entry.ResourceClaimTemplateName
		if name == nil || !strings.HasPrefix(*name, legacy.TemplatePrefix) {
			continue
		}
		if _, err := c.templates.ResourceClaimTemplates(pod.Namespace).Get(*name); apierrors.IsNotFound(err) {
			missing = append(missing, entry)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	source, err := legacy.ParseSource(value)
	if err != nil {
		return permanentError{fmt.Errorf("pod %s: %w", key, err)}
	}
	opts := legacy.Options{GPUShareUnit: c.unit}
	var modelsErr error
	if c.models != nil {
		opts.Models, modelsErr = c.models.Models(ctx)
	}
	built, errs := source.ClaimTemplates(opts)
	var failed []error
	for _, entry := range missing {
		want := *entry.ResourceClaimTemplateName
		tmpl, ok := built[entry.Name]
		switch {
		case !ok && modelsErr != nil:
			failed = append(failed, fmt.Errorf("pod %s: claim %s: the cluster's GPU models could not be read: %w", key, entry.Name, modelsErr))
			continue
		case !ok:
			failed = append(failed, permanentError{fmt.Errorf("pod %s: claim %s (template %s): annotation %s does not translate: %w",
				key, entry.Name, want, legacy.AnnotationSource, errs.ToAggregate())})
			continue
		case tmpl.Name != want:
			// The GPU models changed since admission (a percentage of memory
			// is sized per model), or the annotation was edited.
			failed = append(failed, permanentError{fmt.Errorf("pod %s: claim %s names template %s, but annotation %s translates to %s now: "+
				"the pod's template is not created; delete the pod to have it translated again", key, entry.Name, want, legacy.AnnotationSource, tmpl.Name)})
			continue
		}
		if err := c.create(ctx, pod, &tmpl); err != nil {
			failed = append(failed, err)
		}
	}
	return joinErrors(failed)
}

// joinErrors is errors.Join, permanent only when every error is.
func joinErrors(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	joined := errors.Join(errs...)
	for _, err := range errs {
		var p permanentError
		if !errors.As(err, &p) {
			return joined
		}
	}
	return permanentError{joined}
}

// create makes tmpl in pod's namespace, labelled as the Controller's and
// annotated with the pod. A dry run comes first: an API server with a
// feature gate off drops the fields it does not serve (capacity,
// distinctAttribute, firstAvailable), and a template without them would
// give the pod a weaker claim than it asked for; such a template is not
// created and the error names the fields. A template that exists already
// (another replica, `tessera convert`, an earlier version) is left alone.
func (c *Controller) create(ctx context.Context, pod *corev1.Pod, want *resourceapi.ResourceClaimTemplate) error {
	tmpl := want.DeepCopy()
	tmpl.Namespace = pod.Namespace
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	tmpl.Labels[LabelAdmission] = "true"
	tmpl.Annotations = map[string]string{AnnotationCreatedFor: fmt.Sprintf("%s (uid %s)", pod.Name, pod.UID)}
	api := c.client.ResourceV1().ResourceClaimTemplates(pod.Namespace)
	key := pod.Namespace + "/" + tmpl.Name
	dry, err := api.Create(ctx, tmpl, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "tessera-webhook"})
	switch {
	case apierrors.IsAlreadyExists(err):
		return nil
	case err != nil:
		return fmt.Errorf("create ResourceClaimTemplate %s for pod %s (dry run): %w", key, pod.Name, err)
	}
	if !equality.Semantic.DeepEqual(dry.Spec, want.Spec) {
		lost := missingFields(want.Spec, dry.Spec, field.NewPath("spec"))
		what := "changes the spec"
		if len(lost) > 0 {
			what = "drops " + strings.Join(lost, ", ")
		}
		return permanentError{fmt.Errorf("ResourceClaimTemplate %s for pod %s is not created: the API server %s, "+
			"probably because a feature gate the translation needs is off (assumed: capacity and distinctAttribute need "+
			"DRAConsumableCapacity, firstAvailable DRAPrioritizedList); the pod waits for its template (docs/migration.md)", key, pod.Name, what)}
	}
	_, err = api.Create(ctx, tmpl, metav1.CreateOptions{FieldManager: "tessera-webhook"})
	switch {
	case err == nil:
		klog.FromContext(ctx).V(2).Info("Created a translated pod's ResourceClaimTemplate", "template", key, "pod", klog.KObj(pod))
		return nil
	case apierrors.IsAlreadyExists(err):
		return nil
	default:
		return fmt.Errorf("create ResourceClaimTemplate %s for pod %s: %w", key, pod.Name, err)
	}
}
