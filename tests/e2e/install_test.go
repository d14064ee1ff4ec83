//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// admissionCase is a claim (or, with template, a claim template) with this
// GpuConfig and the refusal its creation must get.
type admissionCase struct {
	name      string
	gpuConfig string
	template  bool
	want      string // "" means admitted
}

// checkAdmission runs each case as a subtest: create makes its claim, and
// the API server's answer must be the refusal the case wants, or none.
func checkAdmission(t *testing.T, cases []admissionCase, create func(admissionCase) error) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := create(tc)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused, want it admitted: %v", err)
				}
				t.Logf("admitted: %s", tc.gpuConfig)
				return
			}
			if err == nil {
				t.Fatalf("created; want it refused with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("refused with\n  %v\nwant the message\n  %s", err, tc.want)
			}
			t.Logf("refused at create: %v", err)
		})
	}
}

// TestWebhookRejectsBadGpuConfig: a claim or claim template whose GpuConfig
// would fail at prepare is refused when it is created, and the user reads the
// field path and the reason; a good one is admitted.
func TestWebhookRejectsBadGpuConfig(t *testing.T) {
	c := needCluster(t)
	framework.RequireWebhook(t, c)
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-webhook")

	tests := []admissionCase{
		{
			name:      "typo",
			gpuConfig: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolaton":"MPS"}}`,
			want: `admission webhook "resourceclaims.gpu.tessera.dev" denied the request: ` +
				`spec.devices.config[0].opaque.parameters: invalid GpuConfig: sharing.isolaton: unknown field`,
		},
		{
			name:      "out-of-range",
			gpuConfig: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS","computeLimit":0}}`,
			want: `admission webhook "resourceclaims.gpu.tessera.dev" denied the request: ` +
				`spec.devices.config[0].opaque.parameters.sharing.computeLimit: Invalid value: 0: must be between 1 and 100`,
		},
		{
			name:      "env-injection",
			gpuConfig: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","env":{"LD_PRELOAD":"/host/evil.so"}}`,
			template:  true,
			want: `admission webhook "resourceclaimtemplates.gpu.tessera.dev" denied the request: ` +
				`spec.spec.devices.config[0].opaque.parameters: invalid GpuConfig: env: unknown field`,
		},
		{
			name:      "good",
			gpuConfig: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS","computeLimit":50}}`,
		},
		{
			name:      "good-template",
			gpuConfig: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","topology":{"nvlink":"Preferred"}}`,
			template:  true,
		},
	}
	checkAdmission(t, tests, func(tc admissionCase) error {
		return c.CreateClaim(ctx, ns, framework.Claim{Name: tc.name, Template: tc.template, Class: framework.SharedClass, Config: tc.gpuConfig})
	})
}

// TestPluginTokenCannotWriteOtherNodesSlices: a token of the plugin's service
// account, bound to the plugin's pod exactly like the one the pod uses, may
// write its own node's ResourceSlices but is refused another node's, by the
// chart's ValidatingAdmissionPolicy.
func TestPluginTokenCannotWriteOtherNodesSlices(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev")
	ctx := context.Background()
	plugin, node := pluginClient(t, c)

	slice := func(node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-vap-"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   framework.Driver,
				NodeName: &node,
				// The policy also pins the pool to the node's own.
				Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			},
		}
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	// Its own node: admitted (dry run, nothing is stored).
	if _, err := plugin.ResourceV1().ResourceSlices().Create(ctx, slice(node), dryRun); err != nil {
		t.Fatalf("the plugin's token may not create a slice of its own node %s: %v", node, err)
	}
	t.Logf("own node %s: create admitted (dry run)", node)

	// Another node: refused on create, and on update and delete of a slice an
	// admin created.
	const other = "e2e-other-node"
	want := fmt.Sprintf("the tessera kubelet plugin on node '%s' may not modify ResourceSlices of node '%s'", node, other)
	_, err := plugin.ResourceV1().ResourceSlices().Create(ctx, slice(other), dryRun)
	framework.CheckDenied(t, "create", err, want)

	existing := c.CreateSlice(ctx, t, slice(other))
	changed := existing.DeepCopy()
	changed.Spec.Pool.Generation++
	_, err = plugin.ResourceV1().ResourceSlices().Update(ctx, changed, metav1.UpdateOptions{})
	framework.CheckDenied(t, "update", err, want)
	err = plugin.ResourceV1().ResourceSlices().Delete(ctx, existing.Name, metav1.DeleteOptions{})
	framework.CheckDenied(t, "delete", err, want)
}

