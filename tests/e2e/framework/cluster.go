//go:build e2e

package framework

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// Driver is the DRA driver name the tests look for in ResourceSlices.
const Driver = "gpu.tessera.dev"

// EnvDoneMarker is the line the demo specs' containers print after their env.
const EnvDoneMarker = "tessera-env-done"

// Timeouts for one wait each. A busy two-core machine needs tens of seconds for a
// pod; nothing here waits without a bound.
var (
	PodTimeout   = 2 * time.Minute
	LogTimeout   = time.Minute
	PollInterval = 500 * time.Millisecond
)

// Cluster is the cluster under test and clients for it.
type Cluster struct {
	Config  *rest.Config
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	Mapper  *restmapper.DeferredDiscoveryRESTMapper
}

// NewCluster connects to the cluster in the kubeconfig file.
func NewCluster(kubeconfig string) (*Cluster, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))
	return &Cluster{Config: cfg, Client: client, Dynamic: dyn, Mapper: mapper}, nil
}

// Poll calls cond every PollInterval until it returns true, an error, or timeout
// passes. The error on timeout says what was waited for and, when cond returned
// one, its last complaint.
func Poll(ctx context.Context, what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, PollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		done, err := cond(ctx)
		if err != nil && !errors.Is(err, errRetry) {
			return false, err
		}
		last = err
		return done, nil
	})
	if err != nil && wait.Interrupted(err) {
		if last != nil {
			return fmt.Errorf("timed out after %v waiting for %s: %w", timeout, what, last)
		}
		return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
	}
	return err
}

// errRetry marks a condition's error as "not yet": Poll keeps polling and reports
// it only on timeout.
var errRetry = errors.New("not yet")

func Retry(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errRetry, fmt.Sprintf(format, args...))
}

// Namespace creates a namespace for one test and deletes it when the test ends.
func (c *Cluster) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ns, err := c.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-", Labels: map[string]string{"tessera.dev/e2e": "true"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() { c.DeleteNamespace(t, ns.Name) })
	return ns.Name
}

// DeleteNamespace deletes ns and waits (bounded) for it to go, so claims are
// released before the next test allocates.
func (c *Cluster) DeleteNamespace(t testing.TB, ns string) {
	ctx := context.Background()
	zero := int64(0)
	err := c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete namespace %s: %v", ns, err)
		return
	}
	err = Poll(ctx, "namespace "+ns+" to be deleted", PodTimeout, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Logf("cleanup: %v", err)
	}
	// The namespace is gone once its claims are deleted in the API server,
	// but kube-scheduler sees the deletions through its informers, which lag
	// on a loaded two-core machine: a test that places shares right away can
	// be scheduled against capacity its predecessor's claims no longer hold
	// (first fit then skips a GPU, or a pod found unschedulable waits for the
	// next cluster event). Give the informers a moment.
	time.Sleep(NamespaceSettle)
}

// NamespaceSettle is how long deleteNamespace waits after the namespace is
// gone.
const NamespaceSettle = 3 * time.Second

