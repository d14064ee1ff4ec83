//go:build e2e

package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// What install.sh installs: the kubelet plugin DaemonSet, and where its pod
// keeps its state on the node.
var (
	PluginNamespace = "tessera"
	PluginDaemonSet = "tessera-kubelet-plugin"
	// CDIDir is the plugin's --cdi-root: one spec per prepared claim,
	// k8s.gpu.tessera.dev-claim_<claim uid>.json.
	CDIDir = "/var/run/cdi"
	// CheckpointFile is <--plugin-data-dir>/checkpoint.json.
	CheckpointFile = "/var/lib/kubelet/plugins/gpu.tessera.dev/checkpoint.json"
)

// CDISpecPath is the CDI spec the plugin writes for a prepared claim.
func CDISpecPath(claimUID types.UID) string {
	return filepath.Join(CDIDir, "k8s.gpu.tessera.dev-claim_"+string(claimUID)+".json")
}

// TesseraCDISpecs lists the plugin's CDI spec files on this host.
func TesseraCDISpecs() ([]string, error) {
	return filepath.Glob(filepath.Join(CDIDir, "k8s.gpu.tessera.dev-claim_*.json"))
}

// CheckpointClaim is the part of a checkpoint entry the tests read
// (pkg/checkpoint.Claim).
type CheckpointClaim struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	State     string    `json:"state"`
	Devices   []struct {
		Device string `json:"device"`
		UUID   string `json:"uuid"`
	} `json:"devices"`
}

// ReadCheckpoint reads the plugin's checkpoint on this host: its claims by UID.
func ReadCheckpoint() (map[types.UID]CheckpointClaim, error) {
	data, err := os.ReadFile(CheckpointFile)
	if err != nil {
		return nil, err
	}
	var file struct {
		Version string                        `json:"version"`
		Claims  map[types.UID]CheckpointClaim `json:"claims"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", CheckpointFile, err)
	}
	if file.Version == "" {
		return nil, fmt.Errorf("%s: no version: not a Tessera checkpoint", CheckpointFile)
	}
	if file.Claims == nil {
		file.Claims = map[types.UID]CheckpointClaim{}
	}
	return file.Claims, nil
}

// RequireNodeFiles skips the test when it does not run on the node whose
// plugin state (checkpoint, CDI specs) it would read; when the suite started
// the local cluster itself, that is a failure.
func RequireNodeFiles(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(CheckpointFile); err != nil {
		if os.Getenv("TESSERA_E2E_START") == "1" {
			t.Fatalf("the local cluster's plugin checkpoint: %v", err)
		}
		t.Skipf("not on the node (%v): the plugin's checkpoint and CDI specs cannot be read", err)
	}
}

// PluginPods returns the pods of the plugin DaemonSet, by its own selector.
func (c *Cluster) PluginPods(ctx context.Context) ([]corev1.Pod, error) {
	ds, err := c.Client.AppsV1().DaemonSets(PluginNamespace).Get(ctx, PluginDaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return nil, err
	}
	pods, err := c.Client.CoreV1().Pods(PluginNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	return pods.Items, nil
}

// podReady reports whether the pod is Running with condition Ready=True and not
// being deleted.
func ReadyPod(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ReadyPluginPod returns the one Ready plugin pod, waiting (bounded) until
// exactly one runs and the DaemonSet counts it available.
func (c *Cluster) ReadyPluginPod(ctx context.Context) (*corev1.Pod, error) {
	var ready *corev1.Pod
	err := Poll(ctx, "one Ready pod of DaemonSet "+PluginNamespace+"/"+PluginDaemonSet, PodTimeout, func(ctx context.Context) (bool, error) {
		pods, err := c.PluginPods(ctx)
		if err != nil {
			return false, Retry("%v", err)
		}
		ready = nil
		for i := range pods {
			if !ReadyPod(&pods[i]) {
				return false, Retry("pod %s: phase %s, deleting %v", pods[i].Name, pods[i].Status.Phase, pods[i].DeletionTimestamp != nil)
			}
			ready = &pods[i]
		}
		if len(pods) != 1 {
			return false, Retry("%d plugin pods", len(pods))
		}
		ds, err := c.Client.AppsV1().DaemonSets(PluginNamespace).Get(ctx, PluginDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, Retry("%v", err)
		}
		if !daemonSetAvailable(ds) {
			return false, Retry("DaemonSet: %d desired, %d available", ds.Status.DesiredNumberScheduled, ds.Status.NumberAvailable)
		}
		return true, nil
	})
	return ready, err
}

func daemonSetAvailable(ds *appsv1.DaemonSet) bool {
	return ds.Status.ObservedGeneration >= ds.Generation &&
		ds.Status.DesiredNumberScheduled > 0 &&
		ds.Status.NumberAvailable == ds.Status.DesiredNumberScheduled &&
		ds.Status.NumberUnavailable == 0
}

// WaitPluginReplaced waits until the plugin pod old is gone and another one
// is Ready.
func (c *Cluster) WaitPluginReplaced(ctx context.Context, old types.UID) error {
	err := Poll(ctx, "plugin pod "+string(old)+" to be gone", PodTimeout, func(ctx context.Context) (bool, error) {
		pods, err := c.PluginPods(ctx)
		if err != nil {
			return false, Retry("%v", err)
		}
		for _, p := range pods {
			if p.UID == old {
				return false, Retry("still there (phase %s)", p.Status.Phase)
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	_, err = c.ReadyPluginPod(ctx)
	return err
}
