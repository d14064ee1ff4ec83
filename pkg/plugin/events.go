package plugin

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/tessera-dev/tessera/pkg/model"
)

// NodeEvents records events on one Node through the API server.
type NodeEvents struct {
	recorder    record.EventRecorder
	broadcaster record.EventBroadcaster
	node        *corev1.ObjectReference
}

// NewNodeEvents starts an event broadcaster for the node; Shutdown stops it.
func NewNodeEvents(ctx context.Context, client kubernetes.Interface, nodeName string) *NodeEvents {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return &NodeEvents{
		broadcaster: b,
		recorder:    b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: model.DriverName, Host: nodeName}),
		// Node events live in the default namespace, keyed by the node name.
		node: &corev1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName), Namespace: ""},
	}
}

// Event implements [EventRecorder].
func (e *NodeEvents) Event(eventType, reason, message string) {
	e.recorder.Event(e.node, eventType, reason, message)
}

// ClaimEvent implements [EventRecorder].
func (e *NodeEvents) ClaimEvent(claim *resourceapi.ResourceClaim, eventType, reason, message string) {
	e.recorder.Event(claim, eventType, reason, message)
}

// Shutdown flushes and stops the broadcaster.
func (e *NodeEvents) Shutdown() { e.broadcaster.Shutdown() }
