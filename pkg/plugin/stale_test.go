package plugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

const (
	stalePod        = types.UID("0b5a9c1e-77aa-4d0e-9a55-3f1c2d4e5f60")
	otherPod        = types.UID("1c6b0d2f-88bb-4e1f-0b66-4a2d3e5f6071")
	stalePodSystemd = "0b5a9c1e_77aa_4d0e_9a55_3f1c2d4e5f60" // as the systemd driver names it
)

// podClaim is newClaim for a claim generated for pod from a template (the
// pod is its controller) and reserved for it and for also.
func podClaim(uid string, pod types.UID, results []result, also ...types.UID) *resourceapi.ResourceClaim {
	c := newClaim(uid, results)
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod-" + uid, UID: pod, Controller: ptr.To(true)}}
	for _, p := range append([]types.UID{pod}, also...) {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-" + string(p), UID: p})
	}
	return c
}

// fakeCgroups makes directories under a fresh cgroup mount and returns it.
func fakeCgroups(t *testing.T, dirs ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// staleNode prepares old (whole gpu-0) on a plugin whose pod cgroups are
// under root, then deletes old from the API server, as a force-deleted
// pod's claim goes before the kubelet unprepares it.
func staleNode(t *testing.T, root string, old *resourceapi.ResourceClaim) (*env, *instance) {
	t.Helper()
	e := newEnv(t)
	client := fake.NewClientset(old.DeepCopy())
	p := e.start(func(o *Options) {
		o.Client = client
		o.PodCgroupRoot = root
	})
	mustPrepare(t, p.Plugin, old)
	if err := client.ResourceV1().ResourceClaims(old.Namespace).Delete(context.Background(), old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	return e, p
}

// wantKept fails unless preparing next on gpu-0 is refused with old still
// prepared and the refusal containing why.
func wantKept(t *testing.T, p *instance, next *resourceapi.ResourceClaim, old types.UID, why string) {
	t.Helper()
	r := prepare(t, p.Plugin, next)
	if r.Err == nil {
		t.Fatalf("gpu-0 given to %s while claim %s may still be used by a container", next.Name, old)
	}
	if !strings.Contains(r.Err.Error(), why) {
		t.Errorf("refusal %q does not say %q", r.Err, why)
	}
	if _, ok := p.store.Get(old); !ok {
		t.Errorf("claim %s was released", old)
	}
}

func wantReleased(t *testing.T, e *env, old types.UID) {
	t.Helper()
	for _, ev := range e.events.List() {
		if strings.HasPrefix(ev, "Normal StaleClaimReleased: released claim default/claim-"+string(old)) {
			return
		}
	}
	t.Errorf("events %q, want StaleClaimReleased of %s", e.events.List(), old)
}

// TestStaleClaimWaitsForItsPodsCgroups: a claim the API server no longer has
// (its pod force-deleted) keeps its GPU while a cgroup of its pod remains,
// in each of the kubelet's layouts, even with no process on the GPU: the
// container may still run with the GPU's device node. Once the cgroup is
// gone the claim is released and the next claim prepared.
func TestStaleClaimWaitsForItsPodsCgroups(t *testing.T) {
	for _, tc := range []struct {
		name, kubepods, pod string
	}{
		{"systemd, cgroup v2, burstable", "kubepods.slice", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + stalePodSystemd + ".slice"},
		{"systemd, guaranteed", "kubepods.slice", "kubepods.slice/kubepods-pod" + stalePodSystemd + ".slice"},
		{"cgroupfs on a hybrid host", "unified/kubepods", "unified/kubepods/besteffort/pod" + string(stalePod)},
		{"cgroupfs, cgroup v1 memory controller", "memory/kubepods", "memory/kubepods/burstable/pod" + string(stalePod)},
		{"custom kubelet cgroup root", "unified/tenant.slice/kubepods.slice", "unified/tenant.slice/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + stalePodSystemd + ".slice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeCgroups(t, tc.pod, tc.pod+"/cri-containerd-abc.scope", tc.kubepods+"/pod"+string(otherPod), "system.slice/containerd.service")
			old := podClaim("uid-old", stalePod, []result{whole("gpu", "gpu-0")})
			e, p := staleNode(t, root, old)
			if got, _ := p.store.Get("uid-old"); !slices.Equal(got.Pods, []types.UID{stalePod}) {
				t.Fatalf("checkpointed pods %q, want the claim's reserving pod %s", got.Pods, stalePod)
			}

			next := newClaim("uid-next", []result{whole("gpu", "gpu-0")})
			wantKept(t, p, next, "uid-old", "pod "+string(stalePod)+" still has cgroup "+filepath.Join(root, tc.pod))

			if err := os.RemoveAll(filepath.Join(root, tc.pod)); err != nil {
				t.Fatal(err)
			}
			mustPrepare(t, p.Plugin, next)
			if _, ok := p.store.Get("uid-old"); ok {
				t.Error("the gone claim is still prepared after its pod's cgroup went")
			}
			wantReleased(t, e, "uid-old")
			mustUnprepare(t, p.Plugin, "uid-old") // the kubelet's late unprepare is a no-op
			mustUnprepare(t, p.Plugin, "uid-next")
			e.assertClean(p)
		})
	}
}

// TestStaleClaimWaitsForEveryPod: of a claim reserved for two pods, the
// cgroup of the second keeps it.
func TestStaleClaimWaitsForEveryPod(t *testing.T) {
	root := fakeCgroups(t, "kubepods/besteffort/pod"+string(otherPod))
	_, p := staleNode(t, root, podClaim("uid-old", stalePod, []result{whole("gpu", "gpu-0")}, otherPod))
	wantKept(t, p, newClaim("uid-next", []result{whole("gpu", "gpu-0")}), "uid-old", "pod "+string(otherPod)+" still has cgroup")
}

// TestStaleClaimWithUnknownPodsIsKept: where the claim's pods cannot be
// checked, a gone claim is kept until the kubelet unprepares it: a record
// without pods (an older release's, or a shared claim's, whose later pods
// never reach the plugin), no cgroup root, a node whose kubelet makes no pod
// cgroups (cgroupsPerQOS: false: containers straight under k8s.io), an
// unreadable root.
func TestStaleClaimWithUnknownPodsIsKept(t *testing.T) {
	noPodCgroups := fakeCgroups(t, "unified/k8s.io/0123abcd", "memory/k8s.io/0123abcd")
	kubelet := fakeCgroups(t, "kubepods.slice/kubepods-besteffort.slice")
	for _, tc := range []struct {
		name string
		root string
		old  *resourceapi.ResourceClaim
		why  string
	}{
		{"shared claim", kubelet, newClaim("uid-old", []result{whole("gpu", "gpu-0")}), "the pods that use it are not recorded"},
		{"no cgroup root", "", podClaim("uid-old", stalePod, []result{whole("gpu", "gpu-0")}), "pod cgroups are not visible"},
		{"no pod cgroups on the node", noPodCgroups, podClaim("uid-old", stalePod, []result{whole("gpu", "gpu-0")}), "no kubelet pod cgroup"},
		{"unreadable root", filepath.Join(kubelet, "missing"), podClaim("uid-old", stalePod, []result{whole("gpu", "gpu-0")}), "its pods cannot be checked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, p := staleNode(t, tc.root, tc.old)
			next := newClaim("uid-next", []result{whole("gpu", "gpu-0")})
			wantKept(t, p, next, "uid-old", tc.why)
			// The kubelet unprepares the old claim once its pod's
			// containers stopped; then the next one is prepared.
			mustUnprepare(t, p.Plugin, "uid-old")
			mustPrepare(t, p.Plugin, next)
			mustUnprepare(t, p.Plugin, "uid-next")
			e.assertClean(p)
		})
	}
}

