package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// TestFailedWriteLeavesDefinedState fails each step of a Put and of a Delete
// in turn. Before the rename nothing changes; from the rename on the change
// is made in memory and on disk and the error wraps ErrNotDurable. Either way
// Get, the file and Refresh agree, and the caller's rollback works.
func TestFailedWriteLeavesDefinedState(t *testing.T) {
	steps := []struct {
		op  op
		err error
		// renamed: the failing step comes after the rename.
		renamed bool
	}{
		{op: opCreate, err: syscall.ENOSPC},
		{op: opWrite, err: syscall.ENOSPC},
		{op: opSync, err: syscall.EIO},
		{op: opClose, err: syscall.EIO},
		{op: opRename, err: syscall.EIO},
		{op: opSyncDir, err: syscall.EIO, renamed: true},
	}
	calls := []struct {
		name string
		// do is the call that fails, undo the caller's rollback of it.
		do, undo func(f *File) error
		// changed is what the store holds once do took effect.
		changed []types.UID
	}{
		{
			name:    "Put",
			do:      func(f *File) error { return f.Put(testClaim("b", PrepareCompleted)) },
			undo:    func(f *File) error { return f.Delete("b") },
			changed: []types.UID{"a", "b"},
		},
		{
			name:    "Delete",
			do:      func(f *File) error { return f.Delete("a") },
			undo:    func(f *File) error { return f.Put(testClaim("a", PrepareCompleted)) },
			changed: nil,
		},
	}
	for _, step := range steps {
		for _, call := range calls {
			t.Run(string(step.op)+"/"+call.name, func(t *testing.T) {
				dir := t.TempDir()
				path, fsys, f := openFaulty(t, dir)
				if err := f.Put(testClaim("a", PrepareCompleted)); err != nil {
					t.Fatal(err)
				}
				before := f.List()
				filesBefore := dirNames(t, dir)

				fsys.set(step.op, step.err)
				err := call.do(f)
				fsys.set(step.op, nil)

				if !errors.Is(err, step.err) {
					t.Fatalf("error %v, want one wrapping %v", err, step.err)
				}
				if !strings.Contains(err.Error(), path) {
					t.Errorf("error %q does not name %s", err, path)
				}
				if got := errors.Is(err, ErrNotDurable); got != step.renamed {
					t.Errorf("errors.Is(%v, ErrNotDurable) = %v, want %v", err, got, step.renamed)
				}
				want := []types.UID{"a"}
				if step.renamed {
					want = call.changed
				}
				_, gotA := f.Get("a")
				_, gotB := f.Get("b")
				if wantA, wantB := slices.Contains(want, "a"), slices.Contains(want, "b"); gotA != wantA || gotB != wantB {
					t.Errorf("Get(a), Get(b) found %v, %v; want %v, %v", gotA, gotB, wantA, wantB)
				}
				if diff := cmp.Diff(want, uids(f.List())); diff != "" {
					t.Errorf("memory (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(f.List(), sortedClaims(onDisk(t, path))); diff != "" {
					t.Errorf("memory and disk disagree (-memory +disk):\n%s", diff)
				}
				if diff := cmp.Diff(filesBefore, dirNames(t, dir)); diff != "" {
					t.Errorf("files in %s (-before +after), temporary file left behind?\n%s", dir, diff)
				}
				// Refresh must not take the file for another writer's.
				if changed, err := f.Refresh(); changed || err != nil {
					t.Errorf("Refresh after the failed %s = %v, %v; want false, nil", call.name, changed, err)
				}
				if diff := cmp.Diff(want, uids(f.List())); diff != "" {
					t.Errorf("memory after Refresh (-want +got):\n%s", diff)
				}

				// The caller treats the error as failure and rolls back.
				if err := call.undo(f); err != nil {
					t.Fatalf("rollback: %v", err)
				}
				if diff := cmp.Diff(before, f.List()); diff != "" {
					t.Errorf("memory after rollback (-before +after):\n%s", diff)
				}
				if diff := cmp.Diff(before, sortedClaims(onDisk(t, path))); diff != "" {
					t.Errorf("disk after rollback (-before +after):\n%s", diff)
				}
				if changed, err := f.Refresh(); changed || err != nil {
					t.Errorf("Refresh after rollback = %v, %v; want false, nil", changed, err)
				}
			})
		}
	}
}

// TestRolledBackClaimDoesNotComeBack: a PrepareCompleted write whose
// directory sync failed, then a rollback that fails too, must not have
// Refresh adopt the claim as PrepareCompleted behind the store's back.
func TestRolledBackClaimDoesNotComeBack(t *testing.T) {
	path, fsys, f := openFaulty(t, t.TempDir())
	if err := f.Put(testClaim("b", PrepareStarted)); err != nil {
		t.Fatal(err)
	}
	fsys.set(opSyncDir, syscall.EIO)
	if err := f.Put(testClaim("b", PrepareCompleted)); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("Put with a failing directory sync: %v, want ErrNotDurable", err)
	}
	fsys.set(opSyncDir, nil)
	fsys.set(opWrite, syscall.ENOSPC)
	if err := f.Delete("b"); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("rollback on a full disk: %v, want ENOSPC", err)
	}
	fsys.set(opWrite, nil)

	got, _ := f.Get("b")
	if changed, err := f.Refresh(); changed || err != nil {
		t.Fatalf("Refresh = %v, %v; want false, nil (nobody else wrote)", changed, err)
	}
	if again, _ := f.Get("b"); again.State != got.State {
		t.Fatalf("Refresh changed claim b from %s to %s", got.State, again.State)
	}
	if disk := onDisk(t, path)["b"]; disk.State != got.State {
		t.Fatalf("memory holds b as %s, disk as %s", got.State, disk.State)
	}
	// The retried rollback works.
	if err := f.Delete("b"); err != nil {
		t.Fatal(err)
	}
	if _, ok := onDisk(t, path)["b"]; ok {
		t.Fatal("claim b still on disk after Delete")
	}
	if changed, err := f.Refresh(); changed || err != nil {
		t.Fatalf("Refresh = %v, %v; want false, nil", changed, err)
	}
	if _, ok := f.Get("b"); ok {
		t.Fatal("claim b came back")
	}
}

