package locality

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/model"
)

// allocated is a claim as the scheduler leaves it in PreBind: one share of
// gpu-<minor>-shared with the locality binding conditions (unless plain),
// the claim's GpuConfig locality in the allocation's config.
func allocated(name string, minor int, l Labels, plain bool) *resourceapi.ResourceClaim {
	raw, _ := json.Marshal(map[string]any{"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "locality": l})
	result := resourceapi.DeviceRequestAllocationResult{
		Request: "gpu", Driver: model.DriverName, Pool: "node", Device: model.SharedDeviceName(minor),
		ShareID: ptr.To(types.UID(name + "-share")),
	}
	if !plain {
		result.BindingConditions = []string{model.LocalityAcceptedCondition}
		result.BindingFailureConditions = []string{model.LocalityRejectedCondition}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name), ResourceVersion: "1"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{result},
			Config: []resourceapi.DeviceAllocationConfiguration{{
				Source: resourceapi.AllocationConfigSourceClaim,
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver: model.DriverName, Parameters: runtime.RawExtension{Raw: raw},
				}},
			}},
		}}},
	}
}

// store is the API server for the controller: it keeps claims, applies
// status writes guarded by resourceVersion, and can fail them.
type store struct {
	claims map[string]*resourceapi.ResourceClaim
	fail   func(name string) error
	writes int
}

func (s *store) WriteDevices(_ context.Context, claim *resourceapi.ResourceClaim, devices []resourceapi.AllocatedDeviceStatus) error {
	s.writes++
	if s.fail != nil {
		if err := s.fail(claim.Name); err != nil {
			return err
		}
	}
	cur, ok := s.claims[claim.Name]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "resourceclaims"}, claim.Name)
	}
	if cur.ResourceVersion != claim.ResourceVersion {
		return apierrors.NewConflict(schema.GroupResource{Resource: "resourceclaims"}, claim.Name, errors.New("changed"))
	}
	next := cur.DeepCopy()
	next.Status.Devices = devices
	rv, _ := strconv.Atoi(cur.ResourceVersion)
	next.ResourceVersion = strconv.Itoa(rv + 1)
	s.claims[claim.Name] = next
	return nil
}

func (s *store) put(c *resourceapi.ResourceClaim) { s.claims[c.Name] = c }

// verdicts is what the scheduler would read: per claim, accepted, rejected
// (with the reason) or waiting.
func verdictOf(c *resourceapi.ResourceClaim) string {
	if len(c.Status.Devices) == 0 {
		return "waiting"
	}
	conds := c.Status.Devices[0].Conditions
	if cond := meta.FindStatusCondition(conds, model.LocalityRejectedCondition); cond != nil && cond.Status == metav1.ConditionTrue {
		return "rejected:" + cond.Reason
	}
	if meta.IsStatusConditionTrue(conds, model.LocalityAcceptedCondition) {
		return "accepted"
	}
	return "waiting"
}

// acceptedShares are the shares of every accepted or unjudged claim, as
// placed.
func acceptedShares(s *store) []Share {
	var out []Share
	for _, c := range s.claims {
		v := viewClaim(c)
		if v.phase == accepted || v.phase == unjudged || v.phase == prepared {
			out = append(out, v.shares...)
		}
	}
	return out
}

func newStore(claims ...*resourceapi.ResourceClaim) *store {
	s := &store{claims: map[string]*resourceapi.ResourceClaim{}}
	for _, c := range claims {
		s.put(c)
	}
	return s
}

func syncAll(t *testing.T, c *Controller, s *store, names ...string) {
	t.Helper()
	for _, name := range names {
		if err := c.Sync(context.Background(), "ns/"+name, s.claims[name]); err != nil {
			t.Fatalf("sync %s: %v", name, err)
		}
	}
}

