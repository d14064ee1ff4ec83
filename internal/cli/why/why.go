package why

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/model"
)

// Input is the cluster as the scheduler sees it.
type Input struct {
	// Slices are all ResourceSlices (every driver: a claim may ask for
	// another driver's devices too).
	Slices []resourceapi.ResourceSlice
	// Classes are all DeviceClasses.
	Classes []resourceapi.DeviceClass
	// Claims are all ResourceClaims; the allocated ones make up the
	// allocated state.
	Claims []resourceapi.ResourceClaim
	// Nodes are the cluster's nodes. When empty (no permission to list
	// them), the nodes named by the slices stand in, without labels.
	Nodes []v1.Node
	// TaintRules are all DeviceTaintRules: the scheduler adds each rule's
	// taint to the devices its selector picks before it allocates.
	TaintRules []resourceapi.DeviceTaintRule
}

// Report is the explanation for one pod or claim.
type Report struct {
	// Target is "pod NAMESPACE/NAME" or "claim NAMESPACE/NAME".
	Target string `json:"target"`
	// Claims are the claims the target needs, in the pod's order.
	Claims []Claim `json:"claims"`
	// Notes are findings about the target as a whole (a claim not yet
	// created, all claims already allocated, a DeviceClass missing).
	Notes []string `json:"notes,omitempty"`
	// Nodes are the nodes that publish gpu.tessera.dev devices, by name.
	Nodes []Node `json:"nodes"`
}

// Claim is one claim of the target.
type Claim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Generated is true for a claim that does not exist yet and stands for
	// what the scheduler will create: the claim of the pod's extended
	// resources (tessera.dev/gpu).
	Generated bool `json:"generated,omitempty"`
	// AllocatedOn is the node of an allocated claim.
	AllocatedOn string `json:"allocatedOn,omitempty"`
	// Requests describe each request: "gpu: 1 of shared.gpu.tessera.dev, memory 20Gi, cores 25".
	Requests []string `json:"requests"`
}

// Node is the verdict for one node.
type Node struct {
	Name string `json:"name"`
	// Fits is the allocator's verdict for all of the target's unallocated
	// claims together on this node.
	Fits bool `json:"fits"`
	// Allocation lists the devices the allocator would pick when it fits:
	// "claim/request: gpu-0-shared".
	Allocation []string `json:"allocation,omitempty"`
	// Reasons are findings about the node rather than one GPU: no device of
	// a class, too few devices for a count, an NVLink domain too small, an
	// allocator error.
	Reasons []string `json:"reasons,omitempty"`
	// GPUs say, per GPU the requests could use, what fails on it.
	GPUs []GPU `json:"gpus,omitempty"`
	// FitsNow is what a new claim would get on this node now.
	FitsNow FitsNow `json:"fitsNow"`
}

// GPU is what fails on one GPU (all of its devices: gpu-N, gpu-N-shared,
// gpu-N-lent).
type GPU struct {
	Name    string   `json:"name"`
	Reasons []string `json:"reasons"`
}

// FitsNow is the free capacity of a node.
type FitsNow struct {
	// LargestShare is the share of the emptiest shareable GPU (untainted,
	// not held whole); nil when no GPU takes a share.
	LargestShare *Share `json:"largestShare,omitempty"`
	// WholeGPUs is the number of GPUs free to be allocated whole.
	WholeGPUs int `json:"wholeGPUs"`
	// MIG lists, per GPU in MIG mode, the profiles a new MIG claim could
	// get now: free static instances, placements whose counters fit.
	MIG []MIGFit `json:"mig,omitempty"`
}

// MIGFit is the MIG profiles one GPU has free now.
type MIGFit struct {
	GPU      string   `json:"gpu"`
	Profiles []string `json:"profiles"`
}

// Share is an amount of one GPU.
type Share struct {
	GPU         string `json:"gpu"`
	MemoryBytes int64  `json:"memoryBytes"`
	Cores       int64  `json:"cores"`
}

