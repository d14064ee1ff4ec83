package mpsdaemon

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

const testNS = "tessera"

func testConfig(mock bool) Config {
	return Config{
		Namespace: testNS, NodeName: "node-a", Image: "registry/tessera-kubelet-plugin:v1",
		Mock: mock, DriverRoot: "/run/nvidia/driver", PriorityClassName: "system-node-critical",
		ReadyTimeout: 2 * time.Second, PollInterval: 5 * time.Millisecond,
	}
}

// kubelet stands in for the node: pods it "runs" become Running and Ready
// when created (unless stalled), with a fresh UID each.
type kubelet struct {
	mu      sync.Mutex
	stalled bool
	created []string
	deleted []string
	n       int
}

func newClient(t *testing.T, k *kubelet, objs ...runtime.Object) *fake.Clientset {
	t.Helper()
	client := fake.NewClientset(objs...)
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		k.mu.Lock()
		defer k.mu.Unlock()
		k.n++
		pod.UID = types.UID("uid-" + pod.Name + "-" + string(rune('0'+k.n)))
		k.created = append(k.created, pod.Name)
		if !k.stalled {
			setReady(pod)
		} else {
			pod.Status.Phase = corev1.PodPending
			pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "no such image"}}}}
		}
		return false, nil, nil
	})
	client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.deleted = append(k.deleted, a.(k8stesting.DeleteAction).GetName())
		return false, nil, nil
	})
	return client
}

func setReady(pod *corev1.Pod) {
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
}

func (k *kubelet) calls() (created, deleted []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.created), slices.Clone(k.deleted)
}

// testDomain is the trust domain (namespace) of the tests' daemons.
const testDomain = "team-a"

func daemonOf(uuid string) isolation.Daemon {
	return isolation.NewMPS("/var/lib/kubelet/plugins/gpu.tessera.dev/mps", nil).Daemon(uuid, testDomain)
}

// keyOf is the key of daemonOf(uuid).
func keyOf(uuid string) isolation.DaemonKey {
	return isolation.DaemonKey{GPU: uuid, Domain: testDomain}
}

