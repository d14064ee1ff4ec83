package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// Config says what Bench measures.
type Config struct {
	// Client talks to the cluster; give it a high QPS (the benchmark's own client
	// must not be what limits the rate).
	Client kubernetes.Interface
	// Nodes are the cluster sizes, in the order measured (fake nodes are added or
	// removed between sizes).
	Nodes []int
	// Workloads are names from WorkloadNames; empty means all.
	Workloads []string
	// Pods is the pods per run; 0 means PodsForNodes.
	Pods int
	// Profile is the mock node profile of the fake nodes (hgx-h100: 8 GPUs).
	Profile string
	// Namespace holds the pods and claim templates; created if missing.
	Namespace string
	// Workers is how many create requests are in flight at once.
	Workers int
	// Stall ends a run when no pod was bound for this long (an unschedulable
	// workload); Cleanup bounds the wait for a run's pods and claims to go.
	Stall, Cleanup time.Duration
	// Log receives one line per step; nil discards them.
	Log io.Writer
	// Load returns the host's 1-minute load average; nil records 0.
	Load func() float64
	// Processes are the pids, by name, whose CPU time each run records
	// (kube-scheduler, kube-apiserver, …).
	Processes map[string]int
}

func (c *Config) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, time.Now().UTC().Format("15:04:05 ")+format+"\n", args...)
	}
}

// Bench measures every workload at every cluster size and returns the results in
// that order. For each size it scales the fake nodes (EnsureNodes), then runs each
// workload once on the empty cluster: it creates the pods, measures each one's
// create→bound latency with a watch, and deletes the pods and their claims again,
// waiting until the claims are gone so the next workload finds every device free.
// A run whose pods stop being bound is reported with Err set, and Bench goes on.
func Bench(ctx context.Context, cfg Config) ([]Result, error) {
	all := Workloads(cfg.Namespace)
	var chosen []Workload
	for _, w := range all {
		if len(cfg.Workloads) == 0 || slices.Contains(cfg.Workloads, w.Name) {
			chosen = append(chosen, w)
		}
	}
	for _, name := range cfg.Workloads {
		if !slices.Contains(WorkloadNames(), name) {
			return nil, fmt.Errorf("unknown workload %q (known: %v)", name, WorkloadNames())
		}
	}
	if err := EnsureDeviceClasses(ctx, cfg.Client); err != nil {
		return nil, err
	}
	if err := ensureNamespace(ctx, cfg.Client, cfg.Namespace); err != nil {
		return nil, err
	}
	for _, w := range chosen {
		if w.Template == nil {
			continue
		}
		_, err := cfg.Client.ResourceV1().ResourceClaimTemplates(cfg.Namespace).Create(ctx, w.Template, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("ResourceClaimTemplate %s/%s: %w", cfg.Namespace, w.Template.Name, err)
		}
	}

	var results []Result
	for _, n := range cfg.Nodes {
		t0 := time.Now()
		if err := EnsureNodes(ctx, cfg.Client, n, cfg.Profile, cfg.Workers, 10*time.Minute); err != nil {
			return results, err
		}
		cfg.logf("%d fake nodes Ready (%s)", n, time.Since(t0).Round(time.Second))
		pods := cfg.Pods
		if pods == 0 {
			pods = PodsForNodes(n)
		}
		for _, w := range chosen {
			r, err := runOnce(ctx, &cfg, w, n, pods, nil)
			if err != nil {
				return results, err
			}
			cfg.logf("%s (load %.2f → %.2f)", r, r.LoadBefore, r.LoadAfter)
			results = append(results, r)
		}
	}
	return results, nil
}

