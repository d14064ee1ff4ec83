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

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/accounting"
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
	c := needDriver(t, "shared.gpu.tessera.dev")
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
	framework.HelmValues(t, c, map[string]any{"locality": map[string]any{"enabled": true}})
	waitLocalityVerdicts(t, c)
	after := timeToBind(t, c, "after")
	t.Logf("one unlabelled share on an idle node, creation to bound: %v without locality, %v with (the verdict's wait)",
		before.Round(100*time.Millisecond), after.Round(100*time.Millisecond))

	// An online placement that never moves an accepted share cannot
	// promise every share a GPU: unlabelled shares may fill the GPU of an
	// affinity group before its last stage arrives (seen: the group's GPU
	// held 9 shares of 8Gi, a tenth does not fit in 81089Mi). What must
	// hold is that no rule is broken and that no share waits while a GPU
	// would take it: a pod still pending after the wait fails the test
	// only when some GPU has the room and would accept its share. A pod
	// stuck that way is retried once in a fresh namespace, after its pods,
	// claims' verdicts, the fences and the controller's log are logged; a
	// second time fails the test.
	var ns string
	var pods []string
	for attempt := 1; ; attempt++ {
		var elapsed time.Duration
		var err error
		ns, pods, elapsed, err = runLocalityWorkload(t, c)
		// Whatever runs, nothing breaks a rule: every placed share in the
		// cluster, per GPU (other tests' shares count too).
		checkLocality(t, c)
		if err == nil {
			t.Logf("%d pods created at once, all running after %v", len(pods), elapsed.Round(time.Second))
			break
		}
		stuck, none := stuckWithPlacement(t, c, ns)
		if len(stuck) == 0 {
			t.Logf("after %v, the pods not running (%s) have no GPU left with the room that would accept them", elapsed.Round(time.Second), strings.Join(none, ", "))
			break
		}
		logLocalityStuck(t, c, ns)
		if attempt == 2 {
			t.Fatalf("after %v: pending while a GPU would take them: %s", elapsed.Round(time.Second), strings.Join(stuck, "; "))
		}
		t.Logf("attempt %d: after %v: pending while a GPU would take them: %s; retrying once in a fresh namespace",
			attempt, elapsed.Round(time.Second), strings.Join(stuck, "; "))
		c.DeleteNamespace(t, ns)
		waitNoFences(t, c)
	}
	logSchedulingLatency(t, c, ns)
	logVerdicts(t, c)
	controllerCannotForgeAttestation(t, c, ns, pods[0])

	// The demo spec on a node without them (on top of them, every GPU may
	// hold unlabelled shares, and the finance report, exclusive, rightly
	// finds no GPU): the replicas on two GPUs, the ETL stages on one, the
	// finance report on a GPU of its own group.
	c.DeleteNamespace(t, ns)
	demoNS := c.Namespace(t, "e2e-locality-demo")
	demo := c.RunSpec(t, demoNS, framework.SpecPath("85-locality.yaml"))
	device := func(pod string) string {
		p, ok := demo[pod]
		if !ok {
			t.Fatalf("demo pod %s did not run", pod)
		}
		return framework.ClaimOf(t, c, p, "gpu").Result.Device
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

// runLocalityWorkload creates the 24 labelled claims and their pods at once
// in a new namespace and waits (bounded) for every pod to run.
func runLocalityWorkload(t *testing.T, c *framework.Cluster) (string, []string, time.Duration, error) {
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
			pod := framework.EnvPod(name, name, false)
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
	err := framework.Poll(ctx, "every locality pod to run", 120*time.Second, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		var waiting []string
		for _, p := range list.Items {
			if p.Status.Phase != corev1.PodRunning {
				waiting = append(waiting, p.Name+": "+framework.Stuck(&p))
			}
		}
		if len(waiting) > 0 {
			return false, framework.Retry("%d of %d pods not running: %s", len(waiting), len(pods), strings.Join(waiting, "; "))
		}
		return true, nil
	})
	return ns, pods, time.Since(start), err
}

