package model

// Allocator table tests for MIG: what kube-scheduler's own allocator
// (structured.NewAllocator, as in allocator_test.go) hands out from what
// Resources publishes for GPUs in MIG mode. The expected results are
// NVIDIA's, not the model's: the combinations the MIG user guide's
// placement table allows (mig_fixtures_test.go names the sources) and its
// instance counts (seven 1g, one +me, four 1g of double memory, one 4g, one 7g).

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// migClaim asks for one MIG device of this profile ("" for any).
func migClaim(name, profile string, selectors ...string) *resourceapi.ResourceClaim {
	if profile != "" {
		selectors = append([]string{onProfile(profile)}, selectors...)
	}
	return newClaim(name, []resourceapi.DeviceRequest{{
		Name:    "mig",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: MIGClassName, Selectors: celSelectors(selectors)},
	}})
}

func onProfile(profile string) string {
	return fmt.Sprintf(`device.attributes[%q].profile == %q`, DriverName, profile)
}

// dynamicNode publishes these GPUs, all with dynamic MIG.
func dynamicNode(t testing.TB, gpus []gpu.GPU, opts ...Option) *testNode {
	t.Helper()
	var uuids []string
	for _, g := range gpus {
		uuids = append(uuids, g.UUID)
	}
	return newTestNode(t, gpus, append([]Option{WithDynamicMIG(uuids...)}, opts...)...)
}

// allocateProfiles allocates one claim per profile, in this order, and
// returns the device each got ("" where it did not fit).
func allocateProfiles(n *testNode, prefix string, profiles []string) []string {
	n.t.Helper()
	got := make([]string, len(profiles))
	for i, p := range profiles {
		got[i] = strings.Join(devices(n.allocate(migClaim(fmt.Sprintf("%s-%d-%s", prefix, i, MIGProfileSlug(p)), p))), ",")
	}
	return got
}

// roles turns the guide's profile roles into this table's profile names.
func (tb migTable) roles(rs ...string) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = map[string]string{
			"1g": tb.small, "1g+me": tb.me, "1g2": tb.double, "2g": tb.two, "3g": tb.three, "4g": tb.four, "7g": tb.seven,
		}[r]
		if out[i] == "" {
			panic("no role " + r)
		}
	}
	return out
}

// guideCombinations are the GPU-instance combinations that fill a GPU with
// 7 compute and 8 memory slices, as the MIG user guide's placement table
// ("Supported MIG Profiles"; nvidia-smi mig -lgipp: 1g at 0-6, 1g of double
// memory at 0/2/4/6 size 2, 2g at 0/2/4, 3g at 0/4 size 4, 4g at 0, 7g at 0
// size 8) allows them, largest first. "1g2" is the 1g profile with two
// memory slices (1g.20gb on H100), "1g+me" the one with media extensions.
// After any of them no further instance fits: either all 7 compute slices
// or all 8 memory slices are taken (or the one slot left, 7, starts no 1g).
var guideCombinations = [][]string{
	{"7g"},
	{"4g", "3g"},
	{"4g", "2g", "1g"},
	{"4g", "1g", "1g", "1g"},
	{"4g", "1g2", "1g2"},
	{"3g", "3g"},
	{"3g", "2g", "2g"},
	{"3g", "2g", "1g", "1g"},
	{"3g", "1g2", "1g2"},
	{"3g", "1g2", "1g", "1g"},
	{"3g", "1g", "1g", "1g", "1g"},
	{"2g", "2g", "2g", "1g"},
	{"2g", "2g", "1g", "1g", "1g"},
	{"2g", "1g", "1g", "1g", "1g", "1g"},
	{"1g2", "1g2", "1g2", "1g2"},
	{"1g2", "1g", "1g", "1g", "1g", "1g", "1g"},
	{"1g", "1g", "1g", "1g", "1g", "1g", "1g"},
	{"1g+me", "1g", "1g", "1g", "1g", "1g", "1g"},
}