// Claims the scheduler placed on one GPU at the same time, all waiting in
// PreBind: whatever order the controller sees them in, it accepts a set
// that keeps every rule.
func TestConcurrentPlacementsOnOneGPU(t *testing.T) {
	tests := []struct {
		name     string
		labels   []Labels
		accepted int // how many it accepts when judged in the given order
	}{
		{name: "anti-affinity", labels: []Labels{{AntiAffinity: "a"}, {AntiAffinity: "a"}, {AntiAffinity: "a"}, {AntiAffinity: "b"}}, accepted: 2},
		{name: "exclusion against unlabelled", labels: []Labels{{Exclusion: "x"}, {}, {Exclusion: "x"}, {}}, accepted: 2},
		{name: "two exclusion groups", labels: []Labels{{Exclusion: "y"}, {Exclusion: "x"}, {Exclusion: "y"}}, accepted: 2},
		{name: "affinity group", labels: []Labels{{Affinity: "g"}, {Affinity: "g"}, {Affinity: "g"}}, accepted: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore()
			var names []string
			for i, l := range tc.labels {
				name := fmt.Sprintf("c%d", i)
				s.put(allocated(name, 0, l, false))
				names = append(names, name)
			}
			c := &Controller{Writer: s}
			syncAll(t, c, s, names...)
			n := 0
			for _, name := range names {
				if v := verdictOf(s.claims[name]); v == "accepted" {
					n++
				} else if !strings.HasPrefix(v, "rejected:") {
					t.Errorf("%s: %s", name, v)
				}
			}
			if n != tc.accepted {
				t.Errorf("accepted %d, want %d", n, tc.accepted)
			}
			if v := Violations(acceptedShares(s)); len(v) > 0 {
				t.Errorf("violations: %v", v)
			}
		})
	}
}

// Many claims with random labels on random GPUs, judged in random order,
// with the informer's cache lagging (a claim is synced again in the version
// before its verdict) and writes failing at random: the accepted claims never
// break a rule, and a claim accepted once is never rejected for the same
// allocation.
func TestRandomPlacementsNeverBreakARule(t *testing.T) {
	labels := []configapi.LocalityLabel{"", "", "p", "q"}
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		s := newStore()
		stale := map[string]*resourceapi.ResourceClaim{}
		var names []string
		for i := range 24 {
			name := fmt.Sprintf("c%d", i)
			l := Labels{Affinity: labels[r.IntN(4)], AntiAffinity: labels[r.IntN(4)], Exclusion: labels[r.IntN(4)]}
			c := allocated(name, r.IntN(4), l, false)
			s.put(c)
			stale[name] = c
			names = append(names, name)
		}
		s.fail = func(string) error {
			if r.IntN(5) == 0 {
				return errors.New("timeout: the write may or may not have happened")
			}
			return nil
		}
		c := &Controller{Writer: s}
		firstVerdict := map[string]string{}
		for range 4 * len(names) {
			name := names[r.IntN(len(names))]
			claim := s.claims[name]
			if r.IntN(3) == 0 {
				claim = stale[name]
			}
			_ = c.Sync(context.Background(), "ns/"+name, claim)
			if v := verdictOf(s.claims[name]); v != "waiting" {
				if first, ok := firstVerdict[name]; ok && first != v {
					t.Fatalf("seed %d: %s was %s, now %s", seed, name, first, v)
				}
				firstVerdict[name] = v
			}
		}
		if v := Violations(acceptedShares(s)); len(v) > 0 {
			t.Fatalf("seed %d: violations: %v", seed, v)
		}
	}
}

// A write that fails after the claim was accepted keeps the claim in the
// ledger: the next claim is judged against it, and the first claim's
// verdict is written when it is synced again.
func TestFailedWriteStillReserves(t *testing.T) {
	s := newStore(allocated("a", 0, Labels{AntiAffinity: "n"}, false), allocated("b", 0, Labels{AntiAffinity: "n"}, false))
	s.fail = func(name string) error {
		if name == "a" {
			return errors.New("timeout")
		}
		return nil
	}
	c := &Controller{Writer: s}
	if err := c.Sync(context.Background(), "ns/a", s.claims["a"]); err == nil {
		t.Fatal("the failed write is not reported")
	}
	syncAll(t, c, s, "b")
	if v := verdictOf(s.claims["b"]); v != "rejected:AntiAffinity" {
		t.Errorf("b: %s", v)
	}
	s.fail = nil
	syncAll(t, c, s, "a")
	if v := verdictOf(s.claims["a"]); v != "accepted" {
		t.Errorf("a: %s", v)
	}
}

