package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

const (
	bootA = "11111111-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
	bootB = "22222222-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
)

// fakeClock returns strictly increasing times, so backups never collide.
func fakeClock() func() time.Time {
	var mu sync.Mutex
	t := time.Unix(1_800_000_000, 0)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Second)
		return t
	}
}

func openWith(t testing.TB, path, bootID string, fsys fileSystem) (*File, Recovery, error) {
	t.Helper()
	// Benchmarks would drown in the per-write V(5) lines; the zero Logger discards.
	ctx := klog.NewContext(context.Background(), klog.Logger{})
	if t, ok := t.(*testing.T); ok {
		_, ctx = ktesting.NewTestContext(t)
	}
	return open(ctx, path, bootID, fsys, fakeClock())
}

func mustOpen(t testing.TB, path, bootID string, fsys fileSystem) (*File, Recovery) {
	t.Helper()
	f, rec, err := openWith(t, path, bootID, fsys)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return f, rec
}

func testClaim(uid string, state ClaimState) Claim {
	return Claim{
		UID:       types.UID(uid),
		Namespace: "default",
		Name:      "claim-" + uid,
		State:     state,
		Devices: []Device{{
			Request:      "gpus",
			Pool:         "node-a",
			Device:       "gpu-3-shared",
			ShareID:      "share-" + uid,
			UUID:         "GPU-3",
			Minor:        3,
			Isolation:    "HAMiCore",
			MemoryLimit:  20 << 30,
			CoresLimit:   25,
			CDIDeviceIDs: []string{"gpu.tessera.dev/gpu=" + uid},
		}},
		Config: json.RawMessage(`{"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"isolation": "HAMiCore"}}`),
	}
}

// onDisk decodes the checkpoint file as a fresh process would.
func onDisk(t *testing.T, path string) map[types.UID]Claim {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read checkpoint: %v", err)
	}
	c, err := decode(data)
	if err != nil {
		t.Fatalf("checkpoint on disk is unreadable: %v", err)
	}
	return c.Claims
}

func uids(claims []Claim) []types.UID {
	var out []types.UID
	for _, c := range claims {
		out = append(out, c.UID)
	}
	return out
}

// dirNames lists dir, so tests can see temp files and backups.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	names, err := osFS{}.ReadDirNames(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

func TestRoundTripThroughDisk(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "checkpoint.json")

	f, rec := mustOpen(t, path, bootA, osFS{})
	if rec.Kind != RecoveryMissing || !strings.Contains(rec.Message, path) {
		t.Fatalf("first open: got %+v, want Missing naming %s", rec, path)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("Open of a missing file must create it: %v", err)
	}

	a, b, c := testClaim("a", PrepareCompleted), testClaim("b", PrepareStarted), testClaim("c", PrepareCompleted)
	c.Devices, c.Config = nil, nil
	for _, cl := range []Claim{b, a, c} {
		if err := f.Put(cl); err != nil {
			t.Fatalf("Put(%s): %v", cl, err)
		}
	}
	b.State = PrepareCompleted
	if err := f.Put(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete("c"); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete("never-there"); err != nil {
		t.Fatalf("Delete of an unknown uid: %v", err)
	}
	want := f.List()
	if diff := cmp.Diff([]types.UID{"a", "b"}, uids(want)); diff != "" {
		t.Fatalf("List (-want +got):\n%s", diff)
	}
	if got, _ := f.Get("b"); got.State != PrepareCompleted {
		t.Fatalf("Get(b).State = %s, want the replaced value", got.State)
	}

	// A new process sees exactly what the old one had.
	g, rec := mustOpen(t, path, bootA, osFS{})
	if rec.Kind != RecoveryNone {
		t.Fatalf("reopen: got %+v, want None", rec)
	}
	if diff := cmp.Diff(want, g.List()); diff != "" {
		t.Fatalf("after reopen (-before +after):\n%s", diff)
	}
	// Config is compact both before and after the restart.
	got, _ := g.Get("a")
	if wantCfg := `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"HAMiCore"}}`; string(got.Config) != wantCfg {
		t.Fatalf("Config = %s, want %s", got.Config, wantCfg)
	}
}

