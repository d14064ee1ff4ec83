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
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/legacy"
)

// webhookMade selects the templates the Controller made (and earlier
// versions' webhook).
var webhookMade = labels.SelectorFromSet(labels.Set{legacy.LabelTranslated: "true", LabelAdmission: "true"})

// byTemplate indexes pods by "namespace/template" for each
// ResourceClaimTemplate their spec.resourceClaims name.
const byTemplate = "template"

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

// Sweep deletes, once, every template the Controller made (or earlier
// versions' webhook) in a namespace that opted in that no pod references
// (neither a cached translated pod nor any pod the API server lists for
// that namespace right before) and that was made, or last used by an
// earlier version's admission, more than Grace ago, and returns the
// deleted ones' "namespace/name". Several replicas may sweep at once: a
// delete is conditional on the version the sweep read, and NotFound or
// Conflict means another replica came first.
func (c *Controller) Sweep(ctx context.Context) ([]string, error) {
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
			// Gone already, or changed since it was read.
		default:
			errs = append(errs, fmt.Errorf("delete ResourceClaimTemplate %s: %w", key, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// referenced lists namespace's pods from the API server (not the cache)
// and returns the templates their spec.resourceClaims name.
func (c *Controller) referenced(ctx context.Context, namespace string) (map[string]bool, error) {
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

// unused reports whether tmpl is a template the Controller made, in a
// namespace that opted in, referenced by no cached pod, and last made or
// used Grace or more before now.
func (c *Controller) unused(tmpl *resourceapi.ResourceClaimTemplate, now time.Time) bool {
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
