package scale

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

// Labels and annotations of the fake nodes.
const (
	// KwokAnnotation marks a node as kwok's: kwok (started with
	// --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake) keeps it
	// Ready and turns the pods bound to it Running.
	KwokAnnotation = "kwok.x-k8s.io/node"
	// NodeLabel marks the fake nodes this package made, so that scaling down
	// deletes only those.
	NodeLabel = "scale.tessera.dev/fake-node"
	// nodePrefix starts every fake node's name.
	nodePrefix = "kwok-gpu-"
)

// NodeName is the name of fake node i: kwok-gpu-00000, kwok-gpu-00001 and so on.
func NodeName(i int) string { return fmt.Sprintf("%s%05d", nodePrefix, i) }

// FakeNode is fake node i as created in the API: kwok's annotation, the usual
// hostname/os/arch labels, and allocatable room for far more pods than the
// benchmark places on it (110 pods, the kubelet's default maximum).
func FakeNode(i int) *corev1.Node {
	name := NodeName(i)
	room := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("128"),
		corev1.ResourceMemory: resource.MustParse("1Ti"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{KwokAnnotation: "fake"},
			Labels: map[string]string{
				corev1.LabelHostname:   name,
				corev1.LabelOSStable:   "linux",
				corev1.LabelArchStable: "amd64",
				NodeLabel:              "true",
			},
		},
		Status: corev1.NodeStatus{Allocatable: room, Capacity: room},
	}
}

// NodeSlices are the ResourceSlices Tessera's kubelet plugin publishes on node
// nodeName when it runs with --mock-profile profile: the profile's mock NVML,
// discovered by gpu.DiscoverNode, modelled by model.Resources with the options
// the plugin passes for a mock profile (driver memory limits not
// enforceable, no taints, no lending) and turned into objects by
// model.ResourceSlices. The objects carry generateName, no name, and no owner:
// the caller sets the Node as owner once it has the Node's UID.
func NodeSlices(nodeName, profile string) ([]resourceapi.ResourceSlice, error) {
	gpus, err := mockGPUs(profile)
	if err != nil {
		return nil, err
	}
	res, err := model.Resources(nodeName, gpus, model.WithDriverMemoryLimits(false))
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", nodeName, err)
	}
	return model.ResourceSlices(nodeName, res)
}

// OwnedBy sets node as the controlling owner of slice, as the kubelet plugin's
// resourceslice controller does, so that deleting the node deletes its slices.
func OwnedBy(slice *resourceapi.ResourceSlice, node *corev1.Node) {
	slice.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "v1",
		Kind:       "Node",
		Name:       node.Name,
		UID:        node.UID,
		Controller: ptr.To(true),
	}}
}

// mockGPUs are the GPUs discovery finds on the profile's mock node; a GPU
// that fails discovery is an error.
func mockGPUs(profile string) ([]gpu.GPU, error) {
	lib, err := gpu.NewMockNode(profile)
	if err != nil {
		return nil, err
	}
	disc, err := gpu.DiscoverNode(lib)
	if err != nil {
		return nil, fmt.Errorf("mock profile %s: %w", profile, err)
	}
	if len(disc.Failed) > 0 {
		return nil, fmt.Errorf("mock profile %s: discovery failed for %d GPUs: %v", profile, len(disc.Failed), disc.Failed[0])
	}
	return disc.GPUs, nil
}
