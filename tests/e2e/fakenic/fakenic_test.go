package fakenic

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"
)

// TestPluginPublishesPreparesAndCleansUp: the plugin serves its sockets,
// publishes the NICs with their roots for the node, prepares a claim's
// NICs (and no other driver's devices), and Stop leaves no slice, socket or
// directory behind. (The fake clientset ignores field selectors, so the
// slice controller would take another driver's slice for one of its own:
// the cluster has none here.)
func TestPluginPublishesPreparesAndCleansUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "node-uid"}})
	// Unix socket paths are short: keep the directories near /tmp.
	dir, err := os.MkdirTemp("", "fakenic")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	reg := filepath.Join(dir, "reg")
	if err := os.Mkdir(reg, 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	p, err := Start(ctx, Options{
		Client: client, NodeName: "node-1", RegistrarDir: reg, PluginDataDir: data,
		NICs: []NIC{{Name: "nic-0", PCIeRoot: "pci0000:15"}, {Name: "nic-x"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, sock := range []string{filepath.Join(reg, DefaultDriver+"-reg.sock"), filepath.Join(data, "dra.sock")} {
		if _, err := os.Stat(sock); err != nil {
			t.Errorf("socket: %v", err)
		}
	}

	var slice resourceapi.ResourceSlice
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, s := range list.Items {
			if s.Spec.Driver == DefaultDriver {
				slice = s
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no slice of %s published: %v", DefaultDriver, err)
	}
	if got := ptr.Deref(slice.Spec.NodeName, ""); got != "node-1" || len(slice.Spec.Devices) != 2 {
		t.Fatalf("slice on node %q with %d devices, want node-1 and 2", got, len(slice.Spec.Devices))
	}
	for _, d := range slice.Spec.Devices {
		root, ok := d.Attributes[deviceattribute.StandardDeviceAttributePCIeRoot]
		switch d.Name {
		case "nic-0":
			if !ok || ptr.Deref(root.StringValue, "") != "pci0000:15" {
				t.Errorf("nic-0: pcieRoot %v, want pci0000:15", root.StringValue)
			}
		case "nic-x":
			if ok {
				t.Errorf("nic-x: pcieRoot %v, want none", root.StringValue)
			}
		}
	}

	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "claim-uid"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: "gpu.tessera.dev", Pool: "node-1", Device: "gpu-0-shared"},
				{Request: "nic", Driver: DefaultDriver, Pool: "node-1", Device: "nic-0"},
			},
		}}},
	}
	res, err := p.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
	if err != nil || res["claim-uid"].Err != nil {
		t.Fatalf("prepare: %v, %+v", err, res)
	}
	if devs := res["claim-uid"].Devices; len(devs) != 1 || devs[0].DeviceName != "nic-0" || len(devs[0].CDIDeviceIDs) != 0 {
		t.Errorf("prepared %+v, want nic-0 without CDI devices", devs)
	}
	if got := p.Prepared("claim-uid"); len(got) != 1 || got[0] != "nic-0" {
		t.Errorf("Prepared = %v", got)
	}

	if err := p.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("%d slices after Stop, want none", len(list.Items))
	}
	for _, path := range []string{filepath.Join(reg, DefaultDriver+"-reg.sock"), data} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("%s after Stop: %v, want gone", path, err)
		}
	}
	if errs := p.Errors(); len(errs) > 0 {
		t.Errorf("background errors: %v", errs)
	}
}
