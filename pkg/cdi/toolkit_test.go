package cdi

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// toolkitSpec is the shape of what nvidia-ctk cdi generate writes for a node
// whose GPU 0 is in MIG mode: no device for the GPU itself, the driver's
// libraries and hooks in the spec's own edits.
const toolkitSpec = `cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0:0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05
    options: [ro, nosuid, nodev, bind]
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
`

// CommonEdits are the toolkit spec's own edits, copied; without a spec
// there are none.
func TestToolkitCommonEdits(t *testing.T) {
	dir := t.TempDir()
	tk, err := NewToolkitSpecs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := tk.CommonEdits(); ok || err != nil {
		t.Fatalf("no spec: ok %v, err %v", ok, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(toolkitSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	edits, ok, err := tk.CommonEdits()
	if err != nil || !ok {
		t.Fatalf("ok %v, err %v", ok, err)
	}
	if len(edits.Mounts) != 1 || edits.Mounts[0].HostPath != "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05" ||
		len(edits.Hooks) != 1 || len(edits.DeviceNodes) != 1 || edits.DeviceNodes[0].Path != "/dev/nvidiactl" {
		t.Errorf("edits %+v", edits)
	}
	edits.Mounts[0].Options[0] = "rw"
	again, _, _ := tk.CommonEdits()
	if again.Mounts[0].Options[0] != "ro" {
		t.Error("CommonEdits hands out the cache's own edits")
	}
	if _, ok, _ := (StaticToolkit{}).CommonEdits(); ok {
		t.Error("an empty StaticToolkit has a spec")
	}
}

// indexSpec names GPUs by NVML index, as nvidia-ctk cdi generate does by
// default: device "0" is /dev/nvidia1 here (the spec was generated when
// the GPU of minor 0 was off the bus, or the indexes changed since).
const indexSpec = `cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
- name: GPU-by-uuid
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia7
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
`

// A device named by index is the GPU's only if it gives the GPU's own
// device node; a device named by UUID is the GPU's whatever its index.
func TestToolkitIndexDeviceMustBeTheGPUsMinor(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(indexSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err := NewToolkitSpecs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok, err := tk.DeviceID("GPU-a", 0, 1); err != nil || !ok || id != "nvidia.com/gpu=0" {
		t.Errorf("index 0, minor 1: %q %v %v; want nvidia.com/gpu=0", id, ok, err)
	}
	_, ok, err := tk.DeviceID("GPU-b", 0, 0)
	if ok || !errors.Is(err, ErrStaleIndexDevice) {
		t.Errorf("index 0, minor 0 (the spec's device 0 is /dev/nvidia1): ok %v, err %v; want ErrStaleIndexDevice", ok, err)
	}
	if id, ok, err := tk.DeviceID("GPU-by-uuid", 3, 3); err != nil || !ok || id != "nvidia.com/gpu=GPU-by-uuid" {
		t.Errorf("by UUID: %q %v %v", id, ok, err)
	}
	if _, ok, err := tk.DeviceID("GPU-c", 5, 5); ok || err != nil {
		t.Errorf("no such device: ok %v, err %v", ok, err)
	}
}
