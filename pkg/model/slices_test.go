package model

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

func TestResourceSlices(t *testing.T) {
	res, err := Resources("node-1", fixtureGPUs(16, 80, oneDomain))
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}
	got, err := ResourceSlices("node-1", res)
	if err != nil {
		t.Fatalf("ResourceSlices: %v", err)
	}
	wantNames := []string{
		"00000-gpu.tessera.dev-node-1-",
		"00001-gpu.tessera.dev-node-1-",
		"00002-gpu.tessera.dev-node-1-",
	}
	var names []string
	for i, s := range got {
		names = append(names, s.GenerateName)
		if s.APIVersion != "resource.k8s.io/v1" || s.Kind != "ResourceSlice" {
			t.Errorf("slice %d: %s %s, want resource.k8s.io/v1 ResourceSlice", i, s.APIVersion, s.Kind)
		}
		if s.Name != "" {
			t.Errorf("slice %d: name %q set; the API server picks it from generateName", i, s.Name)
		}
		want := resourceapi.ResourcePool{Name: "node-1", Generation: 1, ResourceSliceCount: 3}
		if diff := cmp.Diff(want, s.Spec.Pool); diff != "" {
			t.Errorf("slice %d: pool (-want +got):\n%s", i, diff)
		}
		if s.Spec.Driver != DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != "node-1" {
			t.Errorf("slice %d: driver %q nodeName %v, want %s on node-1", i, s.Spec.Driver, s.Spec.NodeName, DriverName)
		}
	}
	if diff := cmp.Diff(wantNames, names); diff != "" {
		t.Errorf("generateName (-want +got):\n%s", diff)
	}
	if len(got[0].Spec.SharedCounters) != 8 || len(got[1].Spec.SharedCounters) != 8 || len(got[2].Spec.Devices) != 32 {
		t.Errorf("got %d+%d counter sets and %d devices, want 8+8 and 32",
			len(got[0].Spec.SharedCounters), len(got[1].Spec.SharedCounters), len(got[2].Spec.Devices))
	}

	// The objects are the caller's: changing them leaves res alone.
	got[2].Spec.Devices[0].Name = "changed"
	if res.Pools["node-1"].Slices[2].Devices[0].Name == "changed" {
		t.Errorf("ResourceSlices shares devices with its input")
	}
}

func TestResourceSlicesGeneration(t *testing.T) {
	res, err := Resources("node-1", fixtureGPUs(1, 80, oneDomain))
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}
	p := res.Pools["node-1"]
	p.Generation = 7
	res.Pools["node-1"] = p
	got, err := ResourceSlices("node-1", res)
	if err != nil {
		t.Fatalf("ResourceSlices: %v", err)
	}
	for _, s := range got {
		if s.Spec.Pool.Generation != 7 {
			t.Errorf("generation %d, want the pool's 7", s.Spec.Pool.Generation)
		}
	}
}

func TestResourceSlicesRejectsNetworkPools(t *testing.T) {
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{"fabric": {AllNodes: true, Slices: []resourceslice.Slice{{}}}}}
	_, err := ResourceSlices("node-1", res)
	if err == nil || !strings.Contains(err.Error(), `pool "fabric"`) {
		t.Errorf("ResourceSlices error %v, want one naming pool \"fabric\"", err)
	}
}