func ensureNamespace(ctx context.Context, c kubernetes.Interface, ns string) error {
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	// Pods need the namespace's default service account, which a controller makes.
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

// ObserveBindings returns a pod informer's handler for the pods named in
// index: the first time it sees pod i bound to a node it sets *boundAt(i) to
// when it saw it and calls then(i), both with mu held.
func ObserveBindings(mu *sync.Mutex, index map[string]int, boundAt func(i int) *time.Time, then func(i int)) func(obj any) {
	return func(obj any) {
		now := time.Now()
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		i, ok := index[p.Name]
		if !ok || !boundAt(i).IsZero() {
			return
		}
		*boundAt(i) = now
		then(i)
	}
}

// runOnce creates pods pods of w on the n-node cluster, measures them and cleans
// up. The error is for a failure of the benchmark itself (the API, the cleanup,
// verify, which when set runs before the cleanup); pods that were not bound go
// into the Result.
func runOnce(ctx context.Context, cfg *Config, w Workload, n, pods int, verify func(context.Context) error) (Result, error) {
	run := fmt.Sprintf("%s-%d-%d", w.Name, n, time.Now().Unix())
	ns := cfg.Namespace
	sel := labels.Set{RunLabel: run}.String()
	load := func() float64 {
		if cfg.Load == nil {
			return 0
		}
		return cfg.Load()
	}

	var (
		mu      sync.Mutex
		samples = make([]Sample, pods)
		index   = make(map[string]int, pods)
		bound   int
		changed = make(chan struct{}, 1)
	)
	names := make([]string, pods)
	for i := range pods {
		names[i] = fmt.Sprintf("%s-n%d-%05d", w.Name, n, i)
		index[names[i]] = i
	}
	observe := ObserveBindings(&mu, index, func(i int) *time.Time { return &samples[i].Bound }, func(int) {
		bound++
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
	}); err != nil {
		return Result{}, err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	factory.Start(watchCtx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return Result{}, fmt.Errorf("%s: pod watch did not sync", run)
	}

	res := Result{Workload: w.Name, Nodes: n, LoadBefore: load()}
	cpuBefore := cpuSnapshot(cfg.Processes)
	jobs := make([]func() error, pods)
	for i := range pods {
		jobs[i] = func() error {
			_, err := cfg.Client.CoreV1().Pods(ns).Create(ctx, w.Pod(ns, names[i], run), metav1.CreateOptions{})
			now := time.Now()
			if err != nil {
				return fmt.Errorf("create pod %s/%s: %w", ns, names[i], err)
			}
			mu.Lock()
			samples[i].Created = now
			mu.Unlock()
			return nil
		}
	}
	if err := parallel(cfg.Workers, jobs); err != nil {
		return Result{}, fmt.Errorf("%s: %w", run, err)
	}

	// Wait for every binding, or until none came for cfg.Stall.
	stall := time.NewTimer(cfg.Stall)
	defer stall.Stop()
	for done := false; !done; {
		mu.Lock()
		all := bound == pods
		mu.Unlock()
		if all {
			break
		}
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-changed:
			stall.Reset(cfg.Stall)
		case <-stall.C:
			done = true
		}
	}
	stopWatch()
	if len(cfg.Processes) > 0 {
		res.CPU = cpuSince(cpuBefore, cpuSnapshot(cfg.Processes))
	}
	mu.Lock()
	agg := Aggregate(samples)
	mu.Unlock()
	res.Pods, res.Bound, res.PodsPerSecond = agg.Pods, agg.Bound, agg.PodsPerSecond
	res.Window, res.CreateWindow, res.P50, res.P99, res.Max = agg.Window, agg.CreateWindow, agg.P50, agg.P99, agg.Max
	res.LoadAfter = load()
	if res.Bound < res.Pods {
		res.Err = fmt.Sprintf("%d of %d pods not bound after %s without progress%s", res.Pods-res.Bound, res.Pods, cfg.Stall, unschedulableReason(ctx, cfg.Client, ns, sel))
	}

	var verr error
	if verify != nil {
		verr = verify(ctx)
	}
	if err := cleanup(ctx, cfg.Client, ns, sel, cfg.Cleanup); err != nil {
		return res, fmt.Errorf("%s: %w", run, errors.Join(verr, err))
	}
	if verr != nil {
		return res, fmt.Errorf("%s: %w", run, verr)
	}
	return res, nil
}

// unschedulableReason is the PodScheduled message of one pending pod of the run.
func unschedulableReason(ctx context.Context, c kubernetes.Interface, ns, sel string) string {
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel, FieldSelector: "spec.nodeName=", Limit: 1})
	if err != nil || len(pods.Items) == 0 {
		return ""
	}
	for _, cond := range pods.Items[0].Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Message != "" {
			return fmt.Sprintf(" (pod %s: %s)", pods.Items[0].Name, cond.Message)
		}
	}
	return ""
}

// cleanup deletes the run's pods at once (grace period 0: no kubelet would
// confirm) and waits until they and every ResourceClaim in ns are gone, so the
// scheduler sees all devices free again.
func cleanup(ctx context.Context, c kubernetes.Interface, ns, sel string, timeout time.Duration) error {
	err := c.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("delete pods: %w", err)
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		claims, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("%d pods, %d ResourceClaims left", len(pods.Items), len(claims.Items))
		return len(pods.Items) == 0 && len(claims.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("cleanup: %w (%s)", err, last)
	}
	return nil
}
