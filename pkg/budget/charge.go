package budget

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"

	celgo "github.com/google/cel-go/cel"
	"github.com/google/cel-go/common"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/parser"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// memoryStep is the shared device's memory requestPolicy step: 1Mi.
const memoryStep = configapi.MinMemoryLimitBytes

// Resource is one dimension of a budget.
type Resource string

// The dimensions of a budget, as spec.hard names them.
const (
	Memory Resource = "memory"
	Cores  Resource = "cores"
	GPUs   Resource = "gpus"
)

// Resources are the dimensions in the order messages name them.
var Resources = []Resource{Memory, Cores, GPUs}

// Amount is what a claim takes from a budget: memory in bytes, cores in
// percent of one GPU, whole GPUs.
type Amount struct {
	Memory, Cores, GPUs int64
}

// Get returns the amount of r.
func (a Amount) Get(r Resource) int64 {
	switch r {
	case Memory:
		return a.Memory
	case Cores:
		return a.Cores
	default:
		return a.GPUs
	}
}

func (a *Amount) set(r Resource, v int64) {
	switch r {
	case Memory:
		a.Memory = v
	case Cores:
		a.Cores = v
	default:
		a.GPUs = v
	}
}

// Add returns a+b, saturating at math.MaxInt64.
func (a Amount) Add(b Amount) Amount {
	var out Amount
	for _, r := range Resources {
		out.set(r, addSat(a.Get(r), b.Get(r)))
	}
	return out
}

// Sub returns a-b, never below zero.
func (a Amount) Sub(b Amount) Amount {
	var out Amount
	for _, r := range Resources {
		out.set(r, max(a.Get(r)-b.Get(r), 0))
	}
	return out
}

// IsZero reports whether a takes nothing.
func (a Amount) IsZero() bool { return a == Amount{} }

func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func mulSat(a, n int64) int64 {
	if a != 0 && n > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * n
}

// Charge is what one claim takes from a budget: the amount, and the
// dimensions whose size cannot be known because no device the claim may get
// is published yet (Unknown: dimension → why). The webhook refuses a claim
// with an unknown size in a dimension the budget limits.
type Charge struct {
	Amount
	Unknown map[Resource]string
}

// Alternative is one way a request may be allocated: the request itself or
// one firstAvailable subrequest, with what it takes.
type Alternative struct {
	// Name is the request's name, or request/subrequest.
	Name  string
	Class string
	// ClassMissing: the DeviceClass does not exist (the request takes
	// nothing, it cannot be allocated; see ClaimCharge.MissingClass).
	ClassMissing bool
	Amount
	Unknown map[Resource]string
}

// Request is what one request of a claim takes, each alternative apart.
type Request struct {
	Name         string
	Alternatives []Alternative
}

// ClaimCharge is what each request of one claim takes. For sums it up for a
// budget.
type ClaimCharge []Request

// For is the claim's charge against a budget of class (empty: every class):
// per request, in each dimension, the largest of its alternatives of that
// class (firstAvailable: any of them may be the one allocated), summed over
// the requests.
func (c ClaimCharge) For(class string) Charge {
	var out Charge
	for _, r := range c {
		var req Amount
		for _, a := range r.Alternatives {
			if class != "" && a.Class != class {
				continue
			}
			for _, res := range Resources {
				req.set(res, max(req.Get(res), a.Get(res)))
			}
			for res, why := range a.Unknown {
				if out.Unknown == nil {
					out.Unknown = map[Resource]string{}
				}
				if _, ok := out.Unknown[res]; !ok {
					out.Unknown[res] = why
				}
			}
		}
		out.Amount = out.Amount.Add(req)
	}
	return out
}

// MissingClass is the first alternative of c whose DeviceClass does not
// exist, nil when every class exists.
func (c ClaimCharge) MissingClass() *Alternative {
	for _, r := range c {
		for i := range r.Alternatives {
			if r.Alternatives[i].ClassMissing {
				return &r.Alternatives[i]
			}
		}
	}
	return nil
}

// ClassLookup returns the DeviceClass called name (NotFound when there is
// none). The result is shared: callers must not modify it.
type ClassLookup func(ctx context.Context, name string) (*resourceapi.DeviceClass, error)