// ApplyFile server-side-applies every object in a (multi-document) YAML file and
// returns them as applied. A namespaced object is put into namespace when that is
// not empty. Objects that did not exist before are deleted when the test ends, in
// reverse order.
func (c *Cluster) ApplyFile(t testing.TB, namespace, path string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := DecodeYAML(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c.Apply(t, namespace, objs...)
}

// Apply is ApplyFile for objects already decoded.
func (c *Cluster) Apply(t testing.TB, namespace string, objs ...*unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	var applied []*unstructured.Unstructured
	for _, obj := range objs {
		obj = obj.DeepCopy()
		gvk := obj.GroupVersionKind()
		mapping, err := c.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			c.Mapper.Reset()
			mapping, err = c.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		}
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = c.Dynamic.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if namespace != "" {
				obj.SetNamespace(namespace)
			}
			if obj.GetNamespace() == "" {
				obj.SetNamespace("default")
			}
			ri = c.Dynamic.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		_, getErr := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
		existed := getErr == nil
		body, err := obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		force := true
		out, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, body,
			metav1.PatchOptions{FieldManager: "tessera-e2e", Force: &force})
		if err != nil {
			t.Fatalf("apply %s %s/%s: %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		applied = append(applied, out)
		if !existed {
			name, kind := out.GetName(), gvk.Kind
			t.Cleanup(func() {
				// Graceful, so that a pod goes only after the kubelet
				// unprepared its claims (see DeletePodAndWait) and the
				// namespace's deletion waits for that.
				err := ri.Delete(context.Background(), name, metav1.DeleteOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("cleanup: delete %s %s: %v", kind, name, err)
				}
			})
		}
	}
	return applied
}

// DecodeYAML splits a multi-document YAML (or JSON) stream into objects,
// skipping empty documents.
func DecodeYAML(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("document %d: %w", len(objs)+1, err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// WaitForPod waits until cond holds for the pod. It gives up early when the pod
// can no longer get there (failed, or a container cannot start), and its error
// then carries the pod's status and events.
func (c *Cluster) WaitForPod(ctx context.Context, ns, name, what string, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := Poll(ctx, fmt.Sprintf("pod %s/%s %s", ns, name, what), PodTimeout, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, Retry("%v", err)
		}
		pod = p
		if cond(p) {
			return true, nil
		}
		if reason := Stuck(p); reason != "" {
			return false, errors.New(reason)
		}
		return false, Retry("phase %s", p.Status.Phase)
	})
	if err != nil {
		return pod, fmt.Errorf("%w\n%s", err, c.DescribePod(ctx, ns, name))
	}
	return pod, nil
}

// WaitForPodRunning waits for the pod's phase Running with every container started.
func (c *Cluster) WaitForPodRunning(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return c.WaitForPod(ctx, ns, name, "to run", func(p *corev1.Pod) bool {
		if p.Status.Phase != corev1.PodRunning {
			return p.Status.Phase == corev1.PodSucceeded
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil && cs.State.Terminated == nil {
				return false
			}
		}
		return true
	})
}

// WaitForPodSucceeded waits for the pod's phase Succeeded.
func (c *Cluster) WaitForPodSucceeded(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return c.WaitForPod(ctx, ns, name, "to succeed", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded
	})
}

// Stuck says why a pod will not get to run, or "" while it still may.
func Stuck(p *corev1.Pod) string {
	if p.Status.Phase == corev1.PodFailed {
		return fmt.Sprintf("pod failed: %s %s", p.Status.Reason, p.Status.Message)
	}
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
				"CreateContainerError", "RunContainerError", "CrashLoopBackOff":
				return fmt.Sprintf("container %s: %s: %s", cs.Name, w.Reason, w.Message)
			}
		}
	}
	return ""
}

// DescribePod is a short `kubectl describe`: phase, conditions, container states
// and the pod's events, for failure messages.
func (c *Cluster) DescribePod(ctx context.Context, ns, name string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var b strings.Builder
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("pod %s/%s: %v", ns, name, err)
	}
	fmt.Fprintf(&b, "pod %s/%s: phase %s on node %q\n", ns, name, p.Status.Phase, p.Spec.NodeName)
	for _, cond := range p.Status.Conditions {
		fmt.Fprintf(&b, "  condition %s=%s %s %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	for _, cs := range p.Status.ContainerStatuses {
		fmt.Fprintf(&b, "  container %s: %+v\n", cs.Name, cs.State)
	}
	events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name,
	})
	if err == nil {
		sort.Slice(events.Items, func(i, j int) bool {
			return events.Items[i].LastTimestamp.Before(&events.Items[j].LastTimestamp)
		})
		for _, e := range events.Items {
			fmt.Fprintf(&b, "  event %s %s: %s\n", e.Type, e.Reason, e.Message)
		}
	}
	return b.String()
}

// PodLog returns a container's log. It asks the API (the kubelet) first and falls
// back to the kubelet's files under /var/log/pods when the test runs on the node
// and the API cannot reach the kubelet.
func (c *Cluster) PodLog(ctx context.Context, ns, name, container string) (string, error) {
	raw, apiErr := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if apiErr == nil {
		return string(raw), nil
	}
	pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("log of %s/%s: %w", ns, name, apiErr)
	}
	log, err := NodeLog(PodLogsDir, ns, name, string(pod.UID), container)
	if err != nil {
		return "", fmt.Errorf("log of %s/%s: API: %v; node: %w", ns, name, apiErr, err)
	}
	return log, nil
}

// PodLogsDir is where the kubelet writes container logs.
var PodLogsDir = "/var/log/pods"

