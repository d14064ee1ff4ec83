package locality

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/model"
)

// in is a share of claim namespace/name on gpu with namespaced labels.
func in(namespace, name string, gpu int, l Labels) Share {
	return Share{Claim: namespace + "/" + name, UID: types.UID(namespace + "." + name), Namespace: namespace,
		GPU: gpuN(gpu), ShareID: name + "-s", Labels: l}
}

// clusterWide is a share whose labels a DeviceClass made cluster-wide.
func clusterWide(namespace, name string, gpu int, l Labels) Share {
	s := in(namespace, name, gpu, Labels{})
	s.ClusterLabels = l
	return s
}

// A tenant cannot reach another namespace's groups by using its labels: it
// cannot join another's exclusion group (and so share its GPU), pull itself
// onto another's affinity GPU, or keep another's anti-affinity replicas off
// the GPUs it holds. Labels a DeviceClass makes cluster-wide are one group
// across namespaces, and never the same group as a namespace's label.
func TestLabelsAreScopedToTheNamespace(t *testing.T) {
	tests := []struct {
		name   string
		held   []Share
		claim  Share
		reason Reason // empty: accepted
		msg    string
	}{
		{
			name:   "exclusion: another namespace's group of the same label is not the tenant's",
			held:   []Share{in("team-a", "train", 0, Labels{Exclusion: "tenant"})},
			claim:  in("team-b", "intruder", 0, Labels{Exclusion: "tenant"}),
			reason: ReasonExclusion,
			msg: `share of team-b/intruder (exclusion "tenant") cannot share node/gpu-0-shared with team-a/train (exclusion "tenant"); ` +
				`a label names a group of its own namespace unless a DeviceClass makes it cluster-wide (locality.scope: Cluster)`,
		},
		{
			name:  "exclusion: the same namespace's group is joined",
			held:  []Share{in("team-a", "train", 0, Labels{Exclusion: "tenant"})},
			claim: in("team-a", "eval", 0, Labels{Exclusion: "tenant"}),
		},
		{
			name:  "anti-affinity: another namespace's label does not repel",
			held:  []Share{in("team-a", "replica-0", 0, Labels{AntiAffinity: "replicas"})},
			claim: in("team-b", "replica-0", 0, Labels{AntiAffinity: "replicas"}),
		},
		{
			name:   "anti-affinity: the same namespace's label repels",
			held:   []Share{in("team-a", "replica-0", 0, Labels{AntiAffinity: "replicas"})},
			claim:  in("team-a", "replica-1", 0, Labels{AntiAffinity: "replicas"}),
			reason: ReasonAntiAffinity,
		},
		{
			name:  "affinity: another namespace's group does not pull",
			held:  []Share{in("team-a", "stage-0", 1, Labels{Affinity: "pipeline"})},
			claim: in("team-b", "stage-0", 0, Labels{Affinity: "pipeline"}),
		},
		{
			name:   "affinity: the same namespace's group pulls",
			held:   []Share{in("team-a", "stage-0", 1, Labels{Affinity: "pipeline"})},
			claim:  in("team-a", "stage-1", 0, Labels{Affinity: "pipeline"}),
			reason: ReasonAffinity,
		},
		{
			name:  "cluster-wide exclusion: one group across namespaces",
			held:  []Share{clusterWide("team-a", "train", 0, Labels{Exclusion: "pool"})},
			claim: clusterWide("team-b", "eval", 0, Labels{Exclusion: "pool"}),
		},
		{
			name:   "cluster-wide exclusion: a namespace's own label of that name is not in it",
			held:   []Share{clusterWide("team-a", "train", 0, Labels{Exclusion: "pool"})},
			claim:  in("team-a", "eval", 0, Labels{Exclusion: "pool"}),
			reason: ReasonExclusion,
			msg: `share of team-a/eval (exclusion "pool") cannot share node/gpu-0-shared with team-a/train (exclusion "pool" (cluster-wide)); ` +
				`a label names a group of its own namespace unless a DeviceClass makes it cluster-wide (locality.scope: Cluster)`,
		},
		{
			name:   "cluster-wide affinity: pulls across namespaces",
			held:   []Share{clusterWide("team-a", "stage-0", 1, Labels{Affinity: "shared-cache"})},
			claim:  clusterWide("team-b", "stage-0", 0, Labels{Affinity: "shared-cache"}),
			reason: ReasonAffinity,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l Ledger
			for _, h := range tc.held {
				l.Set(h.UID, []Share{h})
			}
			v := l.Judge(tc.claim.UID, []Share{tc.claim})
			if v.Accepted != (tc.reason == "") || v.Reason != tc.reason {
				t.Fatalf("verdict %+v, want reason %q", v, tc.reason)
			}
			if tc.msg != "" && v.Message != tc.msg {
				t.Errorf("message\n got: %s\nwant: %s", v.Message, tc.msg)
			}
			// Violations, which the e2e test runs over a cluster's placed
			// shares, agrees with Judge.
			if got := Violations(append(tc.held, tc.claim)); (len(got) == 0) != v.Accepted {
				t.Errorf("Violations %q disagree with the verdict %+v", got, v)
			}
		})
	}
}

