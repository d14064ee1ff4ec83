package scale

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-dev/tessera/pkg/model"
)

// EnsureDeviceClasses creates Tessera's DeviceClasses (model.DeviceClasses, what
// deployments/deviceclasses.yaml holds) or updates them to that spec.
func EnsureDeviceClasses(ctx context.Context, c kubernetes.Interface) error {
	classes := model.DeviceClasses()
	ptrs := make([]*resourceapi.DeviceClass, len(classes))
	for i := range classes {
		ptrs[i] = &classes[i]
	}
	return EnsureClasses(ctx, c, ptrs)
}

// EnsureClasses creates the DeviceClasses or updates them to their spec.
func EnsureClasses(ctx context.Context, c kubernetes.Interface, classes []*resourceapi.DeviceClass) error {
	for _, dc := range classes {
		_, err := c.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			old, gerr := c.ResourceV1().DeviceClasses().Get(ctx, dc.Name, metav1.GetOptions{})
			if gerr != nil {
				return fmt.Errorf("DeviceClass %s: %w", dc.Name, gerr)
			}
			old.Spec = dc.Spec
			_, err = c.ResourceV1().DeviceClasses().Update(ctx, old, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("DeviceClass %s: %w", dc.Name, err)
		}
	}
	return nil
}

// EnsureNodes makes the cluster's fake nodes exactly NodeName(0) … NodeName(n-1),
// each with NodeSlices(name, profile) owned by it: it creates the nodes and
// slices that are missing, replaces a node's slices when their number is wrong,
// and deletes fake nodes beyond n (their slices go with them). workers requests
// run at once. It then waits, up to timeout, until kwok reports every node Ready.
// Nodes without NodeLabel (a real kubelet's) are left alone.
func EnsureNodes(ctx context.Context, c kubernetes.Interface, n int, profile string, workers int, timeout time.Duration) error {
	if n < 0 {
		return fmt.Errorf("node count %d: must not be negative", n)
	}
	template, err := NodeSlices(NodeName(0), profile)
	if err != nil {
		return err
	}
	perNode := len(template)

	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: NodeLabel})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	existing := map[string]*corev1.Node{}
	for i := range nodes.Items {
		existing[nodes.Items[i].Name] = &nodes.Items[i]
	}
	// A node's slices are right when it has perNode of Tessera's and none
	// of another benchmark driver's (an experiment that stopped short).
	slicesOf, foreign := map[string]int{}, map[string]bool{}
	for _, driver := range benchDrivers {
		sliceList, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
		if err != nil {
			return fmt.Errorf("list ResourceSlices: %w", err)
		}
		for _, s := range sliceList.Items {
			switch {
			case s.Spec.NodeName == nil:
			case driver == model.DriverName:
				slicesOf[*s.Spec.NodeName]++
			default:
				foreign[*s.Spec.NodeName] = true
			}
		}
	}

	var jobs []func() error
	want := map[string]bool{}
	for i := range n {
		name := NodeName(i)
		want[name] = true
		node, ok := existing[name]
		if ok && slicesOf[name] == perNode && !foreign[name] {
			continue
		}
		jobs = append(jobs, func() error { return ensureNode(ctx, c, i, node, slicesOf[name] > 0 || foreign[name], profile) })
	}
	for name := range existing {
		if !want[name] {
			jobs = append(jobs, func() error {
				err := c.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return err
			})
		}
	}
	if err := parallel(workers, jobs); err != nil {
		return err
	}
	return waitNodesReady(ctx, c, n, timeout)
}

// PublishOnNodes replaces the ResourceSlices of the benchmark's drivers
// (Tessera's and NVIDIA's) on fake nodes NodeName(0) … NodeName(n-1) with
// pub's, each owned by its node (EnsureNodes puts Tessera's own back: their
// number differs), and waits until the API server lists exactly those.
func PublishOnNodes(ctx context.Context, c kubernetes.Interface, n, workers int, pub Publisher) error {
	var jobs []func() error
	want := map[string]int{}
	for i := range n {
		name := NodeName(i)
		slices, err := pub.Slices(name)
		if err != nil {
			return err
		}
		own := make([]*resourceapi.ResourceSlice, len(slices))
		for j := range slices {
			own[j] = &slices[j]
		}
		want[name] = len(own)
		jobs = append(jobs, func() error {
			node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("node %s: %w", name, err)
			}
			return putSlices(ctx, c, node, own, true)
		})
	}
	if err := parallel(workers, jobs); err != nil {
		return err
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		got := map[string]int{}
		for _, driver := range benchDrivers {
			l, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
			if err != nil {
				last = err
				return false, nil
			}
			for _, s := range l.Items {
				if s.Spec.NodeName == nil {
					continue
				}
				if _, ok := want[*s.Spec.NodeName]; !ok {
					continue
				}
				if driver != pub.Driver {
					last = fmt.Errorf("node %s still has a ResourceSlice of %s", *s.Spec.NodeName, driver)
					return false, nil
				}
				got[*s.Spec.NodeName]++
			}
		}
		if !maps.Equal(got, want) {
			last = fmt.Errorf("ResourceSlices per node %v, want %v", got, want)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("publish %s: %w (%v)", pub.Name, err, last)
	}
	return nil
}