// NodeLog reads a container's log from the kubelet's files
// (<dir>/<ns>_<pod>_<uid>/<container>/<restart>.log, CRI format) and returns the
// text, latest restart last.
func NodeLog(dir, ns, pod, uid, container string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, fmt.Sprintf("%s_%s_%s", ns, pod, uid), container, "*.log"))
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("no log files for container %s of %s/%s under %s", container, ns, pod, dir)
	}
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		b.WriteString(ParseCRILog(string(data)))
	}
	return b.String(), nil
}

// ParseCRILog turns CRI log lines ("<time> stdout|stderr F|P <text>") back into
// the text the container wrote; P marks a partial line continued by the next.
func ParseCRILog(data string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), " ", 4)
		if len(fields) < 3 {
			continue
		}
		text := ""
		if len(fields) == 4 {
			text = fields[3]
		}
		b.WriteString(text)
		if fields[2] != "P" {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// WaitForLog waits until the container's log contains marker and returns the log.
func (c *Cluster) WaitForLog(ctx context.Context, ns, name, container, marker string) (string, error) {
	var log string
	err := Poll(ctx, fmt.Sprintf("%q in the log of %s/%s", marker, ns, name), LogTimeout, func(ctx context.Context) (bool, error) {
		l, err := c.PodLog(ctx, ns, name, container)
		if err != nil {
			return false, Retry("%v", err)
		}
		log = l
		return strings.Contains(l, marker), nil
	})
	return log, err
}

// ParseEnv reads `env` output (KEY=VALUE lines) up to EnvDoneMarker, if present.
// Lines without '=' are ignored.
func ParseEnv(log string) map[string]string {
	env := map[string]string{}
	for _, line := range strings.Split(log, "\n") {
		if line == EnvDoneMarker {
			break
		}
		if k, v, ok := strings.Cut(line, "="); ok && k != "" {
			env[k] = v
		}
	}
	return env
}

// SpecPod is what one pod of an applied spec printed.
type SpecPod struct {
	Pod *corev1.Pod
	// Env and Log are those of the pod's first (main) container.
	Env map[string]string
	// Log is the container's log up to and including EnvDoneMarker.
	Log string
	// Containers is what every container printed: the init containers
	// first, then the main ones, each in the pod's order.
	Containers []ContainerEnv
}

// ContainerEnv is what one container of a pod printed.
type ContainerEnv struct {
	Name string
	Init bool
	Env  map[string]string
	// Log is the container's log up to and including EnvDoneMarker.
	Log string
}

// Container returns what the named container (init or main) printed.
func (p SpecPod) Container(name string) (ContainerEnv, bool) {
	for _, c := range p.Containers {
		if c.Name == name {
			return c, true
		}
	}
	return ContainerEnv{}, false
}

// RunSpec applies a demo spec (demo/specs/*.yaml), waits for each of its pods to
// run and print EnvDoneMarker, and returns each pod's env by pod name. The spec's
// objects are deleted when the test ends. Each pod's env is logged (t.Logf), so
// `go test -v` shows what every container saw.
func (c *Cluster) RunSpec(t testing.TB, namespace, path string) map[string]SpecPod {
	t.Helper()
	return c.WaitForSpecPods(t, c.ApplyFile(t, namespace, path))
}

// RunObjects is RunSpec for objects already decoded.
func (c *Cluster) RunObjects(t testing.TB, namespace string, objs ...*unstructured.Unstructured) map[string]SpecPod {
	t.Helper()
	return c.WaitForSpecPods(t, c.Apply(t, namespace, objs...))
}

// WaitForSpecPods waits for each Pod among applied objects to run and print
// EnvDoneMarker, logs what each printed, and returns the pods by name.
func (c *Cluster) WaitForSpecPods(t testing.TB, objs []*unstructured.Unstructured) map[string]SpecPod {
	t.Helper()
	ctx := context.Background()
	out := map[string]SpecPod{}
	for _, obj := range objs {
		if obj.GetKind() != "Pod" || obj.GetAPIVersion() != "v1" {
			continue
		}
		p, err := c.WaitForEnvPod(ctx, obj.GetNamespace(), obj.GetName())
		if err != nil {
			t.Fatal(err)
		}
		LogSpecPod(t, p)
		out[p.Pod.Name] = p
	}
	return out
}

// WaitForEnvPod waits for one pod to run and each of its containers, init
// containers included, to print EnvDoneMarker, and returns the pod (as it was
// once the markers showed) and what each container printed. Every container
// of the pod must print its env and the marker (EnvCommand, InitEnvCommand).
func (c *Cluster) WaitForEnvPod(ctx context.Context, ns, name string) (SpecPod, error) {
	pod, err := c.WaitForPodRunning(ctx, ns, name)
	if err != nil {
		return SpecPod{}, err
	}
	var out SpecPod
	type ctr struct {
		name string
		init bool
	}
	var ctrs []ctr
	for _, ic := range pod.Spec.InitContainers {
		ctrs = append(ctrs, ctr{ic.Name, true})
	}
	for _, mc := range pod.Spec.Containers {
		ctrs = append(ctrs, ctr{mc.Name, false})
	}
	for _, ct := range ctrs {
		log, err := c.WaitForLog(ctx, ns, name, ct.name, EnvDoneMarker)
		if err != nil {
			return SpecPod{}, fmt.Errorf("container %s: %w\n%s", ct.name, err, log)
		}
		if i := strings.Index(log, EnvDoneMarker); i >= 0 {
			log = log[:i+len(EnvDoneMarker)]
		}
		ce := ContainerEnv{Name: ct.name, Init: ct.init, Env: ParseEnv(log), Log: log}
		out.Containers = append(out.Containers, ce)
		if ct.name == pod.Spec.Containers[0].Name {
			out.Env, out.Log = ce.Env, ce.Log
		}
	}
	// The pod as of now: status.resourceClaimStatuses and container
	// start times are filled in by then.
	if p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		pod = p
	}
	out.Pod = pod
	return out, nil
}