// Pricer computes what claims take. It evaluates the CEL selectors of each
// request's class and of the request itself against the devices of
// gpu.tessera.dev that the cluster's ResourceSlices publish, with the
// scheduler's CEL library, and charges the largest of the devices that
// match (worst case, as the quota evaluator charges the largest of what a
// request may get):
//
//   - a whole GPU (type gpu): its memory capacity, 100 cores, 1 GPU;
//   - a share (type shared or lent): the memory its capacity.requests names,
//     rounded as the scheduler allocates it by the largest over the matched
//     devices of their published requestPolicy (pkg/model: at least 1Gi,
//     then 1Mi steps; those constants when none is published), else the
//     device's full memory (a share that names none is allocated all of
//     it); the cores it may use: its GpuConfig's sharing.computeLimit when
//     one applies, else the cores it names, rounded likewise, else (none
//     named, or 0: best effort) 100; no GPU;
//   - a MIG device (type mig): its memory and cores capacity as pkg/model
//     publishes them (cores: 100 × its compute slices / the GPU's, rounded
//     down; 100 when the device publishes none); no GPU.
//
// times the devices the request asks for: its count, or
// resourceapi.AllocationResultsMaxSize for allocationMode All (the 1.37
// quota evaluator's worst case). adminAccess requests are charged like any
// other (the quota evaluator charges them too).
//
// Every request is charged at least the largest sizes this Pricer has seen
// its class match (kept per class name, never lowered) and the sizes Price
// is given for its class (GPUBudgets' classSizes, persisted and declared),
// also when the devices published now are smaller or none (a node pool
// scaled to zero, the plugin restarting). Pricing one claim is bounded in
// CEL cost (MaxCost) and stops when ctx ends. A class of no known size:
//
//   - Tessera's own classes (gpu.tessera.dev, shared., lent., mig.,
//     nvidia-gpu.gpu.tessera.dev): a share takes what its capacity.requests
//     name and a whole GPU its count of GPUs and 100 cores each; what is
//     left (a whole GPU's memory, a MIG device's size, a share that names
//     no memory) is Unknown;
//   - a class whose selectors (or the request's) require device.driver ==
//     another driver (otherDriverOnly) takes nothing;
//   - any other class (no selectors, selectors that name no driver, or
//     this one): Unknown in every dimension.
//
// A class that does not exist takes nothing and is marked ClassMissing.
type Pricer struct {
	devices Devices
	classes ClassLookup
	cel     *cel.Cache

	// matched caches the sizes of the devices a class and selectors match,
	// for one version of the devices.
	mu      sync.Mutex
	version uint64
	matched map[string]sizes
	// MaxCost bounds the CEL cost of pricing one claim; zero means
	// DefaultMaxCost.
	MaxCost uint64
	// largest are the largest sizes seen matched per class name, over every
	// version (never lowered): what a request of a class that matches
	// nothing now is charged.
	largest map[string]sizes
}

// Devices lists the devices of gpu.tessera.dev the cluster publishes, and
// a version that changes whenever they may have changed; version 0 means
// "not cacheable" (each call may differ).
type Devices func(ctx context.Context) ([]resourceapi.Device, uint64, error)

// maxMatched bounds Pricer's cache of matched sizes.
const maxMatched = 4096

// DefaultMaxCost bounds the CEL cost (in CEL's cost units, as the
// scheduler's library counts them) of pricing one claim: ten times what one
// selector may cost on one device (resourceapi.CELSelectorExpressionMaxCost,
// which also bounds each evaluation). Pricing stops there, and when its
// context ends, and the claim is refused as too costly to price.
const DefaultMaxCost = 10 * resourceapi.CELSelectorExpressionMaxCost

// CostError is the error of a claim whose selectors cost more to evaluate
// than pricing allows (one evaluation over the scheduler's limit, or the
// claim's total over Pricer.MaxCost).
type CostError struct {
	Request string
	Why     string
}

func (e *CostError) Error() string {
	return fmt.Sprintf("its selectors are too costly to evaluate (%s); simplify them", e.Why)
}

// costLeft is what is left of one claim's CEL cost budget.
type costLeft struct{ left uint64 }

