package scale

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-dev/tessera/pkg/model"
)

// Workloads of the experiments (not in Workloads: they need other slices).
const (
	// NVIDIAWholeWorkload is one whole GPU from NVIDIA's class gpu.nvidia.com.
	NVIDIAWholeWorkload = "nvidia-whole"
	// MIGWorkload is one 1g.10gb MIG device from mig.gpu.tessera.dev, on
	// nodes that publish every GPU with dynamic MIG.
	MIGWorkload = "mig-1g"
	// MIGProfile is the profile the MIG workload asks for.
	MIGProfile = "1g.10gb"
	// DynamicMIGProfile is the mock profile of the MIG experiment's nodes.
	DynamicMIGProfile = "hgx-h100-dynamic-mig"
	// MIGBaselineProfile is the same node with no GPU in MIG mode, whose
	// whole GPUs the MIG experiment compares against.
	MIGBaselineProfile = "hgx-h100"
)

// ExperimentWorkloads are the workloads of Peer and MIGFill, their claim
// templates in namespace ns.
func ExperimentWorkloads(ns string) []Workload {
	one := func(class string, selectors ...resourceapi.DeviceSelector) resourceapi.DeviceClaim {
		return resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Selectors: selectors},
		}}}
	}
	profile := resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf(`device.attributes[%q].%s == %q`, model.DriverName, model.AttrProfile, MIGProfile),
	}}
	return []Workload{
		claimWorkload(ns, NVIDIAWholeWorkload, "1 whole GPU from NVIDIA's class "+NVIDIAClassName+", on its slices", 1, one(NVIDIAClassName)),
		claimWorkload(ns, MIGWorkload, "one "+MIGProfile+" MIG device (class "+model.MIGClassName+" and a profile selector), on dynamic-MIG slices", 1.0/7, one(model.MIGClassName, profile)),
	}
}

// workload returns the named workload of Workloads or ExperimentWorkloads.
func workload(ns, name string) (Workload, error) {
	for _, w := range append(Workloads(ns), ExperimentWorkloads(ns)...) {
		if w.Name == name {
			return w, nil
		}
	}
	return Workload{}, fmt.Errorf("unknown workload %q", name)
}

// ensureTemplates creates the workloads' claim templates in ns.
func ensureTemplates(ctx context.Context, c kubernetes.Interface, ns string, ws ...Workload) error {
	for _, w := range ws {
		if w.Template == nil {
			continue
		}
		_, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, w.Template, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("ResourceClaimTemplate %s/%s: %w", ns, w.Template.Name, err)
		}
	}
	return nil
}

// Peer measures whole-GPU claims on Tessera's slices against the same claims
// on the slices NVIDIA's DRA driver publishes for the same node (the profile's
// mock GPUs), on nodes fake nodes: runs times each, alternating (Tessera
// first), pods pods per run, republishing every node's slices before each run.
// Each Result has Run (1…runs) and Published set. The nodes publish Tessera's
// slices again at the end.
func Peer(ctx context.Context, cfg Config, nodes, runs, pods int) ([]Result, error) {
	whole, peer, err := prepareComparison(ctx, &cfg, nodes, NVIDIAWholeWorkload)
	if err != nil {
		return nil, err
	}
	tessera, nvidia := TesseraPublisher(cfg.Profile), NVIDIAPublisher(cfg.Profile)
	type step struct {
		pub Publisher
		w   Workload
	}
	var out []Result
	err = func() error {
		for run := 1; run <= runs; run++ {
			// Tessera first in odd runs, NVIDIA first in even ones: neither
			// always meets the cluster just after the other's cleanup.
			steps := []step{{tessera, whole}, {nvidia, peer}}
			if run%2 == 0 {
				steps[0], steps[1] = steps[1], steps[0]
			}
			for _, st := range steps {
				r, err := publishAndRun(ctx, &cfg, st.pub, st.w, nodes, pods, nil)
				if err != nil {
					return err
				}
				r.Run = run
				out = append(out, r)
			}
		}
		return nil
	}()
	return out, errors.Join(err, PublishOnNodes(context.WithoutCancel(ctx), cfg.Client, nodes, cfg.Workers, tessera))
}