// LogSpecPod logs a pod, its node and every line of env each of its
// containers printed.
func LogSpecPod(t testing.TB, p SpecPod) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s/%s on node %s saw:", p.Pod.Namespace, p.Pod.Name, p.Pod.Spec.NodeName)
	ctrs := p.Containers
	if len(ctrs) == 0 {
		ctrs = []ContainerEnv{{Env: p.Env}}
	}
	for _, c := range ctrs {
		indent := "\n    "
		if len(ctrs) > 1 {
			kind := "container"
			if c.Init {
				kind = "init container"
			}
			fmt.Fprintf(&b, "\n  %s %s:", kind, c.Name)
			indent = "\n      "
		}
		keys := make([]string, 0, len(c.Env))
		for k := range c.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "%s%s=%s", indent, k, c.Env[k])
		}
		if len(keys) == 0 {
			b.WriteString(" (no env)")
		}
	}
	t.Log(b.String())
}

// GPUVarPrefix starts the per-GPU variables a container gets from the driver
// (pkg/isolation.DeviceEdits): TESSERA_GPU_<minor>=<uuid> for each GPU it
// references and, for a share, TESSERA_GPU_<minor>_MEMORY_LIMIT=<bytes> and
// TESSERA_GPU_<minor>_CORES_LIMIT=<percent>. The minor is the N of the
// device gpu-N or gpu-N-shared.
const GPUVarPrefix = "TESSERA_GPU_"

// Suffixes of a share's limit variables.
const (
	MemoryLimitSuffix = "_MEMORY_LIMIT"
	CoresLimitSuffix  = "_CORES_LIMIT"
)

// GPUVar is the variable holding the UUID of GPU minor in a container.
func GPUVar(minor int) string { return GPUVarPrefix + strconv.Itoa(minor) }