// TestMIGDynamicGuideCombinations: on one dynamic-MIG GPU of each table,
// every combination of the guide fits when its instances arrive largest
// first (the order the guide itself creates them in: "the profile ID 9 or
// 3g.20gb must be specified first"), each on a placement of its own, and
// afterwards not even the smallest instance fits.
func TestMIGDynamicGuideCombinations(t *testing.T) {
	for _, table := range slices.Sorted(maps.Keys(migTables)) {
		tb := migTables[table]
		for _, combo := range guideCombinations {
			t.Run(table+"/"+strings.Join(combo, "+"), func(t *testing.T) {
				n := dynamicNode(t, tb.migGPUs(1, nil))
				got := allocateProfiles(n, "c", tb.roles(combo...))
				if slices.Contains(got, "") {
					t.Fatalf("%v: got %v, want every instance placed", tb.roles(combo...), got)
				}
				checkDisjoint(t, tb, got)
				for _, extra := range []string{"1g", "1g+me", "1g2"} {
					if r := n.allocate(migClaim("extra-"+extra, tb.roles(extra)[0])); r != nil {
						t.Errorf("after %v, a %s still fit: %v", got, tb.roles(extra)[0], devices(r))
					}
				}
			})
		}
	}
}

// checkDisjoint fails unless the placement devices cover disjoint memory
// slices, taken from the device names and the guide's sizes (not from the
// model's counters).
func checkDisjoint(t *testing.T, tb migTable, devs []string) {
	t.Helper()
	used := map[int]string{}
	for _, d := range devs {
		ref, err := ParseMIGDevice(d)
		if err != nil || ref.Static {
			t.Fatalf("device %q: %v (static %v)", d, err, ref.Static)
		}
		// The guide's placement sizes (-lgipp): 1 slice for the 1g
		// profiles, 2 for the 1g of double memory and the 2g, 4 for 3g
		// and 4g, 8 for 7g.
		size := map[string]int{
			tb.small: 1, tb.me: 1, tb.double: 2, tb.two: 2, tb.three: 4, tb.four: 4, tb.seven: 8,
		}[slugProfile(tb, ref.ProfileSlug)]
		for s := ref.Start; s < ref.Start+size; s++ {
			if other, dup := used[s]; dup {
				t.Errorf("memory slice %d in both %s and %s", s, other, d)
			}
			used[s] = d
		}
	}
}

// slugProfile is the profile of tb whose slug this is.
func slugProfile(tb migTable, slug string) string {
	for _, p := range tb.mig.Profiles {
		if MIGProfileSlug(p.Name) == slug {
			return p.Name
		}
	}
	return ""
}

// TestMIGDynamicNever: what the guide rules out never fits, whatever the
// arrival order: an 8th 1g, a second 4g, a second +me, a 5th 1g of double
// memory, a 3rd 3g, a 4th 2g, and anything beside a 7g.
func TestMIGDynamicNever(t *testing.T) {
	cases := []struct {
		name   string
		roles  []string // all but the last fit
		refuse string
	}{
		{"eighth 1g", []string{"1g", "1g", "1g", "1g", "1g", "1g", "1g"}, "1g"},
		{"two 4g", []string{"4g"}, "4g"},
		{"two +me", []string{"1g+me"}, "1g+me"},
		{"fifth 1g of double memory", []string{"1g2", "1g2", "1g2", "1g2"}, "1g2"},
		{"third 3g", []string{"3g", "3g"}, "3g"},
		{"fourth 2g", []string{"2g", "2g", "2g"}, "2g"},
		{"1g beside 7g", []string{"7g"}, "1g"},
		{"7g beside 1g", []string{"1g"}, "7g"},
		{"4g beside 3g and 1g", []string{"3g", "1g"}, "4g"},
		{"7g beside +me", []string{"1g+me"}, "7g"},
	}
	for _, table := range slices.Sorted(maps.Keys(migTables)) {
		tb := migTables[table]
		for _, c := range cases {
			t.Run(table+"/"+c.name, func(t *testing.T) {
				n := dynamicNode(t, tb.migGPUs(1, nil))
				got := allocateProfiles(n, "fit", tb.roles(c.roles...))
				if slices.Contains(got, "") {
					t.Fatalf("%v: got %v, want all to fit", tb.roles(c.roles...), got)
				}
				if r := n.allocate(migClaim("refused", tb.roles(c.refuse)[0])); r != nil {
					t.Errorf("after %v, %s fit: %v", got, tb.roles(c.refuse)[0], devices(r))
				}
			})
		}
	}
}