func getPod(t *testing.T, client *fake.Clientset, name string) *corev1.Pod {
	t.Helper()
	pod, err := client.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// TestStartCreatesPod: the pod is created on this node, in this namespace,
// owned by nothing, with the GPU's host directories, and Start returns once
// it is Ready.
func TestStartCreatesPod(t *testing.T) {
	for _, mock := range []bool{true, false} {
		k := &kubelet{}
		client := newClient(t, k)
		cfg := testConfig(mock)
		p, err := NewPods(client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		d := daemonOf("GPU-1")
		if err := p.Start(context.Background(), d, false); err != nil {
			t.Fatalf("mock %v: %v", mock, err)
		}
		pod := getPod(t, client, cfg.PodName(keyOf("GPU-1")))
		if pod.Spec.NodeName != "node-a" || len(pod.OwnerReferences) != 0 || pod.Spec.RestartPolicy != corev1.RestartPolicyAlways {
			t.Errorf("mock %v: nodeName %q, owners %v, restartPolicy %s", mock, pod.Spec.NodeName, pod.OwnerReferences, pod.Spec.RestartPolicy)
		}
		if pod.Annotations[AnnotationGPU] != "GPU-1" || pod.Labels[LabelComponent] != ComponentValue || pod.Annotations[AnnotationSpecHash] == "" {
			t.Errorf("mock %v: labels %v annotations %v", mock, pod.Labels, pod.Annotations)
		}
		hostPaths := map[string]string{}
		for _, v := range pod.Spec.Volumes {
			if v.HostPath != nil {
				hostPaths[v.Name] = v.HostPath.Path
			}
		}
		want := map[string]string{"pipe": d.PipeDir, "shm": d.ShmDir, "log": d.LogDir}
		if !mock {
			want["driver-root"] = "/run/nvidia/driver"
		}
		if diff := cmp.Diff(want, hostPaths); diff != "" {
			t.Errorf("mock %v: host paths (-want +got):\n%s", mock, diff)
		}
		ctr := pod.Spec.Containers[0]
		privileged := ctr.SecurityContext.Privileged != nil && *ctr.SecurityContext.Privileged
		if privileged == mock || pod.Spec.HostPID == mock || slices.Contains(ctr.Args, "--fake") != mock {
			t.Errorf("mock %v: privileged %v, hostPID %v, args %v", mock, privileged, pod.Spec.HostPID, ctr.Args)
		}
		if created, _ := k.calls(); len(created) != 1 {
			t.Errorf("mock %v: created %v, want one pod", mock, created)
		}
	}
}

// TestStartTimesOutWithPodState: a pod that never becomes Ready fails the
// start with the pod's name and why.
func TestStartTimesOutWithPodState(t *testing.T) {
	k := &kubelet{stalled: true}
	cfg := testConfig(true)
	cfg.ReadyTimeout = 100 * time.Millisecond
	p, _ := NewPods(newClient(t, k), cfg)
	err := p.Start(context.Background(), daemonOf("GPU-1"), false)
	if err == nil || !strings.Contains(err.Error(), cfg.PodName(keyOf("GPU-1"))) || !strings.Contains(err.Error(), "ImagePullBackOff") {
		t.Fatalf("Start = %v, want the pod's name and ImagePullBackOff", err)
	}
}

// existing is a daemon pod as an earlier plugin instance left it.
func existing(cfg Config, uuid string, uid types.UID, mutate func(*corev1.Pod)) *corev1.Pod {
	pod := cfg.Pod(daemonOf(uuid))
	pod.UID = uid
	setReady(pod)
	if mutate != nil {
		mutate(pod)
	}
	return pod
}

// TestStartAdopts: a Ready pod with the same spec hash is adopted as it is,
// whether or not clients use it: no create, no delete, same UID.
func TestStartAdopts(t *testing.T) {
	for _, inUse := range []bool{false, true} {
		cfg := testConfig(true)
		k := &kubelet{}
		client := newClient(t, k, existing(cfg, "GPU-1", "old-uid", nil))
		p, _ := NewPods(client, cfg)
		if err := p.Start(context.Background(), daemonOf("GPU-1"), inUse); err != nil {
			t.Fatal(err)
		}
		created, deleted := k.calls()
		if len(created)+len(deleted) != 0 {
			t.Errorf("inUse %v: created %v, deleted %v; want the pod adopted", inUse, created, deleted)
		}
		if uid := getPod(t, client, cfg.PodName(keyOf("GPU-1"))).UID; uid != "old-uid" {
			t.Errorf("inUse %v: pod uid %s, want old-uid", inUse, uid)
		}
	}
}

// TestStartReplaces: a pod that ended is replaced even while in use (it
// serves nobody); one with another spec only when no client uses it.
func TestStartReplaces(t *testing.T) {
	cfg := testConfig(true)
	failed := func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed; p.Status.Reason = "Evicted" }
	outdated := func(p *corev1.Pod) { p.Annotations[AnnotationSpecHash] = "older" }
	for name, tc := range map[string]struct {
		mutate   func(*corev1.Pod)
		inUse    bool
		replaced bool
	}{
		"failed, in use":       {failed, true, true},
		"failed, unused":       {failed, false, true},
		"other spec, in use":   {outdated, true, false},
		"other spec, unused":   {outdated, false, true},
		"same spec, not ready": {func(p *corev1.Pod) { p.Status.Conditions = nil }, true, false},
	} {
		k := &kubelet{}
		client := newClient(t, k, existing(cfg, "GPU-1", "old-uid", tc.mutate))
		p, _ := NewPods(client, cfg)
		err := p.Start(context.Background(), daemonOf("GPU-1"), tc.inUse)
		created, deleted := k.calls()
		if tc.replaced {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			if diff := cmp.Diff([]string{cfg.PodName(keyOf("GPU-1"))}, created); diff != "" || len(deleted) != 1 {
				t.Errorf("%s: created %v, deleted %v; want replaced once", name, created, deleted)
			}
			if uid := getPod(t, client, cfg.PodName(keyOf("GPU-1"))).UID; uid == "old-uid" {
				t.Errorf("%s: pod not replaced", name)
			}
			continue
		}
		if len(created)+len(deleted) != 0 {
			t.Errorf("%s: created %v, deleted %v; want the pod kept", name, created, deleted)
		}
		if name == "same spec, not ready" {
			if err == nil {
				t.Errorf("%s: Start succeeded on a pod that is not Ready", name)
			}
		} else if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestStartWaitsForTerminatingPod: a pod being deleted is waited for and
// then created again (a create would fail with AlreadyExists before).
func TestStartWaitsForTerminatingPod(t *testing.T) {
	cfg := testConfig(true)
	k := &kubelet{}
	client := newClient(t, k, existing(cfg, "GPU-1", "old-uid", func(p *corev1.Pod) {
		p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		p.Finalizers = []string{"test/hold"}
	}))
	p, _ := NewPods(client, cfg)
	go func() {
		time.Sleep(50 * time.Millisecond)
		// The kubelet finishes the deletion.
		_ = client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), testNS, cfg.PodName(keyOf("GPU-1")))
	}()
	if err := p.Start(context.Background(), daemonOf("GPU-1"), true); err != nil {
		t.Fatal(err)
	}
	if created, _ := k.calls(); len(created) != 1 {
		t.Errorf("created %v, want the pod created again once", created)
	}
	if uid := getPod(t, client, cfg.PodName(keyOf("GPU-1"))).UID; uid == "old-uid" {
		t.Error("the terminating pod was taken for the daemon")
	}
}

// TestStopAndRunning: Running lists this node's daemon pods only; Stop
// deletes one and is idempotent.
func TestStopAndRunning(t *testing.T) {
	cfg := testConfig(true)
	other := cfg
	other.NodeName = "node-b"
	k := &kubelet{}
	unrelated := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: testNS, Labels: map[string]string{LabelComponent: ComponentValue}}}
	client := newClient(t, k, existing(cfg, "GPU-1", "u1", nil), existing(cfg, "GPU-2", "u2", nil), existing(other, "GPU-1", "u3", nil), unrelated)
	p, _ := NewPods(client, cfg)
	ctx := context.Background()
	running, err := p.Running(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]isolation.DaemonKey{keyOf("GPU-1"), keyOf("GPU-2")}, running); diff != "" {
		t.Errorf("running (-want +got):\n%s", diff)
	}
	for range 2 {
		if err := p.Stop(ctx, daemonOf("GPU-1")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.CoreV1().Pods(testNS).Get(ctx, cfg.PodName(keyOf("GPU-1")), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod of GPU-1 after Stop: %v", err)
	}
	if _, err := client.CoreV1().Pods(testNS).Get(ctx, other.PodName(keyOf("GPU-1")), metav1.GetOptions{}); err != nil {
		t.Errorf("the other node's pod: %v", err)
	}
	if cfg.PodName(keyOf("GPU-1")) == other.PodName(keyOf("GPU-1")) {
		t.Error("two nodes' daemon pods of the same GPU UUID share a name")
	}
}

// TestPluginRestartAdoptsDaemon: what the plugin does across a restart, with
// the real holder bookkeeping over daemon pods. A claim's daemon survives the
// plugin (the same pod, the same UID, no create and no delete), an orphan
// without holders goes, and the daemon goes after its last claim.
func TestPluginRestartAdoptsDaemon(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(true)
	k := &kubelet{}
	client := newClient(t, k, existing(cfg, "GPU-orphan", "orphan", nil))
	runner, _ := NewPods(client, cfg)

	root := t.TempDir()
	first := isolation.NewMPS(root, runner)
	for _, claim := range []types.UID{"a", "b"} {
		if _, err := first.Acquire(ctx, "GPU-1", testDomain, claim); err != nil {
			t.Fatal(err)
		}
	}
	uid := getPod(t, client, cfg.PodName(keyOf("GPU-1"))).UID

	// The plugin restarts: a new instance rebuilds the holders from its
	// checkpoint (claims a and b prepared) and may stop orphans.
	second := isolation.NewMPS(root, runner)
	if err := second.Restore(ctx, map[isolation.DaemonKey][]types.UID{keyOf("GPU-1"): {"a", "b"}}, true); err != nil {
		t.Fatal(err)
	}
	if got := getPod(t, client, cfg.PodName(keyOf("GPU-1"))).UID; got != uid {
		t.Errorf("daemon pod uid %s after the restart, want %s (adopted)", got, uid)
	}
	created, deleted := k.calls()
	if diff := cmp.Diff([]string{cfg.PodName(keyOf("GPU-1"))}, created); diff != "" {
		t.Errorf("created (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{cfg.PodName(keyOf("GPU-orphan"))}, deleted); diff != "" {
		t.Errorf("deleted (-want +got):\n%s", diff)
	}

	if err := second.Release(ctx, "GPU-1", testDomain, "a"); err != nil {
		t.Fatal(err)
	}
	getPod(t, client, cfg.PodName(keyOf("GPU-1")))
	if err := second.Release(ctx, "GPU-1", testDomain, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods(testNS).Get(ctx, cfg.PodName(keyOf("GPU-1")), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("daemon pod after the last release: %v, want it deleted", err)
	}
}

func TestNewPodsRefusesIncompleteConfig(t *testing.T) {
	client := fake.NewClientset()
	for name, tc := range map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"namespace":   {func(c *Config) { c.Namespace = "" }, "POD_NAMESPACE"},
		"image":       {func(c *Config) { c.Image = "" }, "--mps-image"},
		"driver root": {func(c *Config) { c.DriverRoot = ""; c.Mock = false }, "--mps-host-driver-root"},
	} {
		cfg := testConfig(true)
		tc.mutate(&cfg)
		if _, err := NewPods(client, cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewPods = %v, want an error naming %s", name, err, tc.want)
		}
	}
}
