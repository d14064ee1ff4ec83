//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/budget"
	"github.com/tessera-dev/tessera/pkg/legacy"
)

// TestBudget is issue 24's end-to-end check of namespace GPU budgets, with
// the release switched to budgets.enabled, webhook.legacyTranslation.enabled
// and deviceClasses.nvidiaGPU.create (restored at the end): a claim over a
// GPUBudget is refused with used and hard; 100 concurrent claim creations,
// with the reconciler forced to resync during them, never take a budget
// over hard (the claims that exist afterwards are counted); the claim of a
// translated pod is charged, a second one over the budget refused with the
// refusal in the pod's events; the claim kube-scheduler makes for a pod's
// plain nvidia.com/gpu is refused by a budget of 0 GPUs (the pod stays
// Pending, the refusal in its events) and, once the budget allows it,
// charged a whole GPU at its full memory, which the budget metrics show;
// and a GPUBudget with a negative limit is refused by the CRD's schema.
func TestBudget(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	framework.HelmUpgradeValues(t, c, map[string]any{
		"budgets":       map[string]any{"enabled": true},
		"webhook":       map[string]any{"legacyTranslation": map[string]any{"enabled": true}},
		"deviceClasses": map[string]any{"nvidiaGPU": map[string]any{"create": true}},
	}, false)
	c.RequireDriver(t, legacy.DeviceClassName)

	t.Run("OverBudgetRefused", func(t *testing.T) { budgetOverRefused(t, c) })
	t.Run("ConcurrentClaimsNeverExceed", func(t *testing.T) { budgetConcurrent(t, c) })
	t.Run("TranslatedPodCharged", func(t *testing.T) { budgetTranslatedPod(t, c) })
	t.Run("SchedulerClaimCharged", func(t *testing.T) { budgetSchedulerClaim(t, c) })
	t.Run("SchemaRejectsNegative", func(t *testing.T) { budgetSchemaRejects(t, c) })
	t.Run("SizeChangesBeforeAllocation", func(t *testing.T) { budgetSizeChanges(t, c) })
	t.Run("WebhookDownOutsideSelected", func(t *testing.T) { budgetWebhookDown(t, c) })
}