// TestMIGDynamic3gAnd4gEitherOrder: 3g + 4g fill a GPU whichever comes
// first (the 3g takes start 4 before 0, keeping 0-3 for the 4g), and a
// second 4g never fits.
func TestMIGDynamic3gAnd4gEitherOrder(t *testing.T) {
	for _, table := range slices.Sorted(maps.Keys(migTables)) {
		tb := migTables[table]
		for _, order := range [][]string{{"3g", "4g"}, {"4g", "3g"}} {
			t.Run(table+"/"+strings.Join(order, "-then-"), func(t *testing.T) {
				n := dynamicNode(t, tb.migGPUs(1, nil))
				got := allocateProfiles(n, "o", tb.roles(order...))
				want := map[string]string{
					tb.three: MIGPlacementDeviceName(0, tb.three, 4),
					tb.four:  MIGPlacementDeviceName(0, tb.four, 0),
				}
				for i, p := range tb.roles(order...) {
					if got[i] != want[p] {
						t.Errorf("%s: got %q, want %q", p, got[i], want[p])
					}
				}
				if r := n.allocate(migClaim("second-4g", tb.four)); r != nil {
					t.Errorf("second %s fit: %v", tb.four, devices(r))
				}
			})
		}
	}
}

// TestMIGDynamicSevenSmall: seven 1g fill a GPU from the top down (start 6
// first) and an 8th does not fit; after three of them a 4g still does.
func TestMIGDynamicSevenSmall(t *testing.T) {
	tb := migTables[h100]
	n := dynamicNode(t, tb.migGPUs(1, nil))
	var want []string
	for s := 6; s >= 0; s-- {
		want = append(want, MIGPlacementDeviceName(0, tb.small, s))
	}
	if got := allocateProfiles(n, "small", tb.roles("1g", "1g", "1g", "1g", "1g", "1g", "1g")); !slices.Equal(got, want) {
		t.Errorf("seven 1g.10gb: got %v, want %v", got, want)
	}
	if r := n.allocate(migClaim("eighth", tb.small)); r != nil {
		t.Errorf("eighth 1g.10gb fit: %v", devices(r))
	}

	n = dynamicNode(t, tb.migGPUs(1, nil))
	allocateProfiles(n, "small", tb.roles("1g", "1g", "1g"))
	if got := devices(n.allocate(migClaim("four", tb.four))); !slices.Equal(got, []string{MIGPlacementDeviceName(0, tb.four, 0)}) {
		t.Errorf("4g.40gb after three 1g.10gb: got %v", got)
	}
}

// TestMIGDynamicArrivalOrders allocates the guide's combinations in every
// arrival order, one claim per instance. The scheduler never moves an
// instance, so some orders strand a combination that another order fits;
// this test pins which ones, so that a change of the device order shows
// here (docs/mig.md lists them). NVIDIA's own tools have the same limit (the
// guide: 3g.20gb "must be specified first" for 3-2-1-1).
func TestMIGDynamicArrivalOrders(t *testing.T) {
	tb := migTables[h100]
	var stranded []string
	orders := 0
	for _, combo := range guideCombinations {
		for _, order := range distinctPermutations(combo) {
			orders++
			n := dynamicNode(t, tb.migGPUs(1, nil))
			if got := allocateProfiles(n, "p", tb.roles(order...)); slices.Contains(got, "") {
				stranded = append(stranded, strings.Join(order, ","))
			}
		}
	}
	t.Logf("%d of %d arrival orders of %d combinations strand an instance:\n%s", len(stranded), orders, len(guideCombinations), strings.Join(stranded, "\n"))
	if diff := strings.Join(stranded, "\n"); diff != strings.Join(wantStranded, "\n") {
		t.Errorf("stranded arrival orders changed:\n got %q\nwant %q", stranded, wantStranded)
	}
}

// wantStranded are the arrival orders of guideCombinations in which an
// instance finds no placement although the combination is valid (H100 80GB,
// the device order of migPlacementOrder): 27 of 88. In 21 a 3g.40gb comes
// after 1g or 2g instances that took slices from both halves; in 6 a
// 1g.20gb comes after six 1g.10gb. A 4g.40gb is never stranded.
var wantStranded = []string{
	"2g,2g,3g", "2g,3g,2g",
	"1g,1g,2g,3g", "1g,1g,3g,2g", "1g,2g,1g,3g", "1g,2g,3g,1g", "1g,3g,1g,2g", "1g,3g,2g,1g",
	"2g,1g,1g,3g", "2g,1g,3g,1g", "2g,3g,1g,1g",
	"1g,1g,1g2,3g", "1g,1g,3g,1g2", "1g,1g2,1g,3g", "1g,1g2,3g,1g", "1g,3g,1g,1g2", "1g,3g,1g2,1g",
	"1g,1g,1g,1g,3g", "1g,1g,1g,3g,1g", "1g,1g,3g,1g,1g", "1g,3g,1g,1g,1g",
	"1g,1g,1g,1g,1g,1g,1g2", "1g,1g,1g,1g,1g,1g2,1g", "1g,1g,1g,1g,1g2,1g,1g",
	"1g,1g,1g,1g2,1g,1g,1g", "1g,1g,1g2,1g,1g,1g,1g", "1g,1g2,1g,1g,1g,1g,1g",
}

