package model

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestSharesPackFirstFit: four {memory: 20Gi, cores: 25} shares fill one 80Gi GPU
// (gpu-0-shared), the fifth goes to gpu-1-shared; every result is a share with its
// consumed capacity, as on a real 1.37 control plane.
func TestSharesPackFirstFit(t *testing.T) {
	// GPUs of exactly 80Gi (no mock profile publishes that much: an A100
	// 80GB's 80Gi less what its driver reserves is 81222Mi).
	n := newTestNode(t, fixtureGPUs(4, 80, oneDomain))
	want := []string{"gpu-0-shared", "gpu-0-shared", "gpu-0-shared", "gpu-0-shared", "gpu-1-shared"}
	shareIDs := map[string]bool{}
	for i, wantDevice := range want {
		name := fmt.Sprintf("quarter-%d", i)
		r := n.allocate(shareClaim(name, "20Gi", "25"))
		if got := devices(r); !slices.Equal(got, []string{wantDevice}) {
			t.Fatalf("claim %s: got devices %v, want [%s]", name, got, wantDevice)
		}
		res := r.Devices.Results[0]
		if res.Driver != DriverName || res.Pool != "node-1" || res.Request != "gpu" {
			t.Errorf("claim %s: result %s/%s request %q", name, res.Driver, res.Pool, res.Request)
		}
		if res.ShareID == nil || *res.ShareID == "" || shareIDs[string(*res.ShareID)] {
			t.Errorf("claim %s: shareID %v, want a new one", name, res.ShareID)
		} else {
			shareIDs[string(*res.ShareID)] = true
		}
		wantConsumed := map[resourceapi.QualifiedName]resource.Quantity{Memory: resource.MustParse("20Gi"), Cores: resource.MustParse("25")}
		if diff := cmp.Diff(wantConsumed, res.ConsumedCapacity, cmpQuantity); diff != "" {
			t.Errorf("claim %s: consumedCapacity (-want +got):\n%s", name, diff)
		}
	}
}

// TestSharesPackByReportedMemory: an H100 80GB reports 81559 MiB of which the
// driver reserves about 470, so it publishes 81089Mi, less than 80Gi: four 20Gi
// shares do NOT fit on one, the fourth goes to gpu-1. Quarter shares of an
// H100 must ask for at most 81089Mi/4 (20272Mi); quarters of NVML's total
// (20389Mi) no longer fit four to a GPU.
func TestSharesPackByReportedMemory(t *testing.T) {
	n := newTestNode(t, discover(t, "hgx-h100"))
	var got []string
	for i := range 4 {
		got = append(got, devices(n.allocate(shareClaim(fmt.Sprintf("q20gi-%d", i), "20Gi", "25")))...)
	}
	if want := []string{"gpu-0-shared", "gpu-0-shared", "gpu-0-shared", "gpu-1-shared"}; !slices.Equal(got, want) {
		t.Errorf("20Gi shares on H100: got %v, want %v", got, want)
	}

	n = newTestNode(t, discover(t, "hgx-h100"))
	got = nil
	for i := range 5 {
		got = append(got, devices(n.allocate(shareClaim(fmt.Sprintf("quarter-%d", i), "20272Mi", "25")))...)
	}
	if want := []string{"gpu-0-shared", "gpu-0-shared", "gpu-0-shared", "gpu-0-shared", "gpu-1-shared"}; !slices.Equal(got, want) {
		t.Errorf("20272Mi shares on H100: got %v, want %v", got, want)
	}

	n = newTestNode(t, discover(t, "hgx-h100"))
	got = nil
	for i := range 4 {
		got = append(got, devices(n.allocate(shareClaim(fmt.Sprintf("nvml-quarter-%d", i), "20389Mi", "25")))...)
	}
	if want := []string{"gpu-0-shared", "gpu-0-shared", "gpu-0-shared", "gpu-1-shared"}; !slices.Equal(got, want) {
		t.Errorf("20389Mi shares (quarters of NVML's total) on H100: got %v, want %v", got, want)
	}
}

