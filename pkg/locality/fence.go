package locality

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// FenceTaintKey is the key of the NoSchedule device taint a fence puts on a
// GPU's shared device (value empty). Nothing tolerates it.
const FenceTaintKey = configapi.GroupName + "/locality-fence"

// DefaultFenceTTL is how long a fence stays after the last rejection of a
// claim it steers, when none of them is accepted or deleted.
const DefaultFenceTTL = 30 * time.Second

// DefaultMaxFencesPerClaim bounds how many of one claim's rejections in a row
// raise fences before it rests for one TTL: a share that fits nowhere
// closes GPUs only part of the time.
const DefaultMaxFencesPerClaim = 8

// FenceWriter puts a fence on a GPU's shared device and takes it away; both
// are idempotent.
type FenceWriter interface {
	Fence(ctx context.Context, gpu GPU) error
	Unfence(ctx context.Context, gpu GPU) error
	// UnfenceAll lifts every fence, also those of an earlier leader.
	UnfenceAll(ctx context.Context) error
}

// APIFences is the FenceWriter of the API server: one DeviceTaintRule per
// fenced GPU, selecting driver, pool and device, with the taint
// FenceTaintKey:NoSchedule. NoSchedule keeps new allocations off the device
// and leaves the shares already there alone.
type APIFences struct {
	Client kubernetes.Interface
}

// FenceRuleName is the DeviceTaintRule of a fence on gpu.
func FenceRuleName(gpu GPU) string {
	sum := sha256.Sum256([]byte(gpu.Pool + "/" + gpu.Device))
	return "tessera-locality-fence-" + hex.EncodeToString(sum[:8])
}

// Fence implements FenceWriter.
func (f APIFences) Fence(ctx context.Context, gpu GPU) error {
	rule := &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{
			Name:   FenceRuleName(gpu),
			Labels: map[string]string{"app.kubernetes.io/managed-by": "tessera-locality"},
			Annotations: map[string]string{
				configapi.GroupName + "/fenced-device": gpu.String(),
			},
		},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{
				Driver: ptr.To(configapi.GroupName), Pool: ptr.To(gpu.Pool), Device: ptr.To(gpu.Device),
			},
			Taint: resourceapi.DeviceTaint{Key: FenceTaintKey, Effect: resourceapi.DeviceTaintEffectNoSchedule},
		},
	}
	_, err := f.Client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{FieldManager: FieldManager})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// Unfence implements FenceWriter.