func (c *costLeft) spend(request string, details *celgo.EvalDetails) error {
	if details == nil || details.ActualCost() == nil {
		return nil
	}
	cost := *details.ActualCost()
	if cost >= c.left {
		c.left = 0
		return &CostError{Request: request, Why: "the claim's selectors together exceed the cost pricing allows"}
	}
	c.left -= cost
	return nil
}

// NewPricer returns a Pricer over devices and classes.
func NewPricer(devices Devices, classes ClassLookup) *Pricer {
	return &Pricer{devices: devices, classes: classes, cel: cel.NewCache(100, cel.Features{EnableConsumableCapacity: true}),
		matched: map[string]sizes{}}
}

// Claim computes what each request of devices takes. An error means a
// class could not be read (other than not found) or devices could not be
// listed, ctx ended, or the selectors cost too much (a *CostError).
func (p *Pricer) Claim(ctx context.Context, devices *resourceapi.DeviceClaim) (ClaimCharge, error) {
	return p.Price(ctx, devices, nil)
}

// Price is Claim with known sizes of classes (the classSizes GPUBudgets
// persist and declare): each request is charged at least those of its
// class, as if such devices were published.
func (p *Pricer) Price(ctx context.Context, devices *resourceapi.DeviceClaim, known []configapi.ClassSize) (ClaimCharge, error) {
	if devices == nil || len(devices.Requests) == 0 {
		return nil, nil
	}
	published, version, err := p.devices(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the devices of %s: %w", modelnames.DriverName, err)
	}
	limit := p.MaxCost
	if limit == 0 {
		limit = DefaultMaxCost
	}
	cost := &costLeft{left: limit}
	out := make(ClaimCharge, 0, len(devices.Requests))
	for _, r := range devices.Requests {
		req := Request{Name: r.Name}
		if r.Exactly != nil {
			e := r.Exactly
			a, err := p.alternative(ctx, cost, published, version, known, devices.Config, r.Name, e.DeviceClassName, e.Selectors, e.AllocationMode, e.Count, e.Capacity)
			if err != nil {
				return nil, err
			}
			req.Alternatives = append(req.Alternatives, a)
		}
		for _, s := range r.FirstAvailable {
			a, err := p.alternative(ctx, cost, published, version, known, devices.Config, r.Name+"/"+s.Name, s.DeviceClassName, s.Selectors, s.AllocationMode, s.Count, s.Capacity)
			if err != nil {
				return nil, err
			}
			req.Alternatives = append(req.Alternatives, a)
		}
		out = append(out, req)
	}
	return out, nil
}

// sizes are the largest of the matching devices, per type.
type sizes struct {
	any                        bool
	whole, share, mig          bool
	wholeMemory                int64
	shareMemory                int64
	migMemory, migCores        int64
	shareMemoryKnown, migKnown bool
	// The requestPolicies the matched shares publish, per dimension.
	shareMemoryPolicies, shareCoresPolicies []policy
}

