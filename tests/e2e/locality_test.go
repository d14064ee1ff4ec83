//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/json"

	"github.com/tessera-dev/tessera/pkg/locality"
	"github.com/tessera-dev/tessera/pkg/model"
)

// localityGroup is a set of share pods with the same GpuConfig locality.
type localityGroup struct {
	prefix string
	n      int
	memory string
	labels locality.Labels
}

// TestLocalityRulesUnderConcurrentScheduling: with locality.enabled, 24
// share pods with affinity, anti-affinity and exclusion labels, created at
// once on the 8-GPU mock node, are placed by kube-scheduler in parallel and
// judged by the locality controller before they bind. Every GPU's set of
// placed shares keeps every rule, and every pod runs: whatever GPUs the
// exclusion group ends up on (at most 3), 5 are left for the 5 anti-affinity
// replicas, and the 4 affinity stages fit on any one of them.
func TestLocalityRulesUnderConcurrentScheduling(t *testing.T) {
	c := needCluster(t)
	c.RequireDriver(t, "shared.gpu.tessera.dev")
	// Last, after the release's values are back: no fence may outlive the
	// test (the controller lifts its own when it stops; this is the net).
	t.Cleanup(func() {
		rules := c.Client.ResourceV1().DeviceTaintRules()
		list, err := rules.List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=tessera-locality"})
		if err != nil {
			t.Errorf("list fences: %v", err)
			return
		}
		for _, r := range list.Items {
			t.Errorf("fence %s outlived the locality controller", r.Name)
			_ = rules.Delete(context.Background(), r.Name, metav1.DeleteOptions{})
		}
	})
	before := timeToBind(t, c, "before")
	helmValues(t, c, map[string]any{"locality": map[string]any{"enabled": true}})
	waitLocalityVerdicts(t, c)
	after := timeToBind(t, c, "after")
	t.Logf("one unlabelled share on an idle node, creation to bound: %v without locality, %v with (the verdict's wait)",
		before.Round(100*time.Millisecond), after.Round(100*time.Millisecond))

	groups := []localityGroup{
		{prefix: "tenant", n: 3, memory: "16Gi", labels: locality.Labels{Exclusion: "tenant-a"}},
		{prefix: "replica", n: 5, memory: "8Gi", labels: locality.Labels{AntiAffinity: "replicas"}},
		{prefix: "stage", n: 4, memory: "8Gi", labels: locality.Labels{Affinity: "pipeline"}},
		{prefix: "plain", n: 12, memory: "8Gi"},
	}
	ns := c.Namespace(t, "e2e-locality")
	ctx := context.Background()
	var pods []string
	for _, g := range groups {
		for i := range g.n {
			name := fmt.Sprintf("%s-%d", g.prefix, i)
			if _, err := c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, localityClaim(t, name, g), metav1.CreateOptions{}); err != nil {
				t.Fatalf("create claim %s: %v", name, err)
			}
			pods = append(pods, name)
		}
	}
	// All pods at once: the scheduler places them while earlier ones still
	// wait for their verdict in PreBind.
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(pods))
	for _, name := range pods {
		wg.Go(func() {
			pod := EnvPod(name, name, false)
			var typed corev1.Pod
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(pod.Object, &typed); err != nil {
				errs <- err
				return
			}
			if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, &typed, metav1.CreateOptions{}); err != nil {
				errs <- fmt.Errorf("create pod %s: %w", name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Every pod runs; the wait is bounded and says which did not.
	running := map[string]bool{}
	err := Poll(ctx, "every locality pod to run", 120*time.Second, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, retry("%v", err)
		}
		var waiting []string
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning {
				running[p.Name] = true
			} else {
				waiting = append(waiting, p.Name+": "+stuck(&p))
			}
		}
		if len(waiting) > 0 {
			return false, retry("%d of %d pods not running: %s", len(waiting), len(pods), strings.Join(waiting, "; "))
		}
		return true, nil
	})
	elapsed := time.Since(start)

	// Whatever runs, nothing breaks a rule: every placed share in the
	// cluster, per GPU (other tests' shares count too).
	checkLocality(t, c)
	if err != nil {
		t.Fatalf("after %v: %v", elapsed.Round(time.Second), err)
	}
	t.Logf("%d pods created at once, all running after %v", len(pods), elapsed.Round(time.Second))
	logSchedulingLatency(t, c, ns)
	logVerdicts(t, c)

	// The demo spec on a node without them (on top of them, every GPU may
	// hold unlabelled shares, and the finance report, exclusive, rightly
	// finds no GPU): the replicas on two GPUs, the ETL stages on one, the
	// finance report on a GPU of its own group.
	c.deleteNamespace(t, ns)
	demoNS := c.Namespace(t, "e2e-locality-demo")
	demo := c.RunSpec(t, demoNS, specPath("85-locality.yaml"))
	device := func(pod string) string {
		p, ok := demo[pod]
		if !ok {
			t.Fatalf("demo pod %s did not run", pod)
		}
		return claimOf(t, c, p, "gpu").Result.Device
	}
	if a, b := device("llm-replica-0"), device("llm-replica-1"); a == b {
		t.Errorf("both LLM replicas (antiAffinity) on %s", a)
	}
	if a, b := device("etl-extract"), device("etl-load"); a != b {
		t.Errorf("ETL stages (affinity) on %s and %s", a, b)
	}
	t.Logf("demo: replicas on %s and %s, ETL on %s, finance on %s",
		device("llm-replica-0"), device("llm-replica-1"), device("etl-extract"), device("finance-report"))
	checkLocality(t, c)
}