// budgetSizeChanges: the charged class's size changes between charge and
// allocation. A claim of a DeviceClass that matches no published device is
// charged the size the budget declares for it (spec.classSizes: 1Gi); the
// class is then changed to select whole GPUs, the claim is allocated one,
// and the budget counts it at the GPU's memory, refusing a later claim that
// only fits beside the declared size.
func budgetSizeChanges(t *testing.T, c *framework.Cluster) {
	ctx := context.Background()
	ns := budgetNamespace(t, c, "e2e-budget-size")
	className := ns + ".e2e.gpu.tessera.dev"
	selector := func(typ string) []resourceapi.DeviceSelector {
		return []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == %q`, typ)}}}
	}
	classes := c.Client.ResourceV1().DeviceClasses()
	if _, err := classes.Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: className},
		Spec: resourceapi.DeviceClassSpec{Selectors: selector("e2e-none")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = classes.Delete(context.Background(), className, metav1.DeleteOptions{}) })
	b := &configapi.GPUBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: configapi.SchemeGroupVersion.String(), Kind: configapi.GPUBudgetKind},
		ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: ns},
		Spec: configapi.GPUBudgetSpec{Hard: configapi.BudgetLimits{Memory: ptr.To(resource.MustParse("1000Gi"))},
			ClassSizes: []configapi.ClassSize{{DeviceClassName: className, Type: "gpu", Memory: resource.MustParse("1Gi")}}},
	}
	u, err := budget.ToUnstructured(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Dynamic.Resource(configapi.GPUBudgetResourceVersion).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := framework.Claim{Name: "late", Class: className, Labels: map[string]string{"tessera.dev/e2e": "true"}}
	err = framework.Poll(ctx, "the claim to be admitted", time.Minute, func(ctx context.Context) (bool, error) {
		if err := c.CreateClaim(ctx, ns, claim); err != nil {
			return false, framework.Retry("%v", err) // the budget is being counted
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := getBudget(ctx, c, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Pending) != 1 || got.Status.Pending[0].Charge.Memory.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Fatalf("pending %+v, want the claim charged the declared 1Gi", got.Status.Pending)
	}
	dc, err := classes.Get(ctx, className, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dc.Spec.Selectors = selector("gpu")
	if _, err := classes.Update(ctx, dc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Apply(t, ns, framework.EnvPod("late", "late", false))
	if _, err := c.WaitForPodRunning(ctx, ns, "late"); err != nil {
		t.Fatal(err)
	}
	var used resource.Quantity
	err = framework.Poll(ctx, "the budget to count the claim at its GPU's memory", time.Minute, func(ctx context.Context) (bool, error) {
		got, err := getBudget(ctx, c, ns)
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		used = got.Status.Used.Memory
		if used.Cmp(resource.MustParse("2Gi")) < 0 {
			return false, framework.Retry("used %s", used.String())
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("charged 1Gi at admission, counted %s once allocated a whole GPU", used.String())
	// A budget with room for 2Gi beside the declared 1Gi, not beside the GPU.
	hard := resource.MustParse("3Gi")
	if _, err := c.Dynamic.Resource(configapi.GPUBudgetResourceVersion).Namespace(ns).Patch(ctx, "gpu", types.MergePatchType,
		[]byte(fmt.Sprintf(`{"spec":{"hard":{"memory":%q}}}`, hard.String())), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForRefusal(t, c, ns, shareClaim("beside", "2Gi"))
}

// budgetWebhookDown: a GPUBudget in a namespace without the label the
// budget webhook selects by says it is not enforced; with both webhook
// replicas down (the Deployment scaled to 0), a claim in that namespace is
// still created, over its budget, and one in a selected namespace is
// refused (failurePolicy Fail); the replicas come back.
func budgetWebhookDown(t *testing.T, c *framework.Cluster) {
	ctx := context.Background()
	selected := budgetNamespace(t, c, "e2e-budget-down")
	createBudget(t, c, selected, "40Gi")
	waitForBudgets(t, c, selected, "50Gi")
	other := c.Namespace(t, "e2e-budget-unselected")
	createBudget(t, c, other, "1Gi")
	err := framework.Poll(ctx, "the unselected namespace's budget to say it is not enforced", time.Minute, func(ctx context.Context) (bool, error) {
		b, err := getBudget(ctx, c, other)
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		cond := meta.FindStatusCondition(b.Status.Conditions, configapi.BudgetEnforced)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != configapi.BudgetNotEnforced {
			return false, framework.Retry("conditions %+v", b.Status.Conditions)
		}
		t.Logf("not enforced: %s", cond.Message)
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}

	deployments := c.Client.AppsV1().Deployments(framework.InstallNamespace)
	dep, err := deployments.Get(ctx, "tessera-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	replicas := ptr.Deref(dep.Spec.Replicas, 1)
	selector, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	scale := func(n int32) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
		if _, err := deployments.Patch(ctx, dep.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	restore := func() {
		scale(replicas)
		err := framework.Poll(ctx, "the webhook's replicas to be ready again", 2*time.Minute, func(ctx context.Context) (bool, error) {
			d, err := deployments.Get(ctx, dep.Name, metav1.GetOptions{})
			if err != nil || d.Status.ReadyReplicas < replicas || d.Status.UpdatedReplicas < replicas {
				return false, framework.Retry("%v ready %d of %d", err, d.Status.ReadyReplicas, replicas)
			}
			return true, nil
		})
		if err != nil {
			t.Error(err)
		}
		// Ready replicas answer again: a dry run over the budget is refused.
		waitForBudgets(t, c, selected, "50Gi")
	}
	start := time.Now()
	scale(0)
	restored := false
	t.Cleanup(func() {
		if !restored {
			restore()
		}
	})
	err = framework.Poll(ctx, "the webhook's pods to be gone", time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(framework.InstallNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
		if err != nil || len(pods.Items) > 0 {
			return false, framework.Retry("%v, %d pods", err, len(pods.Items))
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	claims := c.Client.ResourceV1().ResourceClaims
	if _, err := claims(other).Create(ctx, shareClaim("outside", "2Gi"), metav1.CreateOptions{}); err != nil {
		t.Errorf("webhook down, a claim in a namespace the budget webhook does not select: %v, want created", err)
	}
	_, err = claims(selected).Create(ctx, shareClaim("inside", "1Gi"), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "budgets.gpu.tessera.dev") {
		t.Errorf("webhook down, a claim in a selected namespace: %v, want refused by budgets.gpu.tessera.dev's failurePolicy Fail", err)
	} else {
		t.Logf("refused with the webhook down: %v", err)
	}
	restore()
	restored = true
	t.Logf("down and back in %v", time.Since(start).Round(time.Second))
}

// budgetNamespace is a new namespace whose claims the budget webhook
// charges (labelled as budgets.namespaceSelector selects by default).
func budgetNamespace(t *testing.T, c *framework.Cluster, prefix string) string {
	t.Helper()
	ns := c.Namespace(t, prefix)
	enforceBudgets(t, c, ns)
	return ns
}

// enforceBudgets labels ns gpu.tessera.dev/budgets=enforced.
func enforceBudgets(t *testing.T, c *framework.Cluster, ns string) {
	t.Helper()
	patch := `{"metadata":{"labels":{"gpu.tessera.dev/budgets":"enforced"}}}`
	if _, err := c.Client.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// refusal is a budget's refusal in either of the forms the webhook gives:
// with used and hard (the review came from a verified API server) or
// without them (the webhook does not verify its callers).
type refusal [2]string

func budgetRefusal(ns, resource, used, charge, hard string) refusal {
	return refusal{
		fmt.Sprintf("GPU budget %s/gpu: %s: used %s + this claim %s > hard %s", ns, resource, used, charge, hard),
		fmt.Sprintf("GPU budget %s/gpu: %s: this claim (%s) would take the budget over spec.hard", ns, resource, charge),
	}
}

func (r refusal) in(message string) bool {
	return strings.Contains(message, r[0]) || strings.Contains(message, r[1])
}

// createBudget creates a GPUBudget "gpu" in ns capping memory, retrying
// while the CRD is not served yet.
func createBudget(t *testing.T, c *framework.Cluster, ns, memory string) {
	t.Helper()
	createBudgetLimits(t, c, ns, configapi.BudgetLimits{Memory: ptr.To(resource.MustParse(memory))})
}

// createBudgetLimits creates a GPUBudget "gpu" in ns with these limits,
// retrying while the CRD is not served yet.
func createBudgetLimits(t *testing.T, c *framework.Cluster, ns string, hard configapi.BudgetLimits) {
	t.Helper()
	b := &configapi.GPUBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: configapi.SchemeGroupVersion.String(), Kind: configapi.GPUBudgetKind},
		ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: ns},
		Spec:       configapi.GPUBudgetSpec{Hard: hard},
	}
	u, err := budget.ToUnstructured(b)
	if err != nil {
		t.Fatal(err)
	}
	err = framework.Poll(context.Background(), "create a GPUBudget", time.Minute, func(ctx context.Context) (bool, error) {
		if _, err := c.Dynamic.Resource(configapi.GPUBudgetResourceVersion).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return false, framework.Retry("%v", err)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func getBudget(ctx context.Context, c *framework.Cluster, ns string) (*configapi.GPUBudget, error) {
	u, err := c.Dynamic.Resource(configapi.GPUBudgetResourceVersion).Namespace(ns).Get(ctx, "gpu", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return budget.FromUnstructured(u)
}

// shareClaim is a claim for one share of memory and 1 core.
func shareClaim(name, memory string) *resourceapi.ResourceClaim {
	return framework.Claim{Name: name, Request: "share", Memory: memory, Cores: "1", Labels: map[string]string{"tessera.dev/e2e": "true"}}.ResourceClaim()
}

// waitForBudgets waits until the webhook refuses a claim over the budget
// of ns (a dry run): helm's --wait returns when the new replicas are
// ready, but an old one may still answer for a moment. Five in a row.
func waitForBudgets(t *testing.T, c *framework.Cluster, ns, over string) {
	t.Helper()
	waitForRefusal(t, c, ns, shareClaim("probe", over))
}

// waitForRefusal waits until five dry runs of probe in a row are refused
// by a GPU budget.
func waitForRefusal(t *testing.T, c *framework.Cluster, ns string, probe *resourceapi.ResourceClaim) {
	t.Helper()
	inARow := 0
	err := framework.Poll(context.Background(), "the webhook to enforce GPU budgets", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		_, err := c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), "GPU budget") || (!strings.Contains(err.Error(), "> hard") && !strings.Contains(err.Error(), "over spec.hard")) {
			inARow = 0
			return false, framework.Retry("dry run of claim %s: %v", probe.Name, err)
		}
		inARow++
		return inARow == 5, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// budgetOverRefused: 30Gi of a 40Gi budget is allowed, then 20Gi refused
// with used and hard; a dry run charges nothing.
func budgetOverRefused(t *testing.T, c *framework.Cluster) {
	ctx := context.Background()
	ns := budgetNamespace(t, c, "e2e-budget")
	createBudget(t, c, ns, "40Gi")
	waitForBudgets(t, c, ns, "50Gi")
	claims := c.Client.ResourceV1().ResourceClaims(ns)
	if _, err := claims.Create(ctx, shareClaim("a", "30Gi"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("30Gi of a 40Gi budget: %v", err)
	}
	_, err := claims.Create(ctx, shareClaim("b", "20Gi"), metav1.CreateOptions{})
	want := budgetRefusal(ns, "memory", "30Gi", "20Gi", "40Gi")
	if err == nil || !want.in(err.Error()) {
		t.Fatalf("20Gi more: %v, want refused with %q", err, want)
	}
	t.Logf("refused at creation: %v", err)
	b, err := getBudget(ctx, c, ns)
	if err != nil {
		t.Fatal(err)
	}
	if b.Status.Used.Memory.Cmp(resource.MustParse("30Gi")) != 0 {
		t.Errorf("status.used.memory %s after 30Gi admitted, the probes' dry runs and a refusal; want 30Gi", b.Status.Used.Memory.String())
	}
}

// budgetConcurrent: 100 claims of 1Gi created at once against a 37Gi
// budget while the resync annotation is changed every 100ms; afterwards the
// claims that exist take at most 37Gi, and once the reconciler has caught
// up status.used equals them with nothing pending.
func budgetConcurrent(t *testing.T, c *framework.Cluster) {
	ctx := context.Background()
	ns := budgetNamespace(t, c, "e2e-budget-race")
	createBudget(t, c, ns, "37Gi")
	waitForBudgets(t, c, ns, "38Gi")

	stop := make(chan struct{})
	resyncs := 0
	var resyncWG sync.WaitGroup
	resyncWG.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			resyncs++
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}}}`, configapi.GPUBudgetResyncAnnotation, resyncs)
			if _, err := c.Dynamic.Resource(configapi.GPUBudgetResourceVersion).Namespace(ns).Patch(ctx, "gpu", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Errorf("resync annotation: %v", err)
				return
			}
		}
	})

	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, refused, retried := 0, 0, 0
	var others []string
	start := time.Now()
	for i := range 100 {
		wg.Go(func() {
			// A budget that is busy or being counted answers 429 "retry":
			// retry as a controller would.
			var err error
			for range 10 {
				_, err = c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, shareClaim(fmt.Sprintf("c-%03d", i), "1Gi"), metav1.CreateOptions{})
				if err == nil || !strings.Contains(err.Error(), "retry in a few seconds") {
					break
				}
				mu.Lock()
				retried++
				mu.Unlock()
				time.Sleep(time.Second)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case strings.Contains(err.Error(), "> hard 37Gi") || strings.Contains(err.Error(), "over spec.hard"):
				refused++
			default:
				others = append(others, err.Error())
			}
		})
	}
	wg.Wait()
	close(stop)
	resyncWG.Wait()
	t.Logf("100 concurrent creations in %v with %d resync annotations: %d admitted, %d refused over budget, %d retries after busy, %d other errors %v",
		time.Since(start).Round(time.Millisecond), resyncs, admitted, refused, retried, len(others), others)
	if resyncs == 0 {
		t.Error("no resync annotation was written during the creations")
	}

	list, err := c.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var sum resource.Quantity
	for _, cl := range list.Items {
		sum.Add(cl.Spec.Devices.Requests[0].Exactly.Capacity.Requests["memory"])
	}
	if sum.Cmp(resource.MustParse("37Gi")) > 0 {
		t.Errorf("the %d claims that exist take %s memory, over the budget's 37Gi", len(list.Items), sum.String())
	}
	if len(list.Items) != admitted {
		t.Errorf("%d claims exist, %d were admitted", len(list.Items), admitted)
	}
	if len(others) > 0 {
		t.Errorf("%d creations failed for another reason than the budget: %v", len(others), others[0])
	} else if admitted != 37 {
		t.Errorf("%d admitted, want 37: a claim that fit was refused", admitted)
	}
	t.Logf("afterwards: %d claims exist, taking %s of 37Gi", len(list.Items), sum.String())

	// The reconciler catches up: used is what the claims take. Pending
	// charges stay in the ledger until their TTL passes, uncounted once the
	// reconciler's informer holds their claims.
	err = framework.Poll(ctx, "the reconciler to count the claims", time.Minute, func(ctx context.Context) (bool, error) {
		b, err := getBudget(ctx, c, ns)
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		if b.Status.Used.Memory.Cmp(sum) != 0 {
			return false, framework.Retry("used %s with %d pending, want %s", b.Status.Used.Memory.String(), len(b.Status.Pending), sum.String())
		}
		t.Logf("the reconciler counts %s with %d charges still in the ledger", b.Status.Used.Memory.String(), len(b.Status.Pending))
		return true, nil
	})
	if err != nil {
		t.Error(err)
	}
}

