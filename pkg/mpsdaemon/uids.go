package mpsdaemon

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// PodUIDs returns the UIDs of this node's daemon pods. Their processes (the
// MPS servers) compute on behalf of their clients: GPU lending leaves them
// out of any owner's activity.
func (p *Pods) PodUIDs(ctx context.Context) (map[types.UID]bool, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelComponent: ComponentValue, LabelNode: p.Config.nodeHash()})
	list, err := p.pods().List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list pods in %s: %w", p.Config.Namespace, err)
	}
	out := make(map[types.UID]bool, len(list.Items))
	for _, pod := range list.Items {
		if pod.Spec.NodeName == p.Config.NodeName {
			out[pod.UID] = true
		}
	}
	return out, nil
}
