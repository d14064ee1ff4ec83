package cdi

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// TestDirRoundTrip: a written spec is valid for the CDI library, its IDs are
// stable, List sees only our specs, and Remove is idempotent.
func TestDirRoundTrip(t *testing.T) {
	root := t.TempDir()
	d, err := NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	devs := []Device{
		{Name: DeviceName("gpu-0", ""), Edits: cdispec.ContainerEdits{Env: []string{"A=1"}}},
		{Name: DeviceName("gpu-1-shared", "3f1c"), Edits: cdispec.ContainerEdits{Env: []string{"B=2"}}},
	}
	record := []byte(`{"uid":"uid-1","state":"PrepareCompleted"}`)
	if ok, err := d.Current("uid-1", devs, record); err != nil || ok {
		t.Errorf("Current before Write = %v, %v; want false", ok, err)
	}
	ids, err := d.Write("uid-1", devs, record)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := d.Current("uid-1", devs, record); err != nil || !ok {
		t.Errorf("Current after Write = %v, %v; want true", ok, err)
	}
	if ok, _ := d.Current("uid-1", devs[:1], record); ok {
		t.Error("Current with other devices = true")
	}
	if got, err := d.Record("uid-1"); err != nil || string(got) != string(record) {
		t.Errorf("Record = %q, %v; want %q", got, err, record)
	}
	want := []string{"k8s.gpu.tessera.dev/claim=uid-1-gpu-0", "k8s.gpu.tessera.dev/claim=uid-1-gpu-1-shared-3f1c"}
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Errorf("ids (-want +got):\n%s", diff)
	}
	again, err := d.Write("uid-1", devs, record)
	if err != nil || !cmp.Equal(ids, again) {
		t.Errorf("rewrite: %v %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(root, "k8s.gpu.tessera.dev-claim_uid-1.json")); err != nil {
		t.Errorf("spec file name: %v", err)
	}
	// Files that are not ours are never listed.
	for _, name := range []string{"gpu.tessera.dev_metadata_uid-1_gpu.json", "nvidia.yaml", "k8s.gpu.tessera.dev-claim_.json"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	uids, err := d.List()
	if err != nil || !cmp.Equal(uids, []types.UID{"uid-1"}) {
		t.Errorf("List = %v, %v", uids, err)
	}
	spec, err := cdiapi.ReadSpec(d.Path("uid-1"), 0)
	if err != nil {
		t.Fatalf("CDI library rejects our spec: %v", err)
	}
	if spec.GetVendor() != Vendor || spec.GetClass() != Class || spec.GetDevice("uid-1-gpu-0") == nil {
		t.Errorf("spec %s/%s lacks device", spec.GetVendor(), spec.GetClass())
	}
	for range 2 {
		if err := d.Remove("uid-1"); err != nil {
			t.Fatal(err)
		}
	}
	if uids, _ := d.List(); len(uids) != 0 {
		t.Errorf("after Remove: %v", uids)
	}
	if _, err := d.Record("uid-1"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Record after Remove: %v, want fs.ErrNotExist", err)
	}
}

// TestWriteValidates: an invalid spec never reaches the disk.
func TestWriteValidates(t *testing.T) {
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, devs := range map[string][]Device{
		"no devices":  nil,
		"empty edits": {{Name: "gpu-0"}},
		"bad env":     {{Name: "gpu-0", Edits: cdispec.ContainerEdits{Env: []string{"=x"}}}},
		"bad name":    {{Name: "gpu/0", Edits: cdispec.ContainerEdits{Env: []string{"A=1"}}}},
		"duplicate":   {{Name: "gpu-0", Edits: cdispec.ContainerEdits{Env: []string{"A=1"}}}, {Name: "gpu-0", Edits: cdispec.ContainerEdits{Env: []string{"A=1"}}}},
	} {
		if _, err := d.Write("uid-x", devs, nil); err == nil {
			t.Errorf("%s: written", name)
		}
	}
	if uids, _ := d.List(); len(uids) != 0 {
		t.Errorf("invalid specs on disk: %v", uids)
	}
}

func TestStaticToolkit(t *testing.T) {
	id, ok, err := StaticToolkit{"GPU-1": true}.DeviceID("GPU-1", 0, 0)
	if err != nil || !ok || id != "nvidia.com/gpu=GPU-1" {
		t.Errorf("got %q %v %v", id, ok, err)
	}
	if _, ok, _ := (StaticToolkit{}).DeviceID("GPU-1", 0, 0); ok {
		t.Error("found a device that is not there")
	}
}
