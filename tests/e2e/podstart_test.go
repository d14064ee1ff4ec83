//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// podStartKind is one kind of pod TestPodStartLatency starts: no claim, or
// one claim from a template.
type podStartKind struct {
	name     string // in the report
	pod      string // pod name prefix
	template string // "" for a pod without a claim
}

var podStartKinds = []podStartKind{
	{name: "plain", pod: "plain"},
	{name: "share", pod: "share", template: "share"},
	{name: "whole GPU", pod: "whole", template: "whole"},
}

var podStartTemplates = []framework.Claim{
	{Name: "share", Template: true, Memory: "4Gi", Cores: "10"},
	{Name: "whole", Template: true},
}

// podStart is what one pod took from the Create call to the first watch
// event showing it Running with every container started, and to the first
// one with ContainersReady true.
type podStart struct {
	running, ready time.Duration
}

// TestPodStartLatency starts TESSERA_E2E_PODSTARTS rounds of one plain pod,
// one pod with a share claim and one with a whole-GPU claim (the order
// rotates each round), one pod at a time, each deleted and gone before the
// next is created, and reports create→Running and create→ContainersReady per
// kind and the ratio to the plain pod. make bench-podstart runs it; make test
// does not. Nothing is asserted about the times.
func TestPodStartLatency(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TESSERA_E2E_PODSTARTS"))
	if n <= 0 {
		t.Skip("set TESSERA_E2E_PODSTARTS=<rounds> (make bench-podstart)")
	}
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-podstart")
	for _, tmpl := range podStartTemplates {
		c.Apply(t, ns, tmpl.Object())
	}

	// One pod of each kind first, unmeasured: the image and the kubelet's
	// first DRA connection are not what is compared.
	for _, k := range podStartKinds {
		if _, err := startPod(ctx, c, ns, "warm-"+k.pod, k); err != nil {
			t.Fatal(err)
		}
	}

	times := make(map[string][]podStart, len(podStartKinds))
	for i := range n {
		for j := range podStartKinds {
			k := podStartKinds[(i+j)%len(podStartKinds)]
			name := fmt.Sprintf("%s-%d", k.pod, i)
			s, err := startPod(ctx, c, ns, name, k)
			if err != nil {
				t.Fatal(err)
			}
			times[k.name] = append(times[k.name], s)
			t.Logf("round %d: %s pod Running after %s, ContainersReady after %s", i, k.name, s.running.Round(time.Millisecond), s.ready.Round(time.Millisecond))
		}
	}

	report := podStartReport(n, times)
	t.Logf("pod start on the local cluster:\n%s", report)
	if out := os.Getenv("TESSERA_E2E_RESULTS"); out != "" {
		if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// startPod creates the pod, times it to Running and ContainersReady from a
// watch opened before the Create call, then deletes it and waits until it
// is gone (its claim unprepared and deallocated with it).
func startPod(ctx context.Context, c *framework.Cluster, ns, name string, k podStartKind) (podStart, error) {
	obj := framework.EnvPodWith(name, nil, framework.EnvContainer{Name: "ctr"})
	if k.template != "" {
		obj = framework.EnvPod(name, k.template, true)
	}
	var pod corev1.Pod
	if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &pod); err != nil {
		return podStart{}, err
	}
	w, err := c.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return podStart{}, err
	}
	defer w.Stop()
	start := time.Now()
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, &pod, metav1.CreateOptions{}); err != nil {
		return podStart{}, err
	}
	var s podStart
	timeout := time.After(framework.PodTimeout)
	for s.running == 0 || s.ready == 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return s, fmt.Errorf("pod %s/%s: watch ended before the pod was ready", ns, name)
			}
			if ev.Type == watch.Error {
				return s, fmt.Errorf("pod %s/%s: watch: %v", ns, name, ev.Object)
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			now := time.Since(start)
			if s.running == 0 && podRunning(p) {
				s.running = now
			}
			if s.ready == 0 && containersReady(p) {
				s.ready = now
			}
			if reason := framework.Stuck(p); reason != "" {
				return s, fmt.Errorf("pod %s/%s: %s", ns, name, reason)
			}
		case <-timeout:
			return s, fmt.Errorf("pod %s/%s not ready after %s\n%s", ns, name, framework.PodTimeout, c.DescribePod(ctx, ns, name))
		}
	}
	if err := c.DeletePodAndWait(ctx, ns, name); err != nil {
		return s, err
	}
	return s, nil
}

func podRunning(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil {
			return false
		}
	}
	return true
}

func containersReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.ContainersReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podStartReport is results/pod-start.md.
func podStartReport(n int, times map[string][]podStart) string {
	var b strings.Builder
	host, _ := os.Hostname()
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "# Pod start with a Tessera claim vs a plain pod\n\n"+
		"make bench-podstart (TestPodStartLatency, TESSERA_E2E_PODSTARTS=%d): the local cluster (one node, mock hgx-h100, real kube-apiserver, kube-scheduler, "+
		"kube-controller-manager, kubelet and containerd), %d rounds of one pod of each kind, the order rotating each round, one pod at a time, each deleted and gone "+
		"before the next is created; one unmeasured pod of each kind first. Every pod is one busybox container that prints its environment and sleeps (no readiness probe). "+
		"A claim comes from a ResourceClaimTemplate (share: shared.gpu.tessera.dev, 4Gi and 10 cores; whole GPU: gpu.tessera.dev), so its time includes "+
		"kube-controller-manager creating the claim, kube-scheduler allocating it and the kubelet plugin preparing it. "+
		"Times are from the Create call to the first watch event showing the pod Running with its container started, and ContainersReady true. "+
		"Host %s, %d CPUs, load average at the end %s.\n\n",
		n, n, host, runtime.NumCPU(), strings.Join(strings.Fields(string(load))[:min(3, len(strings.Fields(string(load))))], " "))
	plain := times["plain"]
	fmt.Fprintf(&b, "| pod | pods | Running p50 | Running p99 | ContainersReady p50 | ContainersReady p99 | p50 vs plain | p99 vs plain |\n|---|---|---|---|---|---|---|---|\n")
	for _, k := range podStartKinds {
		ts := times[k.name]
		running, ready := make([]time.Duration, len(ts)), make([]time.Duration, len(ts))
		for i, s := range ts {
			running[i], ready[i] = s.running, s.ready
		}
		ratio50, ratio99 := "–", "–"
		if k.template != "" && len(plain) > 0 {
			pr := make([]time.Duration, len(plain))
			for i, s := range plain {
				pr[i] = s.running
			}
			ratio50 = fmt.Sprintf("%.2f×", float64(quantileRaw(running, 0.5))/float64(quantileRaw(pr, 0.5)))
			ratio99 = fmt.Sprintf("%.2f×", float64(quantileRaw(running, 0.99))/float64(quantileRaw(pr, 0.99)))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", k.name, len(ts),
			quantileRaw(running, 0.5).Round(time.Millisecond), quantileRaw(running, 0.99).Round(time.Millisecond),
			quantileRaw(ready, 0.5).Round(time.Millisecond), quantileRaw(ready, 0.99).Round(time.Millisecond), ratio50, ratio99)
	}
	fmt.Fprintf(&b, "\nThe ratios are of create→Running. Nearest-rank percentiles: with %d pods a kind, p99 is the slowest pod when there are fewer than 100. "+
		"Target: a pod with a claim starts within 1.1× of a plain pod.\n", n)
	return b.String()
}

// quantileRaw is the q-quantile (nearest rank) of ds, unrounded.
func quantileRaw(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