// VisibleGPUs returns the GPUs a container sees, minor → UUID, from its
// TESSERA_GPU_<minor>=<uuid> variables; the _MEMORY_LIMIT and _CORES_LIMIT
// variables are limits, not GPUs. A TESSERA_GPU_ variable of any other form
// is an error.
func VisibleGPUs(env map[string]string) (map[int]string, error) {
	gpus := map[int]string{}
	var bad []string
	for k, v := range env {
		rest, ok := strings.CutPrefix(k, GPUVarPrefix)
		if !ok {
			continue
		}
		isLimit := false
		for _, suffix := range []string{MemoryLimitSuffix, CoresLimitSuffix} {
			if r, ok := strings.CutSuffix(rest, suffix); ok {
				rest, isLimit = r, true
				break
			}
		}
		minor, ok := parseMinor(rest)
		switch {
		case !ok:
			bad = append(bad, k)
		case !isLimit:
			gpus[minor] = v
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return gpus, fmt.Errorf("%s: neither %s<minor> nor its %s or %s", strings.Join(bad, ", "), GPUVarPrefix, MemoryLimitSuffix, CoresLimitSuffix)
	}
	return gpus, nil
}

// DeviceMinor is the minor of a Tessera device: the N of gpu-N or gpu-N-shared.
func DeviceMinor(device string) (int, error) {
	rest, ok := strings.CutPrefix(device, "gpu-")
	if ok {
		rest = strings.TrimSuffix(rest, "-shared")
		if minor, ok := parseMinor(rest); ok {
			return minor, nil
		}
	}
	return 0, fmt.Errorf("device %q is not gpu-<minor> or gpu-<minor>-shared", device)
}

// parseMinor parses a canonical decimal minor ("0", "12"; not "", "-1", "01").
func parseMinor(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || strconv.Itoa(n) != s {
		return 0, false
	}
	return n, true
}

// Allocated is one device allocated to a claim, with the device as published.
type Allocated struct {
	Result resourceapi.DeviceRequestAllocationResult
	Device resourceapi.Device
	Slice  *resourceapi.ResourceSlice
}

// Memory is the memory the allocation holds, in bytes: a share's consumed
// memory, or a whole device's memory capacity.
func (a Allocated) Memory() int64 {
	if a.Result.ShareID != nil {
		q := a.Result.ConsumedCapacity["memory"]
		return q.Value()
	}
	q := a.Device.Capacity["memory"].Value
	return q.Value()
}

// Attribute returns the device's attribute by its name in the driver's domain
// ("uuid") or its qualified name, as a string.
func (a Allocated) Attribute(name string) string {
	attr, ok := a.Device.Attributes[resourceapi.QualifiedName(name)]
	if !ok {
		attr, ok = a.Device.Attributes[resourceapi.QualifiedName(a.Result.Driver+"/"+name)]
	}
	switch {
	case !ok:
		return ""
	case attr.StringValue != nil:
		return *attr.StringValue
	case attr.VersionValue != nil:
		return *attr.VersionValue
	case attr.IntValue != nil:
		return fmt.Sprint(*attr.IntValue)
	case attr.BoolValue != nil:
		return fmt.Sprint(*attr.BoolValue)
	}
	return ""
}

// PodClaimName returns the name of the ResourceClaim behind a pod's claim entry
// (the generated one, for a claim from a template).
func PodClaimName(pod *corev1.Pod, podClaim string) (string, error) {
	for _, pc := range pod.Spec.ResourceClaims {
		if pc.Name == podClaim && pc.ResourceClaimName != nil {
			return *pc.ResourceClaimName, nil
		}
	}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == podClaim && s.ResourceClaimName != nil {
			return *s.ResourceClaimName, nil
		}
	}
	return "", fmt.Errorf("pod %s/%s has no claim %q", pod.Namespace, pod.Name, podClaim)
}

// AllocatedDevices returns a claim's allocation with each device looked up in the
// published ResourceSlices.
func (c *Cluster) AllocatedDevices(ctx context.Context, ns, claimName string) ([]Allocated, error) {
	claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", ns, claimName)
	}
	slices, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []Allocated
	for _, r := range claim.Status.Allocation.Devices.Results {
		a := Allocated{Result: r}
		for i := range slices.Items {
			s := &slices.Items[i]
			if s.Spec.Driver != r.Driver || s.Spec.Pool.Name != r.Pool {
				continue
			}
			for _, d := range s.Spec.Devices {
				if d.Name == r.Device {
					a.Device, a.Slice = d, s
				}
			}
		}
		if a.Slice == nil {
			return nil, fmt.Errorf("claim %s/%s: device %s/%s/%s is in no ResourceSlice", ns, claimName, r.Driver, r.Pool, r.Device)
		}
		out = append(out, a)
	}
	return out, nil
}

// DriverSlices lists the ResourceSlices Tessera published.
func (c *Cluster) DriverSlices(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
	list, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + Driver,
	})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// WaitForDevices waits until the driver publishes at least one device that
