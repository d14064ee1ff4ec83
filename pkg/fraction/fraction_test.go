package fraction

import (
	"context"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/model"
)

// TestNamesAreTheModels: the names this package spells itself are pkg/model's
// (those it takes from pkg/model/modelnames are so by construction).
func TestNamesAreTheModels(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{string(attrProductName), string(model.AttrProductName)},
		{string(capMemory), string(model.Memory)},
		{string(capCores), string(model.Cores)},
		{fmt.Sprint(coresPerGPU), fmt.Sprint(model.CoresPerGPU)},
	} {
		if c.got != c.want {
			t.Errorf("%q here, %q in pkg/model", c.got, c.want)
		}
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]string{
		"1/4": "1/4", "2/8": "1/4", " 3/8 ": "3/8", "0.25": "1/4", "0.5": "1/2", "1": "1/1", "1/1": "1/1", //nolint:gocritic // mapKey: the spaces around " 3/8 " are the input under test
		"0.3333": "3333/10000", ".5": "1/2", "1/100": "1/100", "0.01": "1/100",
	} {
		f, err := Parse(in)
		if err != nil || f.String() != want {
			t.Errorf("Parse(%q) = %v, %v; want %s", in, f, err, want)
		}
	}
	for in, want := range map[string]string{
		"": "not a number", "a/4": "integers", "1/0": "denominator must be positive", "1/-4": "denominator must be positive",
		"0": "more than 0", "-1/4": "more than 0", "5/4": "at most 1", "1.5": "at most 1", "1/101": "at least 1/100",
		"0.33333": "four decimal places", "1e-1": "not a number", "quarter": "not a number", "25%": "not a number",
	} {
		if f, err := Parse(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, %v; want an error with %q", in, f, err, want)
		}
	}
	if got := MustParse("3/8").Tiles(); got != 2 {
		t.Errorf("3/8 tiles %d, want 2", got)
	}
}

// profileSlices is what the kubelet plugin publishes for a mock profile's
// first n GPUs (all of them with n 0) on node "node-1".
func profileSlices(t *testing.T, profile string, n int) []resourceapi.ResourceSlice {
	t.Helper()
	return publish(t, profileGPUs(t, profile, n))
}

// profileGPUs are the first n GPUs of a mock profile (all of them with n 0).
func profileGPUs(t *testing.T, profile string, n int) []gpu.GPU {
	t.Helper()
	gpus := gputest.GPUs(t, profile)
	if n > 0 {
		gpus = gpus[:n]
	}
	return gpus
}

// publish is what the kubelet plugin publishes for gpus on node "node-1",
// with the given options.
func publish(t *testing.T, gpus []gpu.GPU, opts ...model.Option) []resourceapi.ResourceSlice {
	t.Helper()
	res, err := model.Resources("node-1", gpus, opts...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := model.ResourceSlices("node-1", res)
	if err != nil {
		t.Fatal(err)
	}
	for i := range objs {
		objs[i].Name = fmt.Sprintf("%s%d", objs[i].GenerateName, i)
	}
	return objs
}

// node runs kube-scheduler's allocator over one node's slices, keeping what
// it allocated as the scheduler's allocated-devices tracker does.
type node struct {
	slices  []*resourceapi.ResourceSlice
	classes model.ClassLister
	cel     *cel.Cache
	state   structured.AllocatedState
}

func newNode(slices []resourceapi.ResourceSlice) *node {
	n := &node{
		classes: model.NewClassLister(model.DeviceClasses()),
		cel:     cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}),
		state:   model.NewAllocatedState(),
	}
	for i := range slices {
		n.slices = append(n.slices, &slices[i])
	}
	return n
}

// allocate places a claim with req, returning its results (nil: it does not fit).
func (n *node) allocate(t *testing.T, name string, req resourceapi.DeviceRequest) []resourceapi.DeviceRequestAllocationResult {
	t.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: k8stypes.UID("uid-" + name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
	}
	a, err := structured.NewAllocator(context.Background(), model.SchedulerFeatures, n.state, n.classes, n.slices, n.cel)
	if err != nil {
		t.Fatal(err)
	}
	results, err := a.Allocate(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
	if len(results) == 0 {
		return nil
	}
	for _, r := range results[0].Devices.Results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			n.state.AllocatedDevices.Insert(id)
			continue
		}
		n.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		n.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
	}
	return results[0].Devices.Results
}

// firstNotMIG is the first GPU of a mock profile that is not in MIG mode
// (a GPU in MIG mode publishes no shared device).
func firstNotMIG(t *testing.T, profile string) []gpu.GPU {
	t.Helper()
	for _, g := range profileGPUs(t, profile, 0) {
		if !g.MIGEnabled {
			return []gpu.GPU{g}
		}
	}
	t.Fatalf("%s: every GPU is in MIG mode", profile)
	return nil
}