// distinctPermutations are the distinct orders of xs.
func distinctPermutations(xs []string) [][]string {
	sorted := slices.Clone(xs)
	slices.Sort(sorted)
	var out [][]string
	var rec func(prefix []string, rest []string)
	rec = func(prefix, rest []string) {
		if len(rest) == 0 {
			out = append(out, slices.Clone(prefix))
			return
		}
		for i := range rest {
			if i > 0 && rest[i] == rest[i-1] {
				continue
			}
			next := append(slices.Clone(rest[:i]), rest[i+1:]...)
			rec(append(prefix, rest[i]), next)
		}
	}
	rec(nil, sorted)
	return out
}

// TestMIGDynamicOneClaim: a single claim that asks for a whole combination
// at once gets it in any order of its requests: the allocator searches
// (backtracks) within a claim, across claims it does not.
func TestMIGDynamicOneClaim(t *testing.T) {
	tb := migTables[h100]
	for _, order := range [][]string{{"1g", "1g", "2g", "3g"}, {"1g", "2g", "1g2", "1g", "1g"}, {"1g", "4g", "2g"}} {
		t.Run(strings.Join(order, "+"), func(t *testing.T) {
			n := dynamicNode(t, tb.migGPUs(1, nil))
			var requests []resourceapi.DeviceRequest
			for i, p := range tb.roles(order...) {
				requests = append(requests, resourceapi.DeviceRequest{
					Name: fmt.Sprintf("r%d", i),
					Exactly: &resourceapi.ExactDeviceRequest{
						DeviceClassName: MIGClassName, Selectors: celSelectors([]string{onProfile(p)}),
					},
				})
			}
			got := devices(n.allocate(newClaim("combo", requests)))
			if len(got) != len(order) {
				t.Fatalf("got %v, want %d devices", got, len(order))
			}
			checkDisjoint(t, tb, got)
		})
	}
}

// TestMIGDynamicAcrossGPUs: instances pack onto the lowest GPU first; a 7g
// goes to the next empty one.
func TestMIGDynamicAcrossGPUs(t *testing.T) {
	tb := migTables[h100]
	n := dynamicNode(t, tb.migGPUs(2, nil))
	if got := devices(n.allocate(migClaim("small", tb.small))); !slices.Equal(got, []string{MIGPlacementDeviceName(0, tb.small, 6)}) {
		t.Errorf("first 1g.10gb: got %v", got)
	}
	if got := devices(n.allocate(migClaim("seven", tb.seven))); !slices.Equal(got, []string{MIGPlacementDeviceName(1, tb.seven, 0)}) {
		t.Errorf("7g.80gb beside a 1g.10gb on gpu-0: got %v", got)
	}
	if r := n.allocate(migClaim("seven-2", tb.seven)); r != nil {
		t.Errorf("second 7g.80gb: %v", devices(r))
	}
	// A request that names no profile gets the smallest that fits.
	if got := devices(n.allocate(migClaim("any", "", fmt.Sprintf(`device.capacity[%q].memory.compareTo(quantity("15Gi")) >= 0`, DriverName)))); !slices.Equal(got, []string{MIGPlacementDeviceName(0, tb.double, 4)}) {
		t.Errorf("any MIG device with 15Gi: got %v, want the 1g.20gb at 4 on gpu-0 (6 is taken)", got)
	}
	n.release("small")
	if got := devices(n.allocate(migClaim("four", tb.four))); !slices.Equal(got, []string{MIGPlacementDeviceName(0, tb.four, 0)}) {
		t.Errorf("4g.40gb: got %v", got)
	}
}

