package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

func testFlags(t *testing.T) flags {
	dir := t.TempDir()
	return flags{
		node:      nodeFlags{name: "node-a", driverRoot: filepath.Join(dir, "driver-root")}, // no NVML in it
		kubelet:   kubeletFlags{pluginDataDir: filepath.Join(dir, "plugin"), kubeconfig: filepath.Join(dir, "no-such-kubeconfig")},
		isolation: isolationFlags{defaultIsolation: "Advisory"},
	}
}

// A node without NVML does not stop the plugin: it gets past NVML to the
// next step (here the missing kubeconfig), instead of failing on NVML.
func TestRunWithoutNVMLKeepsGoing(t *testing.T) {
	f := testFlags(t)
	if err := os.MkdirAll(f.node.driverRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	err := run(ctx, f)
	if err == nil || errors.Is(err, gpu.ErrLibraryNotFound) || !strings.Contains(err.Error(), "kubernetes client configuration") {
		t.Fatalf("run = %v, want it to get past the missing NVML to the kubeconfig", err)
	}
}

// A configuration error of the driver root is still fatal.
func TestRunRelativeDriverRootFails(t *testing.T) {
	f := testFlags(t)
	f.node.driverRoot = "run/nvidia/driver"
	_, ctx := ktesting.NewTestContext(t)
	if err := run(ctx, f); err == nil || !strings.Contains(err.Error(), "not an absolute path") {
		t.Fatalf("run = %v, want the driver root refused", err)
	}
}

func TestMockKnobsNeedMockProfile(t *testing.T) {
	f := testFlags(t)
	f.mock.failDiscovery = []string{"3"}
	_, ctx := ktesting.NewTestContext(t)
	if err := run(ctx, f); err == nil || !strings.Contains(err.Error(), "--mock-profile") {
		t.Fatalf("run = %v, want --mock-fail-discovery refused without --mock-profile", err)
	}
}

func TestOpenNVMLMockFailDiscovery(t *testing.T) {
	f := testFlags(t)
	f.mock.profile = "l4x4"
	f.mock.failDiscovery = []string{"1", "2:nvmlDeviceGetPciInfo"}
	lib, err := openNVML(f)
	if err != nil {
		t.Fatal(err)
	}
	d, err := gpu.DiscoverNode(lib)
	if err != nil || len(d.GPUs) != 2 || len(d.Failed) != 2 || d.Failed[0].Partial != nil || d.Failed[1].Partial == nil {
		t.Errorf("discovery %+v, %v; want GPUs 1 and 2 failed, 2 partly described", d, err)
	}
	f.mock.failDiscovery = []string{"7"}
	if _, err := openNVML(f); err == nil || !strings.Contains(err.Error(), "--mock-fail-discovery") {
		t.Errorf("openNVML with GPU 7 of 4: %v", err)
	}
}

// --mock-mig-state-file keeps the mock's MIG instances across plugin
// processes (the chart sets it in mock mode): an instance made through one
// NVML is there in the next.
func TestOpenNVMLMockMIGState(t *testing.T) {
	f := testFlags(t)
	f.mock.profile = "hgx-h100-mig"
	f.mock.migStateFile = filepath.Join(t.TempDir(), "mig.json")
	lib, err := openNVML(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := lib.(*gpu.MockNode).CreateMIGInstance(1, "1g.10gb", 6); err != nil {
		t.Fatal(err)
	}
	again, err := openNVML(f)
	if err != nil {
		t.Fatal(err)
	}
	d, err := gpu.DiscoverNode(again)
	if err != nil || len(d.GPUs) < 2 || d.GPUs[1].MIG == nil || len(d.GPUs[1].MIG.Instances) != 1 {
		t.Fatalf("second process sees %+v, %v", d.GPUs[1].MIG, err)
	}
}

func TestMIGFlagsChecked(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := testFlags(t)
	f.mock.migStateFile = "/tmp/x.json"
	if err := run(ctx, f); err == nil || !strings.Contains(err.Error(), "--mock-profile") {
		t.Errorf("run = %v, want --mock-mig-state-file refused without --mock-profile", err)
	}
	f = testFlags(t)
	f.node.dynamicMIG = []string{"all", "0"}
	if err := run(ctx, f); err == nil || !strings.Contains(err.Error(), "--dynamic-mig") {
		t.Errorf("run = %v, want --dynamic-mig refused", err)
	}
}