func TestFullDiskErrorNamesPath(t *testing.T) {
	path, fsys, f := openFaulty(t, t.TempDir())
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
		{"unknown version of the current major", func(*testing.T) []byte { return []byte(`{"version":"v1beta1"}`) }, `unknown format version "v1beta1"`},
		{"minor not a number", func(*testing.T) []byte { return []byte(`{"version":"v1.x"}`) }, `unknown format version "v1.x"`},
		{"newer minor with bad checksum", func(t *testing.T) []byte {
			return []byte(strings.Replace(string(valid(t)), `"version": "v1"`, `"version": "v1.3"`, 1))
		}, "checksum mismatch"},
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
			if rec.Kind != RecoveryCorrupt || !rec.LostClaims() || !rec.Untrusted() {
				t.Fatalf("got %+v, want Corrupt, untrusted", rec)
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
	for _, version := range []string{"v9", "v2.1", "v2beta1"} {
		t.Run(version, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "checkpoint.json")
			data := []byte(`{"version":"` + version + `","layout":"something we cannot know"}`)
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			f, _, err := openWith(t, path, bootA, osFS{})
			if f != nil || !errors.Is(err, ErrNewerVersion) {
				t.Fatalf("got %v, want an error wrapping ErrNewerVersion", err)
			}
			for _, want := range []string{path, version, "newer Tessera"} {
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
		})
	}
}

// newerMinorFile is a checkpoint in format version, a newer minor of v1
// holding claims a and b: it has a top-level member, a claim field and a
// device field that v1 does not know. Its checksum is computed here by the
// documented rule (compact, members sorted by name, without "checksum"),
// not by the package.
func newerMinorFile(version string) []byte {
	const claims = `{"a":{"uid":"a","namespace":"default","name":"train","state":"PrepareCompleted",` +
		`"devices":[{"request":"gpus","pool":"node-a","device":"gpu-3-shared","shareID":"s1","uuid":"GPU-3","minor":3,` +
		`"isolation":"MPS","memoryLimit":1024,"cdiDeviceIDs":["gpu.tessera.dev/gpu=a"],"adminAccess":true,"consumedMemory":512,"consumedCores":10,` +
		`"migProfile":"1g.10gb"}],"config":{"kind":"GpuConfig"},"priority":7},` +
		`"b":{"uid":"b","namespace":"default","name":"half","state":"PrepareStarted"}}`
	const generation = `{"epoch":3}`
	canonical := `{"bootID":"` + bootA + `","claims":` + claims + `,"generation":` + generation + `,"version":"` + version + `"}`
	sum := sha256.Sum256([]byte(canonical))
	return []byte("{\n  \"version\": \"" + version + "\",\n  \"bootID\": \"" + bootA + "\",\n" +
		"  \"checksum\": \"sha256:" + hex.EncodeToString(sum[:]) + "\",\n" +
		"  \"generation\": " + generation + ",\n  \"claims\": " + claims + "\n}\n")
}