// TestMIGDynamicForeignInstance: an instance Tessera did not create keeps its
// memory slices, compute slices and engines out of use; one it holds does not.
func TestMIGDynamicForeignInstance(t *testing.T) {
	tb := migTables[h100]
	gpus := tb.migGPUs(1, func(minor int) []gpu.MIGInstance { return []gpu.MIGInstance{tb.instance(minor, 1, tb.three, 4)} })

	n := dynamicNode(t, gpus)
	if got := allocateProfiles(n, "f", []string{tb.small, tb.small, tb.small, tb.small, tb.small}); !slices.Equal(got, []string{
		MIGPlacementDeviceName(0, tb.small, 3), MIGPlacementDeviceName(0, tb.small, 2),
		MIGPlacementDeviceName(0, tb.small, 1), MIGPlacementDeviceName(0, tb.small, 0), "",
	}) {
		t.Errorf("1g.10gb beside a foreign 3g.40gb at 4: got %v, want 3, 2, 1, 0 and no fifth", got)
	}
	n = dynamicNode(t, gpus)
	if got := allocateProfiles(n, "f", []string{tb.four, tb.small}); !slices.Equal(got, []string{MIGPlacementDeviceName(0, tb.four, 0), ""}) {
		t.Errorf("beside a foreign 3g.40gb at 4: got %v, want the 4g.40gb at 0 and then nothing", got)
	}

	three := tb.profile(tb.three).ID
	held := WithMIGHeld(map[string][]MIGHold{gpus[0].UUID: {{ProfileID: three, Placement: gpu.MIGPlacement{Start: 4, Size: 4}}}})
	res, err := Resources("node-1", gpus, WithDynamicMIG(gpus[0].UUID), held)
	if err != nil {
		t.Fatal(err)
	}
	empty, err := Resources("node-1", tb.migGPUs(1, nil), WithDynamicMIG(gpus[0].UUID))
	if err != nil {
		t.Fatal(err)
	}
	got, want := res.Pools["node-1"].Slices[0].SharedCounters, empty.Pools["node-1"].Slices[0].SharedCounters
	if !equalCounterSets(got, want) {
		t.Errorf("counters with the 3g.40gb held by Tessera: %v, want those of an empty GPU %v", got, want)
	}
	// A hold of another profile at the same placement (a claim's instance
	// destroyed and an admin's made there) does not hold this one.
	other := WithMIGHeld(map[string][]MIGHold{gpus[0].UUID: {{ProfileID: three + 100, Placement: gpu.MIGPlacement{Start: 4, Size: 4}}}})
	res, err = Resources("node-1", gpus, WithDynamicMIG(gpus[0].UUID), other)
	if err != nil {
		t.Fatal(err)
	}
	c := res.Pools["node-1"].Slices[0].SharedCounters[0].Counters
	if four, seven := c[MemorySliceCounter(4)].Value, c[MemorySliceCounter(7)].Value; !four.IsZero() || !seven.IsZero() {
		t.Errorf("a hold of another profile kept the foreign instance's slices free: %v", c)
	}
}

func equalCounterSets(a, b []resourceapi.CounterSet) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || len(a[i].Counters) != len(b[i].Counters) {
			return false
		}
		for k, v := range a[i].Counters {
			w, ok := b[i].Counters[k]
			if !ok || v.Value.Cmp(w.Value) != 0 {
				return false
			}
		}
	}
	return true
}

// TestMIGStatic: a static MIG GPU's compute instances are exclusive devices;
// a claim of mig.gpu.tessera.dev with a selector on the profile gets that
// instance, with its MIG UUID, and no second claim gets it.
func TestMIGStatic(t *testing.T) {
	tb := migTables[h100]
	gpus := tb.migGPUs(1, func(minor int) []gpu.MIGInstance {
		return []gpu.MIGInstance{tb.instance(minor, 1, tb.three, 4), tb.instance(minor, 2, tb.four, 0)}
	})
	n := newTestNode(t, gpus)
	r := n.allocate(migClaim("three", tb.three))
	if got := devices(r); !slices.Equal(got, []string{"gpu-0-mig-1"}) {
		t.Fatalf("3g.40gb: got %v, want [gpu-0-mig-1]", got)
	}
	if r := n.allocate(migClaim("three-again", tb.three)); r != nil {
		t.Errorf("second 3g.40gb claim got %v, the only one is held", devices(r))
	}
	if got := devices(n.allocate(migClaim("four", tb.four))); !slices.Equal(got, []string{"gpu-0-mig-2"}) {
		t.Errorf("4g.40gb: got %v, want [gpu-0-mig-2]", got)
	}
	// The UUID a container will see is published on the device.
	uuidSelector := fmt.Sprintf(`device.attributes[%q].uuid == %q`, DriverName, gpus[0].MIG.Instances[0].ComputeInstances[0].UUID)
	n.release("three")
	if got := devices(n.allocate(migClaim("by-uuid", "", uuidSelector))); !slices.Equal(got, []string{"gpu-0-mig-1"}) {
		t.Errorf("claim by MIG UUID: got %v", got)
	}
	if r := n.allocate(migClaim("seven", tb.seven)); r != nil {
		t.Errorf("7g.80gb on a static GPU without one: %v", devices(r))
	}
}