// Get reads what Explain needs from the API and explains target: "NAME" or
// "pod/NAME" for a pod, "claim/NAME" (or "resourceclaim/NAME") for a claim,
// in namespace.
func Get(ctx context.Context, client kubernetes.Interface, namespace, target string) (Report, error) {
	kind, name, found := strings.Cut(target, "/")
	if !found {
		kind, name = "pod", target
	}
	if name == "" {
		return Report{}, fmt.Errorf("%q: want POD, pod/NAME or claim/NAME", target)
	}
	var t Target
	switch strings.ToLower(kind) {
	case "pod", "pods", "po":
		pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return Report{}, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
		}
		t.Pod = pod
	case "claim", "resourceclaim", "resourceclaims", "claims":
		claim, err := client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return Report{}, fmt.Errorf("claim %s/%s: %w", namespace, name, err)
		}
		t.Claim = claim
	default:
		return Report{}, fmt.Errorf("%q: unknown kind %q (want pod or claim)", target, kind)
	}
	var in Input
	sl, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return Report{}, fmt.Errorf("list ResourceSlices: %w", err)
	}
	in.Slices = sl.Items
	cl, err := client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return Report{}, fmt.Errorf("list DeviceClasses: %w", err)
	}
	in.Classes = cl.Items
	claims, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return Report{}, fmt.Errorf("list ResourceClaims: %w", err)
	}
	in.Claims = claims.Items
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		in.Nodes = nodes.Items
	case apierrors.IsForbidden(err):
		// Slices name their nodes; only node selectors need labels.
	default:
		return Report{}, fmt.Errorf("list Nodes: %w", err)
	}
	var rulesNote string
	rules, err := client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		in.TaintRules = rules.Items
	case apierrors.IsForbidden(err):
		rulesNote = "DeviceTaintRules are not readable (forbidden): the taints they add are not considered, so a device a rule keeps off may be reported as fitting"
	case apierrors.IsNotFound(err):
		rulesNote = "the API server does not serve DeviceTaintRules (resource.k8s.io/v1): only the taints the drivers publish are considered"
	default:
		return Report{}, fmt.Errorf("list DeviceTaintRules: %w", err)
	}
	r, err := Explain(ctx, in, t)
	if err == nil && rulesNote != "" {
		r.Notes = append(r.Notes, rulesNote)
	}
	return r, err
}

// Target is a pod or a claim (exactly one set).
type Target struct {
	Pod   *v1.Pod
	Claim *resourceapi.ResourceClaim
}

// Explain runs the allocator for target on every node that publishes
// gpu.tessera.dev devices and explains each refusal. The only error is a
// target that is neither a pod nor a claim.
func Explain(ctx context.Context, in Input, target Target) (Report, error) {
	var r Report
	var claims []*resourceapi.ResourceClaim
	switch {
	case target.Pod != nil:
		pod := target.Pod
		r.Target = "pod " + pod.Namespace + "/" + pod.Name
		claims, r.Notes = podClaims(pod, in)
	case target.Claim != nil:
		r.Target = "claim " + target.Claim.Namespace + "/" + target.Claim.Name
		claims = []*resourceapi.ResourceClaim{target.Claim}
	default:
		return Report{}, fmt.Errorf("explain: no pod and no claim given")
	}
	e := newExplainer(in)
	var pending []*resourceapi.ResourceClaim
	for _, c := range claims {
		info := Claim{Namespace: c.Namespace, Name: c.Name, Generated: c.UID == "", Requests: e.describeRequests(c)}
		if c.Status.Allocation != nil {
			info.AllocatedOn = allocationNode(c.Status.Allocation)
		} else {
			pending = append(pending, c)
		}
		r.Claims = append(r.Claims, info)
	}
	if r.Claims == nil {
		r.Claims = []Claim{}
	}
	r.Nodes = []Node{}
	switch {
	case len(claims) == 0:
		r.Notes = append(r.Notes, "no resource claims: the pod asks for no devices")
		return r, nil
	case len(pending) == 0:
		r.Notes = append(r.Notes, "every claim is allocated: the target does not wait for devices")
		return r, nil
	}
	for _, c := range pending {
		for _, cls := range e.classesOf(c) {
			if _, ok := e.classes[cls]; !ok {
				r.Notes = append(r.Notes, fmt.Sprintf("claim %s/%s: DeviceClass %q does not exist", c.Namespace, c.Name, cls))
			}
		}
	}
	for _, node := range e.nodes() {
		if !e.nodeAllowed(node, claims) {
			continue
		}
		r.Nodes = append(r.Nodes, e.explainNode(ctx, node, pending))
	}
	return r, nil
}