// TestNewerMinorIsLoadedAndKept: after a downgrade, a file in a newer minor
// of the current major is read (known members; the checksum still
// verifies) and left as it is until the first change.
func TestNewerMinorIsLoadedAndKept(t *testing.T) {
	wantClaims := []Claim{
		{UID: "a", Namespace: "default", Name: "train", State: PrepareCompleted,
			Devices: []Device{{Request: "gpus", Pool: "node-a", Device: "gpu-3-shared", ShareID: "s1", UUID: "GPU-3", Minor: 3,
				Isolation: "MPS", MemoryLimit: 1024, CDIDeviceIDs: []string{"gpu.tessera.dev/gpu=a"},
				AdminAccess: true, ConsumedMemory: 512, ConsumedCores: 10}},
			Config: json.RawMessage(`{"kind":"GpuConfig"}`)},
		{UID: "b", Namespace: "default", Name: "half", State: PrepareStarted},
	}
	for _, version := range []string{"v1.1", "v1.3"} {
		t.Run(version, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "checkpoint.json")
			data := newerMinorFile(version)
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			f, rec := mustOpen(t, path, bootA, osFS{})
			if rec.Kind != RecoveryNewerMinor || rec.Version != version || rec.LostClaims() || rec.Untrusted() || rec.BackupPath != "" {
				t.Fatalf("got %+v, want NewerMinor from %s", rec, version)
			}
			for _, want := range []string{path, version, CurrentVersion} {
				if !strings.Contains(rec.Message, want) {
					t.Errorf("message %q does not contain %q", rec.Message, want)
				}
			}
			if diff := cmp.Diff(wantClaims, f.List()); diff != "" {
				t.Fatalf("claims (-want +got):\n%s", diff)
			}
			// Left as it is, also by Refresh and by another Open.
			if changed, err := f.Refresh(); changed || err != nil {
				t.Fatalf("Refresh = %v, %v; want false, nil", changed, err)
			}
			if _, rec := mustOpen(t, path, bootA, osFS{}); rec.Kind != RecoveryNewerMinor {
				t.Fatalf("second open: got %+v, want NewerMinor", rec)
			}
			if kept, _ := os.ReadFile(path); string(kept) != string(data) {
				t.Fatalf("file was rewritten before any change:\n%s", kept)
			}
			if diff := cmp.Diff([]string{"checkpoint.json"}, dirNames(t, dir)); diff != "" {
				t.Errorf("files (-want +got):\n%s", diff)
			}

			// The first change writes the current version with every claim.
			if err := f.Put(testClaim("c", PrepareCompleted)); err != nil {
				t.Fatal(err)
			}
			g, rec := mustOpen(t, path, bootA, osFS{})
			if rec.Kind != RecoveryNone || rec.Version != CurrentVersion {
				t.Fatalf("open after a write: got %+v, want None in %s", rec, CurrentVersion)
			}
			if diff := cmp.Diff(f.List(), g.List()); diff != "" {
				t.Fatalf("after rewrite (-memory +disk):\n%s", diff)
			}
		})
	}
}

// TestRefreshReadsNewerMinor: during a rolling downgrade the other instance
// may write a newer minor; Refresh reads it like Open does.
func TestRefreshReadsNewerMinor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	f, _ := mustOpen(t, path, bootA, osFS{})
	if err := os.WriteFile(path, newerMinorFile("v1.2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Refresh(); !changed || err != nil {
		t.Fatalf("Refresh = %v, %v; want true, nil", changed, err)
	}
	if diff := cmp.Diff([]types.UID{"a", "b"}, uids(f.List())); diff != "" {
		t.Fatalf("claims (-want +got):\n%s", diff)
	}
}

