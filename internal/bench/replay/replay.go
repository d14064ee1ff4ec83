// Package replay plays a fleet job stream (internal/bench/fleet) through a real
// kube-scheduler: every job becomes a ResourceClaim with the spec the
// simulation hands the allocator (fleet.ClaimSpec) and a pod that uses it,
// created at the job's arrival; once the scheduler binds the pod, the job "runs"
// for its run time and then its pod and claim are deleted, which deallocates
// the claim as a finished pod would. Simulated time runs Speed times faster than
// the wall clock.
//
// It needs a cluster whose nodes never run anything and keep bound pods as they
// are: the scale cluster of hack/scale (kwok fake nodes with the slices Tessera
// publishes for a mock profile). The result is the start time of every job in
// simulated seconds, measured by fleet.Summarize like a simulation.
package replay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/internal/bench/fleet"
	"github.com/tessera-dev/tessera/internal/bench/scale"
)

// RunLabel is on every pod and claim of one replay.
const RunLabel = "fleet.tessera.dev/replay"

// Config is one replay.
type Config struct {
	Client    kubernetes.Interface
	Namespace string
	// Kind is the model whose claims the jobs make (fleet.Whole or fleet.Tessera;
	// fleet.Partition needs its partition devices published).
	Kind fleet.Kind
	Jobs []fleet.Job
	// Speed is simulated seconds per wall-clock second.
	Speed float64
	// Stall ends the replay with an error when jobs wait and none was bound for
	// this long (wall clock); 0 means 2 minutes.
	Stall time.Duration
	// Logf, when set, reports progress.
	Logf func(format string, args ...any)
}

// Outcome is what a replay measured.
type Outcome struct {
	// Starts is when each job's pod was bound, in simulated seconds from the
	// replay's start (the simulation's clock).
	Starts []float64
	// MaxCreateLag is the most a job's claim and pod were created after its
	// arrival (wall clock): the driver's own delay, part of the waits.
	MaxCreateLag time.Duration
	// Wall is how long the replay took.
	Wall time.Duration
}

type jobState struct {
	bound    time.Time
	deleting bool
	done     bool
}

