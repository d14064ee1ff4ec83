package isolation

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

func TestBackendEditsErrors(t *testing.T) {
	shareGPU := GPU{UUID: "GPU-1", Shared: true, MemoryLimit: 1 << 30, CoresLimit: 10}
	for name, tc := range map[string]struct {
		in   Claim
		want string
	}{
		"no GPUs":            {Claim{}, "no GPUs"},
		"bad limits":         {Claim{GPUs: []GPU{{UUID: "GPU-1", Shared: true}}}, "invalid limits"},
		"MPS without daemon": {Claim{GPUs: []GPU{shareGPU}, Isolation: configapi.IsolationMPS}, "no MPS daemon"},
		"HAMi unconfigured":  {Claim{GPUs: []GPU{shareGPU}, Isolation: configapi.IsolationHAMiCore}, "--hami-core-library is empty"},
		"unknown backend":    {Claim{GPUs: []GPU{shareGPU}, Isolation: "Magic"}, `unknown isolation "Magic"`},
	} {
		if _, err := BackendEdits(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", name, err, tc.want)
		}
	}
}

// TestDeviceEditsCompose: the edits of devices on different GPUs never set
// one variable to two values, so any set of them (what one container
// references) merges into exactly those GPUs and their limits, whatever the
// order the runtime applies them in.
func TestDeviceEditsCompose(t *testing.T) {
	devices := []GPU{
		{UUID: "GPU-a", Minor: 0, Shared: true, MemoryLimit: 1 << 30, CoresLimit: 10},
		{UUID: "GPU-b", Minor: 1},
		{UUID: "GPU-c", Minor: 2, Shared: true, MemoryLimit: 2 << 30, CoresLimit: 20},
	}
	for _, legacy := range []bool{false, true} {
		for mask := 1; mask < 1<<len(devices); mask++ {
			checkDeviceEditsCompose(t, devices, mask, legacy)
		}
	}
	if _, err := DeviceEdits(GPU{Minor: 3}, false); err == nil {
		t.Error("DeviceEdits without a UUID: no error")
	}
}

// checkDeviceEditsCompose merges the edits of the devices in mask as a
// runtime does and checks what the container gets: its GPUs' variables,
// NVIDIA_VISIBLE_DEVICES=void, and with legacy exactly its GPUs requested
// from a legacy NVIDIA runtime through volume mounts.
func checkDeviceEditsCompose(t *testing.T, devices []GPU, mask int, legacy bool) {
	t.Helper()
	merged := map[string]string{}
	var want, wantRequested, gotRequested []string
	for i, g := range devices {
		if mask&(1<<i) == 0 {
			continue
		}
		edits, err := DeviceEdits(g, legacy)
		if err != nil {
			t.Fatal(err)
		}
		wantRequested = append(wantRequested, g.UUID)
		gotRequested = append(gotRequested, volumeMountRequests(edits.Mounts)...)
		for _, kv := range edits.Env {
			k, v, _ := strings.Cut(kv, "=")
			if old, ok := merged[k]; ok && old != v {
				t.Fatalf("devices %b (legacy %v): %s set to %q and %q", mask, legacy, k, old, v)
			}
			merged[k] = v
		}
		want = append(want, GPUVariable(g.Minor)+"="+g.UUID)
	}
	var got []string
	for k, v := range merged {
		if strings.HasPrefix(k, "TESSERA_GPU_") && !strings.HasSuffix(k, "_LIMIT") {
			got = append(got, k+"="+v)
		}
	}
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("devices %b (legacy %v): visible GPUs (-want +got):\n%s", mask, legacy, diff)
	}
	// void on every node: a legacy NVIDIA runtime must not be able to take
	// the GPUs from the variable, or a node could not refuse it.
	if merged["NVIDIA_VISIBLE_DEVICES"] != "void" {
		t.Errorf("devices %b (legacy %v): NVIDIA_VISIBLE_DEVICES=%q, want void", mask, legacy, merged["NVIDIA_VISIBLE_DEVICES"])
	}
	if !legacy {
		wantRequested = nil
	}
	slices.Sort(gotRequested)
	if diff := cmp.Diff(wantRequested, gotRequested); diff != "" {
		t.Errorf("devices %b (legacy %v): GPUs requested through volume mounts (-want +got):\n%s", mask, legacy, diff)
	}
}

// volumeMountRequests are the device ids a legacy NVIDIA runtime with
// accept-nvidia-visible-devices-as-volume-mounts = true reads from a
// container's mounts: those whose host path is /dev/null, by their path
// under /var/run/nvidia-container-devices (the toolkit's rule, in
// internal/config/image/cuda_image.go).
func volumeMountRequests(mounts []*cdispec.Mount) []string {
	var out []string
	for _, m := range mounts {
		if filepath.Clean(m.HostPath) != "/dev/null" {
			continue
		}
		dest := filepath.Clean(m.ContainerPath)
		if !strings.HasPrefix(dest, "/var/run/nvidia-container-devices/") {
			continue
		}
		if slices.Contains(m.Options, "rw") || !slices.Contains(m.Options, "ro") {
			continue // the request need not, and must not, be writable
		}
		out = append(out, strings.TrimPrefix(dest, "/var/run/nvidia-container-devices/"))
	}
	return out
}