// At start the ledger holds what is on the GPUs before anything is judged:
// accepted claims, claims the node prepared (their verdict dropped from the
// status) and shares of devices without binding conditions.
func TestRebuild(t *testing.T) {
	acceptedClaim := allocated("acc", 0, Labels{AntiAffinity: "n"}, false)
	acceptedClaim.Status.Devices = withVerdict(acceptedClaim, Verdict{Accepted: true}, metav1.Now())
	preparedClaim := allocated("prep", 1, Labels{Exclusion: "x"}, false)
	preparedClaim.Status.Devices = []resourceapi.AllocatedDeviceStatus{{
		Driver: model.DriverName, Pool: "node", Device: model.SharedDeviceName(1), ShareID: ptr.To("prep-share"),
		Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Prepared", LastTransitionTime: metav1.Now()}},
	}}
	plainClaim := allocated("plain", 2, Labels{Affinity: "g"}, true)
	s := newStore(acceptedClaim, preparedClaim, plainClaim,
		allocated("p0", 0, Labels{AntiAffinity: "n"}, false),
		allocated("p1", 1, Labels{}, false),
		allocated("p2", 3, Labels{Affinity: "g"}, false),
		allocated("p3", 2, Labels{Affinity: "g"}, false))
	c := &Controller{Writer: s}
	var all []*resourceapi.ResourceClaim
	for _, claim := range s.claims {
		all = append(all, claim)
	}
	c.Rebuild(all)
	syncAll(t, c, s, "p0", "p1", "p2", "p3", "prep")
	want := map[string]string{"p0": "rejected:AntiAffinity", "p1": "rejected:Exclusion", "p2": "rejected:Affinity", "p3": "accepted", "prep": "accepted"}
	for name, w := range want {
		if got := verdictOf(s.claims[name]); got != w {
			t.Errorf("%s: %s, want %s", name, got, w)
		}
	}
	// The prepared claim's own conditions stay beside the verdict.
	if meta.FindStatusCondition(s.claims["prep"].Status.Devices[0].Conditions, "Ready") == nil {
		t.Error("the node's Ready condition was dropped")
	}
}

// A claim that is deallocated or deleted leaves the ledger; a claim
// allocated again (new share IDs) is judged again.
func TestDeallocationFreesTheGPU(t *testing.T) {
	s := newStore(allocated("a", 0, Labels{Exclusion: "x"}, false), allocated("b", 0, Labels{}, false))
	c := &Controller{Writer: s}
	syncAll(t, c, s, "a", "b")
	if v := verdictOf(s.claims["b"]); v != "rejected:Exclusion" {
		t.Fatalf("b: %s", v)
	}
	delete(s.claims, "a")
	if err := c.Sync(context.Background(), "ns/a", nil); err != nil {
		t.Fatal(err)
	}
	b := allocated("b", 0, Labels{}, false) // deallocated by the scheduler, allocated again
	b.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("b-share-2"))
	s.put(b)
	syncAll(t, c, s, "b")
	if v := verdictOf(s.claims["b"]); v != "accepted" {
		t.Errorf("b after a left: %s", v)
	}
}

func TestInvalidConfigIsRejected(t *testing.T) {
	claim := allocated("bad", 0, Labels{}, false)
	claim.Status.Allocation.Devices.Config[0].Opaque.Parameters.Raw = []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","locality":{"affinty":"x"}}`)
	s := newStore(claim)
	syncAll(t, &Controller{Writer: s}, s, "bad")
	if v := verdictOf(s.claims["bad"]); v != "rejected:InvalidConfig" {
		t.Errorf("verdict %s", v)
	}
}

// APIWriter sends a merge patch of status.devices guarded by uid and
// resourceVersion.
func TestAPIWriter(t *testing.T) {
	claim := allocated("a", 0, Labels{}, false)
	client := fake.NewClientset(claim)
	devices := withVerdict(claim, Verdict{Accepted: true}, metav1.Now())
	if err := (APIWriter{Client: client}).WriteDevices(context.Background(), claim, devices); err != nil {
		t.Fatal(err)
	}
	got, err := client.ResourceV1().ResourceClaims("ns").Get(context.Background(), "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := verdictOf(got); v != "accepted" {
		t.Errorf("verdict %s; status %+v", v, got.Status)
	}
}
