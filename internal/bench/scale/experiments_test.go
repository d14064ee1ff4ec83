package scale

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/model"
)

// allocateOn runs one claim of the workload through kube-scheduler's own
// allocator on one fake node publishing pub, with taken already allocated,
// and returns the devices it got (nil: it does not fit).
func allocateOn(t *testing.T, pub Publisher, w Workload, taken []structured.DeviceID) []string {
	t.Helper()
	const node = "kwok-gpu-00000"
	objs, err := pub.Slices(node)
	if err != nil {
		t.Fatal(err)
	}
	var slices []*resourceapi.ResourceSlice
	for i := range objs {
		s := &objs[i]
		s.Name, s.UID = s.GenerateName+"abcde", types.UID(fmt.Sprintf("slice-%d", i))
		slices = append(slices, s)
	}
	classes := model.ClassLister{}
	for _, c := range model.DeviceClasses() {
		classes[c.Name] = &c
	}
	classes[NVIDIAClassName] = NVIDIADeviceClass()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: w.Name, Namespace: "bench", UID: types.UID(w.Name)},
		Spec:       w.Template.Spec.Spec,
	}
	alloc, err := structured.NewAllocator(context.Background(), model.SchedulerFeatures, structured.AllocatedState{
		AllocatedDevices:         sets.New(taken...),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}, classes, slices, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		t.Fatal(err)
	}
	results, err := alloc.Allocate(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatalf("%s: Allocate: %v", w.Name, err)
	}
	if len(results) == 0 {
		return nil
	}
	var got []string
	for _, r := range results[0].Devices.Results {
		if r.Driver != pub.Driver || r.Pool != node {
			t.Errorf("%s: device %+v, want driver %s, pool %s", w.Name, r, pub.Driver, node)
		}
		got = append(got, r.Device)
	}
	return got
}

// TestNVIDIAPeerSlices: the peer's node is one slice of gpu.nvidia.com with
// the eight GPUs as NVIDIA's driver names them, and its class gives a
// whole-GPU claim one of them.
func TestNVIDIAPeerSlices(t *testing.T) {
	pub := NVIDIAPublisher("hgx-h100")
	slices, err := pub.Slices("n")
	if err != nil {
		t.Fatal(err)
	}
	if len(slices) != 1 || len(slices[0].Spec.Devices) != 8 || slices[0].Spec.Driver != NVIDIADriverName {
		t.Fatalf("slices %+v, want one of %s with 8 devices", slices, NVIDIADriverName)
	}
	for i, d := range slices[0].Spec.Devices {
		memory := d.Capacity["memory"].Value
		if d.Name != fmt.Sprintf("gpu-%d", i) || *d.Attributes["type"].StringValue != "gpu" || d.Attributes["driverVersion"].VersionValue == nil ||
			strings.Count(*d.Attributes["cudaComputeCapability"].VersionValue, ".") != 2 || memory.Value() == 0 {
			t.Errorf("device %d: %+v", i, d)
		}
	}
	w, err := workload("bench", NVIDIAWholeWorkload)
	if err != nil {
		t.Fatal(err)
	}
	if got := allocateOn(t, pub, w, nil); len(got) != 1 {
		t.Fatalf("%s got %v, want one GPU", w.Name, got)
	}
	summary, err := PublisherSummary(pub)
	if err != nil || !strings.Contains(summary, "8 gpu (gpu.nvidia.com)") {
		t.Errorf("summary %q, %v", summary, err)
	}
}

// TestMIGFillTakesWholeGPUs: the MIG experiment's fill takes each GPU's
// largest placement; with seven GPUs taken a 1g.10gb claim lands on the
// eighth, with all eight taken it does not fit; and the whole-GPU fill on
// ordinary slices leaves a whole-GPU claim the GPUs not taken.
func TestMIGFillTakesWholeGPUs(t *testing.T) {
	pub := DynamicMIGPublisher(DynamicMIGProfile)
	largest, err := largestPlacements(pub)
	if err != nil {
		t.Fatal(err)
	}
	if len(largest) != 8 || largest[7] != model.MIGPlacementDeviceName(7, "7g.80gb", 0) {
		t.Fatalf("largest placements %v, want 7g.80gb at 0 on each of 8 GPUs", largest)
	}
	w, err := workload("bench", MIGWorkload)
	if err != nil {
		t.Fatal(err)
	}
	taken := func(pub Publisher, n int, device func(int) string) []structured.DeviceID {
		var out []structured.DeviceID
		for m := range n {
			out = append(out, structured.MakeDeviceID(pub.Driver, "kwok-gpu-00000", device(m)))
		}
		return out
	}
	byMinor := func(m int) string { return largest[m] }
	got := allocateOn(t, pub, w, taken(pub, 7, byMinor))
	if len(got) != 1 || !strings.HasPrefix(got[0], "gpu-7-mig-1g-10gb-") {
		t.Fatalf("with GPUs 0-6 taken %s got %v, want a 1g.10gb placement on GPU 7", w.Name, got)
	}
	if got := allocateOn(t, pub, w, taken(pub, 8, byMinor)); got != nil {
		t.Fatalf("with every GPU taken %s got %v, want no fit", w.Name, got)
	}
	// As the plugin republishes once the instances exist: a taken GPU keeps
	// only its held full-GPU placement, which the fill's claim holds.
	held := DynamicMIGPublisherTaken(DynamicMIGProfile, 7)
	heldSlices, err := held.Slices("kwok-gpu-00000")
	if err != nil {
		t.Fatal(err)
	}
	perGPU := map[int]int{}
	for _, s := range heldSlices {
		for _, d := range s.Spec.Devices {
			if m, ok := d.Attributes[model.AttrParentMinor]; ok {
				perGPU[int(*m.IntValue)]++
			}
		}
	}
	for m := range 8 {
		if want := map[bool]int{true: 1, false: 25}[m < 7]; perGPU[m] != want {
			t.Errorf("taken 7: GPU %d publishes %d placements, want %d", m, perGPU[m], want)
		}
	}
	got = allocateOn(t, held, w, taken(held, 7, byMinor))
	if len(got) != 1 || !strings.HasPrefix(got[0], "gpu-7-mig-1g-10gb-") {
		t.Fatalf("republished with GPUs 0-6 held, %s got %v, want a 1g.10gb placement on GPU 7", w.Name, got)
	}
	plain := TesseraPublisher("hgx-h100")
	whole, err := workload("bench", "whole-claim")
	if err != nil {
		t.Fatal(err)
	}
	if got := allocateOn(t, plain, whole, taken(plain, 7, model.WholeDeviceName)); len(got) != 1 || got[0] != model.WholeDeviceName(7) {
		t.Fatalf("with GPUs 0-6 taken whole-claim got %v, want gpu-7", got)
	}
}