func (p *Pricer) alternative(ctx context.Context, cost *costLeft, published []resourceapi.Device, version uint64, known []configapi.ClassSize,
	configs []resourceapi.DeviceClaimConfiguration, name, className string,
	selectors []resourceapi.DeviceSelector, mode resourceapi.DeviceAllocationMode, count int64,
	capacity *resourceapi.CapacityRequirements) (Alternative, error) {
	alt := Alternative{Name: name, Class: className}
	class, err := p.classes(ctx, className)
	if apierrors.IsNotFound(err) {
		// A claim whose class does not exist cannot be allocated: it takes
		// nothing, and the Charger refuses it where a budget limits
		// anything (its size would be unknown once the class appears).
		alt.ClassMissing = true
		return alt, nil
	}
	if err != nil {
		return alt, fmt.Errorf("request %q: read DeviceClass %s: %w", name, className, err)
	}
	var exprs []string
	for _, s := range class.Spec.Selectors {
		if s.CEL != nil {
			exprs = append(exprs, s.CEL.Expression)
		}
	}
	for _, s := range selectors {
		if s.CEL != nil {
			exprs = append(exprs, s.CEL.Expression)
		}
	}
	sz, err := p.match(ctx, cost, name, published, version, className+"\x00"+class.ResourceVersion, exprs)
	if err != nil {
		return alt, fmt.Errorf("request %q: %w", name, err)
	}
	if sz.any {
		p.remember(className, sz)
	}
	if seen, ok := p.seen(className); ok {
		// The largest sizes seen for the class, also when smaller devices
		// still match: the larger ones' slices may be gone for a while
		// (plugin restart, node drained) and their claims still hold them.
		sz = sz.merge(seen)
	}
	// What budgets persisted or declare for the class: a restart with its
	// node pool at zero prices it as before.
	sz = sz.merge(knownSizes(known, className))
	n := max(count, 1)
	if mode == resourceapi.DeviceAllocationModeAll {
		n = resourceapi.AllocationResultsMaxSize
	}
	var requests map[resourceapi.QualifiedName]resource.Quantity
	if capacity != nil {
		requests = capacity.Requests
	}
	alt.Unknown = map[Resource]string{}
	// none: no published device matches, only the class name tells the kind.
	none := !sz.any
	if none {
		sz = ownClassSizes(className)
		if !sz.any {
			if _, ok := otherDriverOnly(exprs); ok {
				// Another driver's class.
				return Alternative{Name: name, Class: className}, nil
			}
			why := fmt.Sprintf("request %q: class %s may select devices of %s (its selectors do not require device.driver == another driver), none of which it matches is published now or was seen, so its size is unknown", name, className, modelnames.DriverName)
			alt.Unknown = map[Resource]string{Memory: why, Cores: why, GPUs: why}
			return alt, nil
		}
	}
	var per Amount
	if sz.whole {
		per.GPUs = 1
		per.Cores = modelnames.CoresPerGPU
		per.Memory = sz.wholeMemory
		if none {
			alt.Unknown[Memory] = fmt.Sprintf("request %q: no GPU of class %s is published yet, so its memory is unknown", name, className)
		}
	}
	if sz.share {
		memory, ok := shareMemory(requests)
		switch {
		case ok:
			per.Memory = max(per.Memory, roundUpAll(sz.shareMemoryPolicies, modelMemoryPolicy, memory))
		case sz.shareMemoryKnown:
			per.Memory = max(per.Memory, sz.shareMemory)
		default:
			alt.Unknown[Memory] = fmt.Sprintf("request %q names no memory and no GPU of class %s is published yet, so the share's memory (all of its GPU's) is unknown", name, className)
		}
		cores, ok := shareCores(requests)
		if ok {
			cores = roundUpAll(sz.shareCoresPolicies, modelCoresPolicy, cores)
		}
		per.Cores = max(per.Cores, shareCoresUsable(cores, computeLimit(class, configs, name)))
	}
	if sz.mig {
		if sz.migKnown {
			per.Memory = max(per.Memory, sz.migMemory)
			per.Cores = max(per.Cores, sz.migCores)
		} else {
			why := fmt.Sprintf("request %q: no MIG device of class %s is published yet, so its size is unknown", name, className)
			alt.Unknown[Memory], alt.Unknown[Cores] = why, why
		}
	}
	alt.Memory, alt.Cores, alt.GPUs = mulSat(per.Memory, n), mulSat(per.Cores, n), mulSat(per.GPUs, n)
	if len(alt.Unknown) == 0 {
		alt.Unknown = nil
	}
	return alt, nil
}

// otherDriverOnly reports whether exprs provably select only devices of
// another driver: one of them is, or is a conjunct (&&, at any depth) of,
// device.driver == "<driver>" (either operand order) with a driver other
// than this one, parsed with cel-go's parser. All of a request's
// selectors must match a device, so such a conjunct excludes this driver's
// devices. Anything else (no selectors, selectors that name no driver, an
// expression that does not parse) may select this driver's devices.
func otherDriverOnly(exprs []string) (string, bool) {
	p, err := parser.NewParser(parser.Macros(parser.AllMacros...))
	if err != nil {
		return "", false
	}
	for _, e := range exprs {
		tree, errs := p.Parse(common.NewTextSource(e))
		if errs != nil && len(errs.GetErrors()) > 0 {
			continue
		}
		if d, ok := requiredDriver(tree.Expr()); ok && d != modelnames.DriverName {
			return d, true
		}
	}
	return "", false
}

