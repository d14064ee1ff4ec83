package doctor

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"
)

func pluginPod(name, node string, created time.Time, ready bool, phase corev1.PodPhase) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	l, _ := labels.ConvertSelectorToLabelsMap(PluginSelector)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "tessera", Labels: l, CreationTimestamp: metav1.NewTime(created)},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func TestPluginPod(t *testing.T) {
	now := time.Now()
	other := pluginPod("other-driver", "a", now, true, corev1.PodRunning)
	other.Labels = map[string]string{"app.kubernetes.io/name": "nvidia-dra-driver", "app.kubernetes.io/component": "kubelet-plugin"}
	client := fake.NewClientset(
		pluginPod("plugin-a-old", "a", now.Add(-time.Hour), true, corev1.PodRunning),
		pluginPod("plugin-a-surge", "a", now, false, corev1.PodRunning),
		pluginPod("plugin-b", "b", now, true, corev1.PodRunning),
		pluginPod("plugin-c", "c", now, false, corev1.PodPending),
		other,
	)
	ctx := context.Background()
	for _, tc := range []struct {
		node, namespace, want, err string
	}{
		// The Ready one of a surge update, though older.
		{node: "a", want: "plugin-a-old"},
		{node: "b", namespace: "tessera", want: "plugin-b"},
		{node: "b", namespace: "elsewhere", err: "no running kubelet plugin pod (" + PluginSelector + ") on node b in namespace elsewhere"},
		{node: "c", err: "on node c in any namespace: is the node selected"},
		{err: "runs on 2 nodes (a, b): name one"},
	} {
		pod, err := PluginPod(ctx, client, tc.node, tc.namespace, PluginSelector)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("node %q: err %v, want %q", tc.node, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("node %q: %v", tc.node, err)
		case tc.err == "" && pod.Name != tc.want:
			t.Errorf("node %q: pod %s, want %s", tc.node, pod.Name, tc.want)
		}
	}
	// One node: no need to name it.
	single := fake.NewClientset(pluginPod("plugin-b", "b", now, true, corev1.PodRunning))
	if pod, err := PluginPod(ctx, single, "", "", PluginSelector); err != nil || pod.Name != "plugin-b" {
		t.Errorf("single node: %v, %v", pod, err)
	}
}

func TestKubectlExecArgs(t *testing.T) {
	pod := pluginPod("plugin-b", "b", time.Now(), true, corev1.PodRunning)
	got := strings.Join(KubectlExecArgs(pod, "json", "/tmp/kc", "ctx"), " ")
	want := "--kubeconfig /tmp/kc --context ctx exec --namespace tessera plugin-b --container plugin -- tessera-kubelet-plugin doctor --output json"
	if got != want {
		t.Errorf("args\n got %s\nwant %s", got, want)
	}
	if got := strings.Join(KubectlExecArgs(pod, "table", "", ""), " "); !strings.HasPrefix(got, "exec --namespace tessera") {
		t.Errorf("without kubeconfig and context: %s", got)
	}
}