// TestAdminAccessNeedsLabelledNamespace: the 1.37 rule. A claim with
// adminAccess is refused in an ordinary namespace, and admitted, allocated and
// prepared by Tessera in one labelled resource.kubernetes.io/admin-access=true,
// where the container sees exactly that GPU, without limits.
func TestAdminAccessNeedsLabelledNamespace(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev")
	ctx := context.Background()
	spec := framework.Testdata(t, "admin-access.yaml")

	plain := c.Namespace(t, "e2e-admin-denied")
	data, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := framework.DecodeYAML(data)
	if err != nil {
		t.Fatal(err)
	}
	var claim resourceapi.ResourceClaim
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, &claim); err != nil {
		t.Fatal(err)
	}
	_, err = c.Client.ResourceV1().ResourceClaims(plain).Create(ctx, &claim, metav1.CreateOptions{})
	if err == nil {
		t.Fatalf("an adminAccess claim was admitted in namespace %s without the admin-access label", plain)
	}
	if !strings.Contains(err.Error(), "admin") {
		t.Fatalf("refused, but not for admin access: %v", err)
	}
	t.Logf("unlabelled namespace: %v", err)

	admin := c.Namespace(t, "e2e-admin")
	nsObj, err := c.Client.CoreV1().Namespaces().Get(ctx, admin, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["resource.kubernetes.io/admin-access"] = "true"
	if _, err := c.Client.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := c.RunSpec(t, admin, spec)
	got := pods["gpu-monitor"]
	devices, err := c.AllocatedDevices(ctx, admin, "gpu-monitor")
	if err != nil {
		t.Fatal(err)
	}
	if len(devices) != 1 || devices[0].Result.AdminAccess == nil || !*devices[0].Result.AdminAccess {
		t.Fatalf("allocation %+v: want one device with adminAccess", devices)
	}
	// Admin access sees the GPU and holds nothing: no limits.
	g := framework.WholeGPU(t, devices[0])
	framework.WantGPUs(t, "pod gpu-monitor", got.Env, g)
	t.Logf("labelled namespace: admin claim got %s, container sees %s", devices[0].Result.Device, g)
}