// check counts and none that check finds not yet as wanted, and fails the
// test if that does not happen within PodTimeout; what names the wait.
// check returns false to pass over a device, and an error (why) for a device
// not yet as wanted.
func (c *Cluster) WaitForDevices(t testing.TB, what string, check func(resourceapi.Device) (bool, error)) {
	t.Helper()
	err := Poll(context.Background(), what, PodTimeout, func(ctx context.Context) (bool, error) {
		slices, err := c.DriverSlices(ctx)
		if err != nil {
			return false, Retry("%v", err)
		}
		n := 0
		for _, s := range slices {
			for _, d := range s.Spec.Devices {
				counts, err := check(d)
				if err != nil {
					return false, Retry("device %s of slice %s: %v", d.Name, s.Name, err)
				}
				if counts {
					n++
				}
			}
		}
		if n == 0 {
			return false, Retry("no device to check published")
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// RequireDriver skips the test when Tessera is not installed (no DeviceClass or
// no ResourceSlice), so the cluster tests run before the plugin exists.
//
// When the suite installed Tessera itself (TESSERA_E2E_INSTALL=1, as `make e2e`
// does), a missing driver is a failure, not a skip: a broken install must not pass
// as a run with nothing tested.
func (c *Cluster) RequireDriver(t testing.TB, deviceClasses ...string) {
	t.Helper()
	ctx := context.Background()
	skip := t.Skipf
	if os.Getenv("TESSERA_E2E_INSTALL") == "1" {
		skip = t.Fatalf
	}
	for _, dc := range deviceClasses {
		if _, err := c.Client.ResourceV1().DeviceClasses().Get(ctx, dc, metav1.GetOptions{}); err != nil {
			skip("DeviceClass %s: %v (install Tessera: demo/clusters/local/install.sh)", dc, err)
		}
	}
	slices, err := c.DriverSlices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(slices) == 0 {
		skip("no ResourceSlice of %s (install Tessera: demo/clusters/local/install.sh)", Driver)
	}
}

// WaitForUnschedulable waits until the scheduler has tried the pod and given
// up (condition PodScheduled=False, reason Unschedulable) and returns that
// condition. The pod must not be bound meanwhile.
func (c *Cluster) WaitForUnschedulable(ctx context.Context, ns, name string) (corev1.PodCondition, error) {
	var cond corev1.PodCondition
	_, err := c.WaitForPod(ctx, ns, name, "to be unschedulable", func(p *corev1.Pod) bool {
		for _, pc := range p.Status.Conditions {
			if pc.Type == corev1.PodScheduled && pc.Status == corev1.ConditionFalse && pc.Reason == corev1.PodReasonUnschedulable {
				cond = pc
				return true
			}
		}
		return false
	})
	if err != nil {
		return cond, err
	}
	return cond, nil
}

// WantPrepareFailed waits until a device of the claim has the condition the
// plugin writes when prepare refuses the claim (Ready=False, reason
// PrepareFailed) and checks that its message contains want. It fails the
// test, describing pod (the claim's user), if the condition does not come
// or a device has status data, which the plugin writes only for what it
// prepared.
func (c *Cluster) WantPrepareFailed(ctx context.Context, t testing.TB, ns, claim, pod, want string) {
	t.Helper()
	var message string
	err := Poll(ctx, "claim "+claim+"'s Ready=False condition", PodTimeout, func(ctx context.Context) (bool, error) {
		rc, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return false, Retry("%v", err)
		}
		for _, d := range rc.Status.Devices {
			if d.Data != nil {
				return false, fmt.Errorf("claim %s: the refused device %s has status data %s", claim, d.Device, d.Data.Raw)
			}
			if ready := meta.FindStatusCondition(d.Conditions, "Ready"); ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason == "PrepareFailed" {
				message = ready.Message
				return true, nil
			}
		}
		return false, Retry("status.devices %+v", rc.Status.Devices)
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, c.DescribePod(ctx, ns, pod))
	}
	if !strings.Contains(message, want) {
		t.Errorf("claim %s: Ready=False with\n  %s\nwant the message to contain\n  %s", claim, message, want)
		return
	}
	t.Logf("claim %s: refused at prepare: %s", claim, message)
}

// WantNoContainerRunning fails the test if a container of the pod runs, for
// a pod whose claim prepare refused.
func (c *Cluster) WantNoContainerRunning(ctx context.Context, t testing.TB, ns, name string) {
	t.Helper()
	pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil {
			t.Errorf("pod %s: container %s runs although prepare refused its claim", name, cs.Name)
		}
	}
}

// PodEvents returns the messages of the pod's events with this reason
// ("FailedScheduling"), oldest first.
func (c *Cluster) PodEvents(ctx context.Context, ns, name, reason string) ([]string, error) {
	events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name + ",reason=" + reason,
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(events.Items, func(i, j int) bool {
		return events.Items[i].LastTimestamp.Before(&events.Items[j].LastTimestamp)
	})
	var out []string
	for _, e := range events.Items {
		out = append(out, e.Message)
	}
	return out, nil
}

// DeletePodAndWait deletes a pod gracefully (its own grace period; the demo
// pods' is 1 s) and waits until it is gone. The kubelet removes a gracefully
// deleted pod only after its containers stopped and it has unprepared the
// pod's claims (SyncTerminatedPod), so a pod that goes also means its claims
// were unprepared without error. (A forced deletion, grace period 0, would
// remove the object at once and leave the kubelet to clean up later.)
func (c *Cluster) DeletePodAndWait(ctx context.Context, ns, name string) error {
	err := c.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return Poll(ctx, fmt.Sprintf("pod %s/%s to be gone", ns, name), PodTimeout, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, Retry("%v", err)
		}
		return false, Retry("still there")
	})
}