// TestMIGClassesApart: whole, shared and lent claims never get a MIG device,
// MIG claims never get a whole, shared or lent one, on a node with a plain
// GPU (minor 0), a static MIG GPU (1) and a dynamic one (2).
func TestMIGClassesApart(t *testing.T) {
	tb := migTables[h100]
	plain := fixtureGPUs(1, 80, oneDomain)[0]
	gpus := tb.migGPUs(3, func(minor int) []gpu.MIGInstance {
		if minor == 1 {
			return []gpu.MIGInstance{tb.instance(minor, 1, tb.seven, 0)}
		}
		return nil
	})
	gpus[0] = plain
	n := newTestNode(t, gpus, WithDynamicMIG(gpus[2].UUID), WithLending(map[string]Lent{plain.UUID: {Open: true}}))

	for _, s := range n.slices {
		for _, d := range s.Spec.Devices {
			typ := ptr.Deref(d.Attributes[AttrType].StringValue, "")
			_, _, plainErr := ParseDevice(d.Name)
			_, migErr := ParseMIGDevice(d.Name)
			switch {
			case typ == TypeMIG && (migErr != nil || plainErr == nil):
				t.Errorf("MIG device %s: name parses as MIG %v, as plain %v", d.Name, migErr, plainErr)
			case typ != TypeMIG && (plainErr != nil || migErr == nil):
				t.Errorf("%s device %s: name parses as plain %v, as MIG %v", typ, d.Name, plainErr, migErr)
			}
			if ref, err := ParseMIGDevice(d.Name); err == nil && ref.Minor == 0 {
				t.Errorf("the plain GPU published MIG device %s", d.Name)
			}
			if minor, _, err := ParseDevice(d.Name); err == nil && minor != 0 {
				t.Errorf("MIG GPU %d published %s", minor, d.Name)
			}
		}
	}

	for i := range 3 {
		if got := devices(n.allocate(wholeClaim(fmt.Sprintf("whole-%d", i), 1))); i == 0 && !slices.Equal(got, []string{"gpu-0"}) || i > 0 && got != nil {
			t.Errorf("whole claim %d: got %v", i, got)
		}
	}
	n.release("whole-0")
	for i := range 2 {
		if got := devices(n.allocate(shareClaim(fmt.Sprintf("share-%d", i), "10Gi", "10"))); !slices.Equal(got, []string{"gpu-0-shared"}) {
			t.Errorf("share %d: got %v, want gpu-0-shared", i, got)
		}
	}
	lent := newClaim("borrower", []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: LentClassName, AllocationMode: resourceapi.DeviceAllocationModeAll,
	}}})
	if got := devices(n.allocate(lent)); !slices.Equal(got, []string{"gpu-0-lent"}) {
		t.Errorf("all lent devices: got %v, want only gpu-0-lent", got)
	}
	all := newClaim("all-mig", []resourceapi.DeviceRequest{{Name: "mig", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: MIGClassName, AllocationMode: resourceapi.DeviceAllocationModeAll,
		Selectors: celSelectors([]string{onMinor(1)}),
	}}})
	if got := devices(n.allocate(all)); !slices.Equal(got, []string{"gpu-1-mig-1"}) {
		t.Errorf("all MIG devices of GPU 1: got %v, want its one instance", got)
	}
	if r := n.allocate(migClaim("mig-on-0", "", onMinor(0))); r != nil {
		t.Errorf("MIG claim on the plain GPU: %v", devices(r))
	}
}