// requiredDriver finds a conjunct device.driver == "<driver>" of e.
func requiredDriver(e celast.Expr) (string, bool) {
	if e.Kind() != celast.CallKind {
		return "", false
	}
	call := e.AsCall()
	args := call.Args()
	switch call.FunctionName() {
	case operators.LogicalAnd:
		for _, a := range args {
			if d, ok := requiredDriver(a); ok {
				return d, true
			}
		}
	case operators.Equals:
		if len(args) != 2 {
			return "", false
		}
		for i := range 2 {
			if isDeviceDriver(args[i]) && args[1-i].Kind() == celast.LiteralKind {
				if v, ok := args[1-i].AsLiteral().Value().(string); ok {
					return v, true
				}
			}
		}
	}
	return "", false
}

// isDeviceDriver reports whether e is device.driver.
func isDeviceDriver(e celast.Expr) bool {
	if e.Kind() != celast.SelectKind {
		return false
	}
	sel := e.AsSelect()
	op := sel.Operand()
	return !sel.IsTestOnly() && sel.FieldName() == "driver" && op.Kind() == celast.IdentKind && op.AsIdent() == "device"
}

// remember merges sz into the largest sizes seen for class (never lowered).
func (p *Pricer) remember(class string, sz sizes) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.largest == nil {
		p.largest = map[string]sizes{}
	}
	old, ok := p.largest[class]
	if !ok && len(p.largest) >= maxMatched {
		return
	}
	p.largest[class] = old.merge(sz)
}

// seen is the largest sizes seen for class.
func (p *Pricer) seen(class string) (sizes, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sz, ok := p.largest[class]
	return sz, ok
}

// merge is the larger of s and o in every field.
func (s sizes) merge(o sizes) sizes {
	s.any, s.whole, s.share, s.mig = s.any || o.any, s.whole || o.whole, s.share || o.share, s.mig || o.mig
	s.wholeMemory, s.shareMemory = max(s.wholeMemory, o.wholeMemory), max(s.shareMemory, o.shareMemory)
	s.migMemory, s.migCores = max(s.migMemory, o.migMemory), max(s.migCores, o.migCores)
	s.shareMemoryKnown, s.migKnown = s.shareMemoryKnown || o.shareMemoryKnown, s.migKnown || o.migKnown
	for _, p := range o.shareMemoryPolicies {
		s.shareMemoryPolicies = addPolicy(s.shareMemoryPolicies, p)
	}
	for _, p := range o.shareCoresPolicies {
		s.shareCoresPolicies = addPolicy(s.shareCoresPolicies, p)
	}
	return s
}

// knownSizes are the sizes known declares or persisted for class.
func knownSizes(known []configapi.ClassSize, class string) sizes {
	var sz sizes
	for _, k := range known {
		if k.DeviceClassName != class {
			continue
		}
		memory := max(quantityValue(k.Memory), 0)
		sz.any = true
		switch k.Type {
		case modelnames.TypeWhole:
			sz.whole, sz.wholeMemory = true, max(sz.wholeMemory, memory)
		case modelnames.TypeShared, modelnames.TypeLent:
			sz.share, sz.shareMemoryKnown, sz.shareMemory = true, true, max(sz.shareMemory, memory)
		default:
			cores := int64(modelnames.CoresPerGPU)
			if k.Cores != nil {
				cores = *k.Cores
			}
			sz.mig, sz.migKnown = true, true
			sz.migMemory, sz.migCores = max(sz.migMemory, memory), max(sz.migCores, cores)
		}
	}
	return sz
}

// Seen are the largest sizes this Pricer has seen class match, as
// classSizes entries (one per device type), for a GPUBudget's status.
func (p *Pricer) Seen(class string) []configapi.ClassSize {
	sz, ok := p.seen(class)
	if !ok {
		return nil
	}
	var out []configapi.ClassSize
	add := func(typ string, memory int64, cores *int64) {
		out = append(out, configapi.ClassSize{DeviceClassName: class, Type: typ, Memory: *resourceQuantity(memory), Cores: cores})
	}
	if sz.whole && sz.wholeMemory > 0 {
		add(modelnames.TypeWhole, sz.wholeMemory, nil)
	}
	if sz.share && sz.shareMemoryKnown {
		add(modelnames.TypeShared, sz.shareMemory, nil)
	}
	if sz.mig && sz.migKnown {
		add(modelnames.TypeMIG, sz.migMemory, ptr.To(sz.migCores))
	}
	return out
}

