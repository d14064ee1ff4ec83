package plugin

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// TestClaimStatus: after prepare the claim's status.devices carries one entry
// per device with {uuid, memoryLimit, coresLimit, isolation} and a Ready
// condition; NVLink Preferred without NVLink prepares and records that.
func TestClaimStatus(t *testing.T) {
	e := newEnv(t)
	shareClaim := newClaim("uid-s1", []result{share("gpu", "gpu-1-shared", "share-1", "20Gi", "25")},
		claimConfig(isolationConfig(configapi.IsolationMPS)))
	pair := newClaim("uid-s2", []result{whole("gpus", "gpu-0"), whole("gpus", "gpu-2")},
		claimConfig(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","topology":{"nvlink":"Preferred"}}`))
	client := fake.NewClientset(shareClaim.DeepCopy(), pair.DeepCopy())
	p := e.start(func(o *Options) { o.Client = client })
	ctx := ctxFor(t)

	type entry struct {
		Device, ShareID string
		Data            DeviceData
		Conditions      map[string]string // type -> status/reason
	}
	read := func(c *resourceapi.ResourceClaim) []entry {
		t.Helper()
		got, err := client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []entry
		for _, d := range got.Status.Devices {
			if d.Driver != "gpu.tessera.dev" || d.Pool != testNode {
				t.Errorf("status entry for driver %q pool %q", d.Driver, d.Pool)
			}
			en := entry{Device: d.Device, Conditions: map[string]string{}}
			if d.ShareID != nil {
				en.ShareID = *d.ShareID
			}
			if d.Data == nil {
				t.Fatalf("device %s: no data", d.Device)
			}
			if err := json.Unmarshal(d.Data.Raw, &en.Data); err != nil {
				t.Fatalf("device %s: data %s: %v", d.Device, d.Data.Raw, err)
			}
			for _, c := range d.Conditions {
				en.Conditions[c.Type] = string(c.Status) + "/" + c.Reason
			}
			out = append(out, en)
		}
		return out
	}

	mustPrepare(t, p.Plugin, shareClaim)
	want := []entry{{
		Device: "gpu-1-shared", ShareID: "share-1",
		Data:       DeviceData{UUID: uuidOf(1), MemoryLimit: 20 << 30, CoresLimit: 25, Isolation: "MPS"},
		Conditions: map[string]string{"Ready": "True/Prepared"},
	}}
	if diff := cmp.Diff(want, read(shareClaim)); diff != "" {
		t.Errorf("status of share claim (-want +got):\n%s", diff)
	}

	mustPrepare(t, p.Plugin, pair)
	cond := map[string]string{"Ready": "True/Prepared", "NVLinkConnected": "False/DifferentNVLinkDomains"}
	want = []entry{
		{Device: "gpu-0", Data: DeviceData{UUID: uuidOf(0)}, Conditions: cond},
		{Device: "gpu-2", Data: DeviceData{UUID: uuidOf(2)}, Conditions: cond},
	}
	if diff := cmp.Diff(want, read(pair)); diff != "" {
		t.Errorf("status of NVLink-preferred pair (-want +got):\n%s", diff)
	}

	// The API server refuses the status write: prepare still succeeds (the
	// container runs the same); the failure is only logged.
	client.PrependReactor("patch", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden by test")
	})
	mustPrepare(t, p.Plugin, newClaim("uid-refused", []result{whole("gpu", "gpu-3")}))
}

// TestPrepareFailureOnClaim: a prepare that fails says why on the claim: a
// Ready=False condition in status.devices and a Warning event.
func TestPrepareFailureOnClaim(t *testing.T) {
	e := newEnv(t)
	// HAMiCore without the library fails closed.
	c := newClaim("uid-f", []result{share("gpu", "gpu-1-shared", "share-1", "8Gi", "10")},
		claimConfig(isolationConfig(configapi.IsolationHAMiCore)))
	client := fake.NewClientset(c.DeepCopy())
	p := e.start(func(o *Options) {
		o.Client = client
		o.HAMiCore.Library = e.hamiLib + ".missing"
	})
	if r := prepare(t, p.Plugin, c); r.Err == nil {
		t.Fatal("prepare succeeded without HAMi-core")
	}
	got, err := client.ResourceV1().ResourceClaims("default").Get(ctxFor(t), c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Devices) != 1 || len(got.Status.Devices[0].Conditions) != 1 {
		t.Fatalf("status.devices = %+v, want one entry with one condition", got.Status.Devices)
	}
	cond := got.Status.Devices[0].Conditions[0]
	if cond.Type != ConditionReady || cond.Status != metav1.ConditionFalse || cond.Reason != ReasonPrepareFailed ||
		!strings.Contains(cond.Message, "libvgpu.so") {
		t.Errorf("condition %+v, want Ready=False/PrepareFailed naming the library", cond)
	}
	found := false
	for _, ev := range e.events.list() {
		found = found || strings.HasPrefix(ev, "claim default/claim-uid-f: Warning PrepareFailed")
	}
	if !found {
		t.Errorf("events %q, want PrepareFailed on the claim", e.events.list())
	}
}