// TestMIGMockNode: the hgx-h100-mig mock node through Discover: GPU 0 in MIG
// mode with a 4g.40gb at 0 and a 3g.40gb at 4 (static), GPU 1 in MIG mode
// without instances (dynamic here), GPUs 2-7 whole and shared.
func TestMIGMockNode(t *testing.T) {
	gpus := discover(t, "hgx-h100-mig")
	if !gpus[0].MIGEnabled || !gpus[1].MIGEnabled || gpus[2].MIGEnabled || gpus[0].MIG == nil || len(gpus[0].MIG.Instances) != 2 {
		t.Fatalf("mock profile hgx-h100-mig changed: GPU 0 %+v", gpus[0].MIG)
	}
	staticName := map[string]string{} // profile → device of GPU 0
	for _, gi := range gpus[0].MIG.Instances {
		staticName[gi.ProfileName] = MIGStaticDeviceName(0, gi.ID)
	}
	n := newTestNode(t, gpus, WithDynamicMIG(gpus[1].UUID))
	for _, c := range []struct{ profile, want string }{
		{"3g.40gb", staticName["3g.40gb"]},
		{"3g.40gb", MIGPlacementDeviceName(1, "3g.40gb", 4)},
		{"4g.40gb", staticName["4g.40gb"]},
		{"4g.40gb", MIGPlacementDeviceName(1, "4g.40gb", 0)}, // beside the 3g at 4
		{"1g.10gb", ""}, // both GPUs full: 7 compute slices each
	} {
		got := strings.Join(devices(n.allocate(migClaim("c-"+MIGProfileSlug(c.profile)+"-"+c.want, c.profile))), ",")
		if got != c.want {
			t.Errorf("%s: got %q, want %q", c.profile, got, c.want)
		}
	}
	if got := devices(n.allocate(wholeClaim("whole", 1))); !slices.Equal(got, []string{"gpu-7"}) {
		t.Errorf("whole GPU: got %v, want gpu-7", got)
	}

	// GPU 0 published with dynamic MIG: its instances are foreign unless
	// Tessera holds them.
	foreign := newTestNode(t, gpus, WithDynamicMIG(gpus[0].UUID))
	if r := foreign.allocate(migClaim("on-0", "1g.10gb", onMinor(0))); r != nil {
		t.Errorf("1g.10gb over GPU 0's foreign instances: %v", devices(r))
	}
	var held []MIGHold
	for _, gi := range gpus[0].MIG.Instances {
		held = append(held, MIGHold{ProfileID: gi.ProfileID, Placement: gi.Placement})
	}
	adopted := newTestNode(t, gpus, WithDynamicMIG(gpus[0].UUID), WithMIGHeld(map[string][]MIGHold{gpus[0].UUID: held}))
	// Held instances cover all eight memory slices: GPU 0 publishes their own
	// placements (the devices their claims are allocated) and the full-GPU
	// profile's, no other.
	var published []string
	for _, s := range adopted.slices {
		for _, d := range s.Spec.Devices {
			if strings.HasPrefix(d.Name, "gpu-0-") {
				published = append(published, d.Name)
			}
		}
	}
	slices.Sort(published)
	want := []string{MIGPlacementDeviceName(0, "3g.40gb", 4), MIGPlacementDeviceName(0, "4g.40gb", 0), MIGPlacementDeviceName(0, "7g.80gb", 0)}
	slices.Sort(want)
	if !slices.Equal(published, want) {
		t.Errorf("GPU 0 with its instances held publishes %v, want %v", published, want)
	}
	if r := adopted.allocate(migClaim("on-0", "1g.10gb", onMinor(0))); r != nil {
		t.Errorf("1g.10gb on GPU 0 with its instances held: %v", devices(r))
	}
	// With no claim allocated in this test the held placement itself fits.
	if got := devices(adopted.allocate(migClaim("held-3g", "3g.40gb", onMinor(0)))); !slices.Equal(got, []string{MIGPlacementDeviceName(0, "3g.40gb", 4)}) {
		t.Errorf("3g.40gb on GPU 0 with its instances held (no claim allocated in this test): got %v", got)
	}
}

// gpuOneDevices are the names of GPU 1's devices in n's slices, by slice.
func gpuOneDevices(n *testNode) map[string][]string {
	out := map[string][]string{}
	for _, s := range n.slices {
		for _, d := range s.Spec.Devices {
			if strings.HasPrefix(d.Name, "gpu-1-") {
				out[s.Name] = append(out[s.Name], d.Name)
			}
		}
	}
	return out
}