// MIGFill measures one-MIG-device pods on nodes that publish every GPU with
// dynamic MIG (DynamicMIGProfile) against whole-GPU claims on Tessera's
// ordinary slices of the same GPUs (cfg.Profile), at each fill level: fill
// is how many of each node's 8 GPUs are taken before the run, by one claim
// per node whose allocation the benchmark writes itself (the largest MIG
// placement of each taken GPU on the MIG nodes, the whole GPU on the
// others), so the scheduler places the run's pods around them. Each Result
// has Fill (taken GPUs ÷ 8) and Published set. The nodes publish Tessera's
// ordinary slices again at the end.
func MIGFill(ctx context.Context, cfg Config, nodes int, fills []int, pods int) ([]Result, error) {
	whole, mig, err := prepareComparison(ctx, &cfg, nodes, MIGWorkload)
	if err != nil {
		return nil, err
	}
	plain, dynamic := TesseraPublisher(MIGBaselineProfile), DynamicMIGPublisher(DynamicMIGProfile)
	migTaken, err := largestPlacements(dynamic)
	if err != nil {
		return nil, err
	}
	if len(migTaken) != 8 {
		return nil, fmt.Errorf("%s: %d GPUs with MIG placements, want 8", DynamicMIGProfile, len(migTaken))
	}
	var out []Result
	err = func() error {
		for _, k := range fills {
			if k < 0 || k >= 8 {
				return fmt.Errorf("fill %d: want 0 to 7 GPUs of 8 taken", k)
			}
			for _, step := range []struct {
				pub   Publisher
				w     Workload
				class string
				taken func(minor int) string
			}{
				{plain, whole, model.WholeClassName, model.WholeDeviceName},
				{DynamicMIGPublisherTaken(DynamicMIGProfile, k), mig, model.MIGClassName, func(minor int) string { return migTaken[minor] }},
			} {
				fill := &prefill{gpus: k, class: step.class, device: step.taken}
				r, err := publishAndRun(ctx, &cfg, step.pub, step.w, nodes, pods, fill)
				if err != nil {
					return err
				}
				r.Fill = float64(k) / 8
				out = append(out, r)
			}
		}
		return nil
	}()
	return out, errors.Join(err, PublishOnNodes(context.WithoutCancel(ctx), cfg.Client, nodes, cfg.Workers, TesseraPublisher(cfg.Profile)))
}

// prepareComparison is prepareExperiment for a comparison of the whole-claim
// workload with the workload named other: it returns the two workloads.
func prepareComparison(ctx context.Context, cfg *Config, nodes int, other string) (whole, w Workload, err error) {
	if whole, err = workload(cfg.Namespace, "whole-claim"); err != nil {
		return Workload{}, Workload{}, err
	}
	if w, err = workload(cfg.Namespace, other); err != nil {
		return Workload{}, Workload{}, err
	}
	if err := prepareExperiment(ctx, cfg, nodes, whole, w); err != nil {
		return Workload{}, Workload{}, err
	}
	return whole, w, nil
}

// prepareExperiment makes the classes (Tessera's and NVIDIA's), the
// namespaces, the workloads' templates and nodes fake nodes.
func prepareExperiment(ctx context.Context, cfg *Config, nodes int, ws ...Workload) error {
	if err := EnsureDeviceClasses(ctx, cfg.Client); err != nil {
		return err
	}
	if err := EnsureClasses(ctx, cfg.Client, []*resourceapi.DeviceClass{NVIDIADeviceClass()}); err != nil {
		return err
	}
	for _, ns := range []string{cfg.Namespace, fillNamespace(cfg.Namespace)} {
		if err := ensureNamespace(ctx, cfg.Client, ns); err != nil {
			return err
		}
	}
	if err := ensureTemplates(ctx, cfg.Client, cfg.Namespace, ws...); err != nil {
		return err
	}
	// Fill claims an interrupted run left would hold GPUs in every run.
	if err := deleteClaims(ctx, cfg.Client, fillNamespace(cfg.Namespace), cfg.Cleanup); err != nil {
		return err
	}
	return EnsureNodes(ctx, cfg.Client, nodes, cfg.Profile, cfg.Workers, 10*time.Minute)
}

// publishAndRun republishes every node's slices with pub, takes the fill's
// GPUs, runs the workload once and gives the GPUs back.
//
// The scheduler learns of the new slices and the fill's claims through its
// informers, after the API server has them: the run starts Settle later, so
// that neither the scheduler's catching up nor pods it could not place yet
// fall into the measured window.
func publishAndRun(ctx context.Context, cfg *Config, pub Publisher, w Workload, nodes, pods int, fill *prefill) (Result, error) {
	t0 := time.Now()
	if err := PublishOnNodes(ctx, cfg.Client, nodes, cfg.Workers, pub); err != nil {
		return Result{}, err
	}
	cfg.logf("%d nodes publish %s (%s)", nodes, pub.Name, time.Since(t0).Round(time.Second))
	ns := fillNamespace(cfg.Namespace)
	if fill != nil && fill.gpus > 0 {
		defer func() {
			if err := deleteClaims(context.WithoutCancel(ctx), cfg.Client, ns, cfg.Cleanup); err != nil {
				cfg.logf("fill claims: %v", err)
			}
		}()
		if err := fill.take(ctx, cfg, ns, pub, nodes); err != nil {
			return Result{}, err
		}
	}
	select {
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-time.After(Settle):
	}
	var verify func(context.Context) error
	if fill != nil && fill.gpus > 0 {
		verify = func(ctx context.Context) error { return fill.check(ctx, cfg.Client, cfg.Namespace) }
	}
	r, err := runOnce(ctx, cfg, w, nodes, pods, verify)
	r.Published = pub.Name
	cfg.logf("%s (load %.2f → %.2f)", r, r.LoadBefore, r.LoadAfter)
	return r, err
}