// podClaims are the claims of a pod: spec.resourceClaims (by name, or the
// claim generated from a template as status.resourceClaimStatuses names it)
// and the claim of its DRA-backed extended resources (the one the scheduler
// created, or one built the way the scheduler will build it).
func podClaims(pod *v1.Pod, in Input) (claims []*resourceapi.ResourceClaim, notes []string) {
	byName := map[types.NamespacedName]*resourceapi.ResourceClaim{}
	for i := range in.Claims {
		c := &in.Claims[i]
		byName[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c
	}
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		name, _, err := resourceclaim.Name(pod, pc)
		switch {
		case err != nil:
			notes = append(notes, fmt.Sprintf("spec.resourceClaims[%s]: the claim from template %s is not created yet (%v)", pc.Name, ptr.Deref(pc.ResourceClaimTemplateName, ""), err))
			continue
		case name == nil:
			continue // intentionally not created
		}
		c, ok := byName[types.NamespacedName{Namespace: pod.Namespace, Name: *name}]
		if !ok {
			notes = append(notes, fmt.Sprintf("spec.resourceClaims[%s]: claim %s/%s does not exist", pc.Name, pod.Namespace, *name))
			continue
		}
		claims = append(claims, c)
	}
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil && s.ResourceClaimName != "" {
		if c, ok := byName[types.NamespacedName{Namespace: pod.Namespace, Name: s.ResourceClaimName}]; ok {
			return append(claims, c), notes
		}
	}
	if c := extendedResourceClaim(pod, in.Classes); c != nil {
		claims = append(claims, c)
	}
	return claims, notes
}

// extendedResourceClaim is the claim the scheduler builds for a pod's
// extended resources backed by a DeviceClass (spec.extendedResourceName, or
// deviceclass.resource.kubernetes.io/CLASS): one request per container and
// resource for as many devices as the container asks. nil when the pod asks
// for none.
func extendedResourceClaim(pod *v1.Pod, classes []resourceapi.DeviceClass) *resourceapi.ResourceClaim {
	classFor := map[v1.ResourceName]string{}
	for _, c := range classes {
		if c.Spec.ExtendedResourceName != nil {
			classFor[v1.ResourceName(*c.Spec.ExtendedResourceName)] = c.Name
		}
		classFor[v1.ResourceName("deviceclass.resource.kubernetes.io/"+c.Name)] = c.Name
	}
	var requests []resourceapi.DeviceRequest
	add := func(containers []v1.Container) {
		for _, ctr := range containers {
			var names []v1.ResourceName
			for rn := range ctr.Resources.Requests {
				names = append(names, rn)
			}
			for rn := range ctr.Resources.Limits {
				if _, ok := ctr.Resources.Requests[rn]; !ok {
					names = append(names, rn)
				}
			}
			slices.Sort(names)
			for _, rn := range names {
				class, ok := classFor[rn]
				if !ok {
					continue
				}
				q, ok := ctr.Resources.Requests[rn]
				if !ok {
					q = ctr.Resources.Limits[rn]
				}
				if q.Value() <= 0 {
					continue
				}
				requests = append(requests, resourceapi.DeviceRequest{
					Name: ctr.Name + "-" + strings.NewReplacer("/", "-", ".", "-").Replace(string(rn)),
					Exactly: &resourceapi.ExactDeviceRequest{
						DeviceClassName: class,
						AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
						Count:           q.Value(),
					},
				})
			}
		}
	}
	add(pod.Spec.InitContainers)
	add(pod.Spec.Containers)
	if len(requests) == 0 {
		return nil
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name + "-extended-resources"},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests}},
	}
}

// allocationNode names the node an allocation is bound to (its node
// selector's single metadata.name value), or "" for network-attached devices.
func allocationNode(a *resourceapi.AllocationResult) string {
	if a.NodeSelector == nil {
		return ""
	}
	for _, t := range a.NodeSelector.NodeSelectorTerms {
		for _, f := range t.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

// holder is an allocated result of a claim, for naming who holds a device.
type holder struct {
	claim  string // NAMESPACE/NAME
	device string
	shared bool
	memory int64
	cores  int64
}

func (h holder) String() string {
	if _, err := model.ParseMIGDevice(h.device); err == nil {
		return h.claim + " (MIG device " + h.device + ")"
	}
	if !h.shared {
		return h.claim + " (whole GPU)"
	}
	return fmt.Sprintf("%s (%s, %d cores)", h.claim, bytes(h.memory), h.cores)
}

// explainer holds the cluster, indexed.
type explainer struct {
	in      Input
	classes model.ClassLister
	cel     *cel.Cache
	slices  []*resourceapi.ResourceSlice
	state   structured.AllocatedState
	// byRule names the DeviceTaintRule of each taint a rule added to a
	// device of slices.
	byRule ruleTaints
	// holders are the allocated results per device.
	holders map[structured.DeviceID][]holder
	// newest is the newest generation of each pool (driver/pool).
	newest map[string]int64
}

func newExplainer(in Input) *explainer {
	e := &explainer{
		in:      in,
		classes: model.NewClassLister(in.Classes),
		cel:     cel.NewCache(100, cel.Features{EnableConsumableCapacity: true}),
		state:   model.NewAllocatedState(),
		byRule:  ruleTaints{},
		holders: map[structured.DeviceID][]holder{},
		newest:  map[string]int64{},
	}
	rules := sortedRules(in.TaintRules)
	for i := range in.Slices {
		s := applyTaintRules(&in.Slices[i], rules, e.byRule)
		e.slices = append(e.slices, s)
		k := s.Spec.Driver + "/" + s.Spec.Pool.Name
		e.newest[k] = max(e.newest[k], s.Spec.Pool.Generation)
	}
	// The allocated state as the scheduler's allocatedDevices tracker keeps
	// it: admin access ignored, shares by shareID with their consumed
	// capacity, every other result by device.
	for _, c := range in.Claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if ptr.Deref(res.AdminAccess, false) {
				continue
			}
			id := structured.MakeDeviceID(res.Driver, res.Pool, res.Device)
			h := holder{claim: c.Namespace + "/" + c.Name, device: res.Device}
			if res.ShareID != nil {
				e.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, res.ShareID))
				if res.ConsumedCapacity != nil {
					e.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, res.ConsumedCapacity))
				}
				h.shared = true
				if q, ok := res.ConsumedCapacity[model.Memory]; ok {
					h.memory = q.Value()
				}
				if q, ok := res.ConsumedCapacity[model.Cores]; ok {
					h.cores = q.Value()
				}
			} else {
				e.state.AllocatedDevices.Insert(id)
			}
			e.holders[id] = append(e.holders[id], h)
		}
	}
	return e
}