// TestWholeAndSharesExclude: a GPU is held whole or shared, never both, and the
// whole GPU becomes allocatable again once its last share is released.
func TestWholeAndSharesExclude(t *testing.T) {
	n := newTestNode(t, discover(t, "hgx-h100"))

	// Whole-GPU claims fill from the top, shares from the bottom.
	if got := devices(n.allocate(wholeClaim("whole-any", 1))); !slices.Equal(got, []string{"gpu-7"}) {
		t.Errorf("first whole claim got %v, want [gpu-7] (whole GPUs are offered highest minor first)", got)
	}
	n.release("whole-any")

	for i := range 2 {
		if got := devices(n.allocate(shareClaim(fmt.Sprintf("share-%d", i), "10Gi", "10"))); !slices.Equal(got, []string{"gpu-0-shared"}) {
			t.Fatalf("share-%d got %v, want [gpu-0-shared]", i, got)
		}
	}
	if r := n.allocate(wholeClaim("whole-0", 1, onMinor(0))); r != nil {
		t.Fatalf("whole gpu-0 allocated while it holds two shares: %v", devices(r))
	}
	n.release("share-0")
	if r := n.allocate(wholeClaim("whole-0", 1, onMinor(0))); r != nil {
		t.Fatalf("whole gpu-0 allocated while it holds one share: %v", devices(r))
	}
	n.release("share-1")
	if got := devices(n.allocate(wholeClaim("whole-0", 1, onMinor(0)))); !slices.Equal(got, []string{"gpu-0"}) {
		t.Fatalf("whole gpu-0 after its shares were released: got %v, want [gpu-0]", got)
	}

	// Now gpu-0 is held whole: no share may land on it, others go elsewhere.
	if r := n.allocate(shareClaim("share-on-0", "1Gi", "1", onMinor(0))); r != nil {
		t.Errorf("share allocated on gpu-0 held whole: %v", devices(r))
	}
	if got := devices(n.allocate(shareClaim("share-any", "1Gi", "1"))); !slices.Equal(got, []string{"gpu-1-shared"}) {
		t.Errorf("share while gpu-0 is held whole: got %v, want [gpu-1-shared]", got)
	}
	n.release("whole-0")
	if got := devices(n.allocate(shareClaim("share-on-0", "1Gi", "1", onMinor(0)))); !slices.Equal(got, []string{"gpu-0-shared"}) {
		t.Errorf("share on gpu-0 after the whole claim was released: got %v", got)
	}
}

// TestWholeClaimsExhaustShares: when every GPU holds a share, no whole GPU is left.
func TestWholeClaimsExhaustShares(t *testing.T) {
	n := newTestNode(t, discover(t, "l4x4"))
	for m := range 4 {
		n.allocate(shareClaim(fmt.Sprintf("share-%d", m), "1Gi", "0", onMinor(m)))
	}
	if r := n.allocate(wholeClaim("whole", 1)); r != nil {
		t.Errorf("whole GPU allocated while every GPU holds a share: %v", devices(r))
	}
	n.release("share-2")
	if got := devices(n.allocate(wholeClaim("whole", 1))); !slices.Equal(got, []string{"gpu-2"}) {
		t.Errorf("whole claim got %v, want [gpu-2], the only GPU without shares", got)
	}
}