// ensureNode creates fake node i (unless node is it already) and its slices,
// deleting the slices it has first when stale is set.
func ensureNode(ctx context.Context, c kubernetes.Interface, i int, node *corev1.Node, stale bool, profile string) error {
	name := NodeName(i)
	if node == nil {
		var err error
		node, err = c.CoreV1().Nodes().Create(ctx, FakeNode(i), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create node %s: %w", name, err)
		}
	}
	slices, err := NodeSlices(name, profile)
	if err != nil {
		return err
	}
	own := make([]*resourceapi.ResourceSlice, len(slices))
	for j := range slices {
		own[j] = &slices[j]
	}
	return putSlices(ctx, c, node, own, stale)
}

// putSlices creates slices on node, owned by it, after deleting the slices
// of the benchmark's drivers the node has when replace is set.
func putSlices(ctx context.Context, c kubernetes.Interface, node *corev1.Node, slices []*resourceapi.ResourceSlice, replace bool) error {
	for _, driver := range benchDrivers {
		if !replace {
			break
		}
		err := c.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name + ",spec.driver=" + driver})
		if err != nil {
			return fmt.Errorf("node %s: delete ResourceSlices of %s: %w", node.Name, driver, err)
		}
	}
	for _, s := range slices {
		OwnedBy(s, node)
		if _, err := c.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("node %s: create ResourceSlice %s: %w", node.Name, s.GenerateName, err)
		}
	}
	return nil
}

// waitNodesReady polls until exactly n fake nodes exist and all are Ready.
func waitNodesReady(ctx context.Context, c kubernetes.Interface, n int, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: NodeLabel, ResourceVersion: "0"})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		ready := 0
		for _, node := range nodes.Items {
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		last = fmt.Sprintf("%d fake nodes, %d Ready, want %d", len(nodes.Items), ready, n)
		return len(nodes.Items) == n && ready == n, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d fake nodes Ready (is kwok running?): %w (last: %s)", n, err, last)
	}
	return nil
}

// parallel runs jobs, workers at a time, and returns their errors joined (at
// most the first 5, and how many more).
func parallel(workers int, jobs []func() error) error {
	workers = max(1, workers)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		next = make(chan func() error)
	)
	for range min(workers, len(jobs)) {
		wg.Go(func() {
			for job := range next {
				if err := job(); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, job := range jobs {
		next <- job
	}
	close(next)
	wg.Wait()
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Errorf("and %d more errors", len(errs)-5))
	}
	return errors.Join(errs...)
}

// SliceSummary describes the slices of one fake node for the report: slices,
// devices by type.
func SliceSummary(profile string) (string, error) {
	return PublisherSummary(TesseraPublisher(profile))
}

// PublisherSummary describes the slices pub publishes on one fake node.
func PublisherSummary(pub Publisher) (string, error) {
	slices, err := pub.Slices(NodeName(0))
	if err != nil {
		return "", err
	}
	types := map[string]int{}
	counterSets := 0
	for _, s := range slices {
		counterSets += len(s.Spec.SharedCounters)
		for _, d := range s.Spec.Devices {
			t := "?"
			if a, ok := d.Attributes[model.AttrType]; ok && a.StringValue != nil && pub.Driver != model.DriverName {
				t = *a.StringValue + " (" + pub.Driver + ")"
			} else if ok && a.StringValue != nil {
				t = *a.StringValue
			}
			types[t]++
		}
	}
	var parts []string
	for t, k := range types {
		parts = append(parts, strconv.Itoa(k)+" "+t)
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d ResourceSlices (%d counter sets; devices: %s)", len(slices), counterSets, strings.Join(parts, ", ")), nil
}