// nodes are the nodes with gpu.tessera.dev devices, by name: the Node
// objects when known, otherwise a bare Node per name.
func (e *explainer) nodes() []*v1.Node {
	names := sets.New[string]()
	for _, s := range e.slices {
		if s.Spec.Driver == model.DriverName && s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
			names.Insert(*s.Spec.NodeName)
		}
	}
	var out []*v1.Node
	for i := range e.in.Nodes {
		if names.Has(e.in.Nodes[i].Name) {
			out = append(out, &e.in.Nodes[i])
			names.Delete(e.in.Nodes[i].Name)
		}
	}
	for name := range names {
		out = append(out, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	slices.SortFunc(out, func(a, b *v1.Node) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// nodeAllowed is false for a node that an allocated claim of the target
// rules out (its allocation is bound to another node).
func (e *explainer) nodeAllowed(node *v1.Node, claims []*resourceapi.ResourceClaim) bool {
	for _, c := range claims {
		if c.Status.Allocation == nil || c.Status.Allocation.NodeSelector == nil {
			continue
		}
		ok, err := structured.NodeMatches(model.SchedulerFeatures, node, "", false, c.Status.Allocation.NodeSelector)
		if err != nil || !ok {
			return false
		}
	}
	return true
}

// explainNode runs the allocator on one node and, when it refuses, looks at
// every request on every device.
func (e *explainer) explainNode(ctx context.Context, node *v1.Node, claims []*resourceapi.ResourceClaim) Node {
	n := Node{Name: node.Name}
	n.FitsNow = e.fitsNow(node.Name)
	alloc, err := structured.NewAllocator(ctx, model.SchedulerFeatures, e.state, e.classes, e.slices, e.cel)
	if err != nil {
		n.Reasons = append(n.Reasons, "allocator: "+err.Error())
		return n
	}
	results, err := alloc.Allocate(ctx, node, claims)
	if err != nil {
		n.Reasons = append(n.Reasons, "allocator: "+err.Error())
	}
	if err == nil && len(results) == len(claims) {
		n.Fits = true
		for i, res := range results {
			for _, d := range res.Devices.Results {
				n.Allocation = append(n.Allocation, fmt.Sprintf("%s/%s: %s", claims[i].Name, d.Request, d.Device))
			}
		}
		return n
	}
	gpuReasons := map[string][]string{}
	informing := 0
	for _, c := range claims {
		informing += e.explainClaim(ctx, node.Name, c, len(claims) > 1).mergeInto(&n, gpuReasons)
	}
	for name, reasons := range gpuReasons {
		n.GPUs = append(n.GPUs, GPU{Name: name, Reasons: reasons})
	}
	slices.SortFunc(n.GPUs, func(a, b GPU) int { return compareDeviceNames(a.Name, b.Name) })
	if len(n.Reasons) == informing && len(n.GPUs) == 0 {
		n.Reasons = append(n.Reasons, "every request fits some device on its own, but not all of them together (they compete for the same GPUs, or a constraint across requests fails)")
	}
	return n
}

// compareDeviceNames orders gpu-2 before gpu-10.
func compareDeviceNames(a, b string) int {
	ma, _, errA := model.ParseDevice(a)
	mb, _, errB := model.ParseDevice(b)
	if errA == nil && errB == nil {
		return cmp.Compare(ma, mb)
	}
	return cmp.Compare(a, b)
}