// checkLocality fails the test when the placed shares of the cluster break
// a locality rule; it logs every GPU's shares.
func checkLocality(t *testing.T, c *Cluster) {
	t.Helper()
	ctx := context.Background()
	claims, lerr := c.Client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if lerr != nil {
		t.Fatal(lerr)
	}
	var placed []locality.Share
	perGPU := map[string][]string{}
	for i := range claims.Items {
		shares, perr := locality.Placed(&claims.Items[i])
		if perr != nil {
			t.Errorf("claim %s/%s: %v", claims.Items[i].Namespace, claims.Items[i].Name, perr)
		}
		placed = append(placed, shares...)
		for _, s := range shares {
			perGPU[s.GPU.Device] = append(perGPU[s.GPU.Device], fmt.Sprintf("%s%+v", s.Claim, s.Labels))
		}
	}
	gpus := make([]string, 0, len(perGPU))
	for g := range perGPU {
		gpus = append(gpus, g)
	}
	sort.Strings(gpus)
	for _, g := range gpus {
		t.Logf("%s: %s", g, strings.Join(perGPU[g], ", "))
	}
	if v := locality.Violations(placed); len(v) > 0 {
		t.Errorf("%d locality violations:\n%s", len(v), strings.Join(v, "\n"))
	}
}

// localityClaim is a ResourceClaim for one share with the group's memory and
// GpuConfig locality.
func localityClaim(t *testing.T, name string, g localityGroup) *resourceapi.ResourceClaim {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "locality": g.labels})
	if err != nil {
		t.Fatal(err)
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: "shared.gpu.tessera.dev",
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"memory": resource.MustParse(g.memory), "cores": resource.MustParse("5"),
				}},
			}}},
			Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: Driver, Parameters: runtime.RawExtension{Raw: raw}},
			}}},
		}},
	}
}

// waitLocalityVerdicts waits until every shared device of the driver carries
// the locality binding conditions (the plugin republished after its restart).
func waitLocalityVerdicts(t *testing.T, c *Cluster) {
	t.Helper()
	err := Poll(context.Background(), "shared devices to publish the locality binding conditions", PodTimeout, func(ctx context.Context) (bool, error) {
		slices_, err := c.DriverSlices(ctx)
		if err != nil {
			return false, retry("%v", err)
		}
		n := 0
		for _, s := range slices_ {
			for _, d := range s.Spec.Devices {
				if _, kind, err := model.ParseDevice(d.Name); err != nil || kind != model.KindShared {
					continue
				}
				if !slices.Contains(d.BindingConditions, model.LocalityAcceptedCondition) {
					return false, retry("device %s has binding conditions %v", d.Name, d.BindingConditions)
				}
				n++
			}
		}
		if n == 0 {
			return false, retry("no shared device published")
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// logSchedulingLatency logs, over the namespace's pods, the time from
// creation to PodScheduled (whole seconds, the API's resolution): with
// locality on it includes the wait for the verdict in PreBind.
func logSchedulingLatency(t *testing.T, c *Cluster, ns string) {
	list, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Logf("latency: %v", err)
		return
	}
	var secs []float64
	for _, p := range list.Items {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionTrue {
				secs = append(secs, cond.LastTransitionTime.Sub(p.CreationTimestamp.Time).Seconds())
			}
		}
	}
	if len(secs) == 0 {
		return
	}
	slices.Sort(secs)
	t.Logf("creation to PodScheduled over %d pods: median %.0fs, p90 %.0fs, max %.0fs",
		len(secs), secs[len(secs)/2], secs[len(secs)*9/10], secs[len(secs)-1])
}

// logVerdicts logs how many verdicts the locality controller's replicas
// wrote, accepted and rejected by reason (from their logs, --v=2).
func logVerdicts(t *testing.T, c *Cluster) {
	ctx := context.Background()
	list, err := c.Client.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=locality-controller"})
	if err != nil {
		t.Logf("verdicts: %v", err)
		return
	}
	counts := map[string]int{}
	for _, p := range list.Items {
		raw, err := c.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Logf("verdicts: log of %s: %v", p.Name, err)
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if !strings.Contains(line, "Locality verdict") {
				continue
			}
			switch {
			case strings.Contains(line, "accepted=true"):
				counts["accepted"]++
			default:
				_, reason, _ := strings.Cut(line, "reason=")
				reason, _, _ = strings.Cut(reason, " ")
				counts["rejected "+reason]++
			}
		}
	}
	t.Logf("locality verdicts written: %v", counts)
}

// timeToBind creates one unlabelled 8Gi share pod in a namespace of its own
// and returns the time from its creation until it is bound to the node (as
// this test sees it, polling), then deletes it.
func timeToBind(t *testing.T, c *Cluster, what string) time.Duration {
	t.Helper()
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-locality-"+what)
	if _, err := c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, localityClaim(t, "one", localityGroup{memory: "8Gi"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(EnvPod("one", "one", false).Object, &pod); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, &pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var took time.Duration
	err := Poll(ctx, "pod "+ns+"/one to be bound", PodTimeout, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "one", metav1.GetOptions{})
		if err != nil {
			return false, retry("%v", err)
		}
		if p.Spec.NodeName == "" {
			return false, retry("not bound: %s", stuck(p))
		}
		took = time.Since(start)
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeletePodAndWait(ctx, ns, "one"); err != nil {
		t.Logf("delete %s/one: %v", ns, err)
	}
	return took
}