// stuckWithPlacement returns, for each pod of ns that does not run, the
// GPU that has the memory and cores its share asks for and would accept it
// next to the shares placed now (locality.Ledger); pods for which no GPU
// would are returned apart, by name. What is left of a GPU is its shared
// device's capacity less what every allocated claim of the cluster holds of
// it (pkg/accounting: a whole GPU holds all of it).
func stuckWithPlacement(t *testing.T, c *framework.Cluster, ns string) (stuck, none []string) {
	t.Helper()
	ctx := context.Background()
	slices_, err := c.DriverSlices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	capacity := map[accounting.GPU]accounting.Capacity{}
	var gpus []accounting.GPU
	for _, sl := range slices_ {
		for _, d := range sl.Spec.Devices {
			minor, kind, err := model.ParseDevice(d.Name)
			if err != nil || kind != model.KindShared {
				continue
			}
			g := accounting.GPU{Pool: sl.Spec.Pool.Name, Minor: minor}
			memory, cores := d.Capacity[model.Memory].Value, d.Capacity[model.Cores].Value
			capacity[g] = accounting.Capacity{MemoryBytes: memory.Value(), Cores: cores.Value()}
			gpus = append(gpus, g)
		}
	}
	claims, err := c.Client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ledger locality.Ledger
	var devices []accounting.Device
	for i := range claims.Items {
		cl := &claims.Items[i]
		if a := cl.Status.Allocation; a != nil {
			for _, r := range a.Devices.Results {
				if d, ok := accounting.FromResult(r); ok {
					devices = append(devices, d)
				}
			}
		}
		if shares, _ := locality.Placed(cl); len(shares) > 0 {
			ledger.Set(cl.UID, shares)
		}
	}
	used := accounting.Allocated(devices, func(g accounting.GPU) (accounting.Capacity, bool) {
		c, ok := capacity[g]
		return c, ok
	})
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning {
			continue
		}
		cl, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		req := cl.Spec.Devices.Requests[0].Exactly.Capacity.Requests
		var labels locality.Labels
		if err := json.Unmarshal(cl.Spec.Devices.Config[0].Opaque.Parameters.Raw, &struct {
			Locality *locality.Labels `json:"locality"`
		}{&labels}); err != nil {
			t.Fatal(err)
		}
		placeable := false
		for _, g := range gpus {
			room, u := capacity[g], used[g]
			memory, cores := req[model.Memory], req[model.Cores]
			if u.Whole || room.MemoryBytes-u.MemoryBytes < memory.Value() || room.Cores-u.Cores < cores.Value() {
				continue
			}
			device := locality.GPU{Pool: g.Pool, Device: model.SharedDeviceName(g.Minor)}
			share := locality.Share{Claim: ns + "/" + p.Name, UID: cl.UID, Namespace: ns, GPU: device, Labels: labels}
			if ledger.Judge(cl.UID, []locality.Share{share}).Accepted {
				stuck = append(stuck, fmt.Sprintf("%s fits on %s", p.Name, device))
				placeable = true
				break
			}
		}
		if !placeable {
			none = append(none, p.Name)
		}
	}
	return stuck, none
}

// waitNoFences waits (bounded) until the locality controller has lifted
// every fence.
func waitNoFences(t *testing.T, c *framework.Cluster) {
	t.Helper()
	err := framework.Poll(context.Background(), "the locality fences to be lifted", 90*time.Second, func(ctx context.Context) (bool, error) {
		list, err := c.Client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=tessera-locality"})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		if len(list.Items) > 0 {
			return false, framework.Retry("%d fences", len(list.Items))
		}
		return true, nil
	})
	if err != nil {
		t.Logf("%v", err)
	}
}

// controllerCannotForgeAttestation: the locality controller's service
// account may patch status.devices of any claim of the driver (the API
// server's per-driver check), but the chart's verdict policy refuses it a
// write that rewrites what the node reported there: the attestation of a
// running pod's share stays as the kubelet plugin wrote it.
func controllerCannotForgeAttestation(t *testing.T, c *framework.Cluster, ns, claimName string) {
	t.Helper()
	ctx := context.Background()
	claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	devices := claim.Status.DeepCopy().Devices
	i := slices.IndexFunc(devices, func(d resourceapi.AllocatedDeviceStatus) bool { return d.Data != nil })
	if i < 0 {
		t.Fatalf("claim %s/%s: no device entry with data to forge: %+v", ns, claimName, devices)
	}
	before := string(devices[i].Data.Raw)
	devices[i].Data = &runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuAttestation","enforced":["memory","cores"]}`)}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": claim.ResourceVersion, "uid": claim.UID},
		"status":   map[string]any{"devices": devices},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + framework.InstallNamespace + ":tessera-locality",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + framework.InstallNamespace, "system:authenticated"},
	}
	as, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = as.ResourceV1().ResourceClaims(ns).Patch(ctx, claimName, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err == nil || !strings.Contains(err.Error(), "changes only its verdict conditions") {
		t.Errorf("the locality controller rewriting the attestation of claim %s/%s: %v, want refused by the verdict policy", ns, claimName, err)
	} else {
		t.Logf("the locality controller rewriting a share's attestation: refused: %v", err)
	}
	after, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	j := slices.IndexFunc(after.Status.Devices, func(d resourceapi.AllocatedDeviceStatus) bool {
		return d.Driver == devices[i].Driver && d.Pool == devices[i].Pool && d.Device == devices[i].Device
	})
	if j < 0 || after.Status.Devices[j].Data == nil || string(after.Status.Devices[j].Data.Raw) != before {
		t.Errorf("claim %s/%s: the attestation changed after the refused patch", ns, claimName)
	}
}