func TestWriteFailureIsAllOrNothing(t *testing.T) {
	enospc := syscall.ENOSPC
	eio := syscall.EIO
	for _, tc := range []struct {
		op  op
		err error
		// renamed: the failure comes after the rename, so the new content
		// is already visible on disk (documented exception).
		renamed bool
	}{
		{op: opCreate, err: enospc},
		{op: opWrite, err: enospc},
		{op: opSync, err: eio},
		{op: opClose, err: eio},
		{op: opRename, err: eio},
		{op: opSyncDir, err: eio, renamed: true},
	} {
		t.Run(string(tc.op), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "checkpoint.json")
			fsys := newFaultFS()
			f, _ := mustOpen(t, path, bootA, fsys)
			if err := f.Put(testClaim("a", PrepareCompleted)); err != nil {
				t.Fatal(err)
			}
			before := f.List()
			filesBefore := dirNames(t, dir)

			fsys.set(tc.op, tc.err)
			b := testClaim("b", PrepareStarted)
			errPut := f.Put(b)
			errDel := f.Delete("a")
			fsys.set(tc.op, nil)

			for name, err := range map[string]error{"Put": errPut, "Delete": errDel} {
				if !errors.Is(err, tc.err) {
					t.Errorf("%s: error %v, want one wrapping %v", name, err, tc.err)
				}
				if err != nil && !strings.Contains(err.Error(), path) {
					t.Errorf("%s: error %q does not name %s", name, err, path)
				}
			}
			if diff := cmp.Diff(before, f.List()); diff != "" {
				t.Errorf("in-memory state changed by failed writes (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(filesBefore, dirNames(t, dir)); diff != "" {
				t.Errorf("files in %s (-before +after), temporary file left behind?\n%s", dir, diff)
			}
			disk := onDisk(t, path)
			if tc.renamed {
				// The last rename (the Delete) is on disk but not acknowledged.
				if _, ok := disk["a"]; ok {
					t.Errorf("after a failed directory sync the renamed content should be visible")
				}
			} else if diff := cmp.Diff([]types.UID{"a"}, uids(sortedClaims(disk))); diff != "" {
				t.Errorf("old file not intact (-want +got):\n%s", diff)
			}

			// The next successful write makes disk match memory again.
			if err := f.Put(testClaim("c", PrepareCompleted)); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(f.List(), sortedClaims(onDisk(t, path))); diff != "" {
				t.Errorf("disk did not converge to memory (-memory +disk):\n%s", diff)
			}
		})
	}
}

func TestFullDiskErrorNamesPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	fsys := newFaultFS()
	f, _ := mustOpen(t, path, bootA, fsys)
	fsys.set(opWrite, syscall.ENOSPC)
	err := f.Put(testClaim("x", PrepareStarted))
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("got %v, want ENOSPC", err)
	}
	for _, want := range []string{path, "no space left on device", "default/claim-x (uid x)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestOpenFailsWhenItCannotWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	fsys := newFaultFS()
	fsys.set(opWrite, syscall.ENOSPC)
	if _, _, err := openWith(t, path, bootA, fsys); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Open on a full disk: got %v, want ENOSPC", err)
	}
}

func TestOpenUnreadableIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := os.Mkdir(path, 0o700); err != nil { // reading a directory fails
		t.Fatal(err)
	}
	_, _, err := openWith(t, path, bootA, osFS{})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("got %v, want an error naming %s", err, path)
	}
	if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
		t.Fatalf("Open must not touch what it cannot read: %v", err)
	}
}

