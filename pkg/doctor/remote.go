package doctor

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

// PluginSelector selects the chart's kubelet plugin pods (the labels of
// the chart's tessera.pluginSelector, without the release).
const PluginSelector = "app.kubernetes.io/name=tessera,app.kubernetes.io/component=kubelet-plugin"

// PluginContainer is the plugin's container in the chart's DaemonSet.
const PluginContainer = "plugin"

// PluginPod finds the kubelet plugin pod to run doctor in: the one on node
// (any node when node is empty, if there is only one), in namespace (all
// namespaces when empty), matching selector. Of the pods of a surge update
// the Ready one that started last is taken.
func PluginPod(ctx context.Context, client kubernetes.Interface, node, namespace, selector string) (*corev1.Pod, error) {
	opts := metav1.ListOptions{LabelSelector: selector}
	if node != "" {
		opts.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}
	list, err := client.CoreV1().Pods(namespace).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("list the kubelet plugin pods (%s): %w", selector, err)
	}
	pods := slices.DeleteFunc(list.Items, func(p corev1.Pod) bool {
		// The field selector again: not every API (fakes) applies it.
		return p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || (node != "" && p.Spec.NodeName != node)
	})
	where := "in any namespace"
	if namespace != "" {
		where = "in namespace " + namespace
	}
	if len(pods) == 0 {
		if node == "" {
			return nil, fmt.Errorf("no running kubelet plugin pod (%s) %s", selector, where)
		}
		return nil, fmt.Errorf("no running kubelet plugin pod (%s) on node %s %s: is the node selected by the chart's kubeletPlugin.affinity/nodeSelector?", selector, node, where)
	}
	if node == "" {
		nodes := map[string]bool{}
		for _, p := range pods {
			nodes[p.Spec.NodeName] = true
		}
		if len(nodes) > 1 {
			names := make([]string, 0, len(nodes))
			for n := range nodes {
				names = append(names, n)
			}
			slices.Sort(names)
			return nil, fmt.Errorf("the kubelet plugin runs on %d nodes (%s): name one", len(names), strings.Join(names, ", "))
		}
	}
	slices.SortFunc(pods, func(a, b corev1.Pod) int {
		if ra, rb := ready(&a), ready(&b); ra != rb {
			if ra {
				return -1
			}
			return 1
		}
		return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
	})
	return &pods[0], nil
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// KubectlExecArgs are the kubectl arguments that run doctor in the plugin
// pod with this output format; kubeconfig and context are passed on when
// set.
func KubectlExecArgs(pod *corev1.Pod, output, kubeconfig, context string) []string {
	var args []string
	if kubeconfig != "" {
		args = append(args, "--kubeconfig", kubeconfig)
	}
	if context != "" {
		args = append(args, "--context", context)
	}
	return append(args, "exec", "--namespace", pod.Namespace, pod.Name, "--container", PluginContainer, "--",
		"tessera-kubelet-plugin", "doctor", "--output", output)
}
