package legacy

import (
	"fmt"
	"math"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// shape is what one container asks for, in Tessera's terms: gpus devices,
// each either a whole GPU or a share of memory (absolute or a percentage of
// its GPU's) and cores.
type shape struct {
	gpus    int64
	whole   bool
	memory  *resource.Quantity // per GPU
	percent int64              // memory per GPU in percent of the GPU's; 0 when memory is absolute
	cores   *int64             // per GPU; nil when the source sets none
	// corePath is the field that set cores, for errors about them.
	corePath *field.Path
}

// container reads one container's legacy resources. It records the names
// to remove and the errors of what it read.
type container struct {
	c    *corev1.Container
	path *field.Path // the container: spec.containers[1]
	unit MemoryUnit
	errs field.ErrorList
}

// has reports whether name is in the container's limits or requests.
func (r *container) has(name string) bool {
	_, l := r.c.Resources.Limits[corev1.ResourceName(name)]
	_, q := r.c.Resources.Requests[corev1.ResourceName(name)]
	return l || q
}

// fieldOf is the path of name: under limits when it is there, else requests.
func (r *container) fieldOf(name string) *field.Path {
	res := r.path.Child("resources")
	if _, ok := r.c.Resources.Limits[corev1.ResourceName(name)]; ok {
		return res.Child("limits").Key(name)
	}
	return res.Child("requests").Key(name)
}

// quantity is name's value: from limits, else requests. Both set and
// different is an error (the API server refuses that for extended resources
// too, but a mutating webhook runs before its validation).
func (r *container) quantity(name string) (resource.Quantity, bool) {
	l, inLimits := r.c.Resources.Limits[corev1.ResourceName(name)]
	q, inRequests := r.c.Resources.Requests[corev1.ResourceName(name)]
	if inLimits && inRequests && l.Cmp(q) != 0 {
		r.errs = append(r.errs, field.Invalid(r.path.Child("resources", "requests").Key(name), q.String(),
			fmt.Sprintf("differs from limits[%s] (%s): the two must be equal", name, l.String())))
		return resource.Quantity{}, false
	}
	if inLimits {
		return l, true
	}
	return q, inRequests
}

// integer is name's value as a whole number in [lo, hi].
func (r *container) integer(name string, lo, hi int64, what string) (int64, bool) {
	q, ok := r.quantity(name)
	if !ok {
		return 0, false
	}
	v, exact := q.AsInt64()
	switch {
	case !exact:
		r.errs = append(r.errs, field.Invalid(r.fieldOf(name), q.String(), "must be a whole number ("+what+")"))
		return 0, false
	case v < lo || v > hi:
		r.errs = append(r.errs, field.Invalid(r.fieldOf(name), v, fmt.Sprintf("must be between %d and %d (%s)", lo, hi, what)))
		return 0, false
	}
	return v, true
}

func (r *container) fail(name string, value any, detail string) {
	r.errs = append(r.errs, field.Invalid(r.fieldOf(name), value, detail))
}

// legacyNames are the container's resource names this package reads, in
// limits or requests, and unknown names of the same vendors' GPU families.
func (r *container) names() (hami, koord, gpushare, unknown []string) {
	seen := map[string]bool{}
	for _, list := range []corev1.ResourceList{r.c.Resources.Limits, r.c.Resources.Requests} {
		for n := range list {
			name := string(n)
			if seen[name] {
				continue
			}
			seen[name] = true
			switch {
			case name == NvidiaGPU:
			case name == HAMiMemory, name == HAMiMemoryPercentage, name == HAMiCores, name == HAMiPriority:
				hami = append(hami, name)
			case name == KoordCore, name == KoordMemory, name == KoordMemoryRatio, name == KoordGPU, name == KoordShared:
				koord = append(koord, name)
			case name == GPUShareMemory, name == GPUShareCount:
				gpushare = append(gpushare, name)
			case strings.HasPrefix(name, "nvidia.com/"), strings.HasPrefix(name, "aliyun.com/gpu"), strings.HasPrefix(name, koordPrefix+"gpu"):
				unknown = append(unknown, name)
			}
		}
	}
	sortStrings(hami, koord, gpushare, unknown)
	return hami, koord, gpushare, unknown
}

// read is the container's shape, or nil when it has no legacy name to
// translate (none at all, or plain nvidia.com/gpu, which is kept; kept is
// its count then). remove lists the names translation removes.
func (r *container) read() (s *shape, kept int64, remove []string) {
	hami, koord, gpushare, unknown := r.names()
	for _, n := range unknown {
		r.fail(n, n, "not a GPU resource Tessera can translate (it translates nvidia.com/gpu, gpumem, gpumem-percentage and gpucores of HAMi, aliyun.com/gpu-mem of gpushare, and koordinator.sh/gpu-core, gpu-memory, gpu-memory-ratio, gpu and gpu.shared of Koordinator; docs/migration.md)")
	}
	var systems []string
	var first []string
	for _, sys := range []struct {
		name  string
		names []string
	}{{"HAMi", hami}, {"Koordinator", koord}, {"gpushare", gpushare}} {
		if len(sys.names) > 0 {
			systems = append(systems, sys.name)
			first = append(first, sys.names[0])
		}
	}
	if len(systems) > 1 {
		r.fail(first[1], first[1], fmt.Sprintf("mixes %s's resources (%s) with %s's: one container asks one system for GPUs", systems[0], first[0], systems[1]))
	}
	if len(unknown) > 0 || len(systems) > 1 {
		return nil, 0, nil
	}
	switch {
	case len(hami) > 0:
		s = r.hami(hami)
		remove = append(slices.Clone(hami), NvidiaGPU)
	case len(koord) > 0:
		if r.has(NvidiaGPU) {
			// Koordinator refuses the vendor API beside its GPU-share API
			// (20230803-enhance-gpu-share-api.md, Validating Webhook, rule 1;
			// ValidDeviceResourceCombinations has no such combination).
			r.fail(NvidiaGPU, NvidiaGPU, fmt.Sprintf("beside %s: Koordinator refuses nvidia.com/gpu together with its GPU-share resources; keep one", koord[0]))
			return nil, 0, nil
		}
		s = r.koordinator(koord)
		remove = koord
	case len(gpushare) > 0:
		if r.has(NvidiaGPU) {
			r.fail(NvidiaGPU, NvidiaGPU, "beside aliyun.com/gpu-mem: a gpushare container gets part of one GPU, not whole GPUs as well; keep one")
			return nil, 0, nil
		}
		s = r.gpushare()
		remove = gpushare
	case r.has(NvidiaGPU):
		n, ok := r.integer(NvidiaGPU, 1, math.MaxInt32, "a count of GPUs")
		if ok {
			kept = n
		}
	}
	if s == nil {
		remove = nil
	}
	return s, kept, remove
}

// maxGPUs bounds the count of GPUs of one container: a claim's request
// allocates at most 32 devices (resourceapi.AllocationResultsMaxSize).
const maxGPUs = 32

// hami reads HAMi's names (HAMi's GenerateResourceRequests): nvidia.com/gpu
// shares (HAMi's defaultGPUNum, 1, when absent), each of gpumem MiB or
// gpumem-percentage of its GPU (100% when neither), with gpucores percent
// of its compute. 100% of memory with gpucores absent or 100 is an
// exclusive card (HAMi's defaultExclusiveCoreIfNeeded): a whole GPU.
func (r *container) hami(names []string) *shape {
	if r.has(HAMiPriority) {
		r.fail(HAMiPriority, HAMiPriority, "HAMi's task priority has no Tessera equivalent: remove it to translate the container")
		return nil
	}
	s := &shape{gpus: 1}
	ok := true
	if r.has(NvidiaGPU) {
		s.gpus, ok = r.integer(NvidiaGPU, 1, maxGPUs, "HAMi: the number of GPUs, one share on each")
	}
	if r.has(HAMiMemory) && r.has(HAMiMemoryPercentage) {
		r.fail(HAMiMemoryPercentage, HAMiMemoryPercentage, "beside nvidia.com/gpumem: a share's memory is either MiB or a percentage of its GPU's, not both")
		return nil
	}
	if r.has(HAMiMemory) {
		mib, good := r.integer(HAMiMemory, 1, math.MaxInt32, "HAMi: MiB of memory on each GPU")
		ok = ok && good
		s.memory = resource.NewQuantity(mib<<20, resource.BinarySI)
	}
	if r.has(HAMiMemoryPercentage) {
		pct, good := r.integer(HAMiMemoryPercentage, 1, 100, "HAMi: percent of each GPU's memory")
		ok = ok && good
		s.percent = pct
	}
	if s.memory == nil && s.percent == 0 && ok {
		s.percent = 100
	}
	if r.has(HAMiCores) {
		cores, good := r.integer(HAMiCores, 0, 100, "HAMi: percent of each GPU's compute")
		ok = ok && good
		s.cores, s.corePath = &cores, r.fieldOf(HAMiCores)
	}
	if !ok {
		return nil
	}
	s.whole = s.percent == 100 && (s.cores == nil || *s.cores == 100)
	return s
}

// koordinator reads Koordinator's names (ValidateDeviceRequest and
// calcDesiredRequestsAndCountForGPU): gpu-core and gpu-memory-ratio in
// percent of a GPU, above 100 only multiples of 100; gpu-memory in bytes;
// the count of GPUs is gpu.shared, else gpu-memory-ratio / 100 when above
// 100, else 1; each GPU gets the totals divided by the count.
func (r *container) koordinator(names []string) *shape {
	percent := func(name string) (int64, bool) {
		v, ok := r.integer(name, 1, 100*maxGPUs, "Koordinator: percent of one GPU")
		if ok && v > 100 && v%100 != 0 {
			r.fail(name, v, "above 100 Koordinator takes only whole GPUs: a multiple of 100 (200 is two GPUs)")
			return 0, false
		}
		return v, ok
	}
	ok := true
	var core, ratio int64
	var corePath, ratioPath *field.Path
	if r.has(KoordGPU) {
		for _, n := range []string{KoordCore, KoordMemoryRatio, KoordMemory} {
			if r.has(n) {
				r.fail(KoordGPU, KoordGPU, fmt.Sprintf("beside %s: koordinator.sh/gpu is shorthand for gpu-core and gpu-memory-ratio both; set one or the other", n))
				return nil
			}
		}
		v, good := percent(KoordGPU)
		ok = ok && good
		core, ratio, corePath, ratioPath = v, v, r.fieldOf(KoordGPU), r.fieldOf(KoordGPU)
	}
	if r.has(KoordCore) {
		v, good := percent(KoordCore)
		ok = ok && good
		core, corePath = v, r.fieldOf(KoordCore)
	}
	if r.has(KoordMemoryRatio) {
		v, good := percent(KoordMemoryRatio)
		ok = ok && good
		ratio, ratioPath = v, r.fieldOf(KoordMemoryRatio)
	}
	var memory *resource.Quantity
	if r.has(KoordMemory) {
		q, good := r.quantity(KoordMemory)
		if good && q.Sign() <= 0 {
			r.fail(KoordMemory, q.String(), "must be positive (Koordinator: bytes of GPU memory)")
			good = false
		}
		ok = ok && good
		memory = &q
	}
	if memory != nil && r.has(KoordMemoryRatio) {
		r.fail(KoordMemoryRatio, KoordMemoryRatio, "beside koordinator.sh/gpu-memory: memory is either bytes or a ratio, not both (Koordinator refuses both)")
		return nil
	}
	if memory == nil && ratio == 0 {
		name := KoordCore
		if !r.has(name) {
			name = KoordShared
		}
		r.fail(name, name, "without koordinator.sh/gpu-memory or gpu-memory-ratio: Koordinator requires the memory of a share")
		return nil
	}
	count := int64(1)
	if r.has(KoordShared) {
		v, good := r.integer(KoordShared, 1, maxGPUs, "Koordinator: the number of GPUs the request is divided over")
		ok = ok && good
		count = v
	} else if ratio > 100 {
		count = ratio / 100
	}
	if !ok {
		return nil
	}
	s := &shape{gpus: count}
	per := func(v int64, path *field.Path, name string) (int64, bool) {
		if v%count != 0 || v/count > 100 {
			r.errs = append(r.errs, field.Invalid(path, v, fmt.Sprintf("is divided over %d GPU(s) (Koordinator counts GPUs by gpu.shared, else gpu-memory-ratio/100): %s must be a multiple of %d and at most %d", count, name, count, 100*count)))
			return 0, false
		}
		return v / count, true
	}
	if ratio != 0 {
		if s.percent, ok = per(ratio, ratioPath, "the ratio"); !ok {
			return nil
		}
	}
	if memory != nil {
		b := memory.Value()
		if b%count != 0 {
			r.fail(KoordMemory, memory.String(), fmt.Sprintf("is divided over %d GPUs: must be a multiple of %d bytes", count, count))
			return nil
		}
		s.memory = resource.NewQuantity(b/count, resource.BinarySI)
	}
	if core != 0 {
		c, good := per(core, corePath, "gpu-core")
		if !good {
			return nil
		}
		s.cores, s.corePath = &c, corePath
	}
	s.whole = s.percent == 100 && (s.cores == nil || *s.cores == 100)
	return s
}

// gpushare reads aliyun.com/gpu-mem: memory on one GPU in the
// installation's unit, no compute reserved (gpushare isolates nothing).
func (r *container) gpushare() *shape {
	if r.has(GPUShareCount) {
		r.fail(GPUShareCount, GPUShareCount, "a node resource of gpushare (its GPUs per node), not something a container asks for: remove it")
		return nil
	}
	v, ok := r.integer(GPUShareMemory, 1, math.MaxInt32, "gpushare: "+string(r.unit)+" of memory on one GPU")
	if !ok {
		return nil
	}
	shift := 30
	if r.unit == MiB {
		shift = 20
	}
	if v > math.MaxInt64>>shift {
		r.fail(GPUShareMemory, v, "too large")
		return nil
	}
	return &shape{gpus: 1, memory: resource.NewQuantity(v<<shift, resource.BinarySI)}
}
