package model

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestSmallSharesRoundUpToMinimum: the scheduler's own allocator rounds a
// share below MinShareMemory up to it and charges the GPU that much, so an
// H100 (81089Mi published) holds 79 shares that ask for 256Mi, not 316: a
// share's memory includes its CUDA context, and a 256Mi share could not even
// start one.
func TestSmallSharesRoundUpToMinimum(t *testing.T) {
	n := newTestNode(t, discover(t, "hgx-h100"))
	held := 0
	for i := range 400 {
		r := n.allocate(shareClaim(fmt.Sprintf("small-%d", i), "256Mi", "", onMinor(0)))
		if r == nil {
			break
		}
		if got := r.Devices.Results[0].ConsumedCapacity[Memory]; got.Cmp(MinShareMemory) != 0 {
			t.Fatalf("share %d: charged %s of memory, want the minimum share %s", i, got.String(), MinShareMemory.String())
		}
		held++
	}
	if want := 81089 / 1024; held != want {
		t.Errorf("gpu-0 held %d shares of 256Mi, want %d (81089Mi / 1Gi)", held, want)
	}
}

// TestMemoryPublishedInWholeMiB: NVML's reserved memory need not be a whole
// MiB; the GPU publishes its usable memory rounded down to one, so that the
// shared device's default request (all of it) is on the request policy's
// step, as the API server requires, and a claim that names no memory gets it.
func TestMemoryPublishedInWholeMiB(t *testing.T) {
	gpus := discover(t, "hgx-h100")[:1]
	gpus[0].MemoryBytes = 81088<<20 + 12345
	res, err := Resources("node-1", gpus)
	if err != nil {
		t.Fatal(err)
	}
	want := resource.MustParse("81088Mi")
	for _, s := range res.Pools["node-1"].Slices {
		for _, cs := range s.SharedCounters {
			if got := cs.Counters[string(Memory)].Value; got.Cmp(want) != 0 {
				t.Errorf("counter set %s: memory %s, want %s", cs.Name, got.String(), want.String())
			}
		}
		for _, d := range s.Devices {
			c := d.Capacity[Memory]
			if c.Value.Cmp(want) != 0 {
				t.Errorf("%s: memory %s, want %s", d.Name, c.Value.String(), want.String())
			}
			if p := c.RequestPolicy; p != nil && p.Default.Cmp(want) != 0 {
				t.Errorf("%s: default request %s, want %s", d.Name, p.Default.String(), want.String())
			}
		}
	}
	n := newTestNode(t, gpus)
	r := n.allocate(shareClaim("all", "", "10"))
	if got := r.Devices.Results[0].ConsumedCapacity[Memory]; got.Cmp(want) != 0 {
		t.Errorf("a share naming no memory consumed %s, want %s", got.String(), want.String())
	}
}

// TestLendingBelowMinimumShare: a GPU that would lend less than the minimum
// share publishes its lending device closed (no share that small could be
// allocated, and a minimum above the capacity is not a valid policy).
func TestLendingBelowMinimumShare(t *testing.T) {
	gpus := discover(t, "hgx-h100")
	res := validResources(t, gpus, WithLending(map[string]Lent{
		gpus[1].UUID: {Open: true, Memory: 512 << 20},
		gpus[2].UUID: {Open: true, Memory: 2 << 30},
	}))
	lent := map[string]resourceapi.Device{}
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			lent[d.Name] = d
		}
	}
	d := lent["gpu-1-lent"]
	if len(d.Taints) != 2 || d.Taints[0].Value != LentBelowMinimumShare {
		t.Errorf("gpu-1-lent lending 512Mi: taints %v, want both lending taints with %s", d.Taints, LentBelowMinimumShare)
	}
	if c := d.Capacity[Memory]; c.Value.Cmp(c.RequestPolicy.ValidRange.Min.DeepCopy()) <= 0 {
		t.Errorf("gpu-1-lent: capacity %s not above its minimum %s", c.Value.String(), c.RequestPolicy.ValidRange.Min.String())
	}
	d = lent["gpu-2-lent"]
	if c := d.Capacity[Memory]; len(d.Taints) != 0 || c.Value.Cmp(resource.MustParse("2Gi")) != 0 || c.RequestPolicy.ValidRange.Min.Cmp(MinShareMemory) != 0 {
		t.Errorf("gpu-2-lent lending 2Gi: taints %v, capacity %v; want open, 2Gi, minimum %s", d.Taints, c, MinShareMemory.String())
	}
}