// TestAllocationProperties allocates and releases random mixes of whole-GPU and
// shared claims and checks after every step, from the allocation results alone:
//
//   - no GPU is held whole by two claims, or whole and shared at once;
//   - the shares of a GPU never exceed its memory or cores;
//   - a share consumes its request rounded up to whole MiB and to at least
//     MinShareMemory (cores as asked);
//   - the allocator refuses a claim only when no GPU could take it (first-fit over
//     this model loses nothing for single-device claims).
func TestAllocationProperties(t *testing.T) {
	profiles := []string{"l4x4", "a100-pairs", "hgx-h100"}
	iterations := 400
	if testing.Short() {
		iterations = 100
	}
	for seed := int64(1); seed <= 6; seed++ {
		profile := profiles[int(seed-1)%len(profiles)]
		t.Run(fmt.Sprintf("seed-%d-%s", seed, profile), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			gpus := discover(t, profile)
			n := newTestNode(t, gpus)
			memOf := map[int]int64{}
			for _, g := range gpus {
				memOf[g.Minor] = int64(g.MemoryBytes)
			}
			type share struct{ memory, cores int64 }
			held := map[string]int{}    // whole claim → minor
			shares := map[string]int{}  // share claim → minor
			sizes := map[string]share{} // share claim → consumed
			var live []string
			var allocated, refused, released int
			defer func() {
				t.Logf("%d allocated, %d refused, %d released", allocated, refused, released)
				// A quarter: the L4s' 22659Mi refuse more of the mix than
				// the 80GB GPUs do.
				if allocated < iterations/4 || refused == 0 {
					t.Errorf("random mix too easy or too hard to test anything: %d allocated, %d refused", allocated, refused)
				}
			}()

			free := func() (wholeFree map[int]bool, memFree, coresFree map[int]int64) {
				wholeFree, memFree, coresFree = map[int]bool{}, map[int]int64{}, map[int]int64{}
				for m, mem := range memOf {
					wholeFree[m], memFree[m], coresFree[m] = true, mem, CoresPerGPU
				}
				for _, m := range held {
					wholeFree[m] = false
					memFree[m], coresFree[m] = 0, 0
				}
				for c, m := range shares {
					wholeFree[m] = false
					memFree[m] -= sizes[c].memory
					coresFree[m] -= sizes[c].cores
				}
				return
			}

			// checkInvariants checks everything now allocated.
			checkInvariants := func(step int) {
				t.Helper()
				_, memLeft, coresLeft := free()
				for m := range memOf {
					if memLeft[m] < 0 || coresLeft[m] < 0 {
						t.Fatalf("step %d: gpu-%d overcommitted: memory left %d, cores left %d", step, m, memLeft[m], coresLeft[m])
					}
				}
				wholeOn := map[int]int{}
				for _, m := range held {
					wholeOn[m]++
				}
				for c, m := range shares {
					if wholeOn[m] > 0 {
						t.Fatalf("step %d: gpu-%d held whole and shared by %s", step, m, c)
					}
				}
				for m, k := range wholeOn {
					if k > 1 {
						t.Fatalf("step %d: gpu-%d held whole by %d claims", step, m, k)
					}
				}
			}

			for step := range iterations {
				if len(live) > 0 && rng.Intn(3) == 0 {
					i := rng.Intn(len(live))
					name := live[i]
					live = slices.Delete(live, i, i+1)
					n.release(name)
					released++
					delete(held, name)
					delete(shares, name)
					delete(sizes, name)
					continue
				}
				name := fmt.Sprintf("claim-%d", step)
				wholeFree, memFree, coresFree := free()
				if rng.Intn(4) == 0 {
					r := n.allocate(wholeClaim(name, 1))
					couldFit := slices.Contains(mapsValues(wholeFree), true)
					if r == nil {
						if couldFit {
							t.Fatalf("step %d: whole claim refused although a GPU is free: %v", step, wholeFree)
						}
						refused++
						continue
					}
					minor, shared, err := ParseDeviceName(r.Devices.Results[0].Device)
					if err != nil || shared {
						t.Fatalf("step %d: whole claim got %v", step, devices(r))
					}
					if !wholeFree[minor] {
						t.Fatalf("step %d: whole claim got gpu-%d, which is held whole or shared", step, minor)
					}
					if r.Devices.Results[0].ShareID != nil {
						t.Fatalf("step %d: whole GPU result has a shareID", step)
					}
					held[name] = minor
					live = append(live, name)
					allocated++
					checkInvariants(step)
					continue
				}

				// Memory in bytes, often not MiB-aligned; cores 0–60.
				memory := rng.Int63n(30<<30) + 1
				cores := rng.Int63n(61)
				// Rounded up to the step, and to the minimum share.
				wantMem := max((memory+(1<<20-1))&^(1<<20-1), MinShareMemory.Value())
				r := n.allocate(shareClaim(name, resource.NewQuantity(memory, resource.BinarySI).String(), fmt.Sprint(cores)))
				couldFit := false
				for m := range memOf {
					if memFree[m] >= wantMem && coresFree[m] >= cores {
						couldFit = true
					}
				}
				if r == nil {
					if couldFit {
						t.Fatalf("step %d: share {%d bytes, %d cores} refused although a GPU has room: mem %v cores %v", step, memory, cores, memFree, coresFree)
					}
					refused++
					continue
				}
				res := r.Devices.Results[0]
				minor, shared, err := ParseDeviceName(res.Device)
				if err != nil || !shared {
					t.Fatalf("step %d: share got %v", step, devices(r))
				}
				gotMem, gotCores := res.ConsumedCapacity[Memory], res.ConsumedCapacity[Cores]
				if gotMem.Value() != wantMem || gotCores.Value() != cores {
					t.Fatalf("step %d: share {%d, %d} consumed {%s, %s}, want {%d, %d}", step, memory, cores, gotMem.String(), gotCores.String(), wantMem, cores)
				}
				shares[name] = minor
				sizes[name] = share{wantMem, cores}
				live = append(live, name)
				allocated++

				checkInvariants(step)
			}
		})
	}
}

func mapsValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// TestNVLinkConstraint: two whole GPUs with matchAttribute nvlinkDomain.
func TestNVLinkConstraint(t *testing.T) {
	for _, tc := range []struct {
		profile string
		want    []string // nil: unallocatable
	}{
		{profile: "hgx-h100", want: []string{"gpu-7", "gpu-6"}},
		{profile: "a100-pairs", want: []string{"gpu-3", "gpu-2"}},
		{profile: "l4x4"}, // PCIe only: every GPU is its own domain
	} {
		t.Run(tc.profile, func(t *testing.T) {
			n := newTestNode(t, discover(t, tc.profile))
			r := n.allocate(nvlinkPairClaim("pair"))
			if got := devices(r); !slices.Equal(got, tc.want) {
				t.Errorf("NVLink pair got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPreferNVLink: firstAvailable takes the NVLink subrequest where a pair exists
// and falls back to any two GPUs where none does.
func TestPreferNVLink(t *testing.T) {
	for _, tc := range []struct {
		name    string
		profile string
		// held are whole GPUs taken before the claim.
		held        []int
		wantRequest string
		want        []string
	}{
		{name: "pairs", profile: "a100-pairs", wantRequest: "gpus/nvlink", want: []string{"gpu-3", "gpu-2"}},
		{name: "one pair left", profile: "a100-pairs", held: []int{3}, wantRequest: "gpus/nvlink", want: []string{"gpu-1", "gpu-0"}},
		{name: "pairs broken", profile: "a100-pairs", held: []int{3, 1}, wantRequest: "gpus/any", want: []string{"gpu-2", "gpu-0"}},
		{name: "no NVLink", profile: "l4x4", wantRequest: "gpus/any", want: []string{"gpu-3", "gpu-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode(t, discover(t, tc.profile))
			for _, m := range tc.held {
				if n.allocate(wholeClaim(fmt.Sprintf("held-%d", m), 1, onMinor(m))) == nil {
					t.Fatalf("could not hold gpu-%d", m)
				}
			}
			r := n.allocate(preferNVLinkClaim("pair"))
			if got := devices(r); !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for _, res := range r.Devices.Results {
				if res.Request != tc.wantRequest {
					t.Errorf("device %s: request %q, want %q", res.Device, res.Request, tc.wantRequest)
				}
			}
		})
	}
}

// TestBadShareRequests: what the allocator does with share requests that do not
// fit the GPU or its request policy. Requests off the policy's step are rounded up
// (and charged rounded); requests above the GPU or the policy's max are
// unallocatable on the node; a request too large for the allocator's arithmetic
// is an error that aborts the scheduling attempt (not a panic).
func TestBadShareRequests(t *testing.T) {
	for _, tc := range []struct {
		name          string
		memory, cores string
		wantConsumed  [2]string // memory, cores; empty: unallocatable
		wantErr       string
	}{
		{name: "fits", memory: "20Gi", cores: "25", wantConsumed: [2]string{"20Gi", "25"}},
		{name: "whole GPU memory", memory: "81089Mi", cores: "100", wantConsumed: [2]string{"81089Mi", "100"}},
		{name: "memory above GPU", memory: "81090Mi", cores: "1"},
		{name: "NVML's total, reserved memory included", memory: "81559Mi", cores: "1"},
		{name: "memory 100Gi", memory: "100Gi", cores: "1"},
		{name: "cores 150", memory: "1Gi", cores: "150"},
		{name: "cores 101", memory: "1Gi", cores: "101"},
		{name: "memory 0 rounds up to the 1Gi minimum share", memory: "0", cores: "1", wantConsumed: [2]string{"1Gi", "1"}},
		{name: "memory 1000 bytes rounds up to 1Gi", memory: "1000", cores: "1", wantConsumed: [2]string{"1Gi", "1"}},
		{name: "memory below one CUDA context rounds up to 1Gi", memory: "512Mi", cores: "1", wantConsumed: [2]string{"1Gi", "1"}},
		{name: "memory off step rounds up", memory: "1049088Ki", cores: "1", wantConsumed: [2]string{"1025Mi", "1"}},
		{name: "fractional cores round up", memory: "1Gi", cores: "500m", wantConsumed: [2]string{"1Gi", "1"}},
		{name: "no memory asked: all of it", cores: "10", wantConsumed: [2]string{"81089Mi", "10"}},
		{name: "no cores asked: none guaranteed", memory: "1Gi", wantConsumed: [2]string{"1Gi", "0"}},
		{name: "memory beyond the allocator's arithmetic", memory: "8Ei", cores: "1", wantErr: "cannot be represented"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode(t, discover(t, "hgx-h100"))
			r, err := n.tryAllocate(shareClaim("bad", tc.memory, tc.cores))
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Allocate error %v, want one containing %q (result %v)", err, tc.wantErr, devices(r))
				}
				return
			case err != nil:
				t.Fatalf("Allocate: %v", err)
			case tc.wantConsumed[0] == "":
				if r != nil {
					t.Errorf("allocated %v consuming %v, want unallocatable", devices(r), r.Devices.Results[0].ConsumedCapacity)
				}
				return
			case r == nil:
				t.Fatalf("unallocatable, want consumed %v", tc.wantConsumed)
			}
			want := map[resourceapi.QualifiedName]resource.Quantity{
				Memory: resource.MustParse(tc.wantConsumed[0]),
				Cores:  resource.MustParse(tc.wantConsumed[1]),
			}
			if diff := cmp.Diff(want, r.Devices.Results[0].ConsumedCapacity, cmpQuantity); diff != "" {
				t.Errorf("consumedCapacity (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSixteenGPUNode: no mock profile has 16 GPUs, so a fixture does. Its pool is
// two counter slices and one device slice whose devices consume counter sets from
// both; all 16 GPUs allocate whole, and 64 quarter shares fill them.
func TestSixteenGPUNode(t *testing.T) {
	gpus := fixtureGPUs(16, 80, func(m int) string { return fmt.Sprintf("nvl-%d", m/8) })
	n := newTestNode(t, gpus)
	var kinds []string
	for _, s := range n.slices {
		switch {
		case len(s.Spec.SharedCounters) > 0:
			kinds = append(kinds, fmt.Sprintf("counters:%d", len(s.Spec.SharedCounters)))
		default:
			kinds = append(kinds, fmt.Sprintf("devices:%d", len(s.Spec.Devices)))
		}
	}
	if want := []string{"counters:8", "counters:8", "devices:32"}; !slices.Equal(kinds, want) {
		t.Fatalf("slices %v, want %v", kinds, want)
	}

	got := map[string]bool{}
	for i := range 16 {
		r := n.allocate(wholeClaim(fmt.Sprintf("whole-%d", i), 1))
		if r == nil {
			t.Fatalf("whole claim %d unallocatable", i)
		}
		got[r.Devices.Results[0].Device] = true
	}
	if len(got) != 16 {
		t.Errorf("16 whole claims got %d distinct GPUs", len(got))
	}
	if r := n.allocate(wholeClaim("whole-16", 1)); r != nil {
		t.Errorf("17th whole GPU allocated: %v", devices(r))
	}
	if r := n.allocate(shareClaim("share", "1Gi", "1")); r != nil {
		t.Errorf("share allocated while all GPUs are held whole: %v", devices(r))
	}
	for i := range 16 {
		n.release(fmt.Sprintf("whole-%d", i))
	}

	perDevice := map[string]int{}
	for i := range 64 {
		r := n.allocate(shareClaim(fmt.Sprintf("quarter-%d", i), "20Gi", "25"))
		if r == nil {
			t.Fatalf("quarter share %d unallocatable", i)
		}
		perDevice[r.Devices.Results[0].Device]++
	}
	for m := range 16 {
		if k := perDevice[SharedDeviceName(m)]; k != 4 {
			t.Errorf("%s holds %d quarter shares, want 4", SharedDeviceName(m), k)
		}
	}
	if r := n.allocate(shareClaim("quarter-64", "20Gi", "25")); r != nil {
		t.Errorf("65th quarter share allocated: %v", devices(r))
	}
	// Free gpu-0 and gpu-1 (one NVLink domain): an NVLink pair fits again.
	for i := range 8 {
		n.release(fmt.Sprintf("quarter-%d", i))
	}
	if got, want := devices(n.allocate(nvlinkPairClaim("pair"))), []string{"gpu-1", "gpu-0"}; !slices.Equal(got, want) {
		t.Errorf("NVLink pair got %v, want %v", got, want)
	}
}