// ClaimDeviceData is the driver's status.devices[].data of one prepared device
// (pkg/plugin.DeviceData), with the entry's conditions.
type ClaimDeviceData struct {
	Device      string
	UUID        string `json:"uuid"`
	MemoryLimit int64  `json:"memoryLimit"`
	CoresLimit  int64  `json:"coresLimit"`
	Isolation   string `json:"isolation"`
	Conditions  []metav1.Condition
}

// ClaimStatusDevices returns the claim's status.devices entries of Tessera, in
// the order the plugin wrote them. The plugin writes them inside prepare,
// before the kubelet starts a container, so once a pod's container has printed
// its env they are there (or were never written).
func (c *Cluster) ClaimStatusDevices(ctx context.Context, ns, claimName string) ([]ClaimDeviceData, error) {
	claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out []ClaimDeviceData
	for _, d := range claim.Status.Devices {
		if d.Driver != Driver {
			continue
		}
		e := ClaimDeviceData{Device: d.Device, Conditions: d.Conditions}
		if d.Data != nil {
			if err := json.Unmarshal(d.Data.Raw, &e); err != nil {
				return nil, fmt.Errorf("claim %s/%s: status.devices[%s].data %s: %w", ns, claimName, d.Device, d.Data.Raw, err)
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// EnvCommand is what the demo specs' containers run: print the GPU env the
// driver gave them, then EnvDoneMarker, then sleep.
const EnvCommand = envPrint + `; exec sleep 2147483647`

// InitEnvCommand is EnvCommand for an init container: it prints and exits.
const InitEnvCommand = envPrint

const envPrint = `env | grep -E "^(NVIDIA_|CUDA_|TESSERA_|TF_FORCE)" | sort; echo ` + EnvDoneMarker

// EnvImage is the image of the env-printing containers.
const EnvImage = "docker.io/library/busybox:1.36"

// EnvPod returns a pod like the demo specs' that uses one claim as its claim
// entry "gpu": the named ResourceClaim, or, with template, a claim generated
// from the named ResourceClaimTemplate.
func EnvPod(name, claim string, template bool) *unstructured.Unstructured {
	ref := map[string]any{"name": "gpu"}
	if template {
		ref["resourceClaimTemplateName"] = claim
	} else {
		ref["resourceClaimName"] = claim
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": name, "labels": map[string]any{"tessera.dev/e2e": "true"}},
		"spec": map[string]any{
			"terminationGracePeriodSeconds": int64(1),
			"resourceClaims":                []any{ref},
			"containers": []any{map[string]any{
				"name":      "ctr",
				"image":     EnvImage,
				"command":   []any{"sh", "-c", EnvCommand},
				"resources": map[string]any{"claims": []any{map[string]any{"name": "gpu"}}},
			}},
		},
	}}
}

// ScriptPod is a pod whose one container, ctr, uses one claim as its claim
// entry "gpu" (the named ResourceClaim, or, with template, a claim generated
// from the named ResourceClaimTemplate) and runs script with sh -c in
// EnvImage, then prints EnvDoneMarker and sleeps: the KEY=value lines the
// script prints are what WaitForEnvPod returns. Tests may change the pod
// (the container's image, env, securityContext) before Unstructured.
func ScriptPod(name, claim string, template bool, script string) *corev1.Pod {
	ref := corev1.PodResourceClaim{Name: "gpu"}
	if template {
		ref.ResourceClaimTemplateName = &claim
	} else {
		ref.ResourceClaimName = &claim
	}
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			ResourceClaims:                []corev1.PodResourceClaim{ref},
			Containers: []corev1.Container{{
				Name:      "ctr",
				Image:     EnvImage,
				Command:   []string{"sh", "-c", strings.TrimSpace(script) + "\necho " + EnvDoneMarker + "\nexec sleep 2147483647"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
}

// PodClaim is one entry of a pod's spec.resourceClaims: Name, and either
// Claim (a ResourceClaim's name) or Template (a ResourceClaimTemplate's).
type PodClaim struct {
	Name, Claim, Template string
}

// EnvContainer is one container of an EnvPodWith pod. Claims are the pod's
// claim entries it references: "entry" (all of the claim) or
// "entry/request" (one request of it).
type EnvContainer struct {
	Name   string
	Init   bool
	Claims []string
}

// EnvPodWith is EnvPod with any claims and containers: every container
// prints its env and EnvDoneMarker (a main container then sleeps, an init
// container exits), so WaitForEnvPod returns what each one saw.
func EnvPodWith(name string, claims []PodClaim, ctrs ...EnvContainer) *unstructured.Unstructured {
	var podClaims []any
	for _, c := range claims {
		ref := map[string]any{"name": c.Name}
		if c.Template != "" {
			ref["resourceClaimTemplateName"] = c.Template
		} else {
			ref["resourceClaimName"] = c.Claim
		}
		podClaims = append(podClaims, ref)
	}
	var inits, mains []any
	for _, c := range ctrs {
		var refs []any
		for _, r := range c.Claims {
			entry, request, _ := strings.Cut(r, "/")
			ref := map[string]any{"name": entry}
			if request != "" {
				ref["request"] = request
			}
			refs = append(refs, ref)
		}
		cmd := EnvCommand
		if c.Init {
			cmd = InitEnvCommand
		}
		ctr := map[string]any{
			"name":    c.Name,
			"image":   EnvImage,
			"command": []any{"sh", "-c", cmd},
		}
		if len(refs) > 0 {
			ctr["resources"] = map[string]any{"claims": refs}
		}
		if c.Init {
			inits = append(inits, ctr)
		} else {
			mains = append(mains, ctr)
		}
	}
	spec := map[string]any{
		"terminationGracePeriodSeconds": int64(1),
		"containers":                    mains,
	}
	if len(podClaims) > 0 {
		spec["resourceClaims"] = podClaims
	}
	if len(inits) > 0 {
		spec["initContainers"] = inits
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": name, "labels": map[string]any{"tessera.dev/e2e": "true"}},
		"spec":       spec,
	}}
}

// MustDecodeYAML is DecodeYAML for YAML written in a test: the documents
// of docs, in order.
func MustDecodeYAML(t testing.TB, docs ...string) []*unstructured.Unstructured {
	t.Helper()
	yaml := strings.Join(docs, "\n---\n")
	objs, err := DecodeYAML([]byte(yaml))
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml)
	}
	return objs
}

// DeletePods deletes the pods gracefully and waits until they are gone, i.e.
// the kubelet unprepared their claims without error (DeletePodAndWait), so
// the GPUs are free for the next test.
func DeletePods(t *testing.T, c *Cluster, ns string, names ...string) {
	t.Helper()
	start := time.Now()
	for _, n := range names {
		if err := c.DeletePodAndWait(context.Background(), ns, n); err != nil {
			t.Errorf("delete pod %s: %v", n, err)
			continue
		}
		t.Logf("pod %s gone (claims unprepared) after %v", n, time.Since(start).Round(100*time.Millisecond))
	}
}

// WaitForPodGone waits until the pod is deleted from the API.
func (c *Cluster) WaitForPodGone(ctx context.Context, ns, name string, timeout time.Duration) error {
	return Poll(ctx, "pod "+ns+"/"+name+" to be gone", timeout, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, Retry("%v", err)
		}
		return false, Retry("phase %s, deleting %v", p.Status.Phase, p.DeletionTimestamp != nil)
	})
}

// ClaimEvents returns "reason: message" of the events on a claim.
func (c *Cluster) ClaimEvents(ctx context.Context, ns, claim string) ([]string, error) {
	list, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ResourceClaim,involvedObject.name=" + claim})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out, nil
}

// EnvOf waits for a pod already created to run and each container to print
// its env (WaitForEnvPod), fails the test when that does not happen, logs
// what the containers printed (LogSpecPod) and returns it.
func (c *Cluster) EnvOf(ctx context.Context, t testing.TB, ns, name string) SpecPod {
	t.Helper()
	p, err := c.WaitForEnvPod(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	LogSpecPod(t, p)
	return p
}