// TestCorruptOpenIsUntrusted: after a corrupt file the empty store is not the
// truth, and the plugin rebuilds it with Put, which works as usual.
func TestCorruptOpenIsUntrusted(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	garbage := []byte(`{"version":"v1","claims":{"a":`)
	if err := os.WriteFile(path, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	f, rec := mustOpen(t, path, bootA, osFS{})
	if !rec.Untrusted() || rec.Kind != RecoveryCorrupt {
		t.Fatalf("got %+v, want Corrupt, untrusted", rec)
	}
	backup := rec.BackupPath
	rebuilt := []Claim{testClaim("a", PrepareCompleted), testClaim("b", PrepareCompleted)}
	for _, c := range rebuilt {
		if err := f.Put(c); err != nil {
			t.Fatalf("Put(%s) after a corrupt open: %v", c, err)
		}
	}
	if changed, err := f.Refresh(); changed || err != nil {
		t.Fatalf("Refresh = %v, %v; want false, nil", changed, err)
	}
	g, rec := mustOpen(t, path, bootA, osFS{})
	if rec.Kind != RecoveryNone || rec.Untrusted() {
		t.Fatalf("reopen: got %+v, want None", rec)
	}
	if diff := cmp.Diff(f.List(), g.List()); diff != "" {
		t.Fatalf("after reopen (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"checkpoint.json", filepath.Base(backup)}, dirNames(t, dir)); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	if kept, err := os.ReadFile(backup); err != nil || string(kept) != string(garbage) {
		t.Errorf("backup does not hold the corrupt file: %v", err)
	}
}

// TestUntrustedOnlyWhenCorrupt: every other outcome of Open is authoritative.
func TestUntrustedOnlyWhenCorrupt(t *testing.T) {
	for _, kind := range []RecoveryKind{RecoveryNone, RecoveryMissing, RecoveryRebooted, RecoveryOlderVersion, RecoveryNewerMinor} {
		if (Recovery{Kind: kind, Dropped: []Claim{{UID: "a"}}}).Untrusted() {
			t.Errorf("%s: Untrusted() = true", kind)
		}
	}
	if !(Recovery{Kind: RecoveryCorrupt}).Untrusted() {
		t.Errorf("%s: Untrusted() = false", RecoveryCorrupt)
	}
}

// TestCorruptOpenFailureKeepsTheFile: when Open cannot back up or replace a
// corrupt file, the file stays where it is, so that the next Open finds it
// corrupt again rather than missing (which would read as a first start with
// nothing prepared). A failing directory sync after the rename does not fail
// Open: the fresh file is visible, and only the Recovery says it is untrusted.
func TestCorruptOpenFailureKeepsTheFile(t *testing.T) {
	garbage := []byte(`{"version":"v1","claims":{"a":`)
	for _, step := range []op{opCreate, opWrite, opSync, opClose, opRename, opSyncDir} {
		t.Run(string(step), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "checkpoint.json")
			if err := os.WriteFile(path, garbage, 0o600); err != nil {
				t.Fatal(err)
			}
			fsys := newFaultFS()
			fsys.set(step, syscall.EIO)
			f, rec, err := openWith(t, path, bootA, fsys)
			fsys.set(step, nil)
			if step == opSyncDir {
				if err != nil || !rec.Untrusted() || len(f.List()) != 0 {
					t.Fatalf("Open = %+v, %v; want Corrupt, untrusted", rec, err)
				}
				if len(onDisk(t, path)) != 0 {
					t.Fatalf("fresh file not empty")
				}
				return
			}
			if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open = %v; want EIO naming %s", err, path)
			}
			if kept, err := os.ReadFile(path); err != nil || string(kept) != string(garbage) {
				t.Fatalf("corrupt file not kept in place: %q, %v", kept, err)
			}
			_, rec = mustOpen(t, path, bootA, fsys)
			if !rec.Untrusted() {
				t.Fatalf("next Open: got %+v, want Corrupt, untrusted", rec)
			}
			if kept, err := os.ReadFile(rec.BackupPath); err != nil || string(kept) != string(garbage) {
				t.Fatalf("backup does not hold the corrupt file: %v", err)
			}
		})
	}
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string][2]int{"v1": {1, 0}, "v1.3": {1, 3}, "v2.0": {2, 0}, "v10.12": {10, 12}} {
		if major, minor, ok := parseVersion(in); !ok || major != want[0] || minor != want[1] {
			t.Errorf("parseVersion(%q) = %d, %d, %v; want %d, %d", in, major, minor, ok, want[0], want[1])
		}
	}
	for _, in := range []string{"", "v", "1.1", "v1.", "v.1", "v1.x", "v1beta1", "v1.1beta1", "v1.1.1", "v-1", "v1.-1", "v+1"} {
		if _, _, ok := parseVersion(in); ok {
			t.Errorf("parseVersion(%q) accepted", in)
		}
	}
	if major, minor, ok := parseVersion(CurrentVersion); !ok || major != currentMajor || minor != currentMinor {
		t.Errorf("CurrentVersion %s does not parse as %d.%d", CurrentVersion, currentMajor, currentMinor)
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
