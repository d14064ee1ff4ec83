package cdi

import (
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