// logLocalityStuck logs, for pods that do not run, the pod's conditions
// and events and its claim's allocation and verdicts, then the fences and
// the locality controller's logs.
func logLocalityStuck(t *testing.T, c *framework.Cluster, ns string) {
	t.Helper()
	ctx := context.Background()
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("list pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning {
			continue
		}
		t.Logf("%s", c.DescribePod(ctx, ns, p.Name))
		claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Logf("  claim: %v", err)
			continue
		}
		if a := claim.Status.Allocation; a != nil {
			for _, r := range a.Devices.Results {
				t.Logf("  claim allocated %s/%s", r.Pool, r.Device)
			}
		}
		for _, d := range claim.Status.Devices {
			for _, cond := range d.Conditions {
				t.Logf("  claim status %s: %s=%s %s %s", d.Device, cond.Type, cond.Status, cond.Reason, cond.Message)
			}
		}
	}
	rules, err := c.Client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, r := range rules.Items {
			t.Logf("DeviceTaintRule %s: %s %s/%s", r.Name, r.Spec.Taint.Key, ptr.Deref(r.Spec.DeviceSelector.Pool, ""), ptr.Deref(r.Spec.DeviceSelector.Device, ""))
		}
	}
	ctrl, err := c.Client.CoreV1().Pods(framework.InstallNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=locality-controller"})
	if err != nil {
		t.Logf("list locality controller pods: %v", err)
		return
	}
	for _, p := range ctrl.Items {
		log, err := c.PodLog(ctx, p.Namespace, p.Name, p.Spec.Containers[0].Name)
		if err != nil {
			t.Logf("log of %s: %v", p.Name, err)
			continue
		}
		lines := strings.Split(strings.TrimSpace(log), "\n")
		t.Logf("locality controller %s, last %d lines:\n%s", p.Name, min(len(lines), 80), strings.Join(lines[max(0, len(lines)-80):], "\n"))
	}
}

// checkLocality fails the test when the placed shares of the cluster break
// a locality rule; it logs every GPU's shares.
func checkLocality(t *testing.T, c *framework.Cluster) {
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
	return framework.Claim{Name: name, Memory: g.memory, Cores: "5", Config: string(raw)}.ResourceClaim()
}

// waitLocalityVerdicts waits until every shared device of the driver carries
// the locality binding conditions (the plugin republished after its restart).
func waitLocalityVerdicts(t *testing.T, c *framework.Cluster) {
	t.Helper()
	c.WaitForDevices(t, "shared devices to publish the locality binding conditions", func(d resourceapi.Device) (bool, error) {
		if _, kind, err := model.ParseDevice(d.Name); err != nil || kind != model.KindShared {
			return false, nil
		}
		if !slices.Contains(d.BindingConditions, model.LocalityAcceptedCondition) {
			return false, fmt.Errorf("binding conditions %v", d.BindingConditions)
		}
		return true, nil
	})
}

// logSchedulingLatency logs, over the namespace's pods, the time from
// creation to PodScheduled (whole seconds, the API's resolution): with
// locality on it includes the wait for the verdict in PreBind.
func logSchedulingLatency(t *testing.T, c *framework.Cluster, ns string) {
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
func logVerdicts(t *testing.T, c *framework.Cluster) {
	ctx := context.Background()
	list, err := c.Client.CoreV1().Pods(framework.InstallNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=locality-controller"})
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
func timeToBind(t *testing.T, c *framework.Cluster, what string) time.Duration {
	t.Helper()
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-locality-"+what)
	if _, err := c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, localityClaim(t, "one", localityGroup{memory: "8Gi"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(framework.EnvPod("one", "one", false).Object, &pod); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, &pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var took time.Duration
	err := framework.Poll(ctx, "pod "+ns+"/one to be bound", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "one", metav1.GetOptions{})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		if p.Spec.NodeName == "" {
			return false, framework.Retry("not bound: %s", framework.Stuck(p))
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