// TestHAMiCoreFailsClosed: a missing library is an error naming path and flag.
func TestHAMiCoreFailsClosed(t *testing.T) {
	dir := t.TempDir()
	preload, err := WritePreloadFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := HAMiCore{Library: filepath.Join(dir, "libvgpu.so"), PreloadFile: preload}
	err = h.Check()
	if err == nil || !strings.Contains(err.Error(), h.Library) || !strings.Contains(err.Error(), "--hami-core-library") {
		t.Errorf("Check = %v", err)
	}
}

// A claim's directory is made under ClaimRoot, world-writable and sticky; one
// an earlier release made under an old claim root stays the claim's directory
// (its containers keep one region), and unprepare removes it from every root.
func TestHAMiCoreClaimDirs(t *testing.T) {
	base := t.TempDir()
	h := HAMiCore{ClaimRoot: filepath.Join(base, "run", "hami-claims"), OldClaimRoots: []string{filepath.Join(base, "data", "hami", "claims")}}
	// The kubelet's DirectoryOrCreate makes the root 0755; the plugin makes
	// it root's only.
	if err := os.MkdirAll(h.ClaimRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := h.EnsureClaimRoot(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(h.ClaimRoot); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("claim root after EnsureClaimRoot: %v, %v; want mode 0700", fi, err)
	}
	if err := h.CreateClaimDir("new"); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(h.ClaimRoot, "new")
	if got := h.ClaimDir("new"); got != want {
		t.Errorf("ClaimDir(new) = %s, want %s", got, want)
	}
	fi, err := os.Stat(want)
	if err != nil || fi.Mode()&(os.ModePerm|os.ModeSticky) != 0o777|os.ModeSticky {
		t.Fatalf("claim directory %s: %v, %v; want mode 1777", want, fi, err)
	}

	old := filepath.Join(h.OldClaimRoots[0], "upgraded")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := h.ClaimDir("upgraded"); got != old {
		t.Errorf("ClaimDir of a claim prepared under the old root = %s, want %s", got, old)
	}
	if err := h.CreateClaimDir("upgraded"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h.ClaimRoot, "upgraded")); err == nil {
		t.Error("CreateClaimDir made a second directory under the new root for a claim that has one under the old root")
	}
	for _, uid := range []types.UID{"new", "upgraded"} {
		if err := h.RemoveClaimDir(uid); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{want, old} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s still there after RemoveClaimDir: %v", dir, err)
		}
	}
	// A UID that is no directory name never reaches an old root's parent.
	if got := h.ClaimDir(".."); got != filepath.Join(h.ClaimRoot, "..") {
		t.Errorf("ClaimDir(..) = %s, want it under the claim root (and CreateClaimDir refuses it)", got)
	}
	if err := h.CreateClaimDir(".."); err == nil {
		t.Error("CreateClaimDir(..) succeeded")
	}
}

// EnsureClaimRoot leaves a directory that holds anything but claims'
// directories as it is; CreateClaimDir refuses a claim path that is not a
// directory; RememberClaimRoots lists the roots used before.
func TestHAMiCoreClaimRootGuards(t *testing.T) {
	base := t.TempDir()
	shared := HAMiCore{ClaimRoot: filepath.Join(base, "run")}
	if err := os.MkdirAll(filepath.Join(shared.ClaimRoot, "0f0e6a2c-6d1b-4b7e-9c84-2f6c2b0c9b1a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shared.ClaimRoot, "utmp"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared.ClaimRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := shared.EnsureClaimRoot(); err == nil || !strings.Contains(err.Error(), `"utmp"`) {
		t.Errorf("EnsureClaimRoot on a directory holding other files: %v", err)
	}
	if fi, _ := os.Stat(shared.ClaimRoot); fi.Mode().Perm() != 0o755 {
		t.Errorf("EnsureClaimRoot changed a shared directory to %s", fi.Mode())
	}

	h := HAMiCore{ClaimRoot: filepath.Join(base, "claims")}
	if err := h.EnsureClaimRoot(); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(base, filepath.Join(h.ClaimRoot, "link")); err != nil {
		t.Fatal(err)
	}
	if err := h.CreateClaimDir("link"); err == nil {
		t.Error("CreateClaimDir accepted a symlink as the claim's directory")
	}

	file := filepath.Join(base, "roots")
	for _, step := range []struct {
		root string
		want []string
	}{
		{"/run/a", nil},
		{"/run/a", nil},
		{"/run/b", []string{"/run/a"}},
		{"/run/a", []string{"/run/b"}},
	} {
		got, err := RememberClaimRoots(file, step.root)
		if err != nil || !slices.Equal(got, step.want) {
			t.Errorf("RememberClaimRoots(%s) = %v, %v; want %v", step.root, got, err, step.want)
		}
	}
}