// MergeClassSizes is a ∪ b, the largest of each (class, type), sorted.
func MergeClassSizes(a, b []configapi.ClassSize) []configapi.ClassSize {
	var out []configapi.ClassSize
	for _, k := range append(slices.Clone(a), b...) {
		i := slices.IndexFunc(out, func(o configapi.ClassSize) bool { return o.DeviceClassName == k.DeviceClassName && o.Type == k.Type })
		if i < 0 {
			var c configapi.ClassSize
			k.DeepCopyInto(&c)
			out = append(out, c)
			continue
		}
		if k.Memory.Cmp(out[i].Memory) > 0 {
			out[i].Memory = k.Memory.DeepCopy()
		}
		if k.Cores != nil && (out[i].Cores == nil || *k.Cores > *out[i].Cores) {
			out[i].Cores = ptr.To(*k.Cores)
		}
	}
	slices.SortFunc(out, func(x, y configapi.ClassSize) int {
		return strings.Compare(x.DeviceClassName+"\x00"+x.Type, y.DeviceClassName+"\x00"+y.Type)
	})
	return out
}

// ownClassSizes is what a class of Tessera's own gives when none of its
// devices is published: the device kind, sizes unknown.
func ownClassSizes(className string) sizes {
	switch className {
	case modelnames.WholeClassName, modelnames.NVIDIAGPUClassName:
		return sizes{any: true, whole: true}
	case modelnames.SharedClassName, modelnames.LentClassName:
		return sizes{any: true, share: true}
	case modelnames.MIGClassName:
		return sizes{any: true, mig: true}
	}
	return sizes{}
}

func (s *sizes) add(d *resourceapi.Device) {
	s.any = true
	memory, hasMemory := capacityValue(d, modelnames.Memory)
	switch typeOf(d) {
	case modelnames.TypeWhole:
		s.whole = true
		s.wholeMemory = max(s.wholeMemory, memory)
	case modelnames.TypeShared, modelnames.TypeLent:
		s.share = true
		if hasMemory {
			s.shareMemoryKnown = true
			s.shareMemory = max(s.shareMemory, memory)
			if p, ok := policyOf(d.Capacity[modelnames.Memory]); ok {
				s.shareMemoryPolicies = addPolicy(s.shareMemoryPolicies, p)
			}
		}
		if p, ok := policyOf(d.Capacity[modelnames.Cores]); ok {
			s.shareCoresPolicies = addPolicy(s.shareCoresPolicies, p)
		}
	default: // modelnames.TypeMIG, and any type a later model adds: its capacity
		s.mig, s.migKnown = true, true
		s.migMemory = max(s.migMemory, memory)
		cores, ok := capacityValue(d, modelnames.Cores)
		if !ok {
			cores = modelnames.CoresPerGPU
		}
		s.migCores = max(s.migCores, cores)
	}
}