// TestOlderRecordWithoutPodsIsKept: a claim prepared by a release that
// recorded no pods (its checkpoint record has none) is kept when gone,
// although no pod cgroup at all remains on the node.
func TestOlderRecordWithoutPodsIsKept(t *testing.T) {
	root := fakeCgroups(t, "kubepods/besteffort")
	old := podClaim("uid-old", stalePod, []result{whole("gpu", "gpu-0")})
	_, p := staleNode(t, root, old)
	rec, _ := p.store.Get("uid-old")
	rec.Pods = nil // as the older release wrote it
	if err := p.store.Put(rec); err != nil {
		t.Fatal(err)
	}
	wantKept(t, p, newClaim("uid-next", []result{whole("gpu", "gpu-0")}), "uid-old", "the pods that use it are not recorded")
}

// TestStaleClaimStillAllocatedIsKept: a holder the API server still has with
// its allocation keeps the GPU whatever the node's cgroups say.
func TestStaleClaimStillAllocatedIsKept(t *testing.T) {
	e := newEnv(t)
	old := podClaim("uid-old", stalePod, []result{whole("gpu", "gpu-0")})
	client := fake.NewClientset(old.DeepCopy())
	p := e.start(func(o *Options) {
		o.Client = client
		o.PodCgroupRoot = fakeCgroups(t, "kubepods")
	})
	mustPrepare(t, p.Plugin, old)
	if r := prepare(t, p.Plugin, newClaim("uid-next", []result{whole("gpu", "gpu-0")})); r.Err == nil {
		t.Fatal("gpu-0 given to a second claim while the first still has its allocation")
	}
	if _, ok := p.store.Get("uid-old"); !ok {
		t.Error("a claim the API server still has was released")
	}
}

// TestGoneHolderWithProcessesIsKept: a gone claim whose pods' cgroups are
// gone but whose GPU still runs compute processes is not released either.
func TestGoneHolderWithProcessesIsKept(t *testing.T) {
	e := newEnv(t)
	old := podClaim("uid-old", stalePod, []result{whole("gpu", "gpu-0")})
	client := fake.NewClientset(old.DeepCopy())
	p := e.start(func(o *Options) {
		o.Client = client
		o.PodCgroupRoot = fakeCgroups(t, "kubepods")
		o.Processes = func(uuid string) (int, error) {
			if uuid == publishtest.UUID(0) {
				return 1, nil
			}
			return 0, nil
		}
	})
	mustPrepare(t, p.Plugin, old)
	if err := client.ResourceV1().ResourceClaims("default").Delete(context.Background(), old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wantKept(t, p, newClaim("uid-next", []result{whole("gpu", "gpu-0")}), "uid-old", "processes run on its GPUs")
}

// TestReservingPods: only a claim generated for a pod records its reserving
// pods (resource "pods" of the core group, once each).
func TestReservingPods(t *testing.T) {
	c := podClaim("uid", stalePod, nil, otherPod, stalePod)
	c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{APIGroup: "example.com", Resource: "pods", Name: "x", UID: "not-a-pod"})
	if got, want := reservingPods(c), []types.UID{stalePod, otherPod}; !slices.Equal(got, want) {
		t.Errorf("reservingPods = %q, want %q", got, want)
	}
	shared := newClaim("uid", nil)
	shared.Status.ReservedFor = c.Status.ReservedFor
	if got := reservingPods(shared); got != nil {
		t.Errorf("reservingPods of a shared claim = %q, want none", got)
	}
	notPod := podClaim("uid", stalePod, nil)
	notPod.OwnerReferences[0].Kind = "Job"
	if got := reservingPods(notPod); got != nil {
		t.Errorf("reservingPods of a claim a Job owns = %q, want none", got)
	}
}
