package mpsdaemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

// Pods runs each GPU's MPS control daemon in a pod of its own; it implements
// isolation.DaemonRunner (see the package documentation for the contract).
type Pods struct {
	Client kubernetes.Interface
	Config Config
}

var _ isolation.DaemonRunner = (*Pods)(nil)

// NewPods checks cfg and returns the runner.
func NewPods(client kubernetes.Interface, cfg Config) (*Pods, error) {
	switch {
	case client == nil:
		return nil, errors.New("mps daemon pods: no Kubernetes client")
	case cfg.Namespace == "":
		return nil, errors.New("mps daemon pods: no namespace (--mps-namespace, or env POD_NAMESPACE)")
	case cfg.NodeName == "":
		return nil, errors.New("mps daemon pods: no node name")
	case cfg.Image == "":
		return nil, errors.New("mps daemon pods: no image (--mps-image)")
	case !cfg.Mock && cfg.DriverRoot == "":
		return nil, errors.New("mps daemon pods: no host driver root (--mps-host-driver-root)")
	}
	if err := validateResources(cfg.resources()); err != nil {
		return nil, fmt.Errorf("mps daemon pods: resources (--mps-requests, --mps-limits): %w", err)
	}
	return &Pods{Client: client, Config: cfg}, nil
}

func (p *Pods) pods() podClient { return p.Client.CoreV1().Pods(p.Config.Namespace) }

type podClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error)
	Create(ctx context.Context, pod *corev1.Pod, opts metav1.CreateOptions) (*corev1.Pod, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
}

// Start implements isolation.DaemonRunner: it creates the GPU's daemon pod
// or adopts the existing one and returns once it is Ready.
func (p *Pods) Start(ctx context.Context, d isolation.Daemon, inUse bool) error {
	logger := klog.FromContext(ctx)
	want := p.Config.Pod(d)
	timeout := p.Config.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	interval := p.Config.PollInterval
	if interval <= 0 {
		interval = 250 * time.Millisecond
	}
	state := "not looked at yet"
	warnedOutdated := false
	err := wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(ctx context.Context) (bool, error) {
		pod, err := p.pods().Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if _, err := p.pods().Create(ctx, want, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				state = fmt.Sprintf("create failed: %v", err)
				return false, nil
			}
			logger.Info("Created MPS control daemon pod", "pod", klog.KObj(want), "gpu", d.UUID)
			state = "created, not ready yet"
			return false, nil
		case err != nil:
			// The API server may be briefly unreachable; keep trying
			// until the deadline.
			state = fmt.Sprintf("get failed: %v", err)
			return false, nil
		}
		if pod.DeletionTimestamp != nil {
			state = "terminating (waiting for it to go before creating it again)"
			return false, nil
		}
		if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
			logger.Info("Replacing MPS control daemon pod that ended", "pod", klog.KObj(pod), "phase", pod.Status.Phase, "reason", pod.Status.Reason)
			p.deleteUID(ctx, pod)
			state = fmt.Sprintf("ended (%s %s), replaced", pod.Status.Phase, pod.Status.Reason)
			return false, nil
		}
		if hash := pod.Annotations[AnnotationSpecHash]; hash != want.Annotations[AnnotationSpecHash] {
			if !inUse {
				logger.Info("Replacing MPS control daemon pod with another spec; no client uses it", "pod", klog.KObj(pod), "hash", hash, "want", want.Annotations[AnnotationSpecHash])
				p.deleteUID(ctx, pod)
				state = "had another spec, replaced"
				return false, nil
			}
			if !warnedOutdated {
				warnedOutdated = true
				logger.Info("Keeping MPS control daemon pod with another spec: clients may use it; it is replaced once none does", "pod", klog.KObj(pod), "hash", hash, "want", want.Annotations[AnnotationSpecHash])
			}
		}
		if podReady(pod) {
			return true, nil
		}
		state = describe(pod)
		return false, nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("pod %s/%s: %w (last: %s)", p.Config.Namespace, want.Name, ctx.Err(), state)
		}
		return fmt.Errorf("pod %s/%s not ready within %v: %s", p.Config.Namespace, want.Name, timeout, state)
	}
	return nil
}

// deleteUID deletes exactly the pod it looked at, not a successor of the
// same name; failures are retried by the caller's next look.
func (p *Pods) deleteUID(ctx context.Context, pod *corev1.Pod) {
	err := p.pods().Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(pod.UID)}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		klog.FromContext(ctx).Error(err, "Deleting MPS control daemon pod failed", "pod", klog.KObj(pod))
	}
}

// Stop implements isolation.DaemonRunner: it deletes the GPU's daemon pod.
func (p *Pods) Stop(ctx context.Context, d isolation.Daemon) error {
	name := p.Config.PodName(d.Key())
	err := p.pods().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s/%s: %w", p.Config.Namespace, name, err)
	}
	klog.FromContext(ctx).Info("Deleted MPS control daemon pod", "pod", klog.KRef(p.Config.Namespace, name), "gpu", d.UUID)
	return nil
}

// Running implements isolation.DaemonRunner: the daemons of this node's
// daemon pods, terminating ones included.
func (p *Pods) Running(ctx context.Context) ([]isolation.DaemonKey, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelComponent: ComponentValue, LabelNode: p.Config.nodeHash()})
	list, err := p.pods().List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list pods in %s: %w", p.Config.Namespace, err)
	}
	var out []isolation.DaemonKey
	for _, pod := range list.Items {
		key := isolation.DaemonKey{GPU: pod.Annotations[AnnotationGPU], Domain: pod.Annotations[AnnotationDomain]}
		if pod.Spec.NodeName != p.Config.NodeName || key.GPU == "" || pod.Name != p.Config.PodName(key) {
			continue
		}
		out = append(out, key)
	}
	slices.SortFunc(out, func(a, b isolation.DaemonKey) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out), nil
}

func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// describe says why a pod is not ready, for the prepare's error.
func describe(pod *corev1.Pod) string {
	parts := []string{"phase " + string(pod.Status.Phase)}
	for _, c := range pod.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			parts = append(parts, fmt.Sprintf("%s: %s", c.Type, c.Message))
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("container %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message))
		case cs.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("container %s terminated: %s (exit %d) %s", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode, cs.State.Terminated.Message))
		case !cs.Ready:
			parts = append(parts, fmt.Sprintf("container %s running, not ready (restarts %d)", cs.Name, cs.RestartCount))
		}
	}
	return strings.Join(parts, "; ")
}

// Unavailable is the isolation.DaemonRunner of a node whose daemon pods
// cannot be configured: every start fails with Err, so MPS shares fail to
// prepare with the reason instead of running unenforced.
type Unavailable struct{ Err error }

var _ isolation.DaemonRunner = Unavailable{}

// Start implements isolation.DaemonRunner.
func (u Unavailable) Start(context.Context, isolation.Daemon, bool) error { return u.Err }

// Stop implements isolation.DaemonRunner; nothing was started.
func (Unavailable) Stop(context.Context, isolation.Daemon) error { return nil }

// Running implements isolation.DaemonRunner; nothing was started.
func (Unavailable) Running(context.Context) ([]isolation.DaemonKey, error) { return nil, nil }