// TestQuotaRefusesSharesInRestrictedNamespace: the tenant-segregation demo
// (docs/security.md). A ResourceQuota of 0 devices of the shared class keeps a
// namespace to whole GPUs: a share is refused with the quota's message, a
// whole GPU is admitted.
func TestQuotaRefusesSharesInRestrictedNamespace(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-whole-only")
	data, err := os.ReadFile(framework.Testdata(t, "tenant-whole-gpus-only.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := framework.DecodeYAML(data)
	if err != nil {
		t.Fatal(err)
	}
	c.Apply(t, ns, objs[0]) // the ResourceQuota
	var share, whole resourceapi.ResourceClaim
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs[1].Object, &share); err != nil {
		t.Fatal(err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs[2].Object, &whole); err != nil {
		t.Fatal(err)
	}

	// A quota whose status the quota controller has not computed yet does not
	// stop anything: wait for status.hard, as an admin would before admitting
	// the tenant.
	const key = "shared.gpu.tessera.dev.deviceclass.resource.k8s.io/devices"
	err = framework.Poll(ctx, "quota whole-gpus-only to be computed", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		q, err := c.Client.CoreV1().ResourceQuotas(ns).Get(ctx, "whole-gpus-only", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_, ok := q.Status.Hard[key]
		return ok, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	const want = "exceeded quota: whole-gpus-only, requested: " + key + "=1, used: " + key + "=0, limited: " + key + "=0"
	// The API server's quota admission reads quotas from its own informer,
	// which may not have the computed status yet when the client sees it: a
	// share admitted in that window is deleted and created again, and the
	// quota must refuse within the bound.
	var refusal error
	admitted := 0
	err = framework.Poll(ctx, "the quota to refuse a share", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		created, err := c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, share.DeepCopy(), metav1.CreateOptions{})
		if err != nil {
			refusal = err
			return true, nil
		}
		admitted++
		return false, c.Client.ResourceV1().ResourceClaims(ns).Delete(ctx, created.Name, metav1.DeleteOptions{})
	})
	if err != nil {
		t.Fatalf("shares were admitted %d times in namespace %s under quota whole-gpus-only: %v", admitted, ns, err)
	}
	if admitted > 0 {
		t.Logf("the quota admitted %d shares before its status reached the API server's admission", admitted)
	}
	if !apierrors.IsForbidden(refusal) || !strings.Contains(refusal.Error(), want) {
		t.Fatalf("share refused with %v; want the quota's message %q", refusal, want)
	}
	t.Logf("share refused: %v", refusal)
	if _, err := c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, whole.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a whole-GPU claim was refused in the restricted namespace: %v", err)
	}
	t.Log("whole-GPU claim admitted")
}

// TestHelmUpgradeKeepsPreparedClaims: `helm upgrade` rolls the plugin
// DaemonSet (maxSurge: the new pod registers beside the old one). A pod whose
// claim the old plugin prepared keeps running through it, untouched, and a new
// pod's claim is prepared by the new plugin; deleting the old pod afterwards
// unprepares its claim through the new plugin (from the checkpoint).
func TestHelmUpgradeKeepsPreparedClaims(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	ctx := context.Background()
	helm := framework.HelmBinary(t)
	if out, err := exec.Command(helm, "status", "-n", framework.InstallNamespace, framework.InstallRelease).CombinedOutput(); err != nil {
		if os.Getenv("TESSERA_E2E_INSTALL") == "1" {
			t.Fatalf("helm status: %v\n%s", err, out)
		}
		t.Skipf("Tessera is not installed with helm as release %s/%s: %s", framework.InstallNamespace, framework.InstallRelease, out)
	}

	ns := c.Namespace(t, "e2e-upgrade")
	before := c.RunSpec(t, ns, framework.Testdata(t, "shared-claim.yaml"))["shared-claim"]
	oldPlugin, err := framework.PluginPod(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	ctrID := before.Pod.Status.ContainerStatuses[0].ContainerID

	// Count the plugin pods that run side by side during the rollout.
	var mu sync.Mutex
	most := 0
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watchCtx.Err() == nil {
			pods, err := c.Client.CoreV1().Pods(framework.InstallNamespace).List(watchCtx, metav1.ListOptions{LabelSelector: framework.PluginSelector})
			if err == nil {
				running := 0
				for _, p := range pods.Items {
					if p.Status.Phase == corev1.PodRunning {
						running++
					}
				}
				mu.Lock()
				most = max(most, running)
				mu.Unlock()
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()

	stamp := time.Now().UTC().Format("20060102T150405Z")
	start := time.Now()
	cmd := exec.Command(helm, "upgrade", framework.InstallRelease, filepath.Join(framework.RepoRoot, "deployments", "helm", "tessera"),
		"--namespace", framework.InstallNamespace, "--reuse-values",
		"--set-string", "kubeletPlugin.podAnnotations.tessera\\.dev/e2e-upgrade="+stamp,
		"--wait", "--timeout", "4m")
	out, err := cmd.CombinedOutput()
	stopWatch()
	<-watched
	if err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	t.Logf("helm upgrade --wait took %v", time.Since(start).Round(time.Second))

	newPlugin, err := framework.PluginPod(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if newPlugin.UID == oldPlugin.UID || newPlugin.Annotations["tessera.dev/e2e-upgrade"] != stamp {
		t.Fatalf("the plugin pod was not replaced: %s (uid %s) before, %s (uid %s) after", oldPlugin.Name, oldPlugin.UID, newPlugin.Name, newPlugin.UID)
	}
	mu.Lock()
	t.Logf("plugin pod %s replaced by %s; at most %d plugin pods ran at once", oldPlugin.Name, newPlugin.Name, most)
	mu.Unlock()

	// The old pod runs on, the same container, never restarted.
	now, err := c.Client.CoreV1().Pods(ns).Get(ctx, "shared-claim", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.Status.Phase != corev1.PodRunning || now.Status.ContainerStatuses[0].ContainerID != ctrID ||
		now.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("pod shared-claim after the upgrade: phase %s, container %s (was %s), restarts %d",
			now.Status.Phase, now.Status.ContainerStatuses[0].ContainerID, ctrID, now.Status.ContainerStatuses[0].RestartCount)
	}
	t.Logf("pod shared-claim still running, container %s, 0 restarts", framework.ShortID(ctrID))

	// A new pod is prepared by the new plugin.
	objs, err := framework.DecodeYAML(mustRead(t, framework.Testdata(t, "shared-claim.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		o.SetName(o.GetName() + "-after")
		if o.GetKind() == "Pod" {
			claims, _, _ := unstructured.NestedSlice(o.Object, "spec", "resourceClaims")
			for _, cl := range claims {
				cl.(map[string]any)["resourceClaimName"] = "share-after"
			}
			if err := unstructured.SetNestedSlice(o.Object, claims, "spec", "resourceClaims"); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.Apply(t, ns, objs...)
	after, err := c.WaitForPodRunning(ctx, ns, "shared-claim-after")
	if err != nil {
		t.Fatal(err)
	}
	log, err := c.WaitForLog(ctx, ns, after.Name, "ctr", framework.EnvDoneMarker)
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	env := framework.ParseEnv(log)
	devs, err := c.AllocatedDevices(ctx, ns, "share-after")
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 {
		t.Fatalf("claim share-after: %d devices allocated, want 1", len(devs))
	}
	g := framework.ShareGPU(t, devs[0], "20Gi", 25)
	framework.WantGPUs(t, "pod shared-claim-after", env, g)
	t.Logf("new pod shared-claim-after prepared after the upgrade: sees %s", g)

	// The claim the old plugin prepared is unprepared by the new one: its CDI
	// spec goes (checked when the test runs on the node).
	claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "share", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	specs := func() []string {
		m, _ := filepath.Glob(filepath.Join("/var/run/cdi", "*"+string(claim.UID)+"*.json"))
		return m
	}
	onNode := len(specs()) > 0
	// Gracefully (see DeletePodAndWait): the pod goes only once the kubelet
	// unprepared its claim, so the next test's claim on this GPU does not
	// meet a double grant.
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "shared-claim", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = framework.Poll(ctx, "pod shared-claim to be gone and its claim unprepared", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, "shared-claim", metav1.GetOptions{})
		if err == nil {
			return false, framework.Retry("pod still there")
		}
		if !apierrors.IsNotFound(err) {
			return false, err
		}
		if onNode && len(specs()) > 0 {
			return false, framework.Retry("CDI spec %v still there", specs())
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if onNode {
		t.Logf("pod shared-claim deleted; the new plugin unprepared claim %s (its CDI spec is gone)", claim.UID)
	} else {
		t.Log("pod shared-claim deleted (not on the node: CDI spec not checked)")
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