func typeOf(d *resourceapi.Device) string {
	if a, ok := d.Attributes[modelnames.AttrType]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func capacityValue(d *resourceapi.Device, name resourceapi.QualifiedName) (int64, bool) {
	c, ok := d.Capacity[name]
	if !ok {
		return 0, false
	}
	v, ok := c.Value.AsInt64()
	if !ok {
		return math.MaxInt64, true
	}
	return v, true
}

// shareMemory is the memory a share's capacity.requests names, in bytes
// (rounded up; saturating); the scheduler then allocates it rounded by the
// device's requestPolicy (roundUpAll). ok is false when the request names
// none.
func shareMemory(requests map[resourceapi.QualifiedName]resource.Quantity) (int64, bool) {
	q, ok := requests[modelnames.Memory]
	if !ok {
		return 0, false
	}
	return max(quantityValue(q), 0), true
}

// shareCores is the cores a share names, rounded up to a whole percent
// (ok), else all of a GPU's: a share that names none gets no guarantee but
// may use them all, so a budget counts them all.
func shareCores(requests map[resourceapi.QualifiedName]resource.Quantity) (int64, bool) {
	q, ok := requests[modelnames.Cores]
	if !ok {
		return modelnames.CoresPerGPU, false
	}
	return max(quantityValue(q), 0), true
}

// shareCoresUsable is what a share may use of its GPU's compute, which is
// what a budget charges: the config's sharing.computeLimit when one
// applies (it is at least the guarantee), else the guarantee, or the whole
// GPU for a share guaranteed none (ShareLimits: a best-effort share may use
// the idle GPU).
func shareCoresUsable(guaranteed int64, limit *int64) int64 {
	if limit != nil {
		return max(*limit, guaranteed)
	}
	if guaranteed == 0 {
		return modelnames.CoresPerGPU
	}
	return guaranteed
}

// computeLimit is the sharing.computeLimit that applies to request name (or
// request/subrequest): the last opaque config of this driver naming it (or
// no request) in the claim, else in its class, as prepare merges them
// (claim configs after class configs). A config that does not decode sets
// none (the webhook refuses it; prepare fails).
func computeLimit(class *resourceapi.DeviceClass, configs []resourceapi.DeviceClaimConfiguration, name string) *int64 {
	var limit *int64
	take := func(o *resourceapi.OpaqueDeviceConfiguration) {
		if o == nil || o.Driver != modelnames.DriverName {
			return
		}
		cfg, err := configapi.DecodeLenient(o.Parameters.Raw)
		if err != nil || cfg == nil || cfg.Sharing == nil || cfg.Sharing.ComputeLimit == nil {
			return
		}
		limit = ptr.To(int64(*cfg.Sharing.ComputeLimit))
	}
	for _, c := range class.Spec.Config {
		take(c.Opaque)
	}
	parent, _, _ := strings.Cut(name, "/")
	for _, c := range configs {
		if len(c.Requests) == 0 || slices.Contains(c.Requests, name) || slices.Contains(c.Requests, parent) {
			take(c.Opaque)
		}
	}
	return limit
}

// match returns the sizes of the published devices that exprs match, from
// the cache when the devices are of the same version (version 0 is never
// cached).
func (p *Pricer) match(ctx context.Context, cost *costLeft, request string, published []resourceapi.Device, version uint64, class string, exprs []string) (sizes, error) {
	key := class + "\x00" + strings.Join(exprs, "\x00")
	var sz sizes
	if version != 0 {
		p.mu.Lock()
		if p.matched == nil || p.version != version || len(p.matched) >= maxMatched {
			p.version, p.matched = version, map[string]sizes{}
		}
		cached, ok := p.matched[key]
		p.mu.Unlock()
		if ok {
			return cached, nil
		}
	}
	for i := range published {
		if err := ctx.Err(); err != nil {
			return sizes{}, err
		}
		d := &published[i]
		ok, err := p.matches(ctx, cost, request, exprs, d)
		if err != nil {
			return sizes{}, err
		}
		if ok {
			sz.add(d)
		}
	}
	if version != 0 {
		p.mu.Lock()
		if p.version == version && p.matched != nil {
			p.matched[key] = sz
		}
		p.mu.Unlock()
	}
	return sz, nil
}

// matches evaluates exprs on d as the allocator does; an expression that
// fails to compile or evaluate matches nothing, as the allocator then
// allocates nothing.
func (p *Pricer) matches(ctx context.Context, cost *costLeft, request string, exprs []string, d *resourceapi.Device) (bool, error) {
	dev := cel.Device{Driver: modelnames.DriverName, AllowMultipleAllocations: d.AllowMultipleAllocations,
		Attributes: d.Attributes, Capacity: d.Capacity}
	for _, expr := range exprs {
		res := p.cel.GetOrCompile(expr)
		if res.Error != nil {
			return false, nil
		}
		ok, details, err := res.DeviceMatches(ctx, dev)
		if spendErr := cost.spend(request, details); spendErr != nil {
			return false, spendErr
		}
		if err != nil {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			if strings.Contains(err.Error(), "cost limit exceeded") {
				// The scheduler's per-evaluation limit: it cannot
				// allocate such a claim either, and its size is not known.
				return false, &CostError{Request: request, Why: err.Error()}
			}
			return false, nil
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

// Refusal is the error of a claim a budget refuses.
type Refusal struct {
	Namespace, Budget string
	Resource          Resource
	// Used, Charge and Hard are in the budget's unit (bytes, percent, GPUs).
	Used, Charge, Hard int64
	// Unknown, when set, says why the claim's size in Resource is unknown.
	Unknown string
	// MissingClass, when set, is a DeviceClass the claim names that does
	// not exist.
	MissingClass, Request string
	// TooCostly, when set, says why the claim's selectors cost too much to
	// price.
	TooCostly string
}

func (r *Refusal) Error() string {
	if r.TooCostly != "" {
		return fmt.Sprintf("GPU budget %s/%s cannot price this claim: %s", r.Namespace, r.Budget, r.TooCostly)
	}
	if r.MissingClass != "" {
		return fmt.Sprintf("GPU budget %s/%s: request %q: DeviceClass %s not found: such a claim could not be allocated and its size cannot be known; create the DeviceClass first",
			r.Namespace, r.Budget, r.Request, r.MissingClass)
	}
	if r.Unknown != "" {
		return fmt.Sprintf("GPU budget %s/%s limits %s: %s; create the claim once such a device is published", r.Namespace, r.Budget, r.Resource, r.Unknown)
	}
	return fmt.Sprintf("GPU budget %s/%s: %s: used %s + this claim %s > hard %s",
		r.Namespace, r.Budget, r.Resource, format(r.Resource, r.Used), format(r.Resource, r.Charge), format(r.Resource, r.Hard))
}

// Redacted is the refusal without the budget's figures (used, hard): what
// a review whose sender is not verified gets. It names the budget, the
// dimension and the claim's own charge, and how to read the rest.
func (r *Refusal) Redacted() string {
	if r.MissingClass != "" || r.Unknown != "" || r.TooCostly != "" {
		return r.Error() // no figure of the budget in them
	}
	return fmt.Sprintf("GPU budget %s/%s: %s: this claim (%s) would take the budget over spec.hard; its figures: kubectl get gpubudget -n %s %s -o yaml",
		r.Namespace, r.Budget, r.Resource, format(r.Resource, r.Charge), r.Namespace, r.Budget)
}

// IsRefusal reports whether err is (or wraps) a *Refusal.
func IsRefusal(err error) bool {
	var r *Refusal
	return errors.As(err, &r)
}

func format(r Resource, v int64) string {
	if r == Memory {
		return resource.NewQuantity(v, resource.BinarySI).String()
	}
	return fmt.Sprint(v)
}

// Check returns the refusal of charge by a budget with hard limits and used
// so far, nil when it fits. Dimensions are checked in Resources' order.
func Check(namespace, name string, hard Limits, used Amount, charge Charge) *Refusal {
	for _, r := range Resources {
		limit, limited := hard.Get(r)
		if !limited {
			continue
		}
		if why, ok := charge.Unknown[r]; ok {
			return &Refusal{Namespace: namespace, Budget: name, Resource: r, Unknown: why, Hard: limit}
		}
		if c := charge.Get(r); c > 0 && addSat(used.Get(r), c) > limit {
			return &Refusal{Namespace: namespace, Budget: name, Resource: r, Used: used.Get(r), Charge: c, Hard: limit}
		}
	}
	return nil
}

// Limits are a budget's caps; a nil dimension is unlimited.
type Limits struct {
	Memory, Cores, GPUs *int64
}

// Any reports whether l limits any dimension.
func (l Limits) Any() bool { return l.Memory != nil || l.Cores != nil || l.GPUs != nil }

// Get returns the cap of r and whether there is one.
func (l Limits) Get(r Resource) (int64, bool) {
	var p *int64
	switch r {
	case Memory:
		p = l.Memory
	case Cores:
		p = l.Cores
	default:
		p = l.GPUs
	}
	if p == nil {
		return 0, false
	}
	return *p, true
}

// describe lists a charge's non-zero dimensions, for logs.
func (a Amount) String() string {
	var parts []string
	for _, r := range Resources {
		if v := a.Get(r); v != 0 {
			parts = append(parts, fmt.Sprintf("%s %s", r, format(r, v)))
		}
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}