// Replay runs the stream until every job is bound and cleans up after itself
// (also on error): the jobs still running then are deleted.
func Replay(ctx context.Context, cfg Config) (Outcome, error) {
	if cfg.Speed <= 0 {
		return Outcome{}, errors.New("replay: speed must be positive")
	}
	if cfg.Stall == 0 {
		cfg.Stall = 2 * time.Minute
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	specs := make([]resourceapi.ResourceClaimSpec, len(cfg.Jobs))
	for i := range cfg.Jobs {
		s, err := fleet.ClaimSpec(cfg.Kind, &cfg.Jobs[i])
		if err != nil {
			return Outcome{}, fmt.Errorf("replay: job %d: %w", i, err)
		}
		specs[i] = s
	}
	run := fmt.Sprintf("%s-%d", cfg.Kind, time.Now().UnixNano())
	sel := labels.Set{RunLabel: run}.String()
	ns := cfg.Namespace
	c := cfg.Client

	var (
		mu       sync.Mutex
		state    = make([]jobState, len(cfg.Jobs))
		index    = make(map[string]int, len(cfg.Jobs))
		bound    int
		finished int
		changed  = make(chan struct{}, 1)
		errs     []error
		start    time.Time
		deletes  sync.WaitGroup
		timers   []*time.Timer
	)
	// Once every job is bound nothing the scheduler does can change the
	// measurement: the replay stops there and the cleanup deletes what runs.
	rctx, stopJobs := context.WithCancel(ctx)
	defer stopJobs()
	for i := range cfg.Jobs {
		index[podName(i)] = i
	}
	signal := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	finish := func(i int) {
		defer deletes.Done()
		name := podName(i)
		mu.Lock()
		state[i].deleting = true
		mu.Unlock()
		// No kubelet confirms a graceful deletion: force it, as the kubelet
		// would once the container exited.
		err := c.CoreV1().Pods(ns).Delete(rctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err == nil || apierrors.IsNotFound(err) {
			err = c.ResourceV1().ResourceClaims(ns).Delete(rctx, name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				err = nil
			}
		}
		mu.Lock()
		if err != nil && rctx.Err() == nil {
			errs = append(errs, fmt.Errorf("job %d: delete: %w", i, err))
		}
		state[i].done = true
		finished++
		mu.Unlock()
		signal()
	}
	observe := scale.ObserveBindings(&mu, index, func(i int) *time.Time { return &state[i].bound }, func(i int) {
		bound++
		run := time.Duration(cfg.Jobs[i].Runtime / cfg.Speed * float64(time.Second))
		deletes.Add(1)
		timers = append(timers, time.AfterFunc(run, func() { finish(i) }))
		signal()
	})

	factory := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	inf := factory.Core().V1().Pods().Informer()
	// A pod deleted before its job ended was deleted by someone else (a node
	// removed under the replay, for example): the measurement is void.
	gone := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if i, ok := index[p.Name]; ok && !state[i].done && !state[i].deleting {
			errs = append(errs, fmt.Errorf("job %d: pod deleted by someone else (node %q)", i, p.Spec.NodeName))
			signal()
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
		DeleteFunc: gone,
	}); err != nil {
		return Outcome{}, err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	factory.Start(watchCtx.Done())
	defer func() {
		stopWatch()
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return Outcome{}, errors.New("replay: pod watch did not sync")
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		del := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
		if pods, err := c.CoreV1().Pods(ns).List(cctx, metav1.ListOptions{LabelSelector: sel}); err == nil {
			for _, p := range pods.Items {
				_ = c.CoreV1().Pods(ns).Delete(cctx, p.Name, del)
			}
		}
		if claims, err := c.ResourceV1().ResourceClaims(ns).List(cctx, metav1.ListOptions{LabelSelector: sel}); err == nil {
			for _, cl := range claims.Items {
				_ = c.ResourceV1().ResourceClaims(ns).Delete(cctx, cl.Name, metav1.DeleteOptions{})
			}
		}
	}()

	var out Outcome
	start = time.Now()
	createErr := make(chan error, 1)
	go func() {
		for i, j := range cfg.Jobs {
			at := start.Add(time.Duration(j.Arrival / cfg.Speed * float64(time.Second)))
			if d := time.Until(at); d > 0 {
				select {
				case <-ctx.Done():
					createErr <- ctx.Err()
					return
				case <-time.After(d):
				}
			}
			mu.Lock()
			out.MaxCreateLag = max(out.MaxCreateLag, time.Since(at))
			mu.Unlock()
			if err := create(ctx, c, ns, run, i, specs[i]); err != nil {
				createErr <- err
				return
			}
			if i%200 == 199 {
				mu.Lock()
				logf("replay %s: %d/%d created, %d bound, %d finished, %d running", cfg.Kind, i+1, len(cfg.Jobs), bound, finished, bound-finished)
				mu.Unlock()
			}
		}
		createErr <- nil
	}()

	stall := time.NewTimer(cfg.Stall)
	defer stall.Stop()
	created := false
	for {
		mu.Lock()
		all := bound == len(cfg.Jobs)
		b := bound
		failed := len(errs) > 0
		mu.Unlock()
		if failed {
			mu.Lock()
			defer mu.Unlock()
			return out, errors.Join(errs...)
		}
		if all && created {
			break
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case err := <-createErr:
			if err != nil {
				return out, fmt.Errorf("replay: %w", err)
			}
			created = true
		case <-changed:
			if !stall.Stop() {
				select {
				case <-stall.C:
				default:
				}
			}
			stall.Reset(cfg.Stall)
		case <-stall.C:
			if created || b < len(cfg.Jobs) {
				return out, fmt.Errorf("replay %s: %d of %d jobs bound, none for %s", cfg.Kind, b, len(cfg.Jobs), cfg.Stall)
			}
			stall.Reset(cfg.Stall)
		}
	}
	out.Wall = time.Since(start)
	mu.Lock()
	for _, t := range timers {
		if t.Stop() {
			deletes.Done()
		}
	}
	mu.Unlock()
	stopJobs()
	deletes.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 {
		return out, errors.Join(errs...)
	}
	out.Starts = make([]float64, len(cfg.Jobs))
	for i := range state {
		out.Starts[i] = state[i].bound.Sub(start).Seconds() * cfg.Speed
	}
	return out, nil
}

func podName(i int) string { return fmt.Sprintf("job-%05d", i) }

// create makes job i's claim and its pod.
func create(ctx context.Context, c kubernetes.Interface, ns, run string, i int, spec resourceapi.ResourceClaimSpec) error {
	name := podName(i)
	meta := metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{RunLabel: run}}
	claim := &resourceapi.ResourceClaim{ObjectMeta: meta, Spec: spec}
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create claim %s/%s: %w", ns, name, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: meta,
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			AutomountServiceAccountToken:  new(bool),
			Containers: []corev1.Container{{
				Name: "job", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	return nil
}