// writeValid writes a checkpoint holding claims a and b with bootA.
func writeValid(t *testing.T, path string) []byte {
	t.Helper()
	data, err := encode(bootA, map[types.UID]Claim{
		"a": mustNormalize(t, testClaim("a", PrepareCompleted)),
		"b": mustNormalize(t, testClaim("b", PrepareStarted)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return data
}

func mustNormalize(t *testing.T, c Claim) Claim {
	t.Helper()
	n, err := normalize(c)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// withChecksum returns doc as a file with a correct checksum, to build
// files that are well-formed but wrong in some other way.
func withChecksum(t *testing.T, doc string) []byte {
	t.Helper()
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(doc), &top); err != nil {
		t.Fatal(err)
	}
	sum, err := checksumOf(top)
	if err != nil {
		t.Fatal(err)
	}
	top["checksum"], _ = json.Marshal(sum)
	out, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCorruptFileIsMovedAside(t *testing.T) {
	valid := func(t *testing.T) []byte {
		return writeValid(t, filepath.Join(t.TempDir(), "x"))
	}
	for _, tc := range []struct {
		name   string
		data   func(t *testing.T) []byte
		reason string
	}{
		{"garbage", func(*testing.T) []byte { return []byte("\x00\x01not json at all") }, "not a valid JSON object"},
		{"empty", func(*testing.T) []byte { return nil }, "not a valid JSON object"},
		{"truncated", func(t *testing.T) []byte { d := valid(t); return d[:len(d)*2/3] }, "unexpected end of JSON input"},
		{"checksum mismatch", func(t *testing.T) []byte {
			return []byte(strings.Replace(string(valid(t)), `"claim-a"`, `"claim-z"`, 1))
		}, "checksum mismatch"},
		{"no checksum", func(*testing.T) []byte { return []byte(`{"version":"v1","claims":{}}`) }, `no "checksum"`},
		{"no version", func(*testing.T) []byte { return []byte(`{"claims":{}}`) }, `no "version"`},
		{"null", func(*testing.T) []byte { return []byte(`null`) }, `no "version"`},
		{"unknown version", func(*testing.T) []byte { return []byte(`{"version":"banana"}`) }, `unknown format version "banana"`},
		{"key and uid differ", func(t *testing.T) []byte {
			return withChecksum(t, `{"version":"v1","bootID":"`+bootA+`","claims":{"a":{"uid":"b","state":"PrepareStarted"}}}`)
		}, `claim under key "a" has uid "b"`},
		{"claims not an object", func(t *testing.T) []byte {
			return withChecksum(t, `{"version":"v1","bootID":"`+bootA+`","claims":[1,2]}`)
		}, `"claims"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "checkpoint.json")
			data := tc.data(t)
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			f, rec := mustOpen(t, path, bootA, osFS{})
			if rec.Kind != RecoveryCorrupt || !rec.LostClaims() {
				t.Fatalf("got %+v, want Corrupt", rec)
			}
			for _, want := range []string{path, tc.reason, rec.BackupPath} {
				if !strings.Contains(rec.Message, want) {
					t.Errorf("message %q does not contain %q", rec.Message, want)
				}
			}
			if !strings.HasPrefix(rec.BackupPath, path+".corrupt-") {
				t.Errorf("backup path %q, want %s.corrupt-<nanos>", rec.BackupPath, path)
			}
			kept, err := os.ReadFile(rec.BackupPath)
			if err != nil || string(kept) != string(data) {
				t.Errorf("backup does not hold the original bytes: %v", err)
			}
			if got := f.List(); len(got) != 0 {
				t.Errorf("store not empty: %v", uids(got))
			}
			// The fresh file is valid: the next start is a clean one.
			if _, rec := mustOpen(t, path, bootA, osFS{}); rec.Kind != RecoveryNone {
				t.Errorf("open after recovery: got %+v, want None", rec)
			}
		})
	}
}

func TestChecksumIgnoresWhitespace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	data := writeValid(t, path)
	// Strip all indentation; re-encoding through a generic value would
	// reorder keys, which the checksum rightly rejects.
	var buf strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		buf.WriteString(strings.TrimSpace(line))
	}
	if err := os.WriteFile(path, []byte(buf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	f, rec := mustOpen(t, path, bootA, osFS{})
	if rec.Kind != RecoveryNone || len(f.List()) != 2 {
		t.Fatalf("re-indented file: got %+v with %d claims, want None with 2", rec, len(f.List()))
	}
}

func TestRebootStartsEmpty(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	data := writeValid(t, path)

	f, rec := mustOpen(t, path, bootB, osFS{})
	if rec.Kind != RecoveryRebooted || !rec.LostClaims() {
		t.Fatalf("got %+v, want Rebooted", rec)
	}
	if diff := cmp.Diff([]types.UID{"a", "b"}, uids(rec.Dropped)); diff != "" {
		t.Errorf("Dropped (-want +got):\n%s", diff)
	}
	for _, want := range []string{path, bootA, bootB, rec.BackupPath} {
		if !strings.Contains(rec.Message, want) {
			t.Errorf("message %q does not contain %q", rec.Message, want)
		}
	}
	if !strings.HasPrefix(rec.BackupPath, path+".prev-boot-") {
		t.Errorf("backup path %q", rec.BackupPath)
	}
	if kept, err := os.ReadFile(rec.BackupPath); err != nil || string(kept) != string(data) {
		t.Errorf("backup does not hold the previous boot's file: %v", err)
	}
	if len(f.List()) != 0 {
		t.Errorf("store not empty after reboot")
	}

	// The new file carries the new boot id: a plugin restart in this boot keeps its claims.
	if err := f.Put(testClaim("c", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	g, rec := mustOpen(t, path, bootB, osFS{})
	if rec.Kind != RecoveryNone || len(g.List()) != 1 {
		t.Fatalf("restart in the same boot: got %+v with %d claims, want None with 1", rec, len(g.List()))
	}

	// A reboot with nothing prepared drops nothing and keeps no backup.
	if err := g.Delete("c"); err != nil {
		t.Fatal(err)
	}
	_, rec = mustOpen(t, path, bootA, osFS{})
	if rec.Kind != RecoveryRebooted || rec.BackupPath != "" || rec.LostClaims() {
		t.Fatalf("empty reboot: got %+v, want Rebooted without backup", rec)
	}
}

func TestEmptyBootIDDisablesRebootDetection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	writeValid(t, path)
	f, rec := mustOpen(t, path, "", osFS{})
	if rec.Kind != RecoveryNone || len(f.List()) != 2 {
		t.Fatalf("got %+v, want None with 2 claims", rec)
	}
}

func TestNewerVersionIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	data := []byte(`{"version":"v9","layout":"something we cannot know"}`)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, _, err := openWith(t, path, bootA, osFS{})
	if f != nil || !errors.Is(err, ErrNewerVersion) {
		t.Fatalf("got %v, want an error wrapping ErrNewerVersion", err)
	}
	for _, want := range []string{path, "v9", "newer Tessera"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if kept, _ := os.ReadFile(path); string(kept) != string(data) {
		t.Errorf("file was changed")
	}
	if diff := cmp.Diff([]string{"checkpoint.json"}, dirNames(t, dir)); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
}

func TestParseMajor(t *testing.T) {
	for in, want := range map[string]int{"v1": 1, "v2": 2, "v10beta1": 10} {
		if got, ok := parseMajor(in); !ok || got != want {
			t.Errorf("parseMajor(%q) = %d, %v; want %d", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "v", "1", "vx", "banana"} {
		if _, ok := parseMajor(in); ok {
			t.Errorf("parseMajor(%q) accepted", in)
		}
	}
}

// TestV1FixtureAlwaysLoads is the upgrade guarantee: testdata/v1.json was
// written to the v1 format by hand (its checksum computed independently of
// this package) and every future Tessera must load it unchanged. Never edit
// the fixture; add one per new version.
func TestV1FixtureAlwaysLoads(t *testing.T) {
	const fixtureBoot = "2f6d3c1e-9a8b-4c7d-8e6f-5a4b3c2d1e0f"
	data, err := os.ReadFile("testdata/v1.json")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, rec := mustOpen(t, path, fixtureBoot, osFS{})
	if rec.Version != "v1" || (rec.Kind != RecoveryNone && rec.Kind != RecoveryOlderVersion) {
		t.Fatalf("got %+v, want the v1 file loaded", rec)
	}
	want := []Claim{
		{
			UID: "0e0b5a3c-1111-4a55-9d6e-2a1f3c4d5e6f", Namespace: "default", Name: "train-0", State: PrepareCompleted,
			Devices: []Device{
				{Request: "gpus/nvlink", Pool: "node-a", Device: "gpu-0", UUID: "GPU-8f3c1a7e-0000-4a3b-9c1d-000000000000", Minor: 0,
					CDIDeviceIDs: []string{"gpu.tessera.dev/gpu=0e0b5a3c-1111-4a55-9d6e-2a1f3c4d5e6f-gpu-0"}},
				{Request: "gpus/nvlink", Pool: "node-a", Device: "gpu-1", UUID: "GPU-8f3c1a7e-0000-4a3b-9c1d-000000000001", Minor: 1,
					CDIDeviceIDs: []string{"gpu.tessera.dev/gpu=0e0b5a3c-1111-4a55-9d6e-2a1f3c4d5e6f-gpu-1"}},
			},
			Config: json.RawMessage(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","topology":{"nvlink":"Required"}}`),
		},
		{
			UID: "7c2d9e41-2222-4b66-8e7f-3b2a4c5d6e7f", Namespace: "ml", Name: "notebook-share", State: PrepareCompleted,
			Devices: []Device{
				{Request: "gpus", Pool: "node-a", Device: "gpu-3-shared", ShareID: "a1b2c3d4", UUID: "GPU-8f3c1a7e-0000-4a3b-9c1d-000000000003", Minor: 3,
					Isolation: "MPS", MemoryLimit: 20 << 30, CoresLimit: 25,
					CDIDeviceIDs: []string{"gpu.tessera.dev/gpu=7c2d9e41-2222-4b66-8e7f-3b2a4c5d6e7f-gpu-3-shared-a1b2c3d4"}},
			},
			Config: json.RawMessage(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS","computeLimit":50}}`),
		},
		{UID: "c9f0a1b2-3333-4c77-9f80-4c3b5d6e7f80", Namespace: "default", Name: "half-done", State: PrepareStarted},
	}
	if diff := cmp.Diff(want, f.List()); diff != "" {
		t.Fatalf("fixture claims (-want +got):\n%s", diff)
	}
}

// TestOlderVersionIsUpgraded exercises the dispatch that a v2 will use to
// read v1, with a made-up older format "v0" (a list of claims, no checksum).
func TestOlderVersionIsUpgraded(t *testing.T) {
	readers["v0"] = func(top map[string]json.RawMessage) (content, error) {
		var list []Claim
		if err := json.Unmarshal(top["entries"], &list); err != nil {
			return content{}, corrupt("entries: %v", err)
		}
		c := content{Claims: map[types.UID]Claim{}}
		for _, cl := range list {
			c.Claims[cl.UID] = cl
		}
		return c, nil
	}
	t.Cleanup(func() { delete(readers, "v0") })

	path := filepath.Join(t.TempDir(), "checkpoint.json")
	old := `{"version":"v0","entries":[{"uid":"a","namespace":"ns","name":"n","state":"PrepareCompleted"}]}`
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	f, rec := mustOpen(t, path, bootA, osFS{})
	if rec.Kind != RecoveryOlderVersion || rec.Version != "v0" || rec.LostClaims() {
		t.Fatalf("got %+v, want OlderVersion from v0", rec)
	}
	if diff := cmp.Diff([]types.UID{"a"}, uids(f.List())); diff != "" {
		t.Fatalf("claims (-want +got):\n%s", diff)
	}
	data, _ := os.ReadFile(path)
	if c, err := decode(data); err != nil || c.Version != CurrentVersion || c.BootID != bootA || len(c.Claims) != 1 {
		t.Fatalf("file not rewritten as %s: %+v, %v", CurrentVersion, c, err)
	}
}

func TestStaleTempFilesAreRemoved(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	writeValid(t, path)
	stale := filepath.Join(dir, ".checkpoint.json.tmp-12345")
	other := filepath.Join(dir, "unrelated.json")
	for _, p := range []string{stale, other} {
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	mustOpen(t, path, bootA, osFS{})
	if diff := cmp.Diff([]string{"checkpoint.json", "unrelated.json"}, dirNames(t, dir)); diff != "" {
		t.Fatalf("files (-want +got):\n%s", diff)
	}
}

func TestBackupsArePruned(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	_, ctx := ktesting.NewTestContext(t)
	clock := fakeClock()
	var backups []string
	for range keepBackups + 3 {
		if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, rec, err := open(ctx, path, bootA, osFS{}, clock)
		if err != nil || rec.Kind != RecoveryCorrupt {
			t.Fatalf("got %+v, %v", rec, err)
		}
		backups = append(backups, filepath.Base(rec.BackupPath))
	}
	want := append([]string{"checkpoint.json"}, backups[len(backups)-keepBackups:]...)
	slices.Sort(want)
	if diff := cmp.Diff(want, dirNames(t, dir)); diff != "" {
		t.Fatalf("files (-want +got):\n%s", diff)
	}
}

// TestConcurrentWriters runs writers and readers together (meant for -race)
// and checks that memory and disk agree on the result.
func TestConcurrentWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	fsys := newFaultFS()
	fsys.noSync = true // the point is the locking, not the disk
	f, _ := mustOpen(t, path, bootA, fsys)

	const workers, perWorker = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker*2)
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				uid := fmt.Sprintf("w%d-%02d", w, i)
				if err := f.Put(testClaim(uid, PrepareStarted)); err != nil {
					errs <- err
				}
				if err := f.Put(testClaim(uid, PrepareCompleted)); err != nil {
					errs <- err
				}
				if _, ok := f.Get(types.UID(uid)); !ok {
					errs <- fmt.Errorf("Get(%s) after Put: missing", uid)
				}
				_ = f.List()
				if i%2 == 1 { // keep the even ones
					if err := f.Delete(types.UID(uid)); err != nil {
						errs <- err
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	var want []types.UID
	for w := range workers {
		for i := 0; i < perWorker; i += 2 {
			want = append(want, types.UID(fmt.Sprintf("w%d-%02d", w, i)))
		}
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, uids(f.List())); diff != "" {
		t.Fatalf("memory (-want +got):\n%s", diff)
	}
	g, _ := mustOpen(t, path, bootA, osFS{})
	if diff := cmp.Diff(f.List(), g.List()); diff != "" {
		t.Fatalf("disk after reopen (-memory +disk):\n%s", diff)
	}
}

func TestBootID(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(p, []byte("  de8b058a-5a62-45d4-9c8a-117c4ed8d904\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := readBootID(p); err != nil || got != "de8b058a-5a62-45d4-9c8a-117c4ed8d904" {
		t.Errorf("readBootID = %q, %v", got, err)
	}
	if err := os.WriteFile(p, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readBootID(p); err == nil {
		t.Errorf("empty boot id accepted")
	}
	if _, err := readBootID(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("missing file accepted")
	}
	if _, err := os.Stat(bootIDPath); err == nil {
		if id, err := BootID(); err != nil || id == "" {
			t.Errorf("BootID() = %q, %v", id, err)
		}
	}
}