func (f APIFences) Unfence(ctx context.Context, gpu GPU) error {
	err := f.Client.ResourceV1().DeviceTaintRules().Delete(ctx, FenceRuleName(gpu), metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// fences is the controller's record of the fences it raised: per GPU, the
// claims it steers away from there, and until when it stands without a new
// rejection of one of them.
type fences struct {
	byGPU map[GPU]*fence
	// raised counts, per claim, the rejections that fenced GPUs for it since
	// it was last accepted; cool is when a claim that spent them may fence
	// again.
	raised map[types.UID]int
	cool   map[types.UID]time.Time
	// spent counts, per claim, the budgets it spent since it was last
	// accepted.
	spent map[types.UID]int
}

type fence struct {
	claims map[types.UID]bool
	until  time.Time
}

func (f *fences) init() {
	if f.byGPU == nil {
		f.byGPU, f.raised, f.cool, f.spent = map[GPU]*fence{}, map[types.UID]int{}, map[types.UID]time.Time{}, map[types.UID]int{}
	}
}

// reject records that claim uid was rejected on these GPUs; it returns the
// GPUs that need a new fence. Every fence the claim is in then stands for
// ttl more. A claim steered max times since it was last accepted rests:
// its fences are not renewed and expire after ttl, so a share that fits
// nowhere stops closing GPUs; rejected again after its rest (ttl, doubling
// with every budget it spends), it gets a new budget.
func (f *fences) reject(uid types.UID, gpus []GPU, now time.Time, ttl time.Duration, max int) []GPU {
	f.init()
	if f.raised[uid] >= max {
		if now.Before(f.cool[uid]) {
			return nil
		}
		// Its fences have expired, it rested, and it is still rejected: a
		// new budget, so that a share placed late is not left to first
		// fit for ever.
		f.raised[uid] = 0
		delete(f.cool, uid)
	}
	if f.raised[uid]++; f.raised[uid] >= max {
		// Spent: its fences stand for ttl more, then it rests, for ttl the
		// first time and twice as long each time after (up to 16 ttl), so
		// a share that fits nowhere closes GPUs less and less.
		f.cool[uid] = now.Add(ttl + ttl<<min(f.spent[uid], 4))
		f.spent[uid]++
	}
	var raise []GPU
	for _, g := range gpus {
		fc, ok := f.byGPU[g]
		if !ok {
			fc = &fence{claims: map[types.UID]bool{}}
			f.byGPU[g] = fc
			raise = append(raise, g)
		}
		fc.claims[uid] = true
	}
	for _, fc := range f.byGPU {
		if fc.claims[uid] {
			fc.until = now.Add(ttl)
		}
	}
	return raise
}

// settle records that claim uid needs no steering any more (accepted or
// gone); it returns the GPUs whose fence no claim needs.
func (f *fences) settle(uid types.UID) []GPU {
	delete(f.raised, uid)
	delete(f.cool, uid)
	delete(f.spent, uid)
	var lift []GPU
	for g, fc := range f.byGPU {
		if fc.claims[uid] {
			delete(fc.claims, uid)
			if len(fc.claims) == 0 {
				delete(f.byGPU, g)
				lift = append(lift, g)
			}
		}
	}
	return lift
}

// resting reports whether claim uid spent its fences and rests.
func (f *fences) resting(uid types.UID, now time.Time) bool {
	return now.Before(f.cool[uid])
}

// steers reports whether the fence on g steers a claim for which pred
// holds.
func (f *fences) steers(g GPU, pred func(types.UID) bool) bool {
	fc, ok := f.byGPU[g]
	if !ok {
		return false
	}
	for uid := range fc.claims {
		if pred(uid) {
			return true
		}
	}
	return false
}

// gpus returns the fenced GPUs.
func (f *fences) gpus() []GPU {
	return slices.Collect(maps.Keys(f.byGPU))
}

// drop forgets the fences on gpus, whichever claims they steer, and returns
// those that stood.
func (f *fences) drop(gpus []GPU) []GPU {
	var lift []GPU
	for _, g := range gpus {
		if _, ok := f.byGPU[g]; ok {
			delete(f.byGPU, g)
			lift = append(lift, g)
		}
	}
	return lift
}

// expire returns the GPUs whose fence outlived its time, and forgets them.
func (f *fences) expire(now time.Time) []GPU {
	var lift []GPU
	for g, fc := range f.byGPU {
		if !now.Before(fc.until) {
			delete(f.byGPU, g)
			lift = append(lift, g)
		}
	}
	return lift
}

// next is the earliest time a fence expires; zero without fences.
func (f *fences) next() time.Time {
	var t time.Time
	for _, fc := range f.byGPU {
		if t.IsZero() || fc.until.Before(t) {
			t = fc.until
		}
	}
	return t
}

// retry keeps a fence whose lifting failed, to be lifted again at until.
func (f *fences) retry(g GPU, until time.Time) {
	f.init()
	if _, ok := f.byGPU[g]; !ok {
		f.byGPU[g] = &fence{claims: map[types.UID]bool{}, until: until}
	}
}

// UnfenceAll implements FenceWriter: it deletes every fence rule (they carry
// the label app.kubernetes.io/managed-by=tessera-locality).
func (f APIFences) UnfenceAll(ctx context.Context) error {
	list, err := f.Client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=tessera-locality"})
	if err != nil {
		return err
	}
	for _, r := range list.Items {
		if err := f.Client.ResourceV1().DeviceTaintRules().Delete(ctx, r.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}