// config is one allocation config entry carrying a GpuConfig locality.
func config(source resourceapi.AllocationConfigSource, l Labels) resourceapi.DeviceAllocationConfiguration {
	raw, _ := json.Marshal(map[string]any{"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "locality": l})
	return resourceapi.DeviceAllocationConfiguration{
		Source: source,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: model.DriverName, Parameters: runtime.RawExtension{Raw: raw},
		}},
	}
}

// waitingIn is a claim of namespace/name waiting in PreBind for its verdict on
// gpu-<minor>-shared, with these allocation configs.
func waitingIn(namespace, name string, minor int, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(namespace + "." + name), ResourceVersion: "1"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: model.DriverName, Pool: "node", Device: model.SharedDeviceName(minor),
				ShareID:                  ptr.To(types.UID(name + "-share")),
				BindingConditions:        []string{model.LocalityAcceptedCondition},
				BindingFailureConditions: []string{model.LocalityRejectedCondition},
			}},
			Config: configs,
		}}},
	}
}

// The controller reads where each label reaches from the allocation: a
// class config with locality.scope Cluster makes the labels it sets
// cluster-wide; labels the claim sets, or changes, stay in its namespace.
func TestLabelsOfTheAllocation(t *testing.T) {
	class := func(l Labels) resourceapi.DeviceAllocationConfiguration {
		return config(resourceapi.AllocationConfigSourceClass, l)
	}
	claim := func(l Labels) resourceapi.DeviceAllocationConfiguration {
		return config(resourceapi.AllocationConfigSourceClaim, l)
	}
	tests := []struct {
		name                string
		configs             []resourceapi.DeviceAllocationConfiguration
		namespaced, cluster Labels
		err                 string
	}{
		{name: "claim labels", configs: []resourceapi.DeviceAllocationConfiguration{claim(Labels{Exclusion: "x", Affinity: "g"})},
			namespaced: Labels{Exclusion: "x", Affinity: "g"}},
		{name: "class labels without a scope stay in the namespace",
			configs:    []resourceapi.DeviceAllocationConfiguration{class(Labels{Exclusion: "team"})},
			namespaced: Labels{Exclusion: "team"}},
		{name: "class labels with scope Namespace",
			configs:    []resourceapi.DeviceAllocationConfiguration{class(Labels{Exclusion: "team", Scope: configapi.LocalityScopeNamespace})},
			namespaced: Labels{Exclusion: "team"}},
		{name: "class labels with scope Cluster",
			configs: []resourceapi.DeviceAllocationConfiguration{class(Labels{Exclusion: "pool", Scope: configapi.LocalityScopeCluster})},
			cluster: Labels{Exclusion: "pool"}},
		{name: "a claim's own labels beside a cluster-wide class label stay in the namespace",
			configs: []resourceapi.DeviceAllocationConfiguration{
				class(Labels{Exclusion: "pool", Scope: configapi.LocalityScopeCluster}),
				claim(Labels{AntiAffinity: "replicas"}),
			},
			namespaced: Labels{AntiAffinity: "replicas"}, cluster: Labels{Exclusion: "pool"}},
		{name: "a claim that changes the class label gets a label of its namespace",
			configs: []resourceapi.DeviceAllocationConfiguration{
				class(Labels{Exclusion: "pool", Scope: configapi.LocalityScopeCluster}),
				claim(Labels{Exclusion: "other-pool"}),
			},
			namespaced: Labels{Exclusion: "other-pool"}},
		{name: "a claim cannot make its labels cluster-wide",
			configs: []resourceapi.DeviceAllocationConfiguration{claim(Labels{Exclusion: "team-a", Scope: configapi.LocalityScopeCluster})},
			err:     "locality.scope: Forbidden: only a DeviceClass config may set it"},
		{name: "an unknown scope",
			configs: []resourceapi.DeviceAllocationConfiguration{class(Labels{Exclusion: "x", Scope: "Everywhere"})},
			err:     `locality.scope: Unsupported value: "Everywhere": supported values: "Namespace", "Cluster"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := viewClaim(waitingIn("team-a", "c", 0, tc.configs...))
			if tc.err != "" {
				if v.configErr == nil || !strings.Contains(v.configErr.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", v.configErr, tc.err)
				}
				return
			}
			if v.configErr != nil {
				t.Fatal(v.configErr)
			}
			s := v.shares[0]
			if s.Namespace != "team-a" || s.Labels != tc.namespaced || s.ClusterLabels != tc.cluster {
				t.Errorf("share %+v, want namespace team-a, labels %+v, cluster-wide %+v", s, tc.namespaced, tc.cluster)
			}
		})
	}
}

// Through the controller, as the scheduler would see it: team B's share
// that names team A's exclusion group is rejected on team A's GPU (and
// fenced off it), a claim config that asks for a cluster-wide scope is
// rejected as InvalidConfig, and shares of a class whose exclusion group is
// cluster-wide share a GPU across namespaces.
func TestControllerScopesGroupsToTheNamespace(t *testing.T) {
	claimCfg := func(l Labels) resourceapi.DeviceAllocationConfiguration {
		return config(resourceapi.AllocationConfigSourceClaim, l)
	}
	poolClass := config(resourceapi.AllocationConfigSourceClass, Labels{Exclusion: "pool", Scope: configapi.LocalityScopeCluster})
	claims := []*resourceapi.ResourceClaim{
		waitingIn("team-a", "train", 0, claimCfg(Labels{Exclusion: "tenant"})),
		waitingIn("team-b", "intruder", 0, claimCfg(Labels{Exclusion: "tenant"})),
		waitingIn("team-b", "widened", 0, claimCfg(Labels{Exclusion: "tenant", Scope: configapi.LocalityScopeCluster})),
		waitingIn("team-a", "pool-0", 1, poolClass),
		waitingIn("team-b", "pool-1", 1, poolClass),
	}
	want := map[string]string{
		"team-a/train":    "accepted",
		"team-b/intruder": "rejected:Exclusion",
		"team-b/widened":  "rejected:InvalidConfig",
		"team-a/pool-0":   "accepted",
		"team-b/pool-1":   "accepted",
	}
	// The store keys claims by name: the names differ across namespaces.
	s := newStore(claims...)
	c := &Controller{Writer: s}
	for _, cl := range claims {
		if err := c.Sync(context.Background(), cl.Namespace+"/"+cl.Name, s.claims[cl.Name]); err != nil {
			t.Fatalf("sync %s/%s: %v", cl.Namespace, cl.Name, err)
		}
	}
	for key, w := range want {
		_, name, _ := strings.Cut(key, "/")
		if got := verdictOf(s.claims[name]); got != w {
			t.Errorf("%s: %s, want %s", key, got, w)
		}
	}
}