// budgetTranslatedPod: a HAMi vGPU pod (3000Mi share) in a translating
// namespace with a 4000Mi budget: the claim the resourceclaim controller
// makes from its template is charged; a second such pod's claim is refused,
// and the pod says why in its events.
func budgetTranslatedPod(t *testing.T, c *framework.Cluster) {
	ctx := context.Background()
	ns := translatingNamespace(t, c, "e2e-budget-legacy")
	enforceBudgets(t, c, ns)
	createBudget(t, c, ns, "4000Mi")
	waitForTranslation(t, c, ns)
	waitForBudgets(t, c, ns, "5000Mi")
	hami := legacySystemPods[0]
	createPod(t, t, c, ns, legacyPod("hami-1", hami.limits, hami.requests))
	err := framework.Poll(ctx, "the translated pod's claim to be charged", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		b, err := getBudget(ctx, c, ns)
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		if b.Status.Used.Memory.Cmp(resource.MustParse(hami.memory)) != 0 {
			return false, framework.Retry("used %s, want %s", b.Status.Used.Memory.String(), hami.memory)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}

	createPod(t, t, c, ns, legacyPod("hami-2", hami.limits, hami.requests))
	want := budgetRefusal(ns, "memory", "3000Mi", "3000Mi", "4000Mi")
	var seen string
	err = framework.Poll(ctx, "the second pod's event", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=hami-2"})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		var reasons []string
		for _, e := range events.Items {
			if want.in(e.Message) {
				seen = fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message)
				return true, nil
			}
			reasons = append(reasons, e.Reason)
		}
		return false, framework.Retry("events %v", reasons)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second HAMi pod's event: %s", seen)
	pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, "hami-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodPending || len(pod.Status.ResourceClaimStatuses) != 0 {
		t.Errorf("second pod: phase %s, claims %+v; want Pending without a claim", pod.Status.Phase, pod.Status.ResourceClaimStatuses)
	}
}

