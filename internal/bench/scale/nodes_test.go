package scale

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/publish"
)

// capture is a publish.Publisher that keeps what it is given.
type capture struct {
	res *resourceslice.DriverResources
}

func (c *capture) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	c.res = &res
	return nil
}

// TestNodeSlicesAreWhatThePluginPublishes compares a fake node's slices with what
// the kubelet plugin's Inventory publishes for the same mock profile, wired as
// cmd/tessera-kubelet-plugin wires it for --mock-profile.
func TestNodeSlicesAreWhatThePluginPublishes(t *testing.T) {
	for _, profile := range gpu.Profiles() {
		t.Run(profile, func(t *testing.T) {
			const node = "kwok-gpu-00007"
			got, err := NodeSlices(node, profile)
			if err != nil {
				t.Fatal(err)
			}
			lib, err := gpu.NewMockNode(profile)
			if err != nil {
				t.Fatal(err)
			}
			pub := &capture{}
			inv := &publish.Inventory{
				NodeName:     node,
				DiscoverNode: publish.NVMLDiscovery(lib, nil),
				Publisher:    pub,
				Model:        []model.Option{model.WithDriverMemoryLimits(false)},
			}
			if _, err := inv.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			if pub.res == nil {
				t.Fatal("the inventory published nothing")
			}
			want, err := model.ResourceSlices(node, *pub.res)
			if err != nil {
				t.Fatal(err)
			}
			if !apiequality.Semantic.DeepEqual(got, want) {
				t.Errorf("NodeSlices(%s) differ from what the plugin publishes:\ngot  %+v\nwant %+v", profile, got, want)
			}
			for _, s := range got {
				if s.Spec.NodeName == nil || *s.Spec.NodeName != node || s.Spec.Pool.Name != node {
					t.Errorf("slice %s: node %v, pool %s; want both %s", s.GenerateName, s.Spec.NodeName, s.Spec.Pool.Name, node)
				}
			}
		})
	}
}

func TestNodeSlicesUnknownProfile(t *testing.T) {
	_, err := NodeSlices("n", "no-such-profile")
	if err == nil || !strings.Contains(err.Error(), "no-such-profile") {
		t.Fatalf("err = %v, want one naming the profile", err)
	}
}

func TestFakeNodeAndOwner(t *testing.T) {
	n := FakeNode(42)
	if n.Name != "kwok-gpu-00042" || n.Annotations[KwokAnnotation] != "fake" || n.Labels[NodeLabel] != "true" || n.Labels[corev1.LabelHostname] != n.Name {
		t.Fatalf("FakeNode(42) = %+v", n.ObjectMeta)
	}
	n.UID = "uid-42"
	slices, err := NodeSlices(n.Name, "hgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	OwnedBy(&slices[0], n)
	ref := slices[0].OwnerReferences
	if len(ref) != 1 || ref[0].Kind != "Node" || ref[0].Name != n.Name || ref[0].UID != "uid-42" || ref[0].Controller == nil || !*ref[0].Controller {
		t.Fatalf("owner references = %+v", ref)
	}
}

// TestWorkloadClaimsAllocate runs each workload's claim through kube-scheduler's
// own allocator on one fake node, so a claim that could never be allocated
// (a typo in a selector, a capacity the model refuses) fails here rather than as
// a stalled benchmark. It also checks the pods name their template.
func TestWorkloadClaimsAllocate(t *testing.T) {
	pub := TesseraPublisher("hgx-h100")
	wantDevices := map[string]int{"whole-claim": 1, "share": 1, "share-cel": 1, "nvlink-pair": 2}
	for _, w := range Workloads("bench") {
		pod := w.Pod("bench", "p-0", "run-1")
		if pod.Labels[RunLabel] != "run-1" || pod.Labels[WorkloadLabel] != w.Name {
			t.Errorf("%s: pod labels %v", w.Name, pod.Labels)
		}
		if w.Template == nil {
			if len(pod.Spec.ResourceClaims) != 0 {
				t.Errorf("%s: pod has claims but the workload no template", w.Name)
			}
			continue
		}
		if len(pod.Spec.ResourceClaims) != 1 || *pod.Spec.ResourceClaims[0].ResourceClaimTemplateName != w.Template.Name {
			t.Errorf("%s: pod claims %+v, want one from template %s", w.Name, pod.Spec.ResourceClaims, w.Template.Name)
		}
		if got := allocateOn(t, pub, w, nil); len(got) != wantDevices[w.Name] {
			t.Fatalf("%s: allocated %v, want %d devices", w.Name, got, wantDevices[w.Name])
		}
	}
}
