//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-dev/tessera/deployments/helm/pluginflags"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/mpsdaemon"
)

// pluginTokenClient is a client with a token of the plugin's service
// account bound to pod, like the one the pod itself uses.
func pluginTokenClient(t *testing.T, c *framework.Cluster, pod *corev1.Pod) kubernetes.Interface {
	t.Helper()
	expiry := int64(600)
	tr, err := c.Client.CoreV1().ServiceAccounts(framework.InstallNamespace).CreateToken(context.Background(), pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &expiry,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s bound to pod %s: %v", framework.InstallNamespace, pod.Spec.ServiceAccountName, pod.Name, err)
	}
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerToken = tr.Status.Token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// installedDaemonConfig is the mpsdaemon.Config of the installed plugin on
// node, from the DaemonSet's flags, and the MPS root it uses.
func installedDaemonConfig(t *testing.T, ds *appsv1.DaemonSet, node string) (mpsdaemon.Config, string) {
	t.Helper()
	args := ds.Spec.Template.Spec.Containers[0].Args
	cfg, root := pluginflags.MPSDaemon(args, framework.InstallNamespace, node)
	if cfg.Image == "" {
		t.Fatalf("DaemonSet %s passes no --mps-image: %v", ds.Name, args)
	}
	return cfg, root
}

// TestPluginTokenMPSPods: the plugin's service account may create and delete
// pods in its namespace (RBAC), but the chart's ValidatingAdmissionPolicy
// admits only its own node's MPS control daemon pods as pkg/mpsdaemon builds
// them: a token bound to the plugin's pod may create the daemon pod the
// plugin would create (dry run), and is refused one for another node, one
// with a hostPath /etc, and the deletion of a pod that is not a daemon pod
// (the plugin's own) or of another node's daemon pod.
func TestPluginTokenMPSPods(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev")
	ctx := context.Background()
	pod, err := framework.PluginPod(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	node := pod.Spec.NodeName
	plugin := pluginTokenClient(t, c, pod)
	ds, err := c.Client.AppsV1().DaemonSets(framework.InstallNamespace).Get(ctx, framework.PluginDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, root := installedDaemonConfig(t, ds, node)
	daemon := func(change func(*corev1.Pod)) *corev1.Pod {
		p := cfg.Pod(isolation.NewMPS(root, nil).Daemon("GPU-e2e-policy-0000", "e2e-policy"))
		p.Name = "e2e-mps-policy"
		if change != nil {
			change(p)
		}
		return p
	}
	pods := plugin.CoreV1().Pods(framework.InstallNamespace)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	dryDelete := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}

	// The pod the plugin would create: admitted (dry run, nothing runs).
	if _, err := pods.Create(ctx, daemon(nil), dryRun); err != nil {
		t.Fatalf("the plugin's token may not create its node's MPS daemon pod (MPS shares would never start): %v", err)
	}
	t.Logf("own node %s: the daemon pod is admitted (dry run)", node)

	const other = "e2e-other-node"
	refused := func(what string, err error, want string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: admitted for the plugin's token", what)
			return
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: refused with %v; want the policy's message %q", what, err, want)
			return
		}
		t.Logf("%s: %v", what, err)
	}
	_, err = pods.Create(ctx, daemon(func(p *corev1.Pod) { p.Spec.NodeName = other }), dryRun)
	refused("create a daemon pod for another node", err,
		"the tessera kubelet plugin on node '"+node+"' may not create MPS control daemon pods of node '"+other+"'")
	_, err = pods.Create(ctx, daemon(func(p *corev1.Pod) {
		// The volume alone: a mount of it is refused first, by the rule
		// that pins each mount's path.
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "etc", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}})
	}), dryRun)
	refused("create a daemon pod with hostPath /etc", err, "(spec.volumes: etc hostPath /etc)")
	// A privileged, hostPID daemon whose loader runs the token holder's
	// library, or that opens a port on the node.
	_, err = pods.Create(ctx, daemon(func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "LD_PRELOAD", Value: "/dev/shm/x.so"}}
	}), dryRun)
	refused("create a daemon pod with LD_PRELOAD", err, "sets no environment variables, neither values nor from Secrets, ConfigMaps or fields: the plugin sets none (spec.containers[].env: LD_PRELOAD; envFrom)")
	_, err = pods.Create(ctx, daemon(func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 10250, HostPort: 10250}}
	}), dryRun)
	refused("create a daemon pod with a hostPort", err, "opens no host port")

	// Delete: the plugin's own pod is in the namespace and on its node, but
	// is not a daemon pod.
	err = pods.Delete(ctx, pod.Name, dryDelete)
	refused("delete a pod that is not an MPS daemon pod", err,
		"may delete only MPS control daemon pods (label app.kubernetes.io/component=mps-control-daemon), not pod "+pod.Name)

	// Another node's daemon pod (the admin creates it; bound to a node that
	// does not exist, it never runs).
	// It carries the other node's label, so this node's plugin never
	// counts it as its own.
	otherCfg := cfg
	otherCfg.NodeName = other
	foreignPod := otherCfg.Pod(isolation.NewMPS(root, nil).Daemon("GPU-e2e-policy-0000", "e2e-policy"))
	foreignPod.Name = "e2e-mps-policy-other-node"
	foreign, err := c.Client.CoreV1().Pods(framework.InstallNamespace).Create(ctx, foreignPod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("admin: create a daemon pod for %s: %v", other, err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = c.Client.CoreV1().Pods(framework.InstallNamespace).Delete(context.Background(), foreign.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	err = pods.Delete(ctx, foreign.Name, dryDelete)
	refused("delete another node's daemon pod", err,
		"the tessera kubelet plugin on node '"+node+"' may not delete MPS control daemon pods of node '"+other+"'")
}