// wholeGPUClaim is a claim for one whole GPU of the class that serves
// nvidia.com/gpu.
func wholeGPUClaim(name string) *resourceapi.ResourceClaim {
	return framework.Claim{Name: name, Class: legacy.DeviceClassName, Labels: map[string]string{"tessera.dev/e2e": "true"}}.ResourceClaim()
}

// budgetMetricsURL is the webhook's budget metrics: on the local cluster
// the webhook runs in the host's network namespace on 127.0.0.1
// (demo/clusters/local/overlay/values.yaml) and serves them over HTTPS on
// the chart's budgets.metrics.port, 9479; scrapeMetrics sends a token.
func budgetMetricsURL() string {
	if u := os.Getenv("TESSERA_E2E_BUDGET_METRICS_URL"); u != "" {
		return u
	}
	return "https://127.0.0.1:9479/metrics"
}

// budgetSchedulerClaim: in a namespace whose GPUBudget allows 0 whole
// GPUs, a pod asking for plain nvidia.com/gpu: 1 (served by the
// extendedResourceName of nvidia-gpu.gpu.tessera.dev) is admitted, but the
// claim kube-scheduler makes for it is refused by the budget webhook: the
// pod stays Pending with no claim in its namespace, and its events carry
// the refusal. With the budget raised to 1 GPU a later try of the
// scheduler succeeds: the pod runs on a whole GPU, status.used counts 1
// GPU, 100 cores and the GPU's full memory, and the webhook's budget
// metrics say the same.
func budgetSchedulerClaim(t *testing.T, c *framework.Cluster) {
	ctx := context.Background()
	ns := budgetNamespace(t, c, "e2e-budget-gpu")
	createBudgetLimits(t, c, ns, configapi.BudgetLimits{GPUs: ptr.To[int64](0)})
	waitForRefusal(t, c, ns, wholeGPUClaim("probe"))

	createPod(t, t, c, ns, legacyPod("gpu", map[string]string{legacy.NvidiaGPU: "1"}, nil))
	want := budgetRefusal(ns, "gpus", "0", "1", "0")
	var seen string
	var messages []string
	err := framework.Poll(ctx, "the budget's refusal in the pod's events", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=gpu"})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		messages = messages[:0]
		for _, e := range events.Items {
			if want.in(e.Message) {
				seen = fmt.Sprintf("%s %s (%s%s): %s", e.Type, e.Reason, e.Source.Component, e.ReportingController, e.Message)
				return true, nil
			}
			messages = append(messages, e.Reason+": "+e.Message)
		}
		return false, framework.Retry("events %q", messages)
	})
	claims, lerr := c.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if lerr != nil {
		t.Fatal(lerr)
	}
	if err != nil {
		// Not refused: say what the scheduler made instead.
		for _, cl := range claims.Items {
			t.Logf("claim %s (annotations %v): requests %+v, allocated %v", cl.Name, cl.Annotations, cl.Spec.Devices.Requests, cl.Status.Allocation != nil)
		}
		t.Fatalf("%v; events %q", err, messages)
	}
	t.Logf("nvidia.com/gpu: 1 under a budget of 0 GPUs: %s", seen)
	pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, "gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodPending || pod.Status.ExtendedResourceClaimStatus != nil || len(claims.Items) != 0 {
		t.Errorf("pod: phase %s, extendedResourceClaimStatus %+v, %d claims in the namespace; want Pending without a claim",
			pod.Status.Phase, pod.Status.ExtendedResourceClaimStatus, len(claims.Items))
	}
	b, err := getBudget(ctx, c, ns)
	if err != nil {
		t.Fatal(err)
	}
	if b.Status.Used.GPUs != 0 {
		t.Errorf("status.used.gpus %d after the refusal, want 0", b.Status.Used.GPUs)
	}

	// Room for one GPU: the scheduler's next try is admitted and charged.
	raised := time.Now()
	if _, err := c.Dynamic.Resource(configapi.GPUBudgetResourceVersion).Namespace(ns).Patch(ctx, "gpu", types.MergePatchType,
		[]byte(`{"spec":{"hard":{"gpus":1}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	sp, err := c.WaitForEnvPod(ctx, ns, "gpu")
	if err != nil {
		t.Fatal(err)
	}
	framework.LogSpecPod(t, sp)
	t.Logf("the pod ran %v after the budget was raised to 1 GPU", time.Since(raised).Round(time.Second))
	checkDevicePluginPod(t, c, sp)
	ers := sp.Pod.Status.ExtendedResourceClaimStatus
	if ers == nil {
		t.FailNow()
	}
	devs, err := c.AllocatedDevices(ctx, ns, ers.ResourceClaimName)
	if err != nil || len(devs) != 1 {
		t.Fatalf("claim %s: devices %+v, %v", ers.ResourceClaimName, devs, err)
	}
	memory := devs[0].Device.Capacity["memory"].Value
	if memory.IsZero() {
		t.Fatalf("device %s publishes no memory capacity", devs[0].Result.Device)
	}
	err = framework.Poll(ctx, "the budget to count the scheduler's claim", time.Minute, func(ctx context.Context) (bool, error) {
		b, err := getBudget(ctx, c, ns)
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		u := b.Status.Used
		if u.GPUs != 1 || u.Cores != 100 || u.Memory.Cmp(memory) != 0 {
			return false, framework.Retry("used %s memory, %d cores, %d GPUs with %d pending; want %s, 100, 1",
				u.Memory.String(), u.Cores, u.GPUs, len(b.Status.Pending), memory.String())
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("status.used: 1 GPU, 100 cores, %s (device %s's memory capacity)", memory.String(), devs[0].Result.Device)

	// The budget metrics of the replica that serves them (on the host
	// network one replica holds the port).
	var series []string
	err = framework.Poll(ctx, "the budget metrics to show the charge", time.Minute, func(ctx context.Context) (bool, error) {
		samples, err := scrapeMetrics(ctx, budgetMetricsURL())
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		got := map[string]float64{}
		series = series[:0]
		for _, s := range samples {
			if s.labels["namespace"] == ns && s.labels["budget"] == "gpu" {
				got[s.name+"/"+s.labels["resource"]] = s.value
				series = append(series, fmt.Sprintf("%s{resource=%q} %g", s.name, s.labels["resource"], s.value))
			}
		}
		wantSeries := map[string]float64{
			"tessera_gpu_budget_used/gpus": 1, "tessera_gpu_budget_hard/gpus": 1,
			"tessera_gpu_budget_used/cores": 100, "tessera_gpu_budget_used/memory": float64(memory.Value()),
		}
		for k, v := range wantSeries {
			if got[k] != v {
				return false, framework.Retry("%s = %g, want %g (series %v)", k, got[k], v, series)
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("budget metrics at %s: %v", budgetMetricsURL(), series)
}

// budgetSchemaRejects: the CRD's schema refuses a GPUBudget with a negative
// limit at creation (memory as a quantity string or an integer, gpus), and
// accepts the same budget with 1Gi.
func budgetSchemaRejects(t *testing.T, c *framework.Cluster) {
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-budget-schema")
	budgets := c.Dynamic.Resource(configapi.GPUBudgetResourceVersion).Namespace(ns)
	obj := func(hard map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": configapi.SchemeGroupVersion.String(),
			"kind":       configapi.GPUBudgetKind,
			"metadata":   map[string]any{"name": "gpu"},
			"spec":       map[string]any{"hard": hard},
		}}
	}
	create := func(hard map[string]any) error {
		var err error
		perr := framework.Poll(ctx, "the GPUBudget CRD to be served", time.Minute, func(ctx context.Context) (bool, error) {
			_, err = budgets.Create(ctx, obj(hard), metav1.CreateOptions{})
			if apierrors.IsNotFound(err) {
				return false, framework.Retry("%v", err)
			}
			return true, nil
		})
		if perr != nil {
			t.Fatal(perr)
		}
		return err
	}
	for _, tc := range []struct {
		name  string
		hard  map[string]any
		field string
	}{
		{"memory -1Gi", map[string]any{"memory": "-1Gi"}, "spec.hard.memory"},
		{"memory -1", map[string]any{"memory": int64(-1)}, "spec.hard.memory"},
		{"gpus -1", map[string]any{"gpus": int64(-1)}, "spec.hard.gpus"},
	} {
		err := create(tc.hard)
		if err == nil {
			t.Errorf("a GPUBudget with %s was created", tc.name)
			if err := budgets.Delete(ctx, "gpu", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("a GPUBudget with %s: %v; want Invalid naming %s", tc.name, err, tc.field)
			continue
		}
		t.Logf("%s refused: %v", tc.name, err)
	}
	if err := create(map[string]any{"memory": "1Gi"}); err != nil {
		t.Errorf("a GPUBudget with memory 1Gi: %v", err)
	}
}