// Placements blocked by an instance Tessera holds are left out, in GPU 1's
// own slice; an instance no claim holds prunes nothing: it can appear after
// a claim was allocated a placement it overlaps, and that claim's device
// must stay published for the allocator to count its counters.
func TestMIGBlockedPlacementsLeftOut(t *testing.T) {
	gpus := discover(t, "hgx-h100-mig")
	profile := func(name string) gpu.MIGProfile {
		for _, p := range gpus[1].MIG.Profiles {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("no profile %s", name)
		return gpu.MIGProfile{}
	}
	one, three := profile("1g.10gb"), profile("3g.40gb")
	before := gpuOneDevices(newTestNode(t, gpus[1:2], WithDynamicMIG(gpus[1].UUID)))

	// Held: a 3g.40gb at 4 made for a claim.
	at4 := gpu.MIGPlacement{Start: 4, Size: 4}
	held := slices.Clone(gpus[1:2])
	mig := *held[0].MIG
	mig.Instances = []gpu.MIGInstance{{ID: 2, ProfileID: three.ID, ProfileName: three.Name, Placement: at4}}
	held[0].MIG = &mig
	n := newTestNode(t, held, WithDynamicMIG(gpus[1].UUID), WithMIGHeld(map[string][]MIGHold{gpus[1].UUID: {{ProfileID: three.ID, Placement: at4}}}))
	after := gpuOneDevices(n)
	if len(before) != 1 || len(after) != 1 {
		t.Fatalf("GPU 1's devices are in %d slices before and %d after, want one slice of its own", len(before), len(after))
	}
	for _, names := range after {
		for _, name := range names {
			d, _ := ParseMIGDevice(name)
			pl := gpu.MIGPlacement{Start: d.Start, Size: 1}
			if d.ProfileSlug != MIGProfileSlug(three.Name) && d.ProfileSlug != MIGProfileSlug("7g.80gb") && d.Start >= 4 {
				t.Errorf("%s is published over the held 3g.40gb at 4 (%v)", name, pl)
			}
		}
		if !slices.Contains(names, MIGPlacementDeviceName(1, three.Name, 4)) || !slices.Contains(names, MIGPlacementDeviceName(1, "7g.80gb", 0)) {
			t.Errorf("GPU 1 with a held 3g.40gb at 4 publishes %v: want its own placement and 7g.80gb kept", names)
		}
		if len(names) >= 25 {
			t.Errorf("GPU 1 with a held 3g.40gb at 4 publishes all %d placements", len(names))
		}
	}

	// Foreign: a claim holds 3g.40gb at 4 (allocated, not yet prepared),
	// then an admin makes a 1g.10gb at 6, inside it. Nothing is left out,
	// so the claim's device and its counters still count: memory slice 6
	// is overdrawn (the claim's 1 against the published 0), and the
	// allocator then places nothing more on the GPU. Had the claim's
	// device been left out, a 2g.20gb would get the placement at 4, over
	// the claim's.
	n = newTestNode(t, gpus[1:2], WithDynamicMIG(gpus[1].UUID))
	if got := devices(n.allocate(migClaim("x", three.Name))); !slices.Equal(got, []string{MIGPlacementDeviceName(1, three.Name, 4)}) {
		t.Fatalf("3g.40gb got %v, want the placement at 4", got)
	}
	foreign := slices.Clone(gpus[1:2])
	mig = *foreign[0].MIG
	mig.Instances = []gpu.MIGInstance{{ID: 9, ProfileID: one.ID, ProfileName: one.Name, Placement: gpu.MIGPlacement{Start: 6, Size: 1}}}
	foreign[0].MIG = &mig
	republished := newTestNode(t, foreign, WithDynamicMIG(gpus[1].UUID))
	republished.state, republished.claims = n.state, n.claims
	for _, names := range gpuOneDevices(republished) {
		if len(names) != 25 {
			t.Errorf("GPU 1 with a foreign instance publishes %d placements, want all 25", len(names))
		}
	}
	if r := republished.allocate(migClaim("two", "2g.20gb")); r != nil {
		t.Errorf("2g.20gb beside the allocated 3g.40gb at 4 and a foreign 1g.10gb at 6: got %v", devices(r))
	}
	if got := devices(republished.allocate(migClaim("four", "4g.40gb"))); got != nil {
		t.Errorf("4g.40gb beside them: got %v, want no fit", got)
	}
}