// Settle is how long an experiment waits after publishing slices or taking
// GPUs before it creates a run's pods.
const Settle = 15 * time.Second

// fillNamespace holds the claims that take GPUs before a run (runOnce waits
// for every claim of its own namespace to go).
func fillNamespace(ns string) string { return ns + "-fill" }

// prefill takes the first gpus GPUs of every node (each publisher's pool is
// named after its node): one claim per node of
// class, allocated to device(minor) for each, written into the claim's
// status without the scheduler (the scheduler counts every allocated claim
// as holding its devices, reserved or not).
type prefill struct {
	gpus   int
	class  string
	device func(minor int) string
}

func (p *prefill) take(ctx context.Context, cfg *Config, ns string, pub Publisher, nodes int) error {
	t0 := time.Now()
	jobs := make([]func() error, nodes)
	for i := range nodes {
		node := NodeName(i)
		jobs[i] = func() error {
			claim := &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "fill-" + node, Namespace: ns},
				Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
					Name: "gpu",
					Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: p.class, AllocationMode: resourceapi.DeviceAllocationModeExactCount,
						Count: int64(p.gpus)},
				}}}},
			}
			created, err := cfg.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("fill claim %s/%s: %w", ns, claim.Name, err)
			}
			var results []resourceapi.DeviceRequestAllocationResult
			for minor := range p.gpus {
				dev := p.device(minor)
				if dev == "" {
					return fmt.Errorf("fill claim %s/%s: no device to take on GPU %d", ns, claim.Name, minor)
				}
				results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: pub.Driver, Pool: node, Device: dev})
			}
			created.Status.Allocation = &resourceapi.AllocationResult{
				Devices: resourceapi.DeviceAllocationResult{Results: results},
				NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
				}}},
			}
			if _, err := cfg.Client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("fill claim %s/%s: allocate: %w", ns, claim.Name, err)
			}
			return nil
		}
	}
	if err := parallel(cfg.Workers, jobs); err != nil {
		return err
	}
	cfg.logf("took %d of 8 GPUs on each of %d nodes (%s)", p.gpus, nodes, time.Since(t0).Round(time.Second))
	return nil
}

// check fails when a claim in ns (the run's) was allocated a device of a
// GPU the fill took: the scheduler did not count the fill's claims.
func (p *prefill) check(ctx context.Context, c kubernetes.Interface, ns string) error {
	claims, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("check the run's claims: %w", err)
	}
	for _, claim := range claims.Items {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, d := range claim.Status.Allocation.Devices.Results {
			var minor int
			if _, err := fmt.Sscanf(d.Device, "gpu-%d", &minor); err == nil && minor < p.gpus {
				return fmt.Errorf("claim %s/%s got %s on %s, a GPU the fill took", ns, claim.Name, d.Device, d.Pool)
			}
		}
	}
	return nil
}

// deleteClaims deletes every ResourceClaim in ns and waits until they are gone.
func deleteClaims(ctx context.Context, c kubernetes.Interface, ns string, timeout time.Duration) error {
	if err := c.ResourceV1().ResourceClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete fill claims: %w", err)
	}
	return wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, nil
	})
}

// largestPlacements returns, per GPU minor of pub's node, the device of the
// placement that covers the most memory slices (the GPU's full profile):
// taking it takes the whole GPU.
func largestPlacements(pub Publisher) (map[int]string, error) {
	slices, err := pub.Slices(NodeName(0))
	if err != nil {
		return nil, err
	}
	best := map[int]string{}
	size := map[int]int64{}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			minor, ok := d.Attributes[model.AttrParentMinor]
			pl, ok2 := d.Attributes[model.AttrPlacementSize]
			if !ok || !ok2 || minor.IntValue == nil || pl.IntValue == nil {
				continue
			}
			m := int(*minor.IntValue)
			if *pl.IntValue > size[m] || (*pl.IntValue == size[m] && d.Name < best[m]) {
				best[m], size[m] = d.Name, *pl.IntValue
			}
		}
	}
	if len(best) == 0 {
		return nil, fmt.Errorf("%s: no MIG placement devices", pub.Name)
	}
	return best, nil
}

// sortedFills returns the distinct fill levels of rs, ascending.
func sortedFills(rs []Result) []float64 {
	var out []float64
	for _, r := range rs {
		if !slices.Contains(out, r.Fill) {
			out = append(out, r.Fill)
		}
	}
	slices.Sort(out)
	return out
}