// TestFractionsTileEveryProfile: on one GPU of every mock profile (the first
// not in MIG mode), k claims for 1/k are allocated by kube-scheduler's
// allocator and a (k+1)th is not.
func TestFractionsTileEveryProfile(t *testing.T) {
	for _, profile := range gpu.Profiles() {
		if profile == "hgx-h100-dynamic-mig" {
			continue // every GPU in MIG mode: no shares to tile
		}
		slices := publish(t, firstNotMIG(t, profile))
		models := Models(slices)
		if len(models) != 1 {
			t.Fatalf("%s: models %+v, want one", profile, models)
		}
		for k := int64(1); k <= 8; k++ {
			f := Fraction{Num: 1, Den: k}
			req, err := Request("gpu", f, models)
			if err != nil {
				t.Fatalf("%s %s: %v", profile, f, err)
			}
			n := newNode(slices)
			for i := int64(1); i <= k; i++ {
				if n.allocate(t, fmt.Sprintf("c%d", i), req) == nil {
					share, _ := f.Share(models[0])
					t.Errorf("%s: share %d of %d (%s: %s, %d cores) does not fit", profile, i, k, f, share.Memory.String(), share.Cores)
				}
			}
			if got := n.allocate(t, "extra", req); got != nil {
				t.Errorf("%s: %d shares of %s fit on one GPU, want %d: the %dth got %+v", profile, k+1, f, k, k+1, got)
			}
		}
	}
}

// TestRequestPicksEachModel: one request for 1/4 on a node of L4s and on a
// node of H100s gets a quarter of each, through that model's subrequest.
func TestRequestPicksEachModel(t *testing.T) {
	l4, h100 := profileSlices(t, "l4x4", 0), profileSlices(t, "hgx-h100", 0)
	models := Models(append(append([]resourceapi.ResourceSlice{}, l4...), h100...))
	if len(models) != 2 || models[0].Memory.Cmp(models[1].Memory) >= 0 {
		t.Fatalf("models %+v: want L4 then H100", models)
	}
	f := MustParse("1/4")
	req, err := Request("gpu", f, models)
	if err != nil {
		t.Fatal(err)
	}
	if len(req.FirstAvailable) != 2 {
		t.Fatalf("request %+v: want two subrequests", req)
	}
	for i, slices := range [][]resourceapi.ResourceSlice{l4, h100} {
		share, err := f.Share(models[i])
		if err != nil {
			t.Fatal(err)
		}
		results := newNode(slices).allocate(t, "c", req)
		if len(results) != 1 {
			t.Fatalf("%s: results %+v", models[i].Products, results)
		}
		r := results[0]
		if want := "gpu/" + SubrequestName(models[i]); r.Request != want {
			t.Errorf("%s: request %s, want %s", models[i].Products, r.Request, want)
		}
		if got := r.ConsumedCapacity[model.Memory]; got.Cmp(share.Memory) != 0 {
			t.Errorf("%s: consumed %s of memory, want %s", models[i].Products, got.String(), share.Memory.String())
		}
	}
}

func TestShareArithmetic(t *testing.T) {
	h100 := Models(profileSlices(t, "hgx-h100", 1))[0]
	for in, want := range map[string]string{"1/2": "40544Mi 50", "1/3": "27029Mi 33", "1/4": "20272Mi 25", "3/8": "30408Mi 37", "1/1": "81089Mi 100"} {
		s, err := MustParse(in).Share(h100)
		if got := fmt.Sprintf("%s %d", s.Memory.String(), s.Cores); err != nil || got != want {
			t.Errorf("%s of H100 = %s, %v; want %s", in, got, err, want)
		}
	}
	if _, err := Request("gpu", MustParse("1/2"), nil); err != ErrNoModels {
		t.Errorf("no models: %v, want ErrNoModels", err)
	}
}

// TestModelsSkipMIGGPUs: a node with GPUs in MIG mode (hgx-h100-mig: GPUs 0
// and 1) gives the H100 model of its other GPUs, sized as on a node without
// MIG; a node whose GPUs are all in MIG mode gives no model, so a share is
// never sized from a MIG GPU.
func TestModelsSkipMIGGPUs(t *testing.T) {
	mixed := Models(profileSlices(t, "hgx-h100-mig", 0))
	plain := Models(profileSlices(t, "hgx-h100", 0))
	if len(mixed) != 1 || len(plain) != 1 || mixed[0].Memory.Cmp(plain[0].Memory) != 0 || mixed[0].Cores != plain[0].Cores {
		t.Fatalf("models with MIG GPUs %+v, without %+v: want the same H100 model", mixed, plain)
	}
	if got := Models(profileSlices(t, "hgx-h100-mig", 2)); len(got) != 0 {
		t.Errorf("models of two MIG-mode GPUs: %+v, want none", got)
	}
}
